"""Bad options are refused before anything starts; a crashed run's restore is found from its service
TOML; importers refuse the wrong format; interrupted and time-limited runs say what happened."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest

from drivers.process import ChildProcess
from replay.errors import DriverError
from tests.support.scripted_server import Script, ScriptedServer
from tests.support.trace_strategies import write_trace

PY = sys.executable
DAILY = str(Path(__file__).parent.parent / "drivers" / "fake_daily.py")


def replay(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "replay", *args], capture_output=True, text=True, timeout=timeout)


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [
        line
        for line in proc.stderr.splitlines()
        if line.strip() and "RuntimeWarning" not in line and "COMPILED" not in line
    ]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def small_trace(path: Path, n: int = 3, api: str = "openai", sessions: int = 1) -> Path:
    names = ["s"] if sessions == 1 else [f"s{k}" for k in range(sessions)]
    lines: list[dict[str, Any]] = [{"kind": "trace", "format": "agent-replay-trace/1"}]
    lines += [{"kind": "session", "id": name, "api": api, "model": "m"} for name in names]
    for rid in range(1, n + 1):
        lines.append(
            {
                "kind": "request",
                "id": rid,
                "session": names[rid % sessions],
                "t": 0,
                "append": [{"role": "user", "content": f"q{rid}"}],
                "params": {"max_tokens": 4},
            }
        )
    return write_trace(path, lines)


@pytest.mark.parametrize(
    ("option", "words"),
    [
        (["--concurrency", "0", "--plan", "overlap"], "--concurrency must be at least 1"),
        (["--timeout", "-5"], "--timeout must be"),
        (["--timeout", "0"], "--timeout must be"),
        (["--speed", "0", "--plan", "timed"], "--speed must be"),
        (["--workers", "0"], "--workers must be at least 1"),
        (["--max-duration", "-1"], "--max-duration must be"),
        (["--target", "sim:nonsense"], "unknown simulator preset 'nonsense'"),
        (["--sim-args", "--kv-disk-space-mb lots"], "--sim-args:"),
        (["--target", "ftp://x"], "--target must be"),
    ],
)
def test_a_bad_option_is_one_line_exit_2_and_nothing_starts(
    tmp_path: Path, option: list[str], words: str
) -> None:
    trace = small_trace(tmp_path / "t.jsonl")
    out = tmp_path / "r.jsonl"
    proc = replay("run", str(trace), "--out", str(out), "--quiet", *option)
    assert proc.returncode == 2, proc.stderr
    assert words in one_line_error(proc)
    assert not out.exists()  # nothing was sent


def test_a_child_that_dies_while_starting_shows_its_last_log_lines(tmp_path: Path) -> None:
    code = "import sys; print('loading model'); print('error: out of memory', file=sys.stderr); sys.exit(3)"
    child = ChildProcess([PY, "-c", code], log_path=tmp_path / "child.log")
    with pytest.raises(DriverError) as caught, child:
        child.wait_for_line("listening", timeout=20)
    text = str(caught.value)
    assert "exited with code 3 before it was ready" in text
    assert "error: out of memory" in text and "loading model" in text


def test_import_of_the_wrong_format_is_exit_2_at_a_line(tmp_path: Path) -> None:
    src = tmp_path / "not-sharegpt.jsonl"
    src.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n')
    out = tmp_path / "t.jsonl"
    proc = replay("import", "sharegpt", str(src), str(out))
    assert proc.returncode == 2
    assert one_line_error(proc).startswith(f"error: {src}:1: not a ShareGPT file")
    assert not out.exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("workers", [1, 2, 4])
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_restore_with_the_service_toml_finds_a_custom_state_dir_and_removes_the_scratch(
    tmp_path: Path, how: str, workers: int
) -> None:
    """Killed outright, `replay restore` gives the machine back; stopped by SIGTERM, the run does
    it itself. Either way no worker, child or scratch folder is left and the service is back."""
    state = tmp_path / "machine"
    state.mkdir()
    port = free_port()
    custom = tmp_path / "custom-state"
    toml = tmp_path / "daily.toml"
    toml.write_text(
        f"""state_dir = "{custom}"
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
"""
    )
    subprocess.run([PY, DAILY, "start", str(state), str(port)], check=True, timeout=30)
    trace = small_trace(tmp_path / "t.jsonl", n=40, sessions=4)
    out = tmp_path / "r.jsonl"
    # Modelled time at its own pace: the run lasts long enough to be killed in the middle.
    run = subprocess.Popen(
        [
            PY,
            "-m",
            "replay",
            "run",
            str(trace),
            "--service",
            str(toml),
            "--out",
            str(out),
            "--quiet",
            "--sim-args",
            "--time-scale 1 --decode-tps 20",
            "--workers",
            str(workers),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    journal = custom / "journal.json"
    children: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            files = [out] if workers == 1 else list(tmp_path.glob("r.part*of*.jsonl"))
            if journal.exists() and any(f.exists() and b'"kind":"request"' in f.read_bytes() for f in files):
                break
            assert run.poll() is None, run.stderr.read() if run.stderr else ""
            time.sleep(0.05)
        data = json.loads(journal.read_text())
        children = [c["pid"] for c in data["children"]]
        scratch = Path(data["scratch"]).parent
        assert scratch.name.startswith("replay-scratch-") and scratch.is_dir()
        shards = [c.pid for c in psutil.Process(run.pid).children() if "spawn_main" in " ".join(c.cmdline())]
        assert len(shards) == (workers if workers > 1 else 0)
        if how == "SIGKILL":
            os.kill(run.pid, signal.SIGKILL)
            run.wait(10)
            proc = replay("restore", "--service", str(toml))
            assert proc.returncode == 0, proc.stdout + proc.stderr
        else:
            os.kill(run.pid, signal.SIGTERM)
            assert run.wait(60) == 143
            summary = orjson.loads(_summary_line(out))
            assert summary["outcome"] == "SIGTERM"
        deadline = time.monotonic() + 5
        while any(alive(pid) for pid in shards) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(pid) for pid in shards)
        assert not scratch.exists()
        assert json.loads(journal.read_text())["state"] == "restored"
        assert alive(int((state / "daily.pid").read_text()))
        assert not any(alive(pid) for pid in children)
    finally:
        if run.poll() is None:
            os.kill(run.pid, signal.SIGKILL)
        for pid in children:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        subprocess.run([PY, DAILY, "stop", str(state)], timeout=30)


def _summary_line(out: Path) -> bytes:
    return next(line for line in reversed(out.read_bytes().splitlines()) if b'"kind":"summary"' in line)


def test_a_time_limited_run_says_what_finished_and_what_was_cut_off(
    tmp_path: Path, scripted_server: ScriptedServer
) -> None:
    scripted_server.queue.extend([Script(), Script(fault="hang", hang_s=30)])
    trace = small_trace(tmp_path / "t.jsonl", n=3)
    out = tmp_path / "r.jsonl"
    proc = replay(
        "run",
        str(trace),
        "--target",
        scripted_server.url,
        "--out",
        str(out),
        "--quiet",
        "--max-duration",
        "2",
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        f"stopped by --max-duration: 1 of 3 requests finished (0 failed), 1 cancelled in flight, 1 not sent; "
        f"results in {out}"
    ) in proc.stderr
    rows = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert [r["status"] for r in rows if r["kind"] == "request"] == ["ok", "cancelled"]
    assert [r["outcome"] for r in rows if r["kind"] == "summary"] == ["max-duration"]


def test_ctrl_c_says_what_finished_and_what_was_cut_off(
    tmp_path: Path, scripted_server: ScriptedServer
) -> None:
    scripted_server.queue.extend([Script(), Script(fault="hang", hang_s=30)])
    trace = small_trace(tmp_path / "t.jsonl", n=3)
    out = tmp_path / "r.jsonl"
    run = subprocess.Popen(
        [PY, "-m", "replay", "run", str(trace), "--target", scripted_server.url, "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    deadline = time.monotonic() + 30
    while len(scripted_server.seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)
    run.send_signal(signal.SIGINT)
    stdout, stderr = run.communicate(timeout=30)
    assert run.returncode == 130, stderr
    assert (
        "interrupted (Ctrl-C): 1 of 3 requests finished (0 failed), 1 cancelled in flight, 1 not sent"
        in stdout
    )


def test_probe_json_is_json_alone_on_stdout(tmp_path: Path) -> None:
    proc = replay(
        "probe", "--target", "sim", "--out", str(tmp_path / "p"), "--param", "document=500", "--json"
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)  # nothing but the document
    assert len(report["steps"]) == 7 and report["steps"][-1]["server_process"] == 1
    assert "restarted the server before request 7" in proc.stderr  # progress went to stderr
