"""Give the machine back exactly as it was: the safe-restore guard around a benchmark run.

``with Guard(config):`` takes a lock (two runs never fight), reads the daily service's state,
writes a journal, and only then pauses jobs and stops the service. Every later step is written
to the journal before it is taken, so a crash at any point (even ``kill -9``) leaves enough on
disk for ``restore_from_journal`` to finish the job. Leaving the block by any path (normal end,
exception, Ctrl-C, SIGTERM, SIGHUP, ``max_duration``) runs the restore exactly once: stop the
tool's own children (by PID, checked against their start time), start the service, resume the
jobs, then check that the process answering on the service's port is the one the manager owns,
and say so. Signals that arrive during the restore are noted and do not interrupt it.

Python delivers signals to the main thread only, so the guard must be entered there. A signal
or the timeout surfaces as an exception in whatever the main thread runs (plain code or
``anyio.run``), so every ``with``/``finally`` on the way out runs before the restore::

    with Guard(load_guard_config("daily.toml"), max_duration=7200) as guard:
        with start_target("a.toml", workdir, adopt=guard.adopt) as served:
            ...  # the benchmark
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import psutil

from drivers.ports import PortCheck, check_port_owner, port_owners, wait_for_listener
from drivers.process import ChildProcess
from drivers.service import Commands, Manager, Say, ServiceState, manager_from_spec
from replay.errors import DriverError, ReplayError, UsageError

JOURNAL_FORMAT = "agent-replay-journal/1"
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class GuardInterrupt(ReplayError):
    """The run was stopped by a signal; the machine has been restored by the time this surfaces."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


class MaxDurationExceeded(GuardInterrupt):
    """The run went past ``--max-duration``."""

    def __init__(self, seconds: float) -> None:
        ReplayError.__init__(self, f"max duration {seconds:g}s reached")
        self.signum = signal.SIGALRM
        self.exit_code = 124  # as timeout(1)


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "agent-replay"


@dataclass(frozen=True)
class ServiceSpec:
    manager: Manager
    port: int | None = None
    stop_timeout: float = 120.0  # for the manager to report it stopped
    ready_timeout: float = 300.0  # for it to listen on its port again (a model load)


@dataclass(frozen=True)
class GuardConfig:
    service: ServiceSpec | None = None
    pause: tuple[Manager, ...] = ()
    state_dir: Path = field(default_factory=default_state_dir)

    @property
    def journal_path(self) -> Path:
        return self.state_dir / "journal.json"

    @property
    def lock_path(self) -> Path:
        return self.state_dir / "guard.lock"


def load_guard_config(path: str | Path) -> GuardConfig:
    """Read a daily-service TOML::

    [service]                 # the daily server to stop for the run and give back
    manager = "systemd"       # systemd | launchd | command
    unit = "ds4.service"
    user = true
    port = 8000               # checked after the restore: who answers here?
    stop_timeout = 120
    ready_timeout = 600

    [[pause]]                 # jobs to pause during the run (timers, agents, commands)
    manager = "systemd"
    unit = "nightly-review.timer"
    user = true

    state_dir = "~/.local/state/agent-replay"   # lock and journal (optional, top level)
    """
    import tomllib

    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such service file") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: not valid TOML: {e}") from None
    for key in data:
        if key not in ("service", "pause", "state_dir"):
            raise UsageError(f"{path}: unknown key {key!r} (known: service, pause, state_dir)")
    service = None
    if "service" in data:
        table = dict(data["service"])
        numbers = {k: table.pop(k) for k in ("port", "stop_timeout", "ready_timeout") if k in table}
        manager = manager_from_spec(table, f"{path} [service]")
        for k, v in numbers.items():
            if not isinstance(v, int | float) or isinstance(v, bool) or v <= 0:
                raise UsageError(f"{path} [service]: {k} must be a positive number")
        port = numbers.get("port")
        if port is not None and (not isinstance(port, int) or port >= 65536):
            raise UsageError(f"{path} [service]: port must be a whole number below 65536")
        if port is not None and not manager.gives_pid:
            raise UsageError(
                f"{path} [service]: the port check needs the service's PID: add pid_file or pid_command"
            )
        service = ServiceSpec(
            manager,
            port,
            float(numbers.get("stop_timeout", 120.0)),
            float(numbers.get("ready_timeout", 300.0)),
        )
    pause = tuple(
        manager_from_spec(t, f"{path} [[pause]] #{i + 1}", default_name=f"job #{i + 1}")
        for i, t in enumerate(data.get("pause", []))
    )
    state_dir = Path(data["state_dir"]).expanduser() if "state_dir" in data else default_state_dir()
    return GuardConfig(service, pause, state_dir)


