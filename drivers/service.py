"""The user's daily service and scheduled jobs, driven only through their own service manager.

The tool never signals a daily service's processes itself: it asks systemd, launchd or the
user's own commands to stop and start them, so what comes back is what the manager would have
started (same unit, same environment), and a cleanup can never reach a process by its name.
The same managers pause and resume jobs (systemd timers, launchd agents, anything with a
command), where "stop" means pause and "start" means resume.

Every action goes through ``Commands``: in a dry run it prints what it would run; read-only
queries (``systemctl show``, ``launchctl print``, a status command) run in both modes so the dry
run can say what it found.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import psutil

from replay.errors import DriverError, UsageError

Say = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class ServiceState:
    active: bool
    main_pid: int | None
    known: bool = True  # False: the manager has no way to tell (a command with no status)
    cgroup: str | None = None  # systemd's control group, a second proof of ownership
    detail: str = ""


class Commands:
    """Runs a manager's commands (or prints them in a dry run) and reports failures in one line."""

    def __init__(
        self, *, dry_run: bool, say: Say, log_path: Path | None = None, timeout: float = 300.0
    ) -> None:
        self.dry_run = dry_run
        self.say = say
        self.log_path = log_path
        self.timeout = timeout

    def act(self, argv: list[str], what: str) -> None:
        """A command that changes the machine: printed in a dry run, else run and checked."""
        shown = _show(argv)
        if self.dry_run:
            self.say(f"dry-run: would {what}: {shown}")
            return
        self.say(f"{what}: {shown}")
        code, out = self._run(argv)
        if code != 0:
            last = next((ln for ln in reversed(out.splitlines()) if ln.strip()), "").strip()[:200]
            raise DriverError(
                f"{what} failed: `{shown}` exited with code {code}" + (f": {last}" if last else "")
            )

    def query(self, argv: list[str]) -> tuple[int, str]:
        """A read-only command; runs in dry runs too."""
        return self._run(argv)

    def _run(self, argv: list[str]) -> tuple[int, str]:
        # Output goes to a file, not a pipe: a start command that leaves a daemon behind keeps
        # a pipe open forever, and the tool would hang waiting for its end.
        with tempfile.TemporaryFile() as out:
            try:
                proc = subprocess.run(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # a terminal's Ctrl-C must not reach the user's service
                    timeout=self.timeout,
                    check=False,
                )
                code = proc.returncode
            except FileNotFoundError:
                return 127, f"{argv[0]}: not found"
            except subprocess.TimeoutExpired:
                code = -1
            out.seek(0)
            text = out.read().decode("utf-8", "replace")
        if self.log_path is not None and not self.dry_run:
            with open(self.log_path, "a") as log:
                log.write(f"$ {_show(argv)}  -> {code}\n{text}")
        if code == -1:
            raise DriverError(f"`{_show(argv)}` did not finish within {self.timeout:g}s")
        return code, text


class Manager(ABC):
    """One service or job under a service manager. ``spec()`` rebuilds it from a journal."""

    kind: ClassVar[str]

    @abstractmethod
    def describe(self) -> str: ...

    @abstractmethod
    def state(self, cmds: Commands) -> ServiceState: ...

    @abstractmethod
    def stop(self, cmds: Commands) -> None: ...

    @abstractmethod
    def start(self, cmds: Commands) -> None: ...

    @abstractmethod
    def spec(self) -> dict[str, Any]: ...

    @property
    def gives_pid(self) -> bool:
        return True


