"""ChildProcess against real processes: readiness by line and by HTTP, one SIGTERM, SIGKILL only on request."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from drivers.ports import free_port
from drivers.process import ChildProcess, run_to_end
from replay.errors import DriverError

FAKE = str(Path(__file__).with_name("fake_server.py"))


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def decoy(tmp_path: Path):
    """A stranger whose command line is exactly the test server's: it must never be touched."""
    started: list[subprocess.Popen[bytes]] = []

    def make(argv: list[str]) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        started.append(p)
        return p

    yield make
    for p in started:
        assert p.poll() is None, "the decoy was touched"
        os.killpg(p.pid, signal.SIGKILL)  # its own group (it may have forked), which this fixture started
        p.wait()


def test_ready_by_line_then_one_sigterm(tmp_path: Path, decoy) -> None:
    port = free_port()
    terms = tmp_path / "terms"
    argv = [sys.executable, FAKE, "line", str(port), "0.3", str(terms)]
    stranger = decoy(argv)
    child = ChildProcess(argv, log_path=tmp_path / "server.log", stop_timeout=5)
    with child:
        t0 = time.monotonic()
        m = child.wait_for_line(r"listening on (?P<url>http://\S+)", timeout=5)
        assert m.group("url") == f"http://127.0.0.1:{port}"
        assert time.monotonic() - t0 >= 0.2
        assert alive(child.pid)
        assert os.getpgid(child.pid) == child.pid  # its own group, not ours
        assert os.getsid(child.pid) == child.pid
    result = child.stop()
    assert result.how == "terminated" and result.returncode == 0
    assert terms.read_text().split() == [str(child.pid)]  # exactly one SIGTERM, to it alone
    assert not alive(child.pid)
    assert alive(stranger.pid)
    assert "loading model" in (tmp_path / "server.log").read_text()


def test_ready_by_http_probe_waits_through_503(tmp_path: Path, decoy) -> None:
    port = free_port()
    argv = [sys.executable, FAKE, "http", str(port), "0.6"]
    child = ChildProcess(argv, log_path=tmp_path / "server.log", stop_timeout=5)
    with child:
        t0 = time.monotonic()
        child.wait_for_http(f"http://127.0.0.1:{port}/health", timeout=10)
        assert time.monotonic() - t0 >= 0.5
    assert child.stop().how == "terminated"
    log = (tmp_path / "server.log").read_text()
    assert log.count("GET /health") >= 2  # it saw at least one 503 before the 200


def test_exit_before_ready_and_timeout_are_errors(tmp_path: Path) -> None:
    quitter = ChildProcess([sys.executable, "-c", "import sys; sys.exit(3)"], log_path=tmp_path / "q.log")
    with quitter, pytest.raises(DriverError, match="exited with code 3 before it was ready"):
        quitter.wait_for_line("never", timeout=5)
    assert quitter.stop().how == "already-exited"

    port = free_port()
    slow = ChildProcess(
        [sys.executable, FAKE, "line", str(port), "30", str(tmp_path / "t")], log_path=tmp_path / "s.log"
    )
    with slow, pytest.raises(DriverError, match="not ready after 0.3s"):
        slow.wait_for_line("listening on", timeout=0.3)
    assert not alive(slow.pid)

    with pytest.raises(DriverError, match="cannot start"):
        ChildProcess(["/nonexistent/binary"], log_path=tmp_path / "n.log").start()


def test_no_sigkill_unless_asked_then_whole_group(tmp_path: Path, decoy) -> None:
    terms = tmp_path / "terms"
    argv = [sys.executable, FAKE, "stubborn", str(terms)]
    stranger = decoy([sys.executable, FAKE, "stubborn", str(tmp_path / "decoy-terms")])
    child = ChildProcess(argv, log_path=tmp_path / "stubborn.log", stop_timeout=0.4)
    child.start()
    child.wait_for_line("stubborn ready", timeout=5)
    grandchild_file = Path(str(terms) + ".grandchild")
    deadline = time.monotonic() + 5
    while not grandchild_file.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    grandchild = int(grandchild_file.read_text())

    with pytest.raises(DriverError, match="not killed"):
        child.stop()  # give_up defaults to False
    assert alive(child.pid) and alive(grandchild)

    result = child.stop(timeout=0.3, give_up=True)
    assert result.how == "killed"
    assert result.returncode == -signal.SIGKILL
    assert terms.read_text().split() == [str(child.pid)]  # the second stop sent no second SIGTERM
    deadline = time.monotonic() + 2
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not alive(grandchild)
    assert alive(stranger.pid)


def test_listeners_hear_every_step(tmp_path: Path) -> None:
    events: list[tuple[str, int]] = []
    child = ChildProcess(
        [sys.executable, FAKE, "line", str(free_port()), "0", str(tmp_path / "t")],
        log_path=tmp_path / "l.log",
    )
    child.listeners.append(lambda event, c: events.append((event, c.pid)))
    with child:
        child.wait_for_line("listening", timeout=5)
    assert [e for e, _ in events] == ["started", "sigterm", "exited"]
    assert {pid for _, pid in events} == {child.pid}


def test_run_to_end_kills_an_overrunning_command(tmp_path: Path) -> None:
    assert run_to_end([sys.executable, "-c", "print('hi')"], log_path=tmp_path / "a.log", timeout=5) == 0
    assert (tmp_path / "a.log").read_text() == "hi\n"
    t0 = time.monotonic()
    with pytest.raises(DriverError, match="did not finish within 0.3s"):
        run_to_end(
            [sys.executable, "-c", "import time; time.sleep(30)"], log_path=tmp_path / "b.log", timeout=0.3
        )
    assert time.monotonic() - t0 < 5