@dataclass
class RestoreReport:
    actions: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    port_check: PortCheck | None = None

    @property
    def ok(self) -> bool:
        return not self.errors and (self.port_check is None or self.port_check.ok)


class _Journal:
    """The journal file: rewritten atomically (temp file, fsync, rename) on every step."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data
        self._lock = threading.Lock()

    @classmethod
    def read(cls, path: Path) -> _Journal:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise UsageError(f"{path}: no journal (nothing to restore)") from None
        except json.JSONDecodeError as e:
            raise DriverError(f"{path}: journal is not valid JSON ({e.msg} at line {e.lineno})") from None
        if data.get("format") != JOURNAL_FORMAT:
            raise DriverError(f"{path}: not an agent-replay journal (format {data.get('format')!r})")
        return cls(path, data)

    def write(self) -> None:
        with self._lock:
            tmp = self.path.with_name(self.path.name + ".tmp")
            with open(tmp, "w") as f:
                json.dump(self.data, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)


class _Lock:
    """An flock on the state directory's lock file: the kernel drops it if the holder dies."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise DriverError(
                f"another agent-replay run (pid {holder}) holds {self.path}; two runs would fight over the machine"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _default_say(message: str) -> None:
    print(f"guard: {message}", file=sys.stderr, flush=True)


