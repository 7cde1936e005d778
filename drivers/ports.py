"""Who listens on a port, and whether it is the process a service manager says it owns.

The field report ended with a "restored" daily service that was in fact a leftover test server
answering on the daily port. The check here names the listening PID, its parent and command, and
accepts it only when it is the manager's main PID, one of its descendants, or (systemd) a member
of the unit's control group.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil


@dataclass(frozen=True, slots=True)
class PortOwner:
    pid: int | None  # None: the socket belongs to a process this user cannot inspect
    ppid: int | None
    name: str | None
    cmdline: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.pid is None:
            return "a process this user cannot see (pid unknown)"
        return f"pid {self.pid} ({self.name}), parent {self.ppid}"


@dataclass(frozen=True, slots=True)
class PortCheck:
    ok: bool
    port: int
    message: str
    owners: tuple[PortOwner, ...] = field(default=())


def free_port(host: str = "127.0.0.1") -> int:
    """An ephemeral port that was free a moment ago (a server started right after can take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_owners(port: int) -> list[PortOwner]:
    """Processes with a listening TCP socket on ``port`` (any address)."""
    seen: dict[int | None, PortOwner] = {}
    for pid, conn in _listening():
        if conn.laddr and conn.laddr.port == port and pid not in seen:
            seen[pid] = _owner(pid)
    return list(seen.values())


def _listening() -> list[tuple[int | None, Any]]:
    try:
        conns = psutil.net_connections(kind="tcp")
        return [(c.pid, c) for c in conns if c.status == psutil.CONN_LISTEN]
    except psutil.AccessDenied:
        pass  # macOS without root: ask each process this user may inspect
    found = []
    for proc in psutil.process_iter():
        try:
            found += [
                (proc.pid, c) for c in proc.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN
            ]
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def _owner(pid: int | None) -> PortOwner:
    if pid is None:
        return PortOwner(None, None, None)
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            return PortOwner(pid, proc.ppid(), proc.name(), tuple(proc.cmdline()))
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return PortOwner(pid, None, None)


def wait_for_listener(port: int, timeout: float) -> list[PortOwner]:
    """Owners of ``port`` once someone listens on it, or [] after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        owners = port_owners(port)
        if owners or time.monotonic() >= deadline:
            return owners
        time.sleep(0.1)


def _in_cgroup(pid: int, cgroup: str) -> bool:
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return False
    paths = [line.split(":", 2)[-1] for line in text.splitlines()]
    return any(p == cgroup or p.startswith(cgroup.rstrip("/") + "/") for p in paths)


def _descends_from(pid: int, ancestor: int) -> bool:
    try:
        return any(p.pid == ancestor for p in psutil.Process(pid).parents())
    except psutil.NoSuchProcess:
        return False


def _owned(owner: PortOwner, expected_pid: int | None, cgroup: str | None) -> bool:
    if owner.pid is None:
        return False
    if expected_pid is not None and (owner.pid == expected_pid or _descends_from(owner.pid, expected_pid)):
        return True
    return bool(cgroup) and _in_cgroup(owner.pid, cgroup or "")


def check_port_owner(
    port: int, expected_pid: int | None, what: str, *, cgroup: str | None = None
) -> PortCheck:
    """Is the process listening on ``port`` the one ``what`` (a service manager's unit) owns?"""
    owners = tuple(port_owners(port))
    if not owners:
        return PortCheck(False, port, f"port {port}: nobody is listening; {what} is not serving", owners)
    if expected_pid is None and cgroup is None:
        listed = "; ".join(o.describe() for o in owners)
        return PortCheck(False, port, f"port {port}: {listed}; {what} reports no PID to compare", owners)
    strangers = [o for o in owners if not _owned(o, expected_pid, cgroup)]
    listed = "; ".join(o.describe() for o in owners)
    if strangers:
        bad = "; ".join(o.describe() for o in strangers)
        return PortCheck(
            False,
            port,
            f"port {port} is held by {bad}, NOT by {what} (main pid {expected_pid})",
            owners,
        )
    return PortCheck(True, port, f"port {port}: {listed} belongs to {what} (main pid {expected_pid})", owners)