@dataclass(frozen=True)
class Systemd(Manager):
    """A systemd unit (service or timer); ``user`` for ``systemctl --user``, ``sudo`` for ``sudo -n``."""

    unit: str
    user: bool = False
    sudo: bool = False
    kind: ClassVar[str] = "systemd"

    def _ctl(self) -> list[str]:
        base = ["sudo", "-n", "systemctl"] if self.sudo else ["systemctl"]
        return base + (["--user"] if self.user else [])

    def describe(self) -> str:
        return f"systemd{' --user' if self.user else ''} unit {self.unit}"

    def state(self, cmds: Commands) -> ServiceState:
        argv = [*self._ctl(), "show", self.unit, "--property=ActiveState,MainPID,ControlGroup,LoadState"]
        if self.sudo:  # reading needs no privilege
            argv = argv[2:]
        code, out = cmds.query(argv)
        if code != 0:
            raise DriverError(
                f"cannot read the state of {self.describe()}: systemctl exited with code {code}"
            )
        props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        if props.get("LoadState") == "not-found":
            raise DriverError(f"{self.describe()} does not exist")
        active = props.get("ActiveState") in ("active", "activating", "reloading")
        pid = int(props.get("MainPID") or 0) or None
        return ServiceState(
            active, pid, cgroup=props.get("ControlGroup") or None, detail=props.get("ActiveState", "")
        )

    def stop(self, cmds: Commands) -> None:
        cmds.act([*self._ctl(), "stop", self.unit], f"stop {self.describe()}")

    def start(self, cmds: Commands) -> None:
        cmds.act([*self._ctl(), "start", self.unit], f"start {self.describe()}")

    def spec(self) -> dict[str, Any]:
        return {"manager": "systemd", "unit": self.unit, "user": self.user, "sudo": self.sudo}


@dataclass(frozen=True)
class Launchd(Manager):
    """A launchd job: ``launchctl bootout``/``bootstrap`` (or ``unload``/``load`` with ``legacy``).

    ``domain`` defaults to the user's GUI domain (agents); use ``system`` for daemons. The plist is
    what ``bootstrap``/``load`` needs to bring the job back.
    """

    label: str
    plist: str
    domain: str | None = None
    legacy: bool = False
    kind: ClassVar[str] = "launchd"

    @property
    def _domain(self) -> str:
        return self.domain or f"gui/{os.getuid()}"

    def describe(self) -> str:
        return f"launchd job {self.label} ({self._domain})"

    def state(self, cmds: Commands) -> ServiceState:
        if self.legacy:
            code, out = cmds.query(["launchctl", "list", self.label])
            m = re.search(r'"PID"\s*=\s*(\d+);', out)
        else:
            code, out = cmds.query(["launchctl", "print", f"{self._domain}/{self.label}"])
            m = re.search(r"^\s*pid = (\d+)\s*$", out, re.MULTILINE)
        if code != 0:
            return ServiceState(False, None, detail="not loaded")
        return ServiceState(True, int(m.group(1)) if m else None, detail="loaded")

    def stop(self, cmds: Commands) -> None:
        if self.legacy:
            cmds.act(["launchctl", "unload", self.plist], f"unload {self.describe()}")
        else:
            cmds.act(["launchctl", "bootout", f"{self._domain}/{self.label}"], f"boot out {self.describe()}")

    def start(self, cmds: Commands) -> None:
        if self.legacy:
            cmds.act(["launchctl", "load", self.plist], f"load {self.describe()}")
        else:
            cmds.act(["launchctl", "bootstrap", self._domain, self.plist], f"bootstrap {self.describe()}")

    def spec(self) -> dict[str, Any]:
        return {
            "manager": "launchd",
            "label": self.label,
            "plist": self.plist,
            "domain": self.domain,
            "legacy": self.legacy,
        }