class Guard:
    """Stop the daily service and pause jobs for a run; restore them exactly once on any exit."""

    def __init__(
        self,
        config: GuardConfig,
        *,
        dry_run: bool = False,
        max_duration: float | None = None,
        say: Say | None = None,
    ) -> None:
        self.config = config
        self.dry_run = dry_run
        self.max_duration = max_duration
        self.say = say or _default_say
        self.cmds = Commands(dry_run=dry_run, say=self.say, log_path=config.state_dir / "commands.log")
        self.report: RestoreReport | None = None
        self._journal: _Journal | None = None
        self._lock = _Lock(config.lock_path)
        self._children: list[ChildProcess] = []
        self._restore_lock = threading.Lock()
        self._unwinding = False
        self._deferred: int | None = None
        self._old_handlers: dict[int, Any] = {}
        self._dry_plan: dict[str, Any] | None = None

    # -- entering ---------------------------------------------------------------------------

    def __enter__(self) -> Guard:
        if threading.current_thread() is not threading.main_thread():
            raise DriverError("the guard must be entered on the main thread (signals arrive there)")
        if self.dry_run:
            self._dry_enter()
            return self
        self._lock.acquire()
        try:
            self._check_old_journal()
            self._journal = _Journal(self.config.journal_path, self._plan())
            self._journal.data["state"] = "active"
            self._journal.write()
            self.say(f"journal {self.config.journal_path}")
            self._install_signals()
            self._take_over()
            self._start_clock()
        except BaseException:
            self._unwinding = True
            try:
                if self._journal is not None:
                    self.restore()
            except DriverError:
                pass  # already said; the error that stopped the start is the one to raise
            finally:
                self._uninstall_signals()
                self._lock.release()
            raise
        return self

    def _check_old_journal(self) -> None:
        path = self.config.journal_path
        if not path.exists():
            return
        old = _Journal.read(path)
        if old.data.get("state") != "restored":
            raise DriverError(
                f"{path}: an earlier run (pid {old.data.get('tool', {}).get('pid')}) did not finish its "
                "restore; run `replay restore` first"
            )

    def _plan(self) -> dict[str, Any]:
        """Read-only: what is running now, so the restore knows what to give back."""
        data: dict[str, Any] = {
            "format": JOURNAL_FORMAT,
            "state": "planning",
            "tool": {"pid": os.getpid(), "argv": sys.argv, "started": _now()},
            "service": None,
            "jobs": [],
            "children": [],
            "restore": None,
        }
        spec = self.config.service
        if spec is not None:
            st = spec.manager.state(self.cmds)
            data["service"] = {
                "spec": spec.manager.spec(),
                "port": spec.port,
                "stop_timeout": spec.stop_timeout,
                "ready_timeout": spec.ready_timeout,
                "was_active": st.active or not st.known,
                "main_pid": st.main_pid,
                "port_owners": [o.pid for o in port_owners(spec.port)] if spec.port else [],
                "stop_begun": False,
                "stopped": False,
                "started": False,
            }
        for job in self.config.pause:
            st = job.state(self.cmds)
            data["jobs"].append(
                {
                    "spec": job.spec(),
                    "was_active": st.active or not st.known,
                    "pause_begun": False,
                    "paused": False,
                    "resumed": False,
                }
            )
        return data

    def _take_over(self) -> None:
        assert self._journal is not None
        data = self._journal.data
        for entry, job in zip(data["jobs"], self.config.pause, strict=True):
            if not entry["was_active"]:
                self.say(f"{job.describe()} was not active; leaving it")
                continue
            entry["pause_begun"] = True
            self._journal.write()
            job.stop(self.cmds)
            entry["paused"] = True
            self._journal.write()
        svc = data["service"]
        spec = self.config.service
        if svc is not None and spec is not None:
            if not svc["was_active"]:
                self.say(f"{spec.manager.describe()} was not running; it stays stopped")
            else:
                svc["stop_begun"] = True
                self._journal.write()
                spec.manager.stop(self.cmds)
                self._wait_stopped(spec)
                svc["stopped"] = True
                self._journal.write()
        data["state"] = "running"
        self._journal.write()

    def _wait_stopped(self, spec: ServiceSpec) -> None:
        deadline = time.monotonic() + spec.stop_timeout
        while True:
            st = spec.manager.state(self.cmds)
            if not st.active or not st.known:
                break
            if time.monotonic() >= deadline:
                raise DriverError(f"{spec.manager.describe()} still active {spec.stop_timeout:g}s after stop")
            time.sleep(0.05)
        if spec.port:
            owners = port_owners(spec.port)
            while owners and time.monotonic() < deadline:
                time.sleep(0.05)
                owners = port_owners(spec.port)
            if owners:
                held = "; ".join(o.describe() for o in owners)
                self.say(f"warning: port {spec.port} is still held after the stop, by {held}")

    def _dry_enter(self) -> None:
        self.say(f"dry-run: would take the lock {self.config.lock_path}")
        plan = self._plan()
        self.say(f"dry-run: would write the journal {self.config.journal_path}")
        for entry, job in zip(plan["jobs"], self.config.pause, strict=True):
            if entry["was_active"]:
                job.stop(self.cmds)
            else:
                self.say(f"dry-run: {job.describe()} is not active; would leave it")
        svc, spec = plan["service"], self.config.service
        if svc is not None and spec is not None:
            if svc["was_active"]:
                self.say(f"dry-run: {spec.manager.describe()} is running (main pid {svc['main_pid']})")
                spec.manager.stop(self.cmds)
            else:
                self.say(f"dry-run: {spec.manager.describe()} is not running; would leave it stopped")
        if self.max_duration:
            self.say(f"dry-run: would stop the run after {self.max_duration:g}s")
        self._dry_plan = plan

    # -- children ---------------------------------------------------------------------------

    def adopt(self, child: ChildProcess) -> None:
        """Put a child the run starts in the journal, so a crashed tool's restore can stop it."""
        self._children.append(child)
        child.listeners.append(self._on_child_event)
        if child.started:
            self._on_child_event("started", child)

    def _on_child_event(self, event: str, child: ChildProcess) -> None:
        if self._journal is None:
            return
        entries = self._journal.data["children"]
        entry = next((e for e in entries if e["pid"] == (child.pid if child.started else None)), None)
        if event == "started":
            entries.append(
                {
                    "pid": child.pid,
                    "create_time": child.create_time,
                    "name": child.name,
                    "argv0": child.argv[0],
                    "stop_timeout": child.stop_timeout,
                    "give_up": child.give_up,
                    "sigterm_sent": False,
                    "exited": False,
                }
            )
        elif entry is not None and event == "sigterm":
            entry["sigterm_sent"] = True
        elif entry is not None and event == "exited":
            entry["exited"] = True
        self._journal.write()

    # -- leaving ----------------------------------------------------------------------------

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._unwinding = True
        try:
            if self.dry_run:
                self._dry_restore()
                return
            self.restore()
        finally:
            self._uninstall_signals()
            self._lock.release()
        if exc is None and self._deferred is not None:
            raise GuardInterrupt(self._deferred)

    def restore(self) -> RestoreReport:
        """Give everything back, once: a later call (or ``__exit__``) returns the first report.

        Raises DriverError when a step failed or a stranger answers on the service's port; the
        journal then says what is left for ``replay restore``.
        """
        self._unwinding = True
        with self._restore_lock:
            if self.report is not None:
                return self.report
            assert self._journal is not None
            signal.setitimer(signal.ITIMER_REAL, 0)
            self.report = RestoreReport()
            live = {c.pid: c for c in self._children if c.started}
            _restore(self._journal, self.cmds, self.say, self.report, live)
            _finish(self.report, self.say)
            return self.report

    def _dry_restore(self) -> None:
        plan = self._dry_plan
        for child in self._children:
            self.say(f"dry-run: would stop {child.describe()}: one SIGTERM, wait {child.stop_timeout:g}s")
        if plan is None:
            return
        svc, spec = plan["service"], self.config.service
        if svc is not None and spec is not None and svc["was_active"]:
            spec.manager.start(self.cmds)
        for entry, job in zip(plan["jobs"], self.config.pause, strict=True):
            if entry["was_active"]:
                job.start(self.cmds)
        if svc is not None and spec is not None and svc["was_active"] and spec.port:
            self.say(f"dry-run: would check that port {spec.port} is answered by {spec.manager.describe()}")

    # -- signals ----------------------------------------------------------------------------

    def _install_signals(self) -> None:
        for sig in _SIGNALS:
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def _start_clock(self) -> None:
        """``max_duration`` counts the run itself, from the moment the machine is handed over."""
        if self.max_duration:
            self._old_handlers[signal.SIGALRM] = signal.signal(signal.SIGALRM, self._on_alarm)
            signal.setitimer(signal.ITIMER_REAL, self.max_duration)

    def _uninstall_signals(self) -> None:
        if signal.SIGALRM in self._old_handlers:
            signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self._unwinding:
            self.say(f"{name} received while restoring; the restore goes on (it cannot be interrupted)")
            if self._deferred is None:
                self._deferred = signum
            return
        self._unwinding = True
        self.say(f"{name} received: stopping the run and restoring")
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise GuardInterrupt(signum)

    def _on_alarm(self, signum: int, frame: FrameType | None) -> None:
        if self._unwinding:
            return
        self._unwinding = True
        assert self.max_duration is not None
        self.say(f"max duration {self.max_duration:g}s reached: stopping the run and restoring")
        raise MaxDurationExceeded(self.max_duration)


