"""`replay size sweep --workers N` as a user runs it: stopping it stops its worker processes."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from bench.simbench import sweep_trace_file

pytestmark = pytest.mark.e2e


def _start_sweep(tmp_path: Path) -> tuple[subprocess.Popen[bytes], list[psutil.Process]]:
    """A sweep with two budget workers, long enough to interrupt once both are running."""
    trace = sweep_trace_file(tmp_path / "t.jsonl", 60_000)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "replay",
            "size",
            "sweep",
            str(trace),
            "--budgets",
            ",".join(f"{4 * i}G" for i in range(1, 21)),  # ten budgets a worker: many seconds left
            "--workers",
            "3",  # this process reads, two run the budgets
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        kids = psutil.Process(proc.pid).children(recursive=True)
        if sum("spawn_main" in " ".join(k.cmdline()) for k in kids) == 2:
            time.sleep(1.0)  # into the sweep proper
            return proc, kids
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"the sweep did not start two workers: {proc.communicate()[1].decode()[-300:]}")


def test_sigterm_stops_the_sweep_and_its_workers(tmp_path: Path) -> None:
    proc, kids = _start_sweep(tmp_path)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143
    assert b"stopped by SIGTERM" in err and err.count(b"\n") == 1
    _, alive = psutil.wait_procs(kids, timeout=10)
    assert not alive


def test_workers_stop_when_the_sweep_is_killed(tmp_path: Path) -> None:
    proc, kids = _start_sweep(tmp_path)
    proc.kill()  # no chance to clean up: the workers notice on their own, long before they finish
    proc.wait(timeout=10)
    _, alive = psutil.wait_procs(kids, timeout=3)
    assert not alive
