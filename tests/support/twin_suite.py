"""The twin traces CI replays on the real llama-server and on the model (issue #34 item 5).

Each case is a trace (synthetic words, a few thousand tokens), the generated model it runs on and
llama-server's flags; `replay twin` starts the real server (xllamacpp) once per case, reads the
settings it shows, configures the model from them and compares the two request by request. The
flags are the server's; nothing here tells the model what to do. A disagreement is settled by
reading llama.cpp's source (b11549, the build the xllamacpp wheel compiles), never per trace.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replay.trace import TraceWriter
from replay.trace.synth import synth_text

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


def three_taking_turns(w: TraceWriter) -> None:
    """Three conversations taking turns on one slot, each growing a turn at a time: every switch
    leaves the slot's prompt to the host cache and finds the next one's there (or not)."""
    convos: dict[str, Msgs] = {s: [user(250 + 50 * i, 60 + i)] for i, s in enumerate("abc")}
    for t, s in enumerate("abcabcacb"):
        w.request(s, float(t), list(convos[s]))
        convos[s] += [said(15, 70 + t), user(90, 80 + t)]


def five_taking_turns(w: TraceWriter) -> None:
    """Five conversations of ~700 tokens taking turns on one slot, twice round: with a 1 MiB host
    cache (the tiny llama keeps about 0.5 KiB a token) the oldest saved prompts are evicted before
    their conversations come back."""
    convos: dict[str, Msgs] = {s: [user(700 + 20 * i, 110 + i)] for i, s in enumerate("abcde")}
    for t, s in enumerate("abcdeaebdc"):
        w.request(s, float(t), list(convos[s]))
        convos[s] += [said(15, 120 + t), user(60, 130 + t)]


def compaction(w: TraceWriter) -> None:
    """One long conversation compacted twice (the system prompt kept, the history replaced by a
    summary), a second one in between: what the compacted prompt shares is the system prompt only."""
    system = {"role": "system", "content": synth_text(200, 90)}
    a: Msgs = [system, user(400, 91)]
    b: Msgs = [user(300, 92)]
    t = 0.0
    for turn in range(3):
        w.request("a", t, list(a))
        a += [said(20, 93 + turn), user(150, 96 + turn)]
        t += 1.0
    w.request("b", t, list(b))
    a = [system, user(120, 100), user(40, 101)]
    w.request("a", t + 1.0, list(a))
    a += [said(20, 102), user(100, 103)]
    w.request("a", t + 2.0, list(a))
    a = [system, user(90, 104), user(30, 105)]
    w.request("a", t + 3.0, list(a))


def slots_by_similarity(n: int) -> Callable[[TraceWriter], None]:
    """`n + 1` conversations on `n` slots: each goes back to the slot holding its prefix (LCP
    similarity over 0.1), a newcomer takes the least recently used one; the last request is pinned
    by `id_slot` to slot 0."""
    names = "abcde"[: n + 1]

    def build(w: TraceWriter) -> None:
        convos: dict[str, Msgs] = {s: [user(300 + 100 * i, 20 + i)] for i, s in enumerate(names)}
        order = [
            *names[:n],
            names[0],
            names[1],
            names[n],
            *names[2:n],
            names[1],
            names[0],
            names[n],
            names[1],
        ]
        for t, s in enumerate(order):
            params: dict[str, Any] = {"max_tokens": 8}
            if t == len(order) - 1:
                params["id_slot"] = 0
            w.request(s, float(t), list(convos[s]), params)
            convos[s] += [said(15, 30 + t), user(120, 40 + t)]

    build.__doc__ = slots_by_similarity.__doc__
    return build


def gemma2_edits(w: TraceWriter) -> None:
    """The sliding-window model (E3): a conversation grows (a checkpoint at each last user message
    and near each prompt's end), then an earlier user message is edited (resume at a checkpoint
    before it), then a line is inserted in the middle of the first message (only the start comes
    back), then the whole conversation again."""
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
    w.request("a", 5.0, list(a))


def gemma2_restart(w: TraceWriter) -> None:
    """The sliding-window model across a restart (E5): a conversation grows two turns, then its
    slot is saved, the server restarted, the slot restored and the conversation continues (the
    `probe` request). This build (b11549) appends the slot's context checkpoints to the file and
    reads them back, so the request resumes from one; b11063 and older kept only the KV cache there
    and re-processed the whole prompt (field report 002), a build CI does not run."""
    a: Msgs = [user(400, 60)]
    w.request("a", 0.0, list(a))
    a += [said(20, 61), user(300, 62)]
    w.request("a", 1.0, list(a))
    a += [said(20, 63), user(200, 64)]
    w.request("a", 2.0, list(a), {"max_tokens": 8}, "probe")


@dataclass(frozen=True)
class Case:
    build: Callable[[TraceWriter], None]
    model: str  # "llama" or "gemma2" (tests/llama/conftest.py)
    flags: tuple[str, ...]
    shows: str = ""  # what the real server must be seen doing in it (test_twin_suite.SHOWS)


CASES: dict[str, Case] = {
    "one slot, host cache": Case(one_slot, "llama", ("-np", "1", "-c", "8192"), "host restores"),
    "one slot, no host cache": Case(
        one_slot, "llama", ("-np", "1", "-c", "8192", "--cache-ram", "0"), "no restores"
    ),
    "host cache small enough to evict": Case(
        five_taking_turns, "llama", ("-np", "1", "-c", "8192", "--cache-ram", "1"), "evictions"
    ),
    "-np 2, similarity": Case(
        slots_by_similarity(2), "llama", ("-np", "2", "-c", "16384", "--cache-ram", "0"), "2 slots"
    ),
    "-np 4, similarity": Case(
        slots_by_similarity(4), "llama", ("-np", "4", "-c", "32768", "--cache-ram", "0"), "4 slots"
    ),
    "gemma2, edit in the middle (E3)": Case(
        gemma2_edits, "gemma2", ("-np", "1", "-c", "8192"), "checkpoint restores"
    ),
    "gemma2, slot saved, restart, restored (E5)": Case(
        gemma2_restart, "gemma2", ("-np", "1", "-c", "8192"), "restart, slot restored with its checkpoints"
    ),
    "a compaction": Case(
        compaction, "llama", ("-np", "1", "-c", "8192"), "compacted prompt keeps its system prompt"
    ),
    "three sessions taking turns": Case(
        three_taking_turns, "llama", ("-np", "1", "-c", "8192"), "host restores"
    ),
}


def write_trace(path: Path, build: Callable[[TraceWriter], None]) -> Path:
    with TraceWriter(path, source="test") as w:
        for s in "abcde":
            w.session(s)
        orig = w.request

        def request(
            session: str, t: float, messages: Msgs, params: dict[str, Any] | None = None, tag: str = "turn"
        ) -> int:
            return orig(session, t, messages, params or {"max_tokens": 8}, tag=tag)

        w.request = request  # type: ignore[method-assign]
        build(w)
    return path


def server_toml(path: Path, model: Path, flags: tuple[str, ...]) -> Path:
    listed = ", ".join(f'"{f}"' for f in (*flags, "-t", "2", "-lv", "4"))
    path.write_text(
        f'kind = "llamacpp"\nname = "tiny"\nbinary = "xllamacpp"\nmodel = "{model}"\n'
        f"flags = [{listed}]\nready_timeout = 60\nstop_timeout = 10\n"
    )
    return path