def _restore(
    journal: _Journal, cmds: Commands, say: Say, report: RestoreReport, live: dict[int, ChildProcess]
) -> None:
    """The restore proper, shared by the guard and ``restore_from_journal``; each step journaled."""
    data = journal.data
    data["state"] = "restoring"
    data["restore"] = {"started": _now(), "by_pid": os.getpid()}
    journal.write()
    # 1. Our own children, and nothing else.
    for entry in data["children"]:
        if entry["exited"]:
            continue
        try:
            _stop_child(entry, live.get(entry["pid"]), say, report)
            entry["exited"] = True
        except DriverError as e:
            report.errors.append(str(e))
        journal.write()
    # 2. The daily service, if the run stopped it (or began to).
    svc = data["service"]
    manager = manager_from_spec(svc["spec"], "journal service") if svc else None
    if svc is not None and manager is not None and svc["stop_begun"] and not svc["started"]:
        try:
            st = manager.state(cmds)
            if st.active and st.known:
                report.actions.append(f"{manager.describe()} is already running; not started again")
                say(report.actions[-1])
            else:
                manager.start(cmds)
                report.actions.append(f"started {manager.describe()}")
            svc["started"] = True
        except (DriverError, UsageError) as e:
            report.errors.append(str(e))
        journal.write()
    # 3. The paused jobs.
    for i, entry in enumerate(data["jobs"]):
        if not entry["pause_begun"] or entry["resumed"]:
            continue
        try:
            job = manager_from_spec(entry["spec"], f"journal job #{i + 1}")
            st = job.state(cmds)
            if st.active and st.known:
                report.actions.append(f"{job.describe()} is already active; not resumed again")
                say(report.actions[-1])
            else:
                job.start(cmds)
                report.actions.append(f"resumed {job.describe()}")
            entry["resumed"] = True
        except (DriverError, UsageError) as e:
            report.errors.append(str(e))
        journal.write()
    # 4. Who answers on the service's port now?
    if svc is not None and manager is not None and svc["was_active"] and svc.get("port"):
        report.port_check = _check_port(manager, svc, cmds, say)
        data["restore"]["port_check"] = {
            "ok": report.port_check.ok,
            "message": report.port_check.message,
            "owners": [o.pid for o in report.port_check.owners],
        }
    elif svc is not None and manager is not None and not svc["was_active"]:
        say(f"{manager.describe()} was not running before the run; left stopped")
    data["restore"]["finished"] = _now()
    data["restore"]["errors"] = report.errors
    data["state"] = "incomplete" if report.errors else "restored"
    journal.write()


