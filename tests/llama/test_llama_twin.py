"""The llama model against the real llama-server, request by request.

Small traces (a few thousand tokens of synthetic words) are replayed with `replay run --history
recorded` on the real server (xllamacpp, the generated test models) and on the simulator playing
llama-server with the same model file and flags; per request the two must report the same cached
tokens (`timings.cache_n`) and re-processed tokens (`timings.prompt_n`). A disagreement is settled
by reading llama.cpp's source, never by a per-trace setting.

Agreement measured (requests whose re-processed tokens are equal, of all), printed per trace.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from replay.metrics.results import read_results
from replay.trace import TraceWriter
from replay.trace.synth import synth_text
from tests.llama.llamakit import launched, launched_sim, require_xllamacpp

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

Msgs = list[dict[str, str]]


def user(words: int, seed: int) -> dict[str, str]:
    return {"role": "user", "content": synth_text(words, seed)}


def said(words: int, seed: int) -> dict[str, str]:
    """A recorded reply, resent as it was (`--history recorded`)."""
    return {"role": "assistant", "content": synth_text(words, 9000 + seed)}


def one_slot(w: TraceWriter) -> None:
    """Two conversations taking turns on one slot, a resend and a compaction: with a host cache the
    one that comes back finds its state there; without, it is read again."""
    a: Msgs = [{"role": "system", "content": synth_text(120, 1)}, user(500, 2)]
    b: Msgs = [user(600, 3)]
    w.request("a", 0.0, list(a))
    a += [said(20, 1), user(250, 4)]
    w.request("a", 1.0, list(a))
    w.request("b", 2.0, list(b))
    a += [said(20, 2), user(150, 5)]
    w.request("a", 3.0, list(a))
    b += [said(20, 3), user(200, 6)]
    w.request("b", 4.0, list(b))
    w.request("b", 5.0, list(b))  # the same prompt again
    a = [a[0], user(80, 7), user(60, 8)]  # compacted: the system prompt, a summary, the question
    w.request("a", 6.0, list(a))


def three_on_two_slots(w: TraceWriter) -> None:
    """Three conversations on two slots: one goes back to the slot holding its prefix (LCP
    similarity over 0.1), a newcomer takes the least recently used one, one request is pinned by
    `id_slot` to the slot of another conversation."""
    convos: dict[str, Msgs] = {s: [user(300 + 100 * i, 20 + i)] for i, s in enumerate("abc")}
    order = ["a", "b", "a", "b", "c", "b", "a", "c", "b"]
    for t, s in enumerate(order):
        params: dict[str, Any] = {"max_tokens": 8}
        if t == len(order) - 1:
            params["id_slot"] = 0
        w.request(s, float(t), list(convos[s]), params)
        convos[s] += [said(15, 30 + t), user(120, 40 + t)]


def gemma2_edits(w: TraceWriter) -> None:
    """The sliding-window model: a conversation grows (a checkpoint at each last user message and
    near each prompt's end), then an earlier user message is edited (resume at a checkpoint before
    it), then a line is inserted in the middle of the first message (only the start comes back)."""
    a: Msgs = [user(400, 50)]
    w.request("a", 0.0, list(a))
    a += [said(20, 51), user(400, 52)]
    w.request("a", 1.0, list(a))
    a += [said(20, 53), user(400, 54)]
    w.request("a", 2.0, list(a))
    edited = [*a[:2], {"role": "user", "content": a[2]["content"].replace(" ", " edited ", 1)}, *a[3:]]
    w.request("a", 3.0, edited)
    words = a[0]["content"].split(" ")
    middle = [{"role": "user", "content": " ".join([*words[:200], "one inserted line", *words[200:]])}]
    w.request("a", 4.0, middle)
    w.request("a", 5.0, list(a))  # the whole conversation again


CASES: dict[str, tuple[Callable[[TraceWriter], None], str, tuple[str, ...]]] = {
    "one slot, host cache": (one_slot, "llama", ("-np", "1", "-c", "8192")),
    "one slot, no host cache": (one_slot, "llama", ("-np", "1", "-c", "8192", "--cache-ram", "0")),
    "-np 2, similarity": (three_on_two_slots, "llama", ("-np", "2", "-c", "16384", "--cache-ram", "0")),
    "gemma2, edits": (gemma2_edits, "gemma2", ("-np", "1", "-c", "8192")),
}


def write_trace(path: Path, build: Callable[[TraceWriter], None]) -> Path:
    with TraceWriter(path, source="test") as w:
        for s in "abc":
            w.session(s)
        orig = w.request

        def request(session: str, t: float, messages: Msgs, params: dict[str, Any] | None = None) -> int:
            return orig(session, t, messages, params or {"max_tokens": 8})

        w.request = request  # type: ignore[method-assign]
        build(w)
    return path


def replay(url: str, trace: Path, out: Path) -> list[tuple[int, int | None, int | None]]:
    """Per request of the trace, in order: (id, cached tokens, re-processed tokens)."""
    argv = [sys.executable, "-m", "replay", "run", str(trace), "--target", url]
    argv += ["--history", "recorded", "--out", str(out), "--quiet"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = sorted(read_results(out).requests, key=lambda r: r["id"])
    assert all(r["status"] == "ok" for r in rows), rows
    assert all(r.get("reprocessed_source") == "server" for r in rows)  # timings.prompt_n
    return [(r["id"], r["cached_tokens"], r["reprocessed_tokens"]) for r in rows]


@pytest.fixture(scope="module")
def models(tiny_llama: Path, tiny_gemma2: Path) -> dict[str, Path]:
    require_xllamacpp()
    return {"llama": tiny_llama, "gemma2": tiny_gemma2}


@pytest.mark.parametrize("case", list(CASES))
def test_the_simulator_reuses_what_the_real_server_reuses(
    case: str, models: dict[str, Path], tmp_path: Path
) -> None:
    build, model, flags = CASES[case]
    trace = write_trace(tmp_path / "trace.jsonl", build)
    with launched(models[model], *flags, "-t", "2", log_path=tmp_path / "real.log") as real:
        real_rows = replay(real.url, trace, tmp_path / "real.jsonl")
    with launched_sim(models[model], *flags, log_path=tmp_path / "sim.log") as sim:
        sim_rows = replay(sim.url, trace, tmp_path / "sim.jsonl")
    equal = sum(1 for r, s in zip(real_rows, sim_rows, strict=True) if r == s)
    shown = "\n".join(
        f"  #{r[0]}: real cached {r[1]} re-processed {r[2]} | sim {s[1]} {s[2]}"
        for r, s in zip(real_rows, sim_rows, strict=True)
    )
    print(f"\n{case}: agreement {equal}/{len(real_rows)}\n{shown}")
    assert real_rows == sim_rows, f"{case}: agreement {equal}/{len(real_rows)}\n{shown}"
