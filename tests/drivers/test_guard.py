"""The guard gives the daily service back exactly once, whichever way the run ends.

The daily service is a real process under the `command` manager (tests/drivers/fake_daily.py);
each run happens in its own process (guard_scenario.py) so it can be ended by an exception,
SIGINT, SIGTERM, a max-duration timeout, or kill -9 followed by restore_from_journal. The runs
are independent machines (own ports, own state), so they are driven in parallel threads and each
test then checks one run's outcome.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from drivers.guard import Guard, GuardConfig, load_guard_config, restore_from_journal
from drivers.ports import free_port, port_owners
from replay.errors import DriverError, UsageError

HERE = Path(__file__).parent
DAILY = str(HERE / "fake_daily.py")
SCENARIO = str(HERE / "guard_scenario.py")
PY = sys.executable


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


@dataclass
class Machine:
    """A fake user's machine: a daily service on a port, a pausable job, a decoy, a state dir."""

    root: Path
    state: Path
    port: int
    toml: Path
    journal: Path
    decoy: subprocess.Popen[bytes]
    before_pid: int
    returncode: int | None = None
    stderr: str = ""
    seen: dict[str, object] = field(default_factory=dict)

    @classmethod
    def make(cls, root: Path) -> Machine:
        state = root / "machine"
        state.mkdir()
        port = free_port()
        toml = root / "daily.toml"
        toml.write_text(
            f"""
state_dir = "{root / "guard-state"}"

[service]
manager = "command"
name = "daily"
start = ["{PY}", "{DAILY}", "start", "{state}", "{port}"]
stop = ["{PY}", "{DAILY}", "stop", "{state}"]
status = ["{PY}", "{DAILY}", "status", "{state}"]
pid_file = "{state / "daily.pid"}"
port = {port}
stop_timeout = 10
ready_timeout = 10

[[pause]]
manager = "command"
name = "nightly job"
pause = ["{PY}", "{DAILY}", "pause", "{state}"]
resume = ["{PY}", "{DAILY}", "resume", "{state}"]
status = ["{PY}", "{DAILY}", "jobstatus", "{state}"]
"""
        )
        subprocess.run([PY, DAILY, "start", str(state), str(port)], check=True)
        # Same command line as the daily server's process; its bind fails, so it just sleeps.
        decoy = subprocess.Popen([PY, DAILY, "serve", str(port)], start_new_session=True)
        before = int((state / "daily.pid").read_text())
        return cls(root, state, port, toml, root / "guard-state" / "journal.json", decoy, before)

    def daily_pid(self) -> int:
        return int((self.state / "daily.pid").read_text())

    def child_pid(self) -> int:
        return int((self.state / "out" / "child.pid").read_text())

    def counts(self) -> dict[str, int]:
        return {n: lines(self.state / f"{n}.log") for n in ("starts", "stops", "pauses", "resumes")}

    def scenario(self, mode: str) -> subprocess.Popen[str]:
        out = self.state / "out"
        out.mkdir(exist_ok=True)
        return subprocess.Popen(
            [PY, SCENARIO, mode, str(self.toml), str(free_port()), str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def assert_restored_once(self) -> None:
        assert self.counts() == {"starts": 2, "stops": 1, "pauses": 1, "resumes": 1}, self.stderr
        pid = self.daily_pid()
        assert pid != self.before_pid and alive(pid)
        assert [o.pid for o in port_owners(self.port)] == [pid]
        assert not (self.state / "job.paused").exists()
        assert json.loads(self.journal.read_text())["state"] == "restored"
        assert not alive(self.child_pid())
        terms = (self.state / "out" / "child.terms").read_text().split()
        assert terms == [str(self.child_pid())]  # the test server got exactly one SIGTERM
        assert self.decoy.poll() is None  # same command line as the daily server, never touched

    def cleanup(self) -> None:
        """Kill only what this machine started, by PID."""
        for pid_file in (
            self.state / "daily.pid",
            self.state / "out" / "stranger.pid",
            self.state / "out" / "child.pid",
        ):
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
        self.decoy.kill()
        self.decoy.wait()


def wait_running(proc: subprocess.Popen[str], m: Machine) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line == "RUNNING\n", proc.stderr.read() if proc.stderr else line
    m.seen["during"] = m.counts()
    m.seen["before_alive"] = alive(m.before_pid)


def finish(proc: subprocess.Popen[str], m: Machine) -> None:
    _, m.stderr = proc.communicate(timeout=30)
    m.returncode = proc.returncode


def drive_to_end(mode: str) -> Callable[[Machine], None]:
    def drive(m: Machine) -> None:
        proc = m.scenario(mode)
        wait_running(proc, m)
        finish(proc, m)

    return drive


def drive_signal(sig: int) -> Callable[[Machine], None]:
    def drive(m: Machine) -> None:
        proc = m.scenario("wait")
        wait_running(proc, m)
        try:
            restore_from_journal(m.journal, say=lambda s: None)
        except DriverError as e:
            m.seen["restore_while_running"] = str(e)
        proc.send_signal(sig)
        assert proc.stderr is not None
        first = []
        for line in proc.stderr:  # once the run has taken the first signal, press again
            first.append(line)
            if "received: stopping the run and restoring" in line:
                break
        proc.send_signal(sig)  # an impatient second press must neither break nor repeat the restore
        finish(proc, m)
        m.stderr = "".join(first) + m.stderr

    return drive


def drive_kill9(m: Machine) -> None:
    proc = m.scenario("wait")
    wait_running(proc, m)
    proc.kill()
    finish(proc, m)


CASES: dict[str, Callable[[Machine], None]] = {
    "normal": drive_to_end("normal"),
    "exception": drive_to_end("exception"),
    "timeout": drive_to_end("timeout"),
    "sigint": drive_signal(signal.SIGINT),
    "sigterm": drive_signal(signal.SIGTERM),
    "kill9": drive_kill9,
    "stranger": drive_to_end("stranger"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory):
    machines = {name: Machine.make(tmp_path_factory.mktemp(name)) for name in CASES}
    try:
        with ThreadPoolExecutor(len(CASES)) as pool:
            futures = {name: pool.submit(CASES[name], machines[name]) for name in CASES}
            errors = {name: f.exception() for name, f in futures.items()}
        yield machines, errors
    finally:
        for m in machines.values():
            m.cleanup()


def outcome(runs, name: str) -> Machine:
    machines, errors = runs
    if errors[name] is not None:
        raise errors[name]
    m = machines[name]
    assert m.seen["during"] == {"starts": 1, "stops": 1, "pauses": 1, "resumes": 0}
    assert m.seen["before_alive"] is False  # the daily server was stopped through its manager
    return m


@pytest.mark.parametrize(("name", "code", "said"), [
    ("normal", 0, None),
    ("exception", 1, "RuntimeError: boom"),
    ("timeout", 124, "max duration 2.5s reached"),
    ("sigint", 130, "SIGINT received while restoring; the restore goes on"),
    ("sigterm", 143, "SIGTERM received while restoring; the restore goes on"),
])  # fmt: skip
def test_restored_exactly_once(runs, name: str, code: int, said: str | None) -> None:
    m = outcome(runs, name)
    assert m.returncode == code, m.stderr
    m.assert_restored_once()
    assert f"OK: port {m.port}: pid {m.daily_pid()}" in m.stderr
    if said:
        assert said in m.stderr
    if name == "sigterm":
        assert "holds" in str(m.seen["restore_while_running"])  # the live run restores itself


def test_kill_9_then_restore_from_journal(runs) -> None:
    m = outcome(runs, "kill9")
    assert m.returncode == -signal.SIGKILL
    assert alive(m.child_pid())  # the tool died; its test server did not
    assert m.counts()["starts"] == 1 and json.loads(m.journal.read_text())["state"] == "running"
    with pytest.raises(DriverError, match="did not finish its restore; run `replay restore` first"):  # noqa: SIM117
        with Guard(load_guard_config(m.toml)):
            pass
    said: list[str] = []
    report = restore_from_journal(m.journal, say=said.append)
    assert report.ok and report.port_check is not None and report.port_check.ok
    m.assert_restored_once()
    assert any(f"(pid {m.child_pid()}): terminated" in s for s in said)
    again: list[str] = []
    restore_from_journal(m.journal, say=again.append)
    assert "nothing to do" in again[0]
    assert m.counts() == {"starts": 2, "stops": 1, "pauses": 1, "resumes": 1}


def test_port_owner_check_fails_loudly_for_a_stranger(runs) -> None:
    m = outcome(runs, "stranger")
    stranger = int((m.state / "out" / "stranger.pid").read_text())
    assert m.returncode == 1, m.stderr
    assert f"PROBLEM: port {m.port} is held by pid {stranger}" in m.stderr
    assert f"NOT by command-managed daily (main pid {m.daily_pid()})" in m.stderr
    assert "exit: DriverError: port" in m.stderr
    assert m.counts() == {"starts": 2, "stops": 1, "pauses": 1, "resumes": 1}  # restored all the same


def test_two_runs_never_fight(tmp_path: Path) -> None:
    config = GuardConfig(state_dir=tmp_path)
    holder = f"another agent-replay run \\(pid {os.getpid()}\\) holds"
    with Guard(config, say=lambda s: None), pytest.raises(DriverError, match=holder):
        Guard(config).__enter__()
    with Guard(config, say=lambda s: None):  # the lock went with the first run
        pass


def test_dry_run_prints_and_touches_nothing(tmp_path: Path) -> None:
    m = Machine.make(tmp_path)
    try:
        said: list[str] = []
        with Guard(load_guard_config(m.toml), dry_run=True, say=said.append):
            pass
        assert m.counts() == {"starts": 1, "stops": 0, "pauses": 0, "resumes": 0}
        assert not m.journal.exists()
        text = "\n".join(said)
        assert "dry-run: would take the lock" in text
        assert f"dry-run: would stop command-managed daily: {PY} {DAILY} stop {m.state}" in text
        assert "dry-run: would stop command-managed nightly job" in text
        assert f"dry-run: would start command-managed daily: {PY} {DAILY} start" in text
        assert "dry-run: would start command-managed nightly job" in text
        assert f"would check that port {m.port}" in text
    finally:
        m.cleanup()


def test_service_file_problems(tmp_path: Path) -> None:
    bad = tmp_path / "s.toml"
    bad.write_text("[service]\nmanager = 'command'\nstart = 'x'\nstop = 'y'\nport = 8000\n")
    with pytest.raises(UsageError, match=r"s.toml \[service\]: the port check needs the service's PID"):
        load_guard_config(bad)
    bad.write_text("[service]\nmanager = 'upstart'\n")
    with pytest.raises(UsageError, match="manager must be one of systemd, launchd, command"):
        load_guard_config(bad)
    bad.write_text("[[pause]]\nmanager = 'systemd'\n")
    with pytest.raises(UsageError, match=r"\[\[pause\]\] #1: manager 'systemd' needs 'unit'"):
        load_guard_config(bad)
    bad.write_text("[[pause]]\nmanager = 'systemd'\nunit = 'x.timer'\nusr = true\n")
    with pytest.raises(UsageError, match="unknown key 'usr'"):
        load_guard_config(bad)


def _user_systemd() -> str | None:
    """Why systemd --user cannot be used here, or None when it can."""
    try:
        out = subprocess.run(
            ["systemctl", "--user", "is-system-running"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except FileNotFoundError:
        return "systemctl is not installed"
    state = out.stdout.strip() or out.stderr.strip()
    if state not in ("running", "degraded"):
        return f"`systemctl --user is-system-running` says {state!r}: no user systemd manager on this machine"
    return None


@pytest.mark.skipif(_user_systemd() is not None, reason=str(_user_systemd()))
def test_systemd_user_unit_restored(tmp_path: Path) -> None:
    port = free_port()
    unit = f"agent-replay-test-{os.getpid()}.service"
    unit_dir = Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config")) / "systemd" / "user"
    unit_dir.mkdir(parents=True, exist_ok=True)
    unit_file = unit_dir / unit
    unit_file.write_text(f"[Service]\nExecStart={PY} {DAILY} serve {port}\n")
    ctl = ["systemctl", "--user"]
    subprocess.run([*ctl, "daemon-reload"], check=True)
    try:
        subprocess.run([*ctl, "start", unit], check=True)
        deadline = time.monotonic() + 10
        while not port_owners(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        before = port_owners(port)[0].pid
        toml = tmp_path / "d.toml"
        toml.write_text(
            f'state_dir = "{tmp_path / "st"}"\n[service]\nmanager = "systemd"\nunit = "{unit}"\nuser = true\n'
            f"port = {port}\nready_timeout = 10\n"
        )
        said: list[str] = []
        with Guard(load_guard_config(toml), say=said.append):
            assert not port_owners(port)
        after = port_owners(port)
        assert len(after) == 1 and after[0].pid != before
        assert any(s.startswith(f"OK: port {port}: pid {after[0].pid}") for s in said)
        assert json.loads((tmp_path / "st" / "journal.json").read_text())["state"] == "restored"
    finally:
        subprocess.run([*ctl, "stop", unit], check=False)
        unit_file.unlink()
        subprocess.run([*ctl, "daemon-reload"], check=False)
