"""A one-process `replay run` signalled outside its replay loop (here: while the server it started
loads) stops that server by its PID, removes its scratch folder and exits 128 + the signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support.trace_strategies import write_trace

pytestmark = pytest.mark.e2e


def slow_server(path: Path, pids: Path) -> Path:
    """A server binary that answers `--version` and otherwise writes its PID and never gets ready."""
    path.write_text(
        f"#!{sys.executable}\n"
        "import os, sys, time\n"
        "if '--version' in sys.argv:\n"
        "    print('version: 1 (slow)')\n"
        "    sys.exit(0)\n"
        f"open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
        "time.sleep(120)\n"
    )
    path.chmod(0o755)
    return path


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_signal_while_the_server_starts_stops_it_and_removes_the_scratch(tmp_path: Path, sig: str) -> None:
    pids = tmp_path / "server.pids"
    binary = slow_server(tmp_path / "ds4-server", pids)
    target = tmp_path / "slow.toml"
    target.write_text(f"kind = 'ds4'\nbinary = '{binary}'\nready_timeout = 100\n")
    lines = [
        {"kind": "trace", "format": "agent-replay-trace/1"},
        {"kind": "session", "id": "s", "api": "openai", "model": "m"},
        {"kind": "request", "id": 1, "session": "s", "t": 0, "append": [{"role": "user", "content": "q"}]},
    ]
    trace = write_trace(tmp_path / "t.jsonl", lines)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    argv = [sys.executable, "-m", "replay", "run", str(trace), "--server", str(target)]
    argv += ["--out", str(tmp_path / "r.jsonl"), "--quiet"]
    env = {**os.environ, "TMPDIR": str(scratch)}
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    server = 0
    try:
        deadline = time.monotonic() + 60
        while not (pids.exists() and pids.read_text().endswith("\n")):
            assert run.poll() is None, run.communicate()
            assert time.monotonic() < deadline, "the server was not started in 60 s"
            time.sleep(0.05)
        server = int(pids.read_text().split()[0])
        run.send_signal(signal.Signals[sig])
        _, stderr = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(10)
        left = server and alive(server)
        if left:
            os.kill(server, signal.SIGKILL)  # what the run left behind, by its PID
    assert not left, "the server the run started outlived it"
    assert run.returncode == 128 + signal.Signals[sig], stderr
    assert "Traceback" not in stderr
    assert list(scratch.iterdir()) == []  # its scratch folder is gone
