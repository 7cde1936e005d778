"""Sharding by session, and merging shard results into exactly the single-process percentiles."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.refserver import Pacing, serve_in_thread
from replay.engine.plans import make_plan
from replay.engine.run import EngineConfig
from replay.errors import UsageError
from replay.metrics.hist import Summary
from replay.metrics.record import RequestRecord, Usage
from replay.metrics.results import ResultsWriter, read_results
from replay.runs.workers import merge_results, parse_shard, run_workers, select_shard, shard_of
from replay.trace import TraceWriter, read_trace


def test_parse_shard():
    assert parse_shard("1/1") == (1, 1)
    assert parse_shard("3/4") == (3, 4)
    for bad in ("0/2", "3/2", "2", "a/b", "1/0", "-1/2"):
        with pytest.raises(UsageError):
            parse_shard(bad)


def test_shard_of_is_stable_and_covers_every_shard():
    # Pinned values: hosts running `--shard i/N` must agree without talking to each other.
    assert [shard_of(f"session-{i}", 7) for i in range(4)] == [5, 2, 2, 2]
    # Python's str hash() is salted per process; the shard must not be.
    code = "from replay.runs.workers import shard_of; print([shard_of(f's{i}', 5) for i in range(50)])"
    for seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == str([shard_of(f"s{i}", 5) for i in range(50)])
    counts = [0] * 4
    for i in range(400):
        counts[shard_of(f"s{i}", 4) - 1] += 1
    assert all(60 < c < 140 for c in counts)


def _trace(path: Path, sessions: int, turns: int = 2) -> Path:
    with TraceWriter(path, source="test") as w:
        for s in range(sessions):
            sid = f"s{s}"
            w.session(sid)
            msgs = [{"role": "user", "content": f"hello {s}"}]
            for t in range(turns):
                reply = {"role": "assistant", "content": f"r{s}.{t}"}
                w.request(
                    sid,
                    0.0,
                    list(msgs),
                    params={"max_tokens": 3, "stream": True},
                    reply={"message": reply, "output_tokens": 3},
                )
                msgs += [reply, {"role": "user", "content": f"more {t}"}]
    return path


def test_select_shard_partitions_sessions_and_drops_cross_shard_waits(tmp_path):
    trace = read_trace(_trace(tmp_path / "t.jsonl", 12))
    # A request that waits for another session's request (which may live in another shard).
    trace.requests[-1].after = {"request": trace.requests[0].id, "delay_s": 1.0}
    parts = [select_shard(trace, i, 3) for i in (1, 2, 3)]
    seen = [r.id for p in parts for r in p.requests]
    assert sorted(seen) == sorted(r.id for r in trace.requests)
    for i, part in enumerate(parts, 1):
        assert all(shard_of(r.session, 3) == i for r in part.requests)
        assert set(part.sessions) == {r.session for r in part.requests}
        ids = {r.id for r in part.requests}
        for r in part.requests:
            after = (r.after or {}).get("request")
            assert after is None or after in ids
    last = next(r for p in parts for r in p.requests if r.id == trace.requests[-1].id)
    if shard_of(trace.requests[0].session, 3) != shard_of(last.session, 3):
        assert last.after == {"delay_s": 1.0}


_RECORD = st.builds(
    lambda session, ttft_ns, latency_ns, reprocessed, switch, status: RequestRecord(
        session=session,
        t_scheduled=0,
        t_sent=0,
        t_first_token=ttft_ns,
        t_end=latency_ns,
        usage=Usage(reprocessed_tokens=reprocessed),
        switch=switch,
        status=status,
    ),
    st.sampled_from([f"s{i}" for i in range(9)]),
    st.integers(100_000, 50 * 10**9),
    st.integers(10**6, 500 * 10**9),
    st.integers(0, 200_000),
    st.sampled_from([("cold",), ("continue",), ("switch",), ("switch", "concurrent"), ("compaction",)]),
    st.sampled_from(["ok", "ok", "ok", "http_error"]),
)


@settings(max_examples=6, deadline=None)
@given(st.lists(_RECORD, min_size=1, max_size=40), st.integers(2, 3))
def test_merged_shard_files_have_single_process_percentiles(tmp_path_factory, records, n):
    tmp = tmp_path_factory.mktemp("merge")
    single = Summary()
    writers = {i: ResultsWriter(tmp / f"part{i}.jsonl", {"plan": {}}) for i in range(1, n + 1)}
    for k, rec in enumerate(records):
        rec.request_id = k
        single.add(rec)
        writers[shard_of(rec.session, n)].request(rec)
    for w in writers.values():
        w.close({"outcome": "done", "requests": 0})
    merged = merge_results([tmp / f"part{i}.jsonl" for i in range(1, n + 1)], tmp / "merged.jsonl", workers=n)
    back = read_results(tmp / "merged.jsonl").summary
    assert len(read_results(tmp / "merged.jsonl").requests) == len(records)
    assert set(merged.classes) == set(single.classes) == set(back.classes)
    for cls, stats in single.classes.items():
        other = merged.classes[cls]
        assert (other.count, other.errors, other.sums) == (stats.count, stats.errors, stats.sums)
        for metric in ("ttft_us", "latency_us", "reprocessed"):
            for pct in (50, 99, 100):
                assert other.percentile(metric, pct) == stats.percentile(metric, pct)
    # What a later `replay report` reads back from the merged file is the same.
    for pct in (50, 99, 100):
        assert back.classes["all"].percentile("ttft_us", pct) == single.classes["all"].percentile(
            "ttft_us", pct
        )


@pytest.mark.e2e
def test_run_workers_replays_each_session_once_and_merges(tmp_path):
    trace = _trace(tmp_path / "t.jsonl", 10)
    with serve_in_thread(Pacing(first_token_ms=0.0, tokens=3)) as (srv, url):
        config = EngineConfig(base_url=url, run_id="w", timeout_s=20.0)
        outcome = run_workers(
            trace, make_plan("overlap", concurrency=4), config, tmp_path / "out.jsonl", {"kind": "ref"}, 2
        )
        truth = srv.truth.rows
    assert [p.shard for p in outcome.parts] == [1, 2]
    assert all(p.error is None and p.outcome == "done" for p in outcome.parts)
    assert outcome.requests == 20 and outcome.errors == 0
    for part in outcome.parts:
        recs = read_results(part.out).requests
        assert recs and all(shard_of(r["session"], 2) == part.shard for r in recs)
    merged = read_results(tmp_path / "out.jsonl")
    assert merged.run["workers"] == 2
    assert sorted(r["id"] for r in merged.requests) == list(range(1, 21))
    assert sorted(row[1] for row in truth) == sorted(f"w-{i}" for i in range(1, 21))
    rebuilt = Summary()
    for rec in merged.requests:
        rebuilt.add_line(rec)
    for pct in (50, 99, 100):
        assert merged.summary.classes["all"].percentile("ttft_us", pct) == rebuilt.classes["all"].percentile(
            "ttft_us", pct
        )
