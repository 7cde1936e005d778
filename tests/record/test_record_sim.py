"""The recorder against the embedded simulator (`python -m replay.sim` as a child process).

1. Traffic recorded through the proxy replays, through a second proxy, as the same requests in the
   same order, and the replayed traffic is inferred into the same sessions.
2. An anonymised trace gives the simulator the same cache behaviour as the original: re-processed
   tokens per request within 2%.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

from replay.engine.apis import make_client
from replay.engine.plans import make_plan
from replay.engine.run import EngineConfig
from replay.metrics.results import read_results
from replay.record.anonymize import anonymize_trace
from replay.record.serve import RecordingServer
from replay.record.sessions import SessionInference
from replay.runs.pipeline import run_trace
from replay.runs.targets import open_target, resolve_target
from replay.trace import TraceWriter, materialize, read_trace, recorded_reply, validate
from tests.support.recordkit import TOOLS, Agent, FixedWall, tool, user

pytestmark = pytest.mark.e2e
TOOL_CALL = {"X-Replay-Finish": "tool_calls", "X-Replay-Tool": "read_file"}


@contextmanager
def simulator(scale: float = 1000.0) -> Iterator[str]:
    """A fresh simulator (own PID, own disk-KV directory), `scale` times faster than modelled time."""
    with tempfile.TemporaryDirectory(prefix="record-sim-") as tmp:
        target = resolve_target("sim", None, ["--time-scale", str(scale)], Path(tmp))
        with open_target(target, Path(tmp)) as served:
            yield served.url


def recorder(upstream: str, out: Path) -> RecordingServer:
    return RecordingServer(upstream, out, inference=SessionInference(wall_clock=FixedWall(30.0)))


async def agents(url: str) -> None:
    async with make_client() as client:
        a = Agent(client, url, "openai", "You are agent A. " * 40, stream=True, tools=TOOLS)
        b = Agent(client, url, "anthropic", "You are agent B, a reviewer. " * 30, stream=False, tools=TOOLS)
        a.headers.update(TOOL_CALL)
        res = await a.send("A1", user("A: open a.txt"))
        call_a = res.message["tool_calls"][0]["id"]
        a.headers.clear()
        b.headers.update(TOOL_CALL)
        res = await b.send("B1", user("B: open b.txt"))
        call_b = res.message["tool_calls"][0]["id"]
        b.headers.clear()
        await a.send("A2", tool(call_a, "A: contents of a.txt " * 20))
        await b.send("B2", tool(call_b, "B: contents of b.txt " * 20))
        before = list(a.messages)
        async with anyio.create_task_group() as tg:
            tg.start_soon(a.send, "A3", user("A: now summarise " * 50))
            await anyio.sleep(0.01)
            tg.start_soon(lambda: a.send("A3r", user("A: review the skills"), history=before))
        summary = a.messages[-1]["content"]
        await b.send("B3", user("B: anything else?"))
        a.messages = a.messages[:1]
        await a.send("A4", user(f"{summary}\nA: continue"))
        await a.send("A5", user("A: and then?"))


def sessions_and_tags(trace) -> list[tuple[str, str]]:
    return [(r.session, r.tag) for r in trace.requests]


def test_traffic_recorded_on_the_simulator_replays_as_the_same_requests(tmp_path):
    with simulator(scale=50.0) as sim:  # slow enough that A3 is still in flight when A3r comes
        with recorder(sim, tmp_path / "recorded.jsonl") as rec:
            anyio.run(agents, rec.url)
        validate(tmp_path / "recorded.jsonl")
        first = read_trace(tmp_path / "recorded.jsonl")
        assert len(first.requests) == 9 and len(first.sessions) == 2
        tags = [r.tag for r in first.requests]
        assert tags.count("concurrent") == 1 and tags.count("compaction") == 1
        assert {s.api for s in first.sessions.values()} == {"openai", "anthropic"}
        for r in first.requests:
            assert r.reply["status"] == "ok" and r.usage["prompt_tokens"] > 0
        # The simulator's usage is recorded: A5 follows A4 on the one slot, so its prefix was live.
        last = first.requests[-1]
        assert (
            last.parent is first.requests[-2]
            and 0 < last.usage["cached_tokens"] < last.usage["prompt_tokens"]
        )

        with recorder(sim, tmp_path / "replayed.jsonl") as again:
            config = EngineConfig(base_url=again.url, timeout_s=60.0, run_id="rp")
            outcome = run_trace(
                first, make_plan("alternate"), config, tmp_path / "results.jsonl", {"kind": "sim"}
            )
        assert outcome.exit_code == 0 and outcome.requests == 9
    second = read_trace(tmp_path / "replayed.jsonl")
    one, two = recorded_reply(first.by_id()), recorded_reply(second.by_id())
    sent_first = [materialize(r, one) for r in first.requests]
    sent_second = [materialize(r, two) for r in second.requests]
    strip = lambda msgs: [{k: v for k, v in m.items() if k != "reasoning"} for m in msgs]  # noqa: E731
    assert [strip(m) for m in sent_second] == [strip(m) for m in sent_first]
    # Replayed one at a time, the concurrent turn is an ordinary turn; everything else is inferred alike.
    expected = [(s, "turn" if t == "concurrent" else t) for s, t in sessions_and_tags(first)]
    assert sessions_and_tags(second) == expected


SYSTEM = (
    """# House rules for the coding agent

