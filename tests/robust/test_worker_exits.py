"""The exit paths with `--workers 1, 2, 4` (issue #33 item 3): SIGINT, SIGTERM or SIGHUP to the parent
stops every worker and the simulator the run started, merges what was measured into `--out` with
the summary and the interrupted line, and removes the scratch folder; a parent killed by SIGKILL
leaves workers that notice and stop within a second."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest

from tests.support.trace_strategies import write_trace

pytestmark = pytest.mark.e2e

PY = sys.executable
ENDINGS = {"SIGINT": "interrupted (Ctrl-C)", "SIGTERM": "stopped by SIGTERM", "SIGHUP": "stopped by SIGHUP"}


def sessions_trace(path: Path, sessions: int = 8, turns: int = 6) -> Path:
    lines: list[dict[str, Any]] = [{"kind": "trace", "format": "agent-replay-trace/1"}]
    lines += [{"kind": "session", "id": f"s{s}", "api": "openai", "model": "m"} for s in range(sessions)]
    rid = 0
    for s in range(sessions):
        for _ in range(turns):
            rid += 1
            lines.append(
                {
                    "kind": "request",
                    "id": rid,
                    "session": f"s{s}",
                    "t": 0,
                    "append": [{"role": "user", "content": f"q{rid}"}],
                    "params": {"max_tokens": 20},
                }
            )
    return write_trace(path, lines)


def start_run(trace: Path, out: Path, workers: int) -> subprocess.Popen[str]:
    # Modelled time at its own pace (20 tokens/s): each request lasts about a second.
    args = [PY, "-m", "replay", "run", str(trace), "--target", "sim", "--out", str(out), "--quiet"]
    args += ["--workers", str(workers), "--sim-args", "--time-scale 1 --decode-tps 20"]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def results_files(out: Path, workers: int) -> list[Path]:
    if workers == 1:
        return [out]
    return [out.with_name(f"{out.stem}.part{i}of{workers}{out.suffix}") for i in range(1, workers + 1)]


def wait_until_measuring(run: subprocess.Popen[str], out: Path, workers: int) -> list[psutil.Process]:
    """Until a request has finished; returns the run's descendants then (workers, simulator)."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert run.poll() is None, run.communicate()
        if any(p.exists() and b'"kind":"request"' in p.read_bytes() for p in results_files(out, workers)):
            kids = psutil.Process(run.pid).children(recursive=True)
            if workers == 1 or sum("spawn_main" in " ".join(k.cmdline()) for k in kids) == workers:
                return kids
        time.sleep(0.05)
    raise AssertionError("the run measured nothing in 90 s")


def scratch_of(kids: list[psutil.Process]) -> Path:
    for kid in kids:
        line = kid.cmdline()
        if "--kv-disk-dir" in line:
            return Path(line[line.index("--kv-disk-dir") + 1]).parent
    raise AssertionError("no simulator among the run's processes")


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def gone_soon(kids: list[psutil.Process]) -> list[str]:
    """Those still alive a second after the run exited (multiprocessing's resource tracker ends
    when it reads the end of its pipe, a moment after the last process that held it)."""
    deadline = time.monotonic() + 1.0
    while any(alive(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.02)
    left = []
    for kid in kids:
        try:
            if alive(kid):
                left.append(f"{kid.pid}: {' '.join(kid.cmdline())}")
        except psutil.NoSuchProcess:
            pass
    return left


def stop_all(kids: list[psutil.Process]) -> None:
    for kid in kids:
        if alive(kid):
            os.kill(kid.pid, signal.SIGKILL)


@pytest.mark.parametrize("workers", [1, 2, 4])
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_signal_to_the_parent_stops_every_worker_and_server_and_merges(
    tmp_path: Path, workers: int, sig: str
) -> None:
    trace = sessions_trace(tmp_path / "t.jsonl")
    out = tmp_path / "r.jsonl"
    run = start_run(trace, out, workers)
    kids: list[psutil.Process] = []
    try:
        kids = wait_until_measuring(run, out, workers)
        scratch = scratch_of(kids)
        run.send_signal(signal.Signals[sig])
        _, stderr = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(10)
        left = gone_soon(kids)
        stop_all(kids)
    assert run.returncode == 128 + signal.Signals[sig], stderr
    assert left == []  # no worker, simulator or sampler outlives the run
    assert not scratch.exists()
    rows = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    summary = [r for r in rows if r["kind"] == "summary"]
    assert len(summary) == 1 and summary[0]["outcome"] == sig
    requests = [r for r in rows if r["kind"] == "request"]
    assert any(r["status"] == "ok" for r in requests)
    assert summary[0]["requests"] == sum(r["status"] != "cancelled" for r in requests)
    assert f"{ENDINGS[sig]}: {summary[0]['requests']} of 48 requests finished" in stderr
    assert not list(tmp_path.glob("*.input"))


@pytest.mark.parametrize("workers", [2, 4])
def test_workers_of_a_killed_parent_stop_within_a_second_with_their_summary(
    tmp_path: Path, workers: int
) -> None:
    trace = sessions_trace(tmp_path / "t.jsonl")
    out = tmp_path / "r.jsonl"
    run = start_run(trace, out, workers)
    kids: list[psutil.Process] = []
    scratch: Path | None = None
    try:
        kids = wait_until_measuring(run, out, workers)
        scratch = scratch_of(kids)
        shards = [k for k in kids if "spawn_main" in " ".join(k.cmdline())]
        os.kill(run.pid, signal.SIGKILL)
        killed = time.monotonic()
        parts = results_files(out, workers)
        while not all(summarised(p) for p in parts) and time.monotonic() - killed < 5:
            time.sleep(0.01)
        stopped = time.monotonic() - killed  # every worker has stopped its run and written its summary
        while any(alive(k) for k in shards) and time.monotonic() - killed < 10:
            time.sleep(0.01)
        exited = time.monotonic() - killed
    finally:
        if run.poll() is None:
            run.kill()
        run.wait(10)
        stop_all(kids)  # the simulator: a parent killed outright leaves it to `replay restore`
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)  # and its scratch folder
    assert stopped < 1.0, f"workers still running {stopped:.2f} s after the parent was killed"
    assert exited < 5.0, f"worker processes still there {exited:.2f} s after the parent was killed"
    for part in parts:
        last = orjson.loads(part.read_bytes().splitlines()[-1])
        assert last["kind"] == "summary" and last["outcome"] == "SIGTERM", part


def summarised(part: Path) -> bool:
    try:
        return b'"kind":"summary"' in part.read_bytes()[-4096:]
    except FileNotFoundError:
        return False
