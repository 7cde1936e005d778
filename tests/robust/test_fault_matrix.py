"""The fault matrix, end to end through `replay run`: whatever one request's server does, every trace
request gets exactly one results line with the right status, and the run writes its summary."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from typer.testing import CliRunner

from replay.cli import app
from tests.support.scripted_server import Script, ScriptedServer
from tests.support.trace_strategies import write_trace

pytestmark = pytest.mark.e2e

SCRIPTED = str(Path(__file__).parent.parent / "support" / "scripted_server.py")
TIMEOUT_S = 1.5


def wrong_shape(api: str) -> list[bytes]:
    if api == "openai":
        return [
            b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n',
            b'data: {"choices":[{"delta":"str"}]}\n\n',
        ]
    if api == "openai-responses":
        return [
            b'event: response.created\ndata: {"type":"response.created","response":{"id":"resp_1"}}\n\n',
            b'event: response.output_item.added\ndata: {"type":"response.output_item.added","output_index":0,"item":"function_call"}\n\n',
        ]
    return [
        b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":3}}}\n\n',
        b'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":"text"}\n\n',
    ]


def cut_short(api: str) -> list[bytes]:
    """A stream that stops in the middle of an event: the connection closes cleanly."""
    if api == "openai":
        return [b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n', b'data: {"choices":[{"del']
    if api == "openai-responses":
        return [
            b'event: response.created\ndata: {"type":"response.created","response":{"id":"resp_1"}}\n\n',
            b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","output_index":0,"delta":"hi"}\n\n',
            b"event: response.output_text.delta\ndata: {",
        ]
    return [
        b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":3}}}\n\n',
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}\n\n',
        b"event: content_block_delta\ndata: {",
    ]


# fault name -> (script for the faulty request, expected status, words in its error)
FAULTS: dict[str, tuple[Any, str, str]] = {
    "http 500": (lambda api: Script(fault="http_error", http_status=500), "http_error", "HTTP 500"),
    "close mid-stream": (lambda api: Script(raw=cut_short(api)), "stream_broken", "stream ended without"),
    "reset mid-stream": (
        lambda api: Script(fault="reset_mid_stream", fault_after=2, tokens=5),
        "stream_broken",
        "connection failed",
    ),
    "hang before headers": (lambda api: Script(fault="hang", hang_s=20), "timeout", "no complete response"),
    "hang mid-stream": (
        lambda api: Script(fault="hang_mid_stream", fault_after=2, tokens=5, hang_s=20),
        "timeout",
        "no complete response",
    ),
    "malformed SSE": (lambda api: Script(fault="bad_json", fault_after=1), "stream_broken", "not JSON"),
    "error event": (
        lambda api: Script(fault="event_error", fault_after=1),
        "server_error",
        "scripted failure",
    ),
    "wrong-shaped JSON": (lambda api: Script(raw=wrong_shape(api)), "bad_payload", "wrong reply shape"),
}


def two_sessions(path: Path, api: str) -> Path:
    """Two sessions of two turns each: requests 1-4, the second turn of each extends the first."""
    lines: list[dict[str, Any]] = [{"kind": "trace", "format": "agent-replay-trace/1"}]
    for sid in ("a", "b"):
        lines.append({"kind": "session", "id": sid, "api": api, "model": "m"})
    turns = [(1, "a", None), (2, "b", None), (3, "a", 1), (4, "b", 2)]
    for rid, sid, parent in turns:
        req: dict[str, Any] = {
            "kind": "request",
            "id": rid,
            "session": sid,
            "t": 0,
            "params": {"max_tokens": 8},
        }
        if parent is None:
            req["append"] = [{"role": "user", "content": f"hello from {sid}"}]
        else:
            req.update(
                parent=parent, keep=1, append=[{"$reply": parent}, {"role": "user", "content": "and then?"}]
            )
        lines.append(req)
    return write_trace(path, lines)


def results(out: Path) -> tuple[dict[int, dict[str, Any]], list[dict[str, Any]]]:
    rows = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    requests = [r for r in rows if r["kind"] == "request"]
    by_id = {r["id"]: r for r in requests}
    assert len(by_id) == len(requests), "a request has two lines"
    return by_id, [r for r in rows if r["kind"] == "summary"]


@pytest.mark.parametrize("api", ["openai", "anthropic", "openai-responses"])
@pytest.mark.parametrize("plan", ["alternate", "overlap"])
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_one_faulty_reply_is_one_failed_line_and_the_run_completes(
    tmp_path: Path, scripted_server: ScriptedServer, fault: str, plan: str, api: str
) -> None:
    make, status, words = FAULTS[fault]
    scripted_server.by_trace_id[2] = make(api)
    trace = two_sessions(tmp_path / "t.jsonl", api)
    out = tmp_path / "r.jsonl"
    args = ["run", str(trace), "--target", scripted_server.url, "--out", str(out), "--quiet"]
    args += ["--plan", plan, "--timeout", str(TIMEOUT_S)] + (
        ["--concurrency", "2"] if plan == "overlap" else []
    )
    result = CliRunner().invoke(app, args)
    assert isinstance(result.exception, SystemExit) or result.exception is None, repr(result.exception)
    assert result.exit_code == 1  # a request failed
    by_id, summary = results(out)
    assert sorted(by_id) == [1, 2, 3, 4]
    assert by_id[2]["status"] == status, by_id[2]
    assert words in by_id[2]["error"] and "\n" not in by_id[2]["error"]
    assert all(by_id[i]["status"] == "ok" for i in (1, 3, 4)), [by_id[i]["error"] for i in (1, 3, 4)]
    assert len(summary) == 1 and summary[0]["outcome"] == "done" and summary[0]["errors"] == 1
    if status == "bad_payload":
        assert by_id[2]["evidence"]


class ChildScripted:
    """The scripted server in its own process, so a test can kill it by PID mid-run."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, SCRIPTED, "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        match = re.match(r"PORT (\d+)", line)
        assert match, line
        self.url = f"http://127.0.0.1:{match.group(1)}"

    def seen(self) -> int:
        try:
            return len(httpx.get(self.url + "/_seen", timeout=2).json())
        except httpx.HTTPError:
            return 0

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


