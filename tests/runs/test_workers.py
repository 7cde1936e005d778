"""Workers: each replays the sessions it is handed, and their files merge into exactly the
single-process percentiles."""

from __future__ import annotations

import dataclasses
import os
import pickle
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.refserver import Pacing, serve_in_thread
from replay.engine.plans import make_plan
from replay.engine.run import EngineConfig
from replay.metrics.hist import Summary
from replay.metrics.record import RequestRecord, Usage
from replay.metrics.results import ResultsWriter, read_results
from replay.runs.workers import merge_results, pack, run_workers, unpack
from replay.trace import TraceWriter, read_trace
from replay.trace.model import Request, Session, Trace, TraceHeader
from replay.trace.select import assign_shards, session_work


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


def _same(a: Trace, b: Trace) -> None:
    assert (a.path, a.header, a.sessions) == (b.path, b.header, b.sessions)
    assert [r.id for r in a.requests] == [r.id for r in b.requests]
    for x, y in zip(a.requests, b.requests, strict=True):
        assert x.messages() == y.messages()
        assert (x.session, x.t, x.keep, x.params, x.reply, x.after, x.tag, x.line, x.n_messages) == (
            y.session,
            y.t,
            y.keep,
            y.params,
            y.reply,
            y.after,
            y.tag,
            y.line,
            y.n_messages,
        )


def test_a_worker_gets_its_sessions_whole_even_with_a_parent_left_out(tmp_path):
    trace = read_trace(_trace(tmp_path / "t.jsonl", 4, turns=3))
    firsts = {r.session: r.id for r in reversed(trace.requests)}
    without = dataclasses.replace(trace, requests=[r for r in trace.requests if r.id not in firsts.values()])
    back = unpack(pickle.loads(pickle.dumps(pack(without))))
    _same(back, without)
    assert all(r.parent is not None for r in back.requests)  # rebuilt from the parent that travelled


def test_a_ten_thousand_turn_session_travels_to_a_worker():
    # A parent chain this deep would make pickle recurse past the interpreter's limit.
    requests: list[Request] = []
    parent = None
    for i in range(10_000):
        keep = 0 if parent is None else parent.n_messages
        req = Request(i + 1, "s", float(i), parent, keep, ({"role": "user", "content": f"t{i}"},), {})
        requests.append(req)
        parent = req
    trace = Trace("t.jsonl", TraceHeader(source="test", start="06:45"), {"s": Session("s")}, requests)
    back = unpack(pickle.loads(pickle.dumps(pack(trace))))
    assert len(back.requests[-1].messages()) == 10_000
    assert back.requests[-1].messages() == trace.requests[-1].messages()
    assert back.header == trace.header


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
        writers[zlib.crc32(rec.session.encode()) % n + 1].request(rec)  # any split merges exactly
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
            read_trace(trace),
            make_plan("overlap", concurrency=4),
            config,
            tmp_path / "out.jsonl",
            {"kind": "ref"},
            2,
        )
        truth = srv.truth.rows
    assert [p.shard for p in outcome.parts] == [1, 2]
    assert all(p.error is None and p.outcome == "done" for p in outcome.parts)
    assert outcome.requests == 20 and outcome.errors == 0
    owner = assign_shards(session_work(read_trace(trace)), 2)
    for part in outcome.parts:
        recs = read_results(part.out).requests
        assert recs and all(owner[r["session"]] == part.shard for r in recs)
    assert {read_results(p.out).run["target"]["worker"] for p in outcome.parts} == {"1/2", "2/2"}
    merged = read_results(tmp_path / "out.jsonl")
    assert merged.run["workers"] == 2 and "worker" not in merged.run["target"]
    assert sorted(r["id"] for r in merged.requests) == list(range(1, 21))
    assert sorted(row[1] for row in truth) == sorted(f"w-{i}" for i in range(1, 21))
    rebuilt = Summary()
    for rec in merged.requests:
        rebuilt.add_line(rec)
    for pct in (50, 99, 100):
        assert merged.summary.classes["all"].percentile("ttft_us", pct) == rebuilt.classes["all"].percentile(
            "ttft_us", pct
        )


_NO_MAIN_GUARD = """
import sys
from replay.engine.plans import make_plan
from replay.engine.run import EngineConfig
from replay.errors import ReplayError
from replay.runs.workers import run_workers
from replay.trace import read_trace

try:  # a spawned worker runs this again as its main module and dies bootstrapping
    run_workers(read_trace(sys.argv[1]), make_plan("overlap", concurrency=2),
                EngineConfig(base_url="http://127.0.0.1:9", run_id="g", timeout_s=5.0),
                sys.argv[2], {"kind": "none"}, 2)
except ReplayError as exc:
    print("failed:", exc)
"""


def test_workers_that_die_before_reading_their_part_fail_the_run_instead_of_hanging(tmp_path):
    """Each part here is ~400 KiB, far more than a pipe holds: passed through the spawn pipe, the
    parent blocked writing it forever once the child died without reading."""
    trace = _trace(tmp_path / "t.jsonl", 400, turns=20)
    script = tmp_path / "no_guard.py"
    script.write_text(_NO_MAIN_GUARD)
    done = subprocess.run(
        [sys.executable, str(script), str(trace), str(tmp_path / "out.jsonl")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert "failed: no shard wrote a results file" in done.stdout, done.stderr[-2000:]
    assert "worker exited with code 1" in done.stdout
    assert not list(tmp_path.glob("*.input"))  # the parts handed over are not left behind


def test_workers_are_capped_by_sessions_and_cores_in_one_line():
    from replay.runs.workers import cap_workers

    assert cap_workers(4, sessions=100, cores=2) == (4, None)
    assert cap_workers(1000, sessions=2, cores=2) == (
        2,
        "note: --workers 1,000 capped at 2 (the trace has 2 sessions and a worker owns whole sessions)",
    )
    assert cap_workers(200, sessions=5000, cores=2) == (
        8,
        "note: --workers 200 capped at 8 (4 per core on 2 cores)",
    )
    assert cap_workers(3, sessions=0, cores=1)[0] == 1
