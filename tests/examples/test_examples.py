"""Every example TOML in `examples/` is exercised by a dry run of `replay run`.

The server binaries and service managers are stand-ins on PATH that note every call: a dry run
may read a service's state (`systemctl show`, `launchctl print`, a status command) but must start,
stop or run nothing, so the test fails if any stand-in is asked to do more than that.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TRACE = ROOT / "traces" / "sample.jsonl"
SERVERS = sorted((EXAMPLES / "servers").glob("*.toml"))
SERVICES = sorted((EXAMPLES / "services").glob("*.toml"))

# name -> shell body; each appends its argv to $CALLS first. Read-only queries answer as a machine
# whose daily server runs (PID 4242); anything else is a call a dry run must never make.
STAND_INS = {
    "ds4-server": "exit 1",
    "llama-server": "exit 1",
    "vllm": "exit 1",
    "systemctl": 'case " $* " in *" show "*) printf "ActiveState=active\\nMainPID=4242\\nLoadState=loaded\\n";; *) exit 1;; esac',
    "launchctl": 'case "$1" in print) printf "\\tpid = 4242\\n";; *) exit 1;; esac',
    "tmux": 'case "$1" in has-session) exit 0;; *) exit 1;; esac',
    "crontab": "exit 1",
}
READ_ONLY = ("systemctl --user show", "launchctl print", "tmux has-session")


@pytest.fixture
def machine(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH finds the stand-ins first and whose HOME is empty."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in STAND_INS.items():
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> "$CALLS"\n{body}\n')
        script.chmod(0o755)
    home = tmp_path / "home"
    (home / ".local/state/ds4").mkdir(parents=True)
    (home / ".local/state/ds4/ds4.pid").write_text("4242\n")  # examples/services/commands.toml
    return {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(home),
        "CALLS": str(tmp_path / "calls.txt"),
    }


def _dry_run(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replay", "run", str(TRACE), "--dry-run", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
    )


def _calls(env: dict[str, str]) -> list[str]:
    path = Path(env["CALLS"])
    return path.read_text().splitlines() if path.exists() else []


def test_there_is_an_example_per_server_kind_and_service_manager() -> None:
    kinds = {
        line.split('"')[1] for p in SERVERS for line in p.read_text().splitlines() if line.startswith("kind")
    }
    managers = {
        line.split('"')[1]
        for p in SERVICES
        for line in p.read_text().splitlines()
        if line.startswith("manager")
    }
    assert kinds == {"ds4", "llamacpp", "vllm", "sglang", "sim"}
    assert managers == {"systemd", "launchd", "command"}


@pytest.mark.parametrize("server", SERVERS, ids=lambda p: p.stem)
def test_a_server_example_dry_runs_and_starts_nothing(
    server: Path, machine: dict[str, str], tmp_path: Path
) -> None:
    done = _dry_run(machine, tmp_path, "--server", str(server))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "would start:" in done.stdout
    assert "--port" in done.stdout
    assert _calls(machine) == []
    assert not (tmp_path / "results.jsonl").exists()


@pytest.mark.parametrize("service", SERVICES, ids=lambda p: p.stem)
def test_a_service_example_dry_runs_and_only_reads_state(
    service: Path, machine: dict[str, str], tmp_path: Path
) -> None:
    done = _dry_run(
        machine, tmp_path, "--server", str(EXAMPLES / "servers" / "sim-64g.toml"), "--service", str(service)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    said = done.stdout + done.stderr
    assert "dry-run: would take the lock" in said
    # The service and the job it pauses, each stopped and given back (launchd says boot out/bootstrap).
    assert len(re.findall(r"^dry-run: would (stop|boot out) ", said, re.MULTILINE)) == 2
    assert len(re.findall(r"^dry-run: would (start|bootstrap) ", said, re.MULTILINE)) == 2
    assert all(call.startswith(READ_ONLY) for call in _calls(machine)), _calls(machine)


def test_the_simulator_example_keeps_its_budget_in_effect(tmp_path: Path) -> None:
    """Its budget is only in effect with a disk directory: the example must set one."""
    text = (EXAMPLES / "servers" / "sim-64g.toml").read_text()
    assert 'kv_disk_dir = "auto"' in text and '"--kv-disk-space-mb", "65536"' in text


def test_the_agents_examples_serve_the_simulator_as_fast_as_just_agents_does() -> None:
    """At the default time scale the simulator takes a real server's time: Claude Code waited 41 s
    for its first token. Every `replay sim serve` line shown for agents runs as `just agents` does."""
    from replay.sim.server.options import parse

    agents = (ROOT / "tests" / "agents" / "test_agents_live.py").read_text()
    (scale,) = re.findall(r'"--time-scale", "([0-9.]+)"', agents)
    lines = [
        line
        for doc in (EXAMPLES / "agents" / "README.md", ROOT / "README.md")
        for line in doc.read_text().splitlines()
        if line.startswith("replay sim serve") and "--tool-call-rate" in line
    ]
    assert len(lines) == 2
    for line in lines:
        argv = shlex.split(line.split("#")[0].rstrip(" &"))[3:]
        assert parse(argv)[1].time_scale == float(scale), line


@pytest.mark.parametrize("server", ["ds4", "llama-server", "vllm"])
def test_a_dry_run_without_the_server_installed_shows_the_plan_and_says_what_is_missing(
    server: str, machine: dict[str, str], tmp_path: Path
) -> None:
    env = {**machine, "PATH": str(Path(sys.executable).parent)}  # none of the stand-ins, no server
    binary = {"ds4": "ds4-server"}.get(server, server)
    done = _dry_run(env, tmp_path, "--server", str(EXAMPLES / "servers" / f"{server}.toml"))
    assert done.returncode == 0, done.stdout + done.stderr
    said = " ".join((done.stdout + done.stderr).split())
    assert f"would start: {'DS4_LOCK_FILE=' if server == 'ds4' else ''}" in said
    assert f"warning: {binary} is not installed here" in said
    assert f"set binary = '/path/to/{binary}'" in said
    assert not (tmp_path / "results.jsonl").exists()


def test_a_real_run_without_the_server_installed_still_refuses(
    machine: dict[str, str], tmp_path: Path
) -> None:
    env = {**machine, "PATH": str(Path(sys.executable).parent)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "replay",
            "run",
            str(TRACE),
            "--server",
            str(EXAMPLES / "servers" / "ds4.toml"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 2 and "binary 'ds4-server' is not on PATH" in done.stderr
