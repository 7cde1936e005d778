"""Where a run sends its requests: a URL already serving, or the embedded simulator as a child.

`--target sim` starts `python -m replay.sim` on a free port as a child process with its own PID,
waits for its `listening on` line, and stops it by that PID when the run ends, whatever the exit
path. A URL target is never started or stopped by the tool.
"""

from __future__ import annotations

import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drivers.process import ChildProcess
from replay.errors import UsageError

# Modelled time runs this many times faster than a real server would, unless the user says.
DEFAULT_SIM_TIME_SCALE = 200.0
_LISTENING = re.compile(r"listening on (http://\S+)")


@dataclass(slots=True)
class Target:
    kind: str
    url: str
    flags: list[str] = field(default_factory=list)
    log_path: str | None = None
    pid: int | None = None

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "url": self.url, "flags": self.flags, "log": self.log_path, "pid": self.pid}


def sim_argv(preset: str | None, extra: list[str]) -> list[str]:
    argv = [sys.executable, "-m", "replay.sim", "--host", "127.0.0.1", "--port", "0"]
    if preset:
        argv += ["--preset", preset]
    if "--time-scale" not in extra:
        argv += ["--time-scale", str(DEFAULT_SIM_TIME_SCALE)]
    return argv + extra


@contextmanager
def open_target(spec: str, sim_args: list[str] | None = None, log_path: Path | None = None) -> Iterator[Target]:
    """Yield a ready target; `log_path` is where a started server's log goes (default: a temp dir)."""
    if spec.startswith(("http://", "https://")):
        if sim_args:
            raise UsageError("--sim-args only applies to --target sim")
        yield Target(kind="external", url=spec.rstrip("/"))
        return
    if spec != "sim" and not spec.startswith("sim:"):
        raise UsageError(f"--target must be a URL (http://HOST:PORT) or sim[:preset], not {spec!r}")
    preset = spec.partition(":")[2] or None
    extra = list(sim_args or [])
    with tempfile.TemporaryDirectory(prefix="replay-sim-") as tmp:
        if "--kv-disk-dir" not in extra:
            extra += ["--kv-disk-dir", str(Path(tmp) / "kv")]
        argv = sim_argv(preset, extra)
        log = Path(log_path) if log_path else Path(tmp) / "sim-server.log"
        log.unlink(missing_ok=True)
        child = ChildProcess(argv, log_path=log, name="replay-sim", stop_timeout=30.0, give_up=True)
        with child:
            match = child.wait_for_line(_LISTENING, timeout=60.0)
            yield Target(kind="sim", url=match.group(1).rstrip("/"), flags=argv[3:], log_path=str(log), pid=child.pid)
