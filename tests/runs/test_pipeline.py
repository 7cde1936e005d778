"""The one replay pipeline, end to end through the CLI against the scripted SSE server."""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from replay.metrics.results import read_results
from replay.runs.options import ReplayOptions
from replay.runs.probe import run_cache_probe
from replay.runs.scenario import run_arms
from replay.runs.targets import resolve_target
from replay.scenario.catalog import find_scenario
from replay.trace import TraceWriter
from tests.support.scripted_server import Script

USAGE = {"prompt_tokens": 100, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 40}}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replay", *args], capture_output=True, text=True, check=False
    )


def _sessions_with_a_probe(path: Path, sessions: int = 9, turns: int = 2) -> tuple[Path, int]:
    """`sessions` conversations of `turns` turns; the last one ends with a `probe` request."""
    probe = 0
    with TraceWriter(path, source="test") as w:
        for s in range(sessions):
            w.session(f"s{s}")
        for turn in range(turns):
            for s in range(sessions):
                msgs = [{"role": "user", "content": f"s{s} turn {t}"} for t in range(turn + 1)]
                w.request(f"s{s}", turn * 0.05 + s * 0.01, msgs, {"max_tokens": 3})
        msgs = [{"role": "user", "content": "again from scratch"}]
        probe = w.request(f"s{sessions - 1}", 1.0, msgs, {"max_tokens": 3}, tag="probe")
    return path, probe


def _ids(out: Path) -> list[int]:
    return [r["id"] for r in read_results(out).requests]


@pytest.mark.e2e
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("count", [2, 3])
def test_the_shards_of_a_trace_replay_exactly_one_whole_run(scripted_server, tmp_path, count, workers):
    scripted_server.default = Script(usage=USAGE)
    trace, probe = _sessions_with_a_probe(tmp_path / "t.jsonl")
    url = scripted_server.url
    whole = tmp_path / "whole.jsonl"
    done = _cli("run", str(trace), "--target", url, "--out", str(whole), "--quiet")
    assert done.returncode == 0, done.stderr
    expected = sorted(_ids(whole))
    assert len(expected) == 18 and probe not in expected  # `replay run` leaves the probe out
    seen: list[int] = []
    for index in range(1, count + 1):
        part = tmp_path / f"shard{index}.jsonl"
        argv = ["run", str(trace), "--target", url, "--out", str(part), "--quiet"]
        done = _cli(*argv, "--shard", f"{index}/{count}", "--workers", str(workers))
        assert done.returncode == 0, done.stderr
        res = read_results(part)
        assert res.run["target"]["shard"] == f"{index}/{count}"
        seen += _ids(part)
    assert sorted(seen) == expected  # the union is the whole run, and no request twice
    assert len(seen) == len(set(seen))


RUN_KEYS = {"tool", "trace", "target", "plan", "history", "think", "seed", "started", "host"}
TARGET_KEYS = {"kind", "url", "build", "effective", "warnings"}


def _lines_after_summary(out: Path) -> set[str]:
    kinds = [o["kind"] for o in map(orjson.loads, out.read_bytes().splitlines())]
    return set(kinds[kinds.index("summary") + 1 :])


@pytest.mark.e2e
def test_scenario_arms_and_the_probe_write_the_same_header_and_checks_as_a_run(tmp_path):
    """One pipeline: the run header, the target header with its settings and warnings, the
    counter check and the memory line, whichever verb replayed the trace."""
    probe = find_scenario("cache-probe", {"document": 500})
    (arm,) = run_arms(probe, tmp_path / "scenario", ["4G"], time_scale=10_000.0)
    server = resolve_target("sim", None, ["--time-scale", "10000"], tmp_path / "sim")
    report = run_cache_probe(server, tmp_path / "probe", params={"document": 500})
    for out in (arm.results, report.results):
        res = read_results(out)
        assert set(res.run) >= RUN_KEYS and set(res.run["target"]) >= TARGET_KEYS
        assert res.run["seed"] == 0 and res.run["target"]["effective"]["kv_disk_budget_mib"]
        assert {"metrics", "memory"} <= _lines_after_summary(out)
    assert read_results(arm.results).run["target"]["arm"] == "4G"
    lines = [orjson.loads(x) for x in report.results.read_bytes().splitlines()]
    assert len([o for o in lines if o["kind"] == "memory"]) == 2  # one per server process
    assert report.metrics[1]["server_process"] == 1


