"""Which part of a trace a replay sends: shards by session, workers within a shard, probes left out."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.errors import UsageError
from replay.trace import TraceWriter, read_trace
from replay.trace.model import Request, Session, Trace, TraceHeader
from replay.trace.select import assign_shards, parse_shard, select_shard, session_work, split_workers


def _trace(path: Path, sessions: int, turns: int = 2) -> Path:
    with TraceWriter(path, source="test") as w:
        for s in range(sessions):
            sid = f"s{s}"
            w.session(sid)
            msgs = [{"role": "user", "content": f"hello {s}"}]
            for t in range(turns):
                reply = {"role": "assistant", "content": f"r{s}.{t}"}
                w.request(sid, 0.0, list(msgs), params={"max_tokens": 3}, reply={"message": reply})
                msgs += [reply, {"role": "user", "content": f"more {t}"}]
    return path


def test_parse_shard():
    assert parse_shard("1/1") == (1, 1)
    assert parse_shard("3/4") == (3, 4)
    for bad in ("0/2", "3/2", "2", "a/b", "1/0", "-1/2"):
        with pytest.raises(UsageError):
            parse_shard(bad)


def test_auto_shard_takes_the_kubernetes_completion_index():
    assert parse_shard("auto/4", {"JOB_COMPLETION_INDEX": "0"}) == (1, 4)
    assert parse_shard("auto/4", {"JOB_COMPLETION_INDEX": "3"}) == (4, 4)
    for env in ({}, {"JOB_COMPLETION_INDEX": "4"}, {"JOB_COMPLETION_INDEX": "x"}):
        with pytest.raises(UsageError):
            parse_shard("auto/4", env)


def test_two_sessions_over_two_shards_give_one_each(tmp_path):
    trace = read_trace(_trace(tmp_path / "t.jsonl", 2))
    assert [len(select_shard(trace, i, 2).sessions) for i in (1, 2)] == [1, 1]


def test_shards_are_balanced_by_work_heaviest_first():
    assert assign_shards({"a": 100, "b": 60, "c": 50, "d": 10}, 2) == {"a": 1, "b": 2, "c": 2, "d": 1}
    assert assign_shards({"x": 5, "y": 5, "z": 5}, 5) == {"x": 1, "y": 2, "z": 3}


def test_work_counts_recorded_usage_else_the_messages(tmp_path):
    with TraceWriter(tmp_path / "t.jsonl", source="test") as w:
        w.session("big")
        w.session("small")
        w.request("big", 0.0, [{"role": "user", "content": {"synth": {"tokens": 90_000, "seed": 1}}}])
        w.request("small", 0.0, [{"role": "user", "content": "x" * 400}], usage={"prompt_tokens": 7})
    assert session_work(read_trace(tmp_path / "t.jsonl")) == {"big": 90_000, "small": 7}


def test_the_split_is_the_same_in_every_process(tmp_path):
    # Python's str hash() is salted per process; the split must not be.
    path = _trace(tmp_path / "t.jsonl", 9, turns=3)
    code = (
        "from replay.trace import read_trace; from replay.trace.select import assign_shards, session_work; "
        f"print(sorted(assign_shards(session_work(read_trace({str(path)!r})), 4).items()))"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outs) == 1


def test_select_shard_partitions_sessions_and_drops_cross_shard_waits(tmp_path):
    trace = read_trace(_trace(tmp_path / "t.jsonl", 12))
    # A request that waits for another session's request (which may live in another shard).
    trace.requests[-1].after = {"request": trace.requests[0].id, "delay_s": 1.0}
    parts = [select_shard(trace, i, 3) for i in (1, 2, 3)]
    seen = [r.id for p in parts for r in p.requests]
    assert sorted(seen) == sorted(r.id for r in trace.requests)
    owner = assign_shards(session_work(trace), 3)
    for i, part in enumerate(parts, 1):
        assert all(owner[r.session] == i for r in part.requests)
        assert set(part.sessions) == {r.session for r in part.requests}
        ids = {r.id for r in part.requests}
        for r in part.requests:
            after = (r.after or {}).get("request")
            assert after is None or after in ids
    last = next(r for p in parts for r in p.requests if r.id == trace.requests[-1].id)
    if owner[trace.requests[0].session] != owner[last.session]:
        assert last.after == {"delay_s": 1.0}


def _memory_trace(sessions: list[str]) -> Trace:
    requests = [
        Request(i + 1, sid, 0.0, None, 0, ({"role": "user", "content": sid},), {})
        for i, sid in enumerate(sessions)
    ]
    return Trace("t.jsonl", TraceHeader(), {sid: Session(sid) for sid in dict.fromkeys(sessions)}, requests)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=60),
    st.integers(1, 4),
    st.integers(1, 4),
)
def test_workers_of_every_shard_replay_each_request_exactly_once(sessions, count, workers):
    trace = _memory_trace(sessions)
    owner = assign_shards(session_work(trace), count)
    seen: list[int] = []
    for index in range(1, count + 1):
        shard = select_shard(trace, index, count)
        parts = split_workers(shard, workers)
        assert len(parts) == workers
        for part in parts:
            assert all(owner[r.session] == index for r in part.requests)
            assert set(part.sessions) <= set(shard.sessions)
            seen += [r.id for r in part.requests]
    assert sorted(seen) == [r.id for r in trace.requests]


def test_one_shard_of_two_is_spread_over_both_of_two_workers():
    # Each worker of a shard gets a share of its sessions, not all of them.
    trace = _memory_trace([f"session-{i}" for i in range(40)])
    shard = select_shard(trace, 1, 2)
    parts = split_workers(shard, 2)
    assert all(len(p.requests) >= 5 for p in parts)
    assert sum(len(p.requests) for p in parts) == len(shard.requests)


def test_without_a_shard_workers_split_as_shards_of_the_whole():
    trace = _memory_trace([f"s{i}" for i in range(30)])
    parts = split_workers(trace, 3)
    for w, part in enumerate(parts, 1):
        assert [r.id for r in part.requests] == [r.id for r in select_shard(trace, w, 3).requests]
    with pytest.raises(UsageError):
        split_workers(trace, 0)
