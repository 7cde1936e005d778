"""Child processes the tool starts, watches and stops by their own PID, nothing else.

Why this is not a plain ``subprocess.Popen``: a benchmark run stops a user's daily server and
starts test servers on the same machine, so every signal must reach only what the tool started.
A child gets its own session (so a terminal Ctrl-C reaches the tool, which then stops the child
exactly once), its output goes to files, and the tool detects its exit without reaping it
(``waitid(WNOWAIT)``): while the zombie is unreaped its PID and process group cannot be reused,
so a late ``killpg`` can never hit a stranger.

Stopping is one SIGTERM to the child's PID, then a wait with a deadline: ds4 treats a second
signal as "exit now, skip the shutdown checkpoint", and that checkpoint can take seconds per GiB.
Only a caller that gives up (``give_up=True``) gets a SIGKILL, sent to the child's own group.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from replay.errors import DriverError

# Events a listener hears about, in order: "started", "sigterm", "sigkill", "exited".
Listener = Callable[[str, "ChildProcess"], None]


@dataclass(frozen=True, slots=True)
class StopResult:
    """How a stop ended; ``how`` is the strongest thing the tool had to do."""

    pid: int
    returncode: int
    how: str  # "already-exited" | "terminated" | "killed"
    seconds: float


class ChildProcess:
    """One command started in its own session, output captured to ``log_path``.

    ``stderr_path`` defaults to the same file as stdout, so a server's log is one file in the
    order it was written. Use it as a context manager: entering starts it (if not started),
    leaving stops it with the policy given here.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        log_path: Path,
        stderr_path: Path | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        stop_timeout: float = 30.0,
        give_up: bool = False,
        name: str | None = None,
    ) -> None:
        if not argv:
            raise DriverError("cannot start an empty command")
        self.argv = [str(a) for a in argv]
        self.log_path = Path(log_path)
        self.stderr_path = Path(stderr_path) if stderr_path else self.log_path
        self.env = dict(env or {})
        self.cwd = cwd
        self.stop_timeout = stop_timeout
        self.give_up = give_up
        self.name = name or Path(self.argv[0]).name
        self.listeners: list[Listener] = []
        self._popen: subprocess.Popen[bytes] | None = None
        self._create_time: float | None = None
        self._term_sent = False
        self._result: StopResult | None = None

    # -- identity -------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        if self._popen is None:
            raise DriverError(f"{self.name}: not started")
        return self._popen.pid

    @property
    def create_time(self) -> float:
        """psutil's start time: with the PID it names this process even after a PID reuse."""
        if self._create_time is None:
            raise DriverError(f"{self.name}: not started")
        return self._create_time

    @property
    def started(self) -> bool:
        return self._popen is not None

    def describe(self) -> str:
        return f"{self.name} (pid {self.pid})" if self.started else self.name

    # -- start ----------------------------------------------------------------------------

    def start(self) -> ChildProcess:
        if self._popen is not None:
            raise DriverError(f"{self.describe()}: already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.stderr_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env}
        with open(self.log_path, "ab") as out:
            err = out if self.stderr_path == self.log_path else open(self.stderr_path, "ab")  # noqa: SIM115
            try:
                self._popen = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    env=env,
                    cwd=self.cwd,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as e:
                raise DriverError(f"cannot start {self.argv[0]}: {e.strerror or e}") from e
            finally:
                if err is not out:
                    err.close()
        try:
            self._create_time = psutil.Process(self._popen.pid).create_time()
        except psutil.NoSuchProcess:
            self._create_time = time.time()
        self._notify("started")
        return self

    # -- exit detection (never reaps before the caller is done with the PID) --------------

    def poll(self) -> int | None:
        """Exit code if the child has exited, else None; does not reap it."""
        if self._result is not None:
            return self._result.returncode
        if self._popen is None:
            raise DriverError(f"{self.name}: not started")
        if self._popen.returncode is not None:
            return self._popen.returncode
        if not hasattr(os, "waitid"):  # no waitid: reap on exit, losing only the PID-hold guarantee
            return self._popen.poll()
        try:
            info = os.waitid(os.P_PID, self._popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return self._popen.poll()
        if info is None:
            return None
        if info.si_code == os.CLD_EXITED:
            return info.si_status
        return -info.si_status

    def running(self) -> bool:
        return self.started and self.poll() is None

    def wait(self, timeout: float | None) -> int | None:
        """Wait for the child's exit (not reaping); its exit code, or None at the deadline."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.005
        while True:
            code = self.poll()
            if code is not None:
                return code
            if deadline is not None and time.monotonic() >= deadline:
                return None
            left = 0.1 if deadline is None else max(0.0, deadline - time.monotonic())
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.1)

    # -- readiness ------------------------------------------------------------------------

    def wait_for_line(self, pattern: str | re.Pattern[str], timeout: float) -> re.Match[str]:
        """Wait until a line of the child's output matches ``pattern`` (searched per line)."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        paths = list(dict.fromkeys([self.log_path, self.stderr_path]))
        readers = {p: _LineReader(p) for p in paths}
        deadline = time.monotonic() + timeout
        while True:
            exited = self.poll()  # read once more after an exit: the line may be its last words
            for reader in readers.values():
                for line in reader.new_lines():
                    m = regex.search(line)
                    if m:
                        return m
            if exited is not None:
                raise DriverError(self._exited_early(exited))
            if time.monotonic() >= deadline:
                raise DriverError(
                    f"{self.describe()} not ready after {timeout:g}s (no line matching "
                    f"{regex.pattern!r}); see {self.log_path}"
                )
            time.sleep(0.02)

    def wait_for_http(self, url: str, timeout: float, *, ok: int = 200) -> None:
        """Poll ``url`` until it answers ``ok``; 503 (loading) and refused connections mean "not yet"."""
        import httpx  # here, not at the top: it costs 0.3 s, and samplers and guards never probe

        deadline = time.monotonic() + timeout
        last = "no answer"
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while True:
                code = self.poll()
                if code is not None:
                    raise DriverError(self._exited_early(code))
                try:
                    status = client.get(url).status_code
                except httpx.HTTPError as e:
                    last = type(e).__name__
                else:
                    if status == ok:
                        return
                    last = f"HTTP {status}"
                if time.monotonic() >= deadline:
                    raise DriverError(
                        f"{self.describe()} not ready after {timeout:g}s ({url}: {last}); see {self.log_path}"
                    )
                time.sleep(0.05)

    def _exited_early(self, code: int) -> str:
        """The error for a child that died while starting, with its last words: its log may live in
        a scratch folder that is removed before anyone could read it."""
        tail: list[str] = []
        for path in dict.fromkeys([self.log_path, self.stderr_path]):
            tail += log_tail(path, EXIT_TAIL_LINES)
        said = "".join(f"\n  | {line}" for line in tail[-EXIT_TAIL_LINES:])
        return (
            f"{self.describe()} exited with code {code} before it was ready; last lines of {self.log_path}:"
            + (said or " (empty)")
        )

    # -- stop -----------------------------------------------------------------------------

    def stop(self, timeout: float | None = None, *, give_up: bool | None = None) -> StopResult:
        """One SIGTERM (never a second), wait up to ``timeout``; SIGKILL the group only if giving up.

        Raises DriverError, leaving the child running, when the deadline passes and the caller
        did not give up; calling again later keeps waiting without another SIGTERM.
        """
        if self._result is not None:
            return self._result
        if self._popen is None:
            raise DriverError(f"{self.name}: not started")
        timeout = self.stop_timeout if timeout is None else timeout
        give_up = self.give_up if give_up is None else give_up
        t0 = time.monotonic()
        pid = self._popen.pid
        how = "terminated"
        if self.poll() is not None and not self._term_sent:
            how = "already-exited"
        elif not self._term_sent:
            self._term_sent = True
            self._notify("sigterm")
            os.kill(pid, signal.SIGTERM)
        code = self.wait(timeout)
        stragglers = self._group_members() if code is not None else []
        if stragglers:
            stragglers = self._wait_group_empty(max(0.0, timeout - (time.monotonic() - t0)))
        if code is None or stragglers:
            if not give_up:
                what = f"pid {pid}" if code is None else f"group {pid} members {stragglers}"
                raise DriverError(
                    f"{self.name}: {what} still running {timeout:g}s after SIGTERM; not killed "
                    f"(not asked to give up); see {self.log_path}"
                )
            self._notify("sigkill")
            # Safe: the leader is not reaped yet, so this group id is still ours.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            how = "killed"
            self.wait(None)
        self._popen.wait()
        self._result = StopResult(pid, self._popen.returncode, how, time.monotonic() - t0)
        self._notify("exited")
        return self._result

    def _group_members(self) -> list[int]:
        """Live members of the child's own process group other than its (exited) leader."""
        pgid = self.pid
        members = []
        for proc in psutil.process_iter(["status"]):
            if proc.pid == pgid or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            try:
                if os.getpgid(proc.pid) == pgid:
                    members.append(proc.pid)
            except (ProcessLookupError, PermissionError):
                continue
        return members

    def _wait_group_empty(self, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        while True:
            members = self._group_members()
            if not members or time.monotonic() >= deadline:
                return members
            time.sleep(0.05)

    def _notify(self, event: str) -> None:
        for listener in list(self.listeners):
            listener(event, self)

    # -- context manager ------------------------------------------------------------------

    def __enter__(self) -> ChildProcess:
        if not self.started:
            try:
                self.start()
            except BaseException:  # a signal between its start and the block: stop it all the same
                if self.started:
                    self.stop()
                raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.started:
            self.stop()

    def __repr__(self) -> str:
        return f"ChildProcess({self.describe()}, argv={self.argv!r})"


EXIT_TAIL_LINES = 8


def log_tail(path: Path, lines: int) -> list[str]:
    """The last `lines` non-empty lines of a log (its last 16 KiB), for an error message."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - (16 << 10)))
            data = handle.read()
    except OSError:
        return []
    text = data.decode("utf-8", "replace").splitlines()
    return [line.rstrip() for line in text if line.strip()][-lines:]


class _LineReader:
    """Reads whole new lines appended to a file since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def new_lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        data = self.partial + data
        *lines, self.partial = data.split(b"\n")
        return [line.decode("utf-8", "replace").rstrip("\r") for line in lines]


def run_to_end(
    argv: Sequence[str],
    *,
    log_path: Path,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    name: str | None = None,
) -> int:
    """Run a short command (a build, ``--version``) as a child; kill its group if it overruns."""
    child = ChildProcess(argv, log_path=log_path, env=env, cwd=cwd, name=name, give_up=True)
    child.start()
    try:
        code = child.wait(timeout)
        if code is None:
            child.stop(timeout=2.0, give_up=True)
            raise DriverError(f"{child.name} did not finish within {timeout:g}s; see {log_path}")
        return child.stop(timeout=2.0).returncode
    except BaseException:
        if child.running():
            child.stop(timeout=2.0, give_up=True)
        raise
