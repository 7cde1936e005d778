"""What a replay holds while it runs: replies until their last reader, done stamps until their
last waiter, no list per request (the soak benchmark measures the rates; these are the mechanisms)."""

from __future__ import annotations

import gc
import sys
import types

import anyio
import orjson
import pytest

from replay.engine.plans import make_plan
from replay.engine.run import Engine, EngineConfig, reply_readers
from replay.metrics.record import RequestRecord
from replay.runs.recording import KEPT_FIELDS, Recording, run_recordings
from replay.trace import TraceWriter, read_trace
from tests.support.scripted_server import Script

USAGE = {"prompt_tokens": 100, "completion_tokens": 3}


def live_trace(path, sessions=4, turns=4):
    """Sessions whose every turn resends the previous replies (`$reply` markers), each reply a
    tool call whose result follows it."""
    with TraceWriter(path, source="test") as w:
        for s in range(sessions):
            w.session(f"s{s}")
            msgs = [{"role": "user", "content": f"start {s}"}]
            for t in range(turns):
                call = {"id": f"rec-{s}-{t}", "name": "read_file", "arguments": "{}"}
                reply = {"role": "assistant", "content": f"recorded {s}.{t}", "tool_calls": [call]}
                w.request(f"s{s}", 0.0, list(msgs), {"max_tokens": 3}, reply={"message": reply})
                msgs += [reply, {"role": "tool", "tool_call_id": call["id"], "content": f"file {s}.{t}"}]
    return path


def test_each_live_reply_is_held_until_the_last_request_that_resends_it_and_then_dropped(
    scripted_server, tmp_path
):
    scripted_server.default = Script(
        usage=USAGE, token_text="live", tool_calls=[{"id": "live-1", "name": "read_file", "arguments": "{}"}]
    )
    trace = read_trace(live_trace(tmp_path / "t.jsonl"))
    assert any("$reply" in m for r in trace.requests for m in r.append)
    held: list[tuple[int, int]] = []  # (turn of the record, replies its session holds)
    engine: Engine

    def sink(rec: RequestRecord) -> None:
        held.append((trace.by_id()[rec.request_id].line, len(engine.sessions[rec.session].live_replies)))

    engine = Engine(
        trace, make_plan("overlap", concurrency=3), EngineConfig(base_url=scripted_server.url), sink
    )
    anyio.run(engine.run)
    # The server's replies were spliced in: the last turn of a session carries the live text...
    last = [s for s in scripted_server.seen if s.body["messages"][0]["content"] == "start 0"][-1]
    replies = [m["content"] for m in last.body["messages"] if m["role"] == "assistant"]
    assert len(replies) == 3 and all(r.startswith("live") for r in replies)
    assert {m["tool_call_id"] for m in last.body["messages"] if m["role"] == "tool"} == {"live-1"}
    # ...and after the run nothing is left: no reply, no done stamp, no count.
    assert all(not s.live_replies and not s.tool_ids for s in engine.sessions.values())
    assert not engine._done_at and not engine._waiters and not engine._readers and not engine._done_events
    assert max(n for _, n in held) <= 3  # a session never holds more replies than its later turns read


def test_a_session_of_one_request_keeps_no_reply_at_all(scripted_server, tmp_path):
    scripted_server.default = Script(usage=USAGE, token_text="live")
    trace = read_trace(live_trace(tmp_path / "t.jsonl", sessions=5, turns=1))
    counts = []
    engine: Engine

    def sink(rec: RequestRecord) -> None:
        counts.append(sum(len(s.live_replies) for s in engine.sessions.values()))

    engine = Engine(trace, make_plan("alternate"), EngineConfig(base_url=scripted_server.url), sink)
    anyio.run(engine.run)
    assert counts == [0] * 5