def _stop_child(entry: dict[str, Any], child: ChildProcess | None, say: Say, report: RestoreReport) -> None:
    if child is not None:
        result = child.stop()
        report.actions.append(f"stopped {child.name} (pid {result.pid}): {result.how}")
        say(report.actions[-1])
        return
    pid = entry["pid"]
    try:
        proc = psutil.Process(pid)
        same = abs(proc.create_time() - entry["create_time"]) < 0.5
    except psutil.NoSuchProcess:
        same = False
    if not same:
        report.actions.append(f"{entry['name']} (pid {pid}) is gone; nothing to stop")
        say(report.actions[-1])
        return
    if entry["sigterm_sent"]:
        say(f"{entry['name']} (pid {pid}) already had its SIGTERM; waiting, no second signal")
    else:
        entry["sigterm_sent"] = True
        os.kill(pid, signal.SIGTERM)
    try:
        proc.wait(timeout=entry["stop_timeout"])
        how = "terminated"
    except psutil.TimeoutExpired:
        if not entry["give_up"]:
            raise DriverError(
                f"{entry['name']} (pid {pid}) still running {entry['stop_timeout']:g}s after SIGTERM; "
                "not killed (its target says kill_on_timeout = false)"
            ) from None
        if abs(proc.create_time() - entry["create_time"]) < 0.5 and os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        proc.wait(timeout=10)
        how = "killed"
    except psutil.NoSuchProcess:
        how = "terminated"
    report.actions.append(f"stopped {entry['name']} (pid {pid}): {how}")
    say(report.actions[-1])


def _check_port(manager: Manager, svc: dict[str, Any], cmds: Commands, say: Say) -> PortCheck:
    port = svc["port"]
    say(f"waiting up to {svc['ready_timeout']:g}s for port {port} to answer")
    wait_for_listener(port, svc["ready_timeout"])
    deadline = time.monotonic() + 5.0
    st: ServiceState = manager.state(cmds)
    while st.main_pid is None and time.monotonic() < deadline:
        time.sleep(0.1)
        st = manager.state(cmds)
    check = check_port_owner(port, st.main_pid, manager.describe(), cgroup=st.cgroup)
    say(("OK: " if check.ok else "PROBLEM: ") + check.message)
    return check


def _finish(report: RestoreReport, say: Say) -> None:
    if report.errors:
        for e in report.errors:
            say(f"restore error: {e}")
        raise DriverError(f"restore incomplete ({len(report.errors)} errors, first: {report.errors[0]})")
    if report.port_check is not None and not report.port_check.ok:
        raise DriverError(report.port_check.message)


def restore_from_journal(
    path: str | Path | None = None, *, dry_run: bool = False, say: Say | None = None
) -> RestoreReport:
    """Finish a restore a crashed run left behind (``replay restore``); a done restore is not redone."""
    say = say or _default_say
    path = Path(path) if path else default_state_dir() / "journal.json"
    if not path.exists():  # no run left anything behind: not an error
        say(f"nothing to restore: no journal at {path}")
        return RestoreReport()
    journal = _Journal.read(path)
    if journal.data.get("state") == "restored":
        say(f"{path}: already restored at {journal.data.get('restore', {}).get('finished')}; nothing to do")
        return RestoreReport()
    cmds = Commands(dry_run=dry_run, say=say, log_path=path.parent / "commands.log")
    if dry_run:
        _dry_restore_journal(journal, cmds, say)
        return RestoreReport()
    lock = _Lock(path.parent / "guard.lock")
    lock.acquire()  # fails while the run that wrote the journal is alive and holds it
    try:
        report = RestoreReport()
        _restore(journal, cmds, say, report, {})
        _finish(report, say)
        return report
    finally:
        lock.release()


def _dry_restore_journal(journal: _Journal, cmds: Commands, say: Say) -> None:
    data = journal.data
    for entry in data["children"]:
        if not entry["exited"]:
            say(f"dry-run: would stop {entry['name']} (pid {entry['pid']}) if it is still that process")
    svc = data["service"]
    if svc and svc["stop_begun"] and not svc["started"]:
        manager_from_spec(svc["spec"], "journal service").start(cmds)
    for i, entry in enumerate(data["jobs"]):
        if entry["pause_begun"] and not entry["resumed"]:
            manager_from_spec(entry["spec"], f"journal job #{i + 1}").start(cmds)
    if svc and svc["was_active"] and svc.get("port"):
        say(f"dry-run: would check who answers on port {svc['port']}")
