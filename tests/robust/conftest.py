"""A simulator child process shared by a module's tests (explicit PID, 127.0.0.1, port 0)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

LISTENING = re.compile(r"ds4-server: listening on (http://127\.0\.0\.1:\d+)")


class SimChild:
    def __init__(self, *args: str) -> None:
        cmd = [sys.executable, "-m", "replay.sim", "--port", "0", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.url = self._wait_url(30.0)

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def _wait_url(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if m := LISTENING.search(line):
                    return m.group(1)
            if self.proc.poll() is not None:
                break
            time.sleep(0.01)
        self.stop()
        raise AssertionError("simulator did not start:\n" + "\n".join(self.lines[-20:]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._reader.join(5)


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    """A fast simulator (modelled time 10,000x faster, a small context) for whole runs."""
    child = SimChild("--time-scale", "10000", "-c", "8192")
    try:
        yield child.url
    finally:
        child.stop()