@dataclass(frozen=True)
class Command(Manager):
    """Anything else: the user's own start/stop commands (strings run by ``sh -c``, or argv lists).

    ``status`` exits 0 while the service runs. Its main PID, for the port-owner check, comes from
    ``pid_file`` or the first number ``pid_command`` prints.
    """

    name: str
    start_cmd: str | tuple[str, ...]
    stop_cmd: str | tuple[str, ...]
    status_cmd: str | tuple[str, ...] | None = None
    pid_file: str | None = None
    pid_cmd: str | tuple[str, ...] | None = None
    kind: ClassVar[str] = "command"

    def describe(self) -> str:
        return f"command-managed {self.name}"

    @property
    def gives_pid(self) -> bool:
        return self.pid_file is not None or self.pid_cmd is not None

    def state(self, cmds: Commands) -> ServiceState:
        pid = self._pid(cmds)
        if self.status_cmd is not None:
            code, _ = cmds.query(_argv(self.status_cmd))
            return ServiceState(code == 0, pid if code == 0 else None, detail=f"status exit {code}")
        if self.pid_file is not None:
            return ServiceState(pid is not None, pid, detail="pid file")
        return ServiceState(True, pid, known=False, detail="no status command")

    def _pid(self, cmds: Commands) -> int | None:
        text = ""
        if self.pid_file is not None:
            try:
                text = Path(self.pid_file).expanduser().read_text()
            except OSError:
                return None
        elif self.pid_cmd is not None:
            code, text = cmds.query(_argv(self.pid_cmd))
            if code != 0:
                return None
        m = re.search(r"\d+", text)
        if not m:
            return None
        pid = int(m.group())
        return pid if psutil.pid_exists(pid) else None

    def stop(self, cmds: Commands) -> None:
        cmds.act(_argv(self.stop_cmd), f"stop {self.describe()}")

    def start(self, cmds: Commands) -> None:
        cmds.act(_argv(self.start_cmd), f"start {self.describe()}")

    def spec(self) -> dict[str, Any]:
        def keep(v: Any) -> Any:
            return list(v) if isinstance(v, tuple) else v

        return {
            "manager": "command",
            "name": self.name,
            "start": keep(self.start_cmd),
            "stop": keep(self.stop_cmd),
            "status": keep(self.status_cmd),
            "pid_file": self.pid_file,
            "pid_command": keep(self.pid_cmd),
        }


_KEYS = {
    "systemd": {"unit", "user", "sudo"},
    "launchd": {"label", "plist", "domain", "legacy"},
    "command": {"name", "start", "stop", "pause", "resume", "status", "pid_file", "pid_command"},
}


def manager_from_spec(spec: dict[str, Any], where: str, *, default_name: str = "service") -> Manager:
    """Build a manager from a TOML table or a journal entry; problems read ``where: problem``."""

    def bad(problem: str) -> UsageError:
        return UsageError(f"{where}: {problem}")

    kind = spec.get("manager")
    if kind not in _KEYS:
        raise bad(f"manager must be one of {', '.join(_KEYS)}, not {kind!r}")
    allowed = _KEYS[kind] | {"manager"}
    for key in spec:
        if key not in allowed:
            raise bad(f"unknown key {key!r} for manager {kind!r} (known: {', '.join(sorted(allowed))})")

    def text(key: str, required: bool = False) -> str | None:
        v = spec.get(key)
        if v is None and required:
            raise bad(f"manager {kind!r} needs {key!r}")
        if v is not None and not isinstance(v, str):
            raise bad(f"{key} must be a string")
        return v

    def flag(key: str) -> bool:
        v = spec.get(key, False)
        if not isinstance(v, bool):
            raise bad(f"{key} must be true or false")
        return v

    def cmd(*keys: str, required: bool = False) -> str | tuple[str, ...] | None:
        for key in keys:
            v = spec.get(key)
            if v is None:
                continue
            if isinstance(v, str) and v.strip():
                return v
            if isinstance(v, list) and v and all(isinstance(x, str) for x in v):
                return tuple(v)
            raise bad(f"{key} must be a command string or a list of strings")
        if required:
            raise bad(f"manager 'command' needs {' or '.join(repr(k) for k in keys)}")
        return None

    if kind == "systemd":
        return Systemd(unit=text("unit", True) or "", user=flag("user"), sudo=flag("sudo"))
    if kind == "launchd":
        return Launchd(
            label=text("label", True) or "",
            plist=str(Path(text("plist", True) or "").expanduser()),
            domain=text("domain"),
            legacy=flag("legacy"),
        )
    start = cmd("start", "resume", required=True)
    stop = cmd("stop", "pause", required=True)
    assert start is not None and stop is not None
    name = text("name") or default_name
    pid_file = text("pid_file")
    return Command(
        name=name,
        start_cmd=start,
        stop_cmd=stop,
        status_cmd=cmd("status"),
        pid_file=str(Path(pid_file).expanduser()) if pid_file else None,
        pid_cmd=cmd("pid_command"),
    )


def _argv(cmd: str | tuple[str, ...]) -> list[str]:
    return ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)


def _show(argv: list[str]) -> str:
    if argv[:2] == ["/bin/sh", "-c"] and len(argv) == 3:
        return argv[2]
    return shlex.join(argv)
