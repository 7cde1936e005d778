"""Helpers for the server-hardening tests: the simulator and the recording proxy as child
processes (explicit PIDs, 127.0.0.1, free ports), raw-socket clients, and their memory."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

# Small limits so the tests see each one act within a second or two.
TEST_LIMITS = [
    "--max-body",
    "1MiB",
    "--header-timeout",
    "1",
    "--body-timeout",
    "1",
    "--keep-alive-timeout",
    "1",
    "--max-connections",
    "8",
]
_URL = re.compile(r"listening on (http://127\.0\.0\.1:\d+)")


class Child:
    """A server child process; its output is collected line by line, its URL read from it."""

    def __init__(self, cmd: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # the sim logs to stderr, `replay record` talks on stdout
            text=True,
            env={**os.environ, **(env or {}), "COLUMNS": "200"},
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + 30
        while True:
            for line in list(self.lines):
                if m := _URL.search(line):
                    self.url = m.group(1)
                    self.port = int(self.url.rsplit(":", 1)[1])
                    return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError("server did not start:\n" + "\n".join(self.lines))
            time.sleep(0.01)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def log(self) -> str:
        return "\n".join(self.lines)

    def rss_mib(self) -> float:
        return psutil.Process(self.proc.pid).memory_info().rss / 2**20

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            rc = self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            rc = self.proc.wait(5)
        self._reader.join(5)
        return rc


def start_sim(*args: str) -> Child:
    return Child([sys.executable, "-m", "replay.sim", "--port", "0", "--time-scale", "1000", *args])


def start_proxy(upstream: str, out: Path, *args: str) -> Child:
    cmd = [sys.executable, "-m", "replay", "record", "--upstream", upstream, "--listen", "127.0.0.1:0"]
    return Child([*cmd, "--out", str(out), *args])


def raw_exchange(port: int, data: bytes, wait_s: float = 10.0) -> tuple[bytes, float]:
    """Send `data` and read until the server closes: (what came back, seconds it took)."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(data)
        s.settimeout(wait_s)
        t0 = time.monotonic()
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return out, time.monotonic() - t0


def status_of(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1]) if raw.startswith(b"HTTP/1.1 ") else -1
