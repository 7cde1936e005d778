"""A user's "daily service" for the guard tests, managed through plain commands.

start STATE PORT   start `serve PORT` detached (pid in STATE/daily.pid), wait until the port
                   answers, append to STATE/starts.log
stop STATE         SIGTERM the PID in STATE/daily.pid (only it), wait for it, append to stops.log
status STATE       exit 0 while that PID runs
serve PORT         listen on 127.0.0.1:PORT; if the port is taken, just sleep (a decoy with the
                   same command line as the real one)
pause/resume STATE a scheduled job: append to pauses.log / resumes.log; jobstatus exits 0 if active
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def alive(pid: int) -> bool:
    """Running and not a zombie (this script runs often: no psutil import, /proc where there is one)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def log(state: Path, name: str) -> None:
    with open(state / name, "a") as f:
        f.write(f"{time.monotonic()}\n")


def pid_of(state: Path) -> int | None:
    try:
        return int((state / "daily.pid").read_text())
    except (OSError, ValueError):
        return None


def main() -> int:
    cmd = sys.argv[1]
    if cmd == "serve":
        port = int(sys.argv[2])
        signal.signal(signal.SIGTERM, lambda s, f: os._exit(0))
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            while True:
                time.sleep(1)
        sock.listen(8)
        while True:
            conn, _ = sock.accept()
            conn.close()
    state = Path(sys.argv[2])
    if cmd == "start":
        port = int(sys.argv[3])
        with open(state / "daily.log", "ab") as out:
            p = subprocess.Popen(
                [sys.executable, __file__, "serve", str(port)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
        (state / "daily.pid").write_text(str(p.pid))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.02)
        log(state, "starts.log")
        return 0
    if cmd == "stop":
        pid = pid_of(state)
        if pid is not None and alive(pid):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 5
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
        (state / "daily.pid").unlink(missing_ok=True)
        log(state, "stops.log")
        return 0
    if cmd == "status":
        pid = pid_of(state)
        return 0 if pid is not None and alive(pid) else 3
    if cmd == "pause":
        (state / "job.paused").touch()
        log(state, "pauses.log")
        return 0
    if cmd == "resume":
        (state / "job.paused").unlink(missing_ok=True)
        log(state, "resumes.log")
        return 0
    if cmd == "jobstatus":
        return 3 if (state / "job.paused").exists() else 0
    raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    sys.exit(main())