def test_reply_readers_counts_every_request_that_carries_the_reply_below_a_fork(tmp_path):
    trace = read_trace(live_trace(tmp_path / "t.jsonl", sessions=1, turns=4))
    first, second, third, fourth = trace.requests
    # A fork: a second branch off `second` (a concurrent turn) also carries first's reply.
    branch = fourth.replaced(id=99, parent=second, append=fourth.append)
    readers = reply_readers([*trace.requests, branch])
    assert readers[first.id] == 4  # second, third, fourth and the branch resend it
    assert readers[second.id] == 2  # third and fourth
    assert readers[third.id] + readers.get(99, 0) == 2  # fourth, and the branch (which names third)
    assert fourth.id not in readers  # no later request resends the last reply


def test_a_recording_keeps_no_line_unless_asked_and_then_only_the_fields_read(scripted_server, tmp_path):
    scripted_server.default = Script(usage=USAGE)
    trace = read_trace(live_trace(tmp_path / "t.jsonl", sessions=3, turns=2))
    config = EngineConfig(base_url=scripted_server.url)
    plain = Recording(trace, make_plan("alternate"), config, tmp_path / "a.jsonl", {"kind": "x"}, False)
    slim = Recording(
        trace,
        make_plan("alternate"),
        config,
        tmp_path / "b.jsonl",
        {"kind": "x"},
        True,
        keep_fields=("seq", "prompt_tokens"),
    )
    a, b = run_recordings([plain, slim], None)
    assert a.results == [] and a.requests == 6
    assert b.results == [{"seq": i, "prompt_tokens": 100} for i in range(1, 7)]
    assert a.lag_p50_s is not None and plain.lags.get_total_count() == 6  # lags live in a histogram
    summary = orjson.loads((tmp_path / "a.jsonl").read_bytes().splitlines()[-1])
    assert summary["lag_p99_s"] == a.lag_p99_s


def _held_bytes(root: object, skip: set[int]) -> int:
    """Bytes of the objects reachable from `root` that `skip` (the trace's, the modules' globals)
    does not hold; code, classes and modules left out (they would reach every module's globals)."""
    seen, stack, total = set(skip), [root], 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _SHARED):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total


_SHARED = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.CodeType, type)


def _reachable(root: object) -> set[int]:
    seen, stack = set(), [root]
    while stack:
        obj = stack.pop()
        if id(obj) not in seen and not isinstance(obj, _SHARED):
            seen.add(id(obj))
            stack.extend(gc.get_referents(obj))
    return seen


@pytest.mark.parametrize("keep", [False, True])
def test_what_a_recording_holds_does_not_grow_with_the_requests_done(scripted_server, tmp_path, keep):
    # Everything the run holds beyond the trace (engine, sink, writer, histograms, held load),
    # weighed after N and after 3N finished requests of one 4N-request trace: the indexes built
    # from the trace at the start are the same size at both points, so per-request state shows.
    scripted_server.default = Script(usage=USAGE, token_text="live")
    n = 150
    trace = read_trace(live_trace(tmp_path / "t.jsonl", sessions=4 * n // 5, turns=5))
    skip = _reachable(trace) | {id(vars(m)) for m in list(sys.modules.values())}
    weighed: dict[int, int] = {}
    recording: Recording

    def observe(line: dict) -> None:
        done = recording.counts["requests"]
        if done in (n, 3 * n):
            weighed[done] = _held_bytes(recording, skip)

    recording = Recording(
        trace,
        make_plan("alternate"),  # one request at a time: the same few in flight at both points
        EngineConfig(base_url=scripted_server.url, lookahead=2),
        tmp_path / "out.jsonl",
        {"kind": "x"},
        keep,  # the records a simulator's log is read with: read back from the file afterwards
        observe=observe,
        keep_fields=KEPT_FIELDS,
    )
    (outcome,) = run_recordings([recording], None)
    assert outcome.requests == 4 * n and outcome.errors == 0
    # 8 bytes a request (16 were the held-load stamps, ~30 a set of every session seen) would show.
    assert weighed[3 * n] - weighed[n] < 1024, weighed
    # What the waiting requests' memory rose to is in the summary: at most the lookahead.
    summary = orjson.loads((tmp_path / "out.jsonl").read_bytes().splitlines()[-1])
    assert 1 <= summary["waiting_max"] <= 2 and recording.engine.progress.waiting == 0
    assert len(outcome.results) == (4 * n if keep else 0)