You work in a Python repository. Before you change a file, read it. Keep functions short and
typed; run `pytest -q` after every change. Never push to `main`.

## Style
- 4-space indentation, no tabs.
- Docstrings say *why*, not what.
- Errors: raise `ReplayError` subclasses with one-line messages.
"""
    * 6
)


def code(name: str, n: int) -> str:
    lines = [
        f"def {name}_{i}(value: int, scale: float = {i}.5) -> float:"
        + f"\n    return value * scale + {i * 7}"
        for i in range(n)
    ]
    return f"# file {name}.py\n" + "\n\n".join(lines) + "\n"


def write_original(path: Path) -> None:
    """Two sessions sharing a long system prompt, with tool calls, code, JSON and a compaction."""
    with TraceWriter(path, source="record") as w:
        w.session("main", api="openai", model="m")
        w.session("cron", role="cron", api="openai", model="m")
        tools = w.blob("tools", TOOLS)
        params = {"max_tokens": 64, "tools": tools, "stream": True}
        hist = {
            "main": [{"role": "system", "content": SYSTEM}],
            "cron": [{"role": "system", "content": SYSTEM}],
        }
        rid = 0
        prev: dict[str, int] = {}

        def req(sid: str, msgs: list, reply: dict, tag: str = "turn") -> None:
            nonlocal rid
            rid += 1
            after = {"request": prev[sid], "delay_s": 1.0} if sid in prev else None
            w.request(sid, rid * 10.0, msgs, params=params, reply=reply, after=after, tag=tag)
            prev[sid] = rid

        for turn in range(4):
            for sid in ("main", "cron"):
                call = {
                    "id": f"{sid}-call-{turn}",
                    "name": "read_file",
                    "arguments": f'{{"path": "src/{sid}/mod_{turn}.py", "lines": [1, {40 + turn}]}}',
                }
                ask = {
                    "role": "user",
                    "content": f"Step {turn} for {sid}: open src/{sid}/mod_{turn}.py and check the types.\nThen report.",
                }
                msgs = [*hist[sid], ask]
                reply = {
                    "role": "assistant",
                    "content": f"Reading mod_{turn}.py for {sid}.",
                    "tool_calls": [call],
                }
                req(sid, msgs, {"message": reply, "finish": "tool_calls", "output_tokens": 30})
                result = {
                    "role": "tool",
                    "tool_call_id": call["id"],
                    "content": code(f"{sid}_mod_{turn}", 12 + 4 * turn),
                }
                hist[sid] = [*msgs, reply, result]
                done = {
                    "role": "assistant",
                    "content": f"mod_{turn} of {sid} looks fine: every function is typed.",
                }
                req(sid, hist[sid], {"message": done, "finish": "stop", "output_tokens": 20})
                hist[sid] = [*hist[sid], done]
        summary = {
            "role": "user",
            "content": "Summary so far: main checked mod_0..mod_3; all typed.\nContinue with mod_4.",
        }
        hist["main"] = [hist["main"][0], summary]
        req(
            "main",
            hist["main"],
            {
                "message": {"role": "assistant", "content": "Continuing."},
                "finish": "stop",
                "output_tokens": 12,
            },
            tag="compaction",
        )


def replay_on_fresh_sim(trace_path: Path, out: Path) -> list[dict]:
    with simulator() as sim:
        config = EngineConfig(base_url=sim, timeout_s=60.0, run_id="anon")
        outcome = run_trace(read_trace(trace_path), make_plan("alternate"), config, out, {"kind": "sim"})
    assert outcome.exit_code == 0
    return read_results(out).requests


def test_anonymised_trace_has_the_same_cache_behaviour_on_the_simulator(tmp_path):
    write_original(tmp_path / "orig.jsonl")
    anonymize_trace(tmp_path / "orig.jsonl", tmp_path / "anon.jsonl", key="k")
    orig = replay_on_fresh_sim(tmp_path / "orig.jsonl", tmp_path / "orig.results.jsonl")
    anon = replay_on_fresh_sim(tmp_path / "anon.jsonl", tmp_path / "anon.results.jsonl")
    assert len(orig) == len(anon) == 17
    worst = 0.0
    for a, b in zip(orig, anon, strict=True):
        assert a["id"] == b["id"] and a["switch"] == b["switch"]
        assert a["reprocessed_source"] == b["reprocessed_source"] == "server"
        x, y = a["reprocessed_tokens"], b["reprocessed_tokens"]
        worst = max(worst, abs(x - y) / max(x, 1))
        assert abs(x - y) <= 0.02 * x, (a["id"], x, y)
        assert abs(a["prompt_tokens"] - b["prompt_tokens"]) <= 0.02 * a["prompt_tokens"]
    print(f"\nanonymised vs original re-processed tokens: worst request differs by {worst:.2%}")
    assert sum(a["reprocessed_tokens"] for a in orig) > 2 * sum(a["output_tokens"] for a in orig)