@pytest.mark.e2e
@pytest.mark.parametrize("workers", [1, 2])
def test_a_finished_run_with_failed_requests_exits_0_only_without_fail_on_errors(
    scripted_server, tmp_path, workers
):
    """A shard of a Kubernetes Job that finished exits 0 when some requests failed (they are in its
    results); `replay run` alone still exits 1, as does `--fail-on-errors`."""
    scripted_server.default = Script(usage=USAGE)
    scripted_server.by_trace_id[2] = Script(fault="http_error", http_status=503)
    trace, _ = _sessions_with_a_probe(tmp_path / "t.jsonl", sessions=2)
    base = ["run", str(trace), "--target", scripted_server.url, "--quiet", "--workers", str(workers)]
    codes = {}
    for flag in ("", "--fail-on-errors", "--no-fail-on-errors"):
        out = tmp_path / f"r{flag}.jsonl"
        done = _cli(*base, "--out", str(out), *([flag] if flag else []))
        codes[flag] = done.returncode
        summary = read_results(out).summary_line or {}
        assert (summary["outcome"], summary["requests"], summary["errors"]) == ("done", 4, 1), done.stderr
    assert codes == {"": 1, "--fail-on-errors": 1, "--no-fail-on-errors": 0}
    assert "run complete: 4 of 4 requests finished (1 failed)" in done.stderr  # said, even --quiet


def test_a_run_whose_worker_died_did_not_finish_whatever_the_other_workers_did(tmp_path, monkeypatch):
    """So `--no-fail-on-errors` never turns a lost worker into exit 0: the run's outcome is `failed`."""
    from types import SimpleNamespace

    from replay.metrics.results import ResultsWriter
    from replay.runs import pipeline
    from replay.runs.workers import WorkerReport, WorkersOutcome

    out = tmp_path / "r.jsonl"

    def workers_one_lost(*args, **kwargs):
        merged = ResultsWriter(out, {})  # the surviving worker's part, merged
        merged.close({"outcome": "done", "requests": 3, "errors": 1, "cancelled": 0})
        parts = [
            WorkerReport(shard=1, count=2, out=str(out), outcome="done", requests=3, errors=1, exit_code=1),
            WorkerReport(shard=2, count=2, out="", outcome="failed", exit_code=1, error="worker exited"),
        ]
        return WorkersOutcome(out=str(out), parts=parts)

    monkeypatch.setattr(pipeline, "run_workers", workers_one_lost)
    options = ReplayOptions()
    job = SimpleNamespace(
        served=SimpleNamespace(url="http://127.0.0.1:9"),
        trace=None,
        options=options,
        engine_config=lambda: options.engine_config("http://127.0.0.1:9"),
        out=out,
        workers=2,
        shard=(1, 1),
    )
    outcome = pipeline._spread(job, {})
    assert (outcome.outcome, outcome.exit_code) == ("failed", 1)


@pytest.mark.e2e
@pytest.mark.parametrize("workers", [1, 2])
def test_a_shard_that_starts_after_its_instant_says_by_how_much_in_its_log_and_header(
    scripted_server, tmp_path, workers
):
    """A pod that was Pending past `--start-at` (or started again after a drain) still runs, and says so."""
    scripted_server.default = Script(usage=USAGE)
    trace, _ = _sessions_with_a_probe(tmp_path / "t.jsonl", sessions=2)
    past = (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=42)).isoformat()
    argv = ["run", str(trace), "--target", scripted_server.url, "--quiet", "--workers", str(workers)]
    late = tmp_path / "late.jsonl"
    started = time.monotonic()
    done = _cli(*argv, "--out", str(late), "--start-at", past)
    took_s = time.monotonic() - started  # the process's start and run on this machine, now
    assert done.returncode == 0, done.stderr
    said = re.search(r"this shard starts ([\d.]+) s after --start-at", done.stderr)
    assert said and 42 <= float(said.group(1)) < 100, done.stderr
    assert 42 <= read_results(late).run["start"]["late_s"] < 100
    # On time: an instant the same command reaches with room to spare, so a loaded machine's
    # slow process start (2 s was not enough under load) is not taken for a late pod.
    on_time = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2 + took_s)).isoformat()
    done = _cli(*argv, "--out", str(tmp_path / "on-time.jsonl"), "--start-at", on_time)
    assert done.returncode == 0 and "shard starts" not in done.stderr, done.stderr
