"""`replay size sweep --server llama` (issue #34 item 3): the llama cache model walked over a trace
at each `--cache-ram` and `-np`. One rule set, two walkers: the sweep's sequential walker
(`LlamaWalker`) and the event-loop model (`LlamaModel`, fed each request once the last is done)
give the same result for every request, on drawn traces and settings.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay.sim.model.llama.config import llama_config
from replay.sizing.llama import llama_jobs, smallest, sweep_llama, tokenizer, walk
from replay.trace import TraceWriter
from replay.trace.reader import read_trace
from replay.trace.synth import synth_text


def write(path: Path, turns: list[tuple[int, str, int]], sessions: int) -> Path:
    """Sessions taking turns: (session, op, words); op `turn` adds a user message, `compact`
    keeps the first message only, `edit` changes the first message."""
    convos: dict[str, list[dict[str, Any]]] = {f"s{i}": [] for i in range(sessions)}
    with TraceWriter(path, source="test") as w:
        for s in convos:
            w.session(s)
        for t, (who, op, words) in enumerate(turns):
            s = f"s{who % sessions}"
            msgs = convos[s]
            if op == "compact" and msgs:
                msgs[:] = msgs[:1]
            if op == "edit" and msgs:
                msgs[0] = {**msgs[0], "content": msgs[0]["content"] + " edited"}
            msgs.append({"role": "user", "content": synth_text(words, t * 11 + who)})
            w.request(s, float(t), list(msgs), {"max_tokens": 8})
            msgs.append({"role": "assistant", "content": synth_text(12, 5000 + t)})
    return path


turn = st.tuples(
    st.integers(0, 3), st.sampled_from(["turn", "turn", "turn", "compact", "edit"]), st.integers(5, 900)
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns=st.lists(turn, min_size=1, max_size=10),
    sessions=st.integers(1, 4),
    preset=st.sampled_from(["tiny-llama", "tiny-gemma2", "report002-hybrid"]),
    rams=st.lists(st.sampled_from([0, 1, 2, 8192]), min_size=1, max_size=3, unique=True),
    nps=st.lists(st.integers(1, 3), min_size=1, max_size=2, unique=True),
    history=st.sampled_from(["live", "recorded"]),
)
def test_one_rule_set_two_walkers(
    turns: list[tuple[int, str, int]],
    sessions: int,
    preset: str,
    rams: list[int],
    nps: list[int],
    history: str,
) -> None:
    with tempfile.TemporaryDirectory() as d:
        trace = read_trace(write(Path(d) / "t.jsonl", turns, sessions), freeze=True)
    by_walker = sweep_llama(trace.requests, rams, nps, preset=preset, history=history)
    by_loop = sweep_llama(trace.requests, rams, nps, preset=preset, history=history, how="loop")
    assert by_walker == by_loop
    cfg = llama_config(preset, n_parallel=nps[0], cache_ram_mib=rams[0])
    jobs = llama_jobs(trace.requests, cfg, tokenizer(preset), history)
    walked, walked_events = walk(cfg, jobs, "walker")
    looped, looped_events = walk(cfg, jobs, "loop")
    assert walked == looped and walked_events == looped_events
    assert [r.prompt_tokens for r in walked] == [len(j.prompt) for j in jobs]


def test_a_host_cache_keeps_switches_cheap_and_the_smallest_is_named(tmp_path: Path) -> None:
    # Four conversations of ~600 words taking turns on one slot: without a host cache every switch
    # reads its conversation again; with one the state comes back.
    turns = [(i % 4, "turn", 600 if i < 4 else 40) for i in range(12)]
    trace = write(tmp_path / "turns.jsonl", turns, 4)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "replay",
            "size",
            "sweep",
            str(trace),
            "--server",
            "llama",
            "--preset",
            "tiny-llama",
            "--cache-ram",
            "0,1,2,8G",
            "--np",
            "1,2",
            "--history",
            "recorded",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    doc = orjson.loads(done.stdout)
    rows = {(r["n_parallel"], r["cache_ram_mib"]): r for r in doc["rows"]}
    assert set(rows) == {(n, m) for n in (1, 2) for m in (0, 1, 2, 8192)}
    assert rows[(1, 0)]["host_restores"] == 0 and rows[(1, 8192)]["host_restores"] == 8
    assert rows[(1, 8192)]["worst_switch"] < rows[(1, 0)]["worst_switch"] / 5
    assert rows[(1, 1)]["host_evictions"] > 0  # 1 MiB holds about two of the tiny model's prompts
    assert doc["smallest"]["1"] == min(
        m for (n, m), r in rows.items() if n == 1 and r["worst_switch"] <= rows[(1, 8192)]["worst_switch"]
    )
    from replay.sizing.llama import LlamaRow

    best = smallest([LlamaRow(**r) for r in doc["rows"]], target=10**9)
    assert best[1] is not None and best[1].cache_ram_mib == 0  # any size meets a goal that high
    bad = subprocess.run(
        [sys.executable, "-m", "replay", "size", "sweep", str(trace), "--server", "llama", "--np", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--np takes slot counts" in bad.stderr
