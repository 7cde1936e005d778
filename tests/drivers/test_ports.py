"""The port-owner check: the manager's PID or its descendant passes; anyone else fails, by name."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from drivers.ports import check_port_owner, free_port, port_owners
from drivers.process import ChildProcess

LISTEN = (
    "import socket, subprocess, sys, time\n"
    "if sys.argv[1] == 'parent':\n"
    "    subprocess.Popen([sys.executable, '-c', sys.argv[3], 'child', sys.argv[2], sys.argv[3]])\n"
    "    time.sleep(30)\n"
    "s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[2]))); s.listen(); print('bound', flush=True)\n"
    "time.sleep(30)\n"
)


def test_descendant_of_the_main_pid_passes_and_a_stranger_fails(tmp_path: Path) -> None:
    port = free_port()
    assert not check_port_owner(port, os.getpid(), "unit x").ok  # nobody listening
    argv = [sys.executable, "-c", LISTEN, "parent", str(port), LISTEN]
    sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
    with (
        ChildProcess(argv, log_path=tmp_path / "l.log", stop_timeout=0.3, give_up=True) as parent,
        ChildProcess(sleeper, log_path=tmp_path / "s.log") as other,
    ):
        parent.wait_for_line("bound", timeout=5)
        owners = port_owners(port)
        assert len(owners) == 1 and owners[0].ppid == parent.pid
        ok = check_port_owner(port, parent.pid, "unit x")
        assert ok.ok and ok.message.startswith(f"port {port}: pid {owners[0].pid} (python")
        bad = check_port_owner(port, other.pid, "unit x")  # a live process, not an ancestor
        assert not bad.ok
        assert f"is held by pid {owners[0].pid}" in bad.message and "NOT by unit x" in bad.message
        nopid = check_port_owner(port, None, "unit x")
        assert not nopid.ok and "reports no PID" in nopid.message