@pytest.mark.parametrize("api", ["openai", "anthropic"])
@pytest.mark.parametrize("plan", ["alternate", "overlap"])
def test_a_server_killed_mid_run_fails_the_rest_one_line_each(tmp_path: Path, plan: str, api: str) -> None:
    server = ChildScripted("--tokens", "40", "--token-interval-s", "0.05")
    try:
        trace = two_sessions(tmp_path / "t.jsonl", api)
        out = tmp_path / "r.jsonl"
        args = [sys.executable, "-m", "replay", "run", str(trace), "--target", server.url, "--out", str(out)]
        args += ["--quiet", "--plan", plan, "--timeout", "20"] + (
            ["--concurrency", "2"] if plan == "overlap" else []
        )
        run = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while server.seen() < 2 and time.monotonic() < deadline:  # the second request is in flight
            time.sleep(0.05)
        server.kill()
        _, stderr = run.communicate(timeout=60)
        assert run.returncode == 1, stderr
    finally:
        server.kill()
    by_id, summary = results(out)
    assert sorted(by_id) == [1, 2, 3, 4]
    statuses = [by_id[i]["status"] for i in (1, 2, 3, 4)]
    assert by_id[2]["status"] == "stream_broken"  # cut off in flight
    # Sent after the kill: refused, or (a race with the dying listener's backlog) reset before any answer.
    assert by_id[4]["status"] == "connect_error" or "before response headers" in by_id[4]["error"], by_id[4]
    assert set(statuses) <= {"ok", "stream_broken", "connect_error"}
    assert len(summary) == 1 and summary[0]["errors"] == statuses.count("stream_broken") + statuses.count(
        "connect_error"
    )
