"""Start the reference server as a child process (at real-time priority when allowed) and read it.

On a 2-core machine the client under test starves an ordinary-priority server, and the server's
own TTFT truth drifts by tens of milliseconds; `chrt -f 50` keeps it on time. Where that is not
permitted the server runs normally and the results say so.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.refserver import Pacing
from drivers.process import ChildProcess

LISTENING = r"listening on (http://\S+)"


@dataclass(slots=True)
class RunningServer:
    url: str
    pid: int
    realtime: bool
    loop: str
    note: str

    def cpu_s(self) -> float:
        """CPU seconds the server has used so far (to show it was not the bottleneck)."""
        times = psutil.Process(self.pid).cpu_times()
        return times.user + times.system

    def truth(self, clear: bool = True) -> dict[str, list[Any]]:
        """The server's stamps by request key (X-Request-ID, else `#sid`); cleared after reading."""
        resp = httpx.get(f"{self.url}/truth", params={"clear": "1"} if clear else None, timeout=60.0)
        resp.raise_for_status()
        doc = resp.json()
        out: dict[str, list[Any]] = {}
        for row in doc["rows"]:
            out[row[1] if row[1] is not None else f"#{row[0]}"] = row
        return out

    def clear(self) -> None:
        httpx.get(f"{self.url}/truth", params={"clear": "1"}, timeout=60.0).raise_for_status()


def realtime_prefix() -> tuple[list[str], str]:
    """`chrt -f 50` if this process may use it, else nothing, with the reason."""
    chrt = shutil.which("chrt")
    if chrt is None:
        return [], "chrt not found: server at normal priority"
    probe = subprocess.run([chrt, "-f", "50", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        return (
            [],
            f"chrt -f 50 not permitted ({probe.stderr.decode().strip()[:80]}): server at normal priority",
        )
    return [chrt, "-f", "50"], "server at SCHED_FIFO priority 50 (chrt -f 50)"


@contextmanager
def refserver(
    pacing: Pacing | None = None,
    realtime: bool = True,
    log_dir: Path | None = None,
    truth_cap: int | None = None,
) -> Iterator[RunningServer]:
    """The reference server on a free 127.0.0.1 port, stopped by its PID on the way out.

    `truth_cap`: most requests kept for `/truth` (the server's default when None); 0 for a load
    that never reads them (a soak), so the server keeps nothing per request."""
    pacing = pacing or Pacing()
    prefix, note = realtime_prefix() if realtime else ([], "server at normal priority (asked)")
    argv = [
        *prefix,
        sys.executable,
        "-m",
        "bench.refserver",
        "--port",
        "0",
        "--first-token-ms",
        str(pacing.first_token_ms),
        "--token-ms",
        str(pacing.token_ms),
        "--tokens",
        str(pacing.tokens),
        "--model",
        pacing.model,
        *(["--truth-cap", str(truth_cap)] if truth_cap is not None else []),
    ]
    with tempfile.TemporaryDirectory(prefix="replay-refserver-") as tmp:
        log = (log_dir or Path(tmp)) / "refserver.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.unlink(missing_ok=True)
        child = ChildProcess(argv, log_path=log, name="refserver", stop_timeout=10.0, give_up=True)
        with child:
            match = child.wait_for_line(LISTENING, timeout=30.0)
            line = match.string
            loop = "uvloop" if "(uvloop loop)" in line else "asyncio"
            yield RunningServer(
                url=match.group(1), pid=child.pid, realtime=bool(prefix), loop=loop, note=note
            )
