"""`replay record` as a user runs it: the live table, the foreground process, its options."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import time

import anyio
import httpx
import pytest
from rich.console import Console

from replay.engine.apis import make_client
from replay.errors import UsageError
from replay.record.live import RecordView
from replay.record.serve import parse_listen, record
from replay.trace import validate
from tests.support.recordkit import Agent, jsonl, settle, user
from tests.support.scripted_server import Script


def test_live_table_shows_sessions_depth_and_last_request(scripted_server, recording):
    scripted_server.by_id["bad"] = Script(fault="http_error", http_status=503)

    async def drive() -> None:
        async with make_client() as client:
            main = Agent(client, recording.url, "openai", "main system")
            await main.send("m1", user("one"))
            await main.send("m2", user("two"))
            cron = Agent(client, recording.url + "/s/cron-backup", "anthropic", "cron system", stream=False)
            await cron.send("c1", user("backup"))
            with pytest.raises(AssertionError):
                await cron.send("bad", user("backup again"))

    anyio.run(drive)
    settle(recording)
    out = io.StringIO()
    Console(file=out, width=140, color_system=None).print(
        RecordView(recording.recorder, recording.proxy, "up", "t.jsonl")
    )
    text = out.getvalue()
    # the upstream refused the last one: counted, not recorded, not part of the session
    assert re.search(r"recorded\s+3\s+errors\s+0\s+rejected\s+1", text)
    rows = {
        line.split()[0]: line.split()
        for line in text.splitlines()
        if line.strip().startswith(("s1", "cron-backup"))
    }
    assert rows["s1"][1:5] == ["interactive", "openai", "2", "4"]  # 2 requests, the last of 4 messages
    assert rows["cron-backup"][1:5] == ["cron", "anthropic", "1", "2"]
    assert "ok" in rows["cron-backup"] and "upstream rejected a request: HTTP 503" in text


def test_replay_record_runs_in_the_foreground_until_sigterm(scripted_server, tmp_path):
    out = tmp_path / "trace.jsonl"
    code = "import sys; from replay.record.serve import record; sys.exit(record(sys.argv[1], '127.0.0.1:0', sys.argv[2]))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, scripted_server.url, str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        match = re.search(r"listening on (http://127\.0\.0\.1:\d+)", first)
        assert match, first
        url = match.group(1)
        deadline = time.monotonic() + 10
        while True:
            try:
                reply = httpx.post(
                    url + "/v1/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                )
                break
            except httpx.ConnectError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert reply.status_code == 200
        # a body the recorder cannot read leaves a problem line under the live table
        httpx.post(url + "/v1/chat/completions", json={"model": "m", "messages": "not a list"})
        os.kill(proc.pid, signal.SIGTERM)
        rc = proc.wait(15)
        rest = proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)
    assert rc == 0
    assert any(line.startswith(f"{out}: 1 requests") for line in rest.splitlines()), rest  # its own line
    assert rest.endswith("\n")
    summary = " ".join(rest.split())
    assert f"{out}: 1 requests recorded in 1 sessions" in summary and "stopped by SIGTERM" in summary
    assert validate(out)["requests"] == 1
    assert jsonl(out)[0]["source"] == "record"


def test_listen_and_option_errors(tmp_path):
    assert parse_listen("127.0.0.1:8080") == ("127.0.0.1", 8080)
    assert parse_listen(":9000") == ("127.0.0.1", 9000)
    assert parse_listen("9000") == ("127.0.0.1", 9000)
    assert parse_listen("[::1]:7") == ("::1", 7)
    for bad in ("host:port", "1:99999"):
        with pytest.raises(UsageError):
            parse_listen(bad)
    with pytest.raises(UsageError, match="--key"):
        record("http://127.0.0.1:1", "127.0.0.1:0", tmp_path / "t.jsonl", anonymize=True)
    with pytest.raises(UsageError, match="--upstream"):
        record("127.0.0.1:1", "127.0.0.1:0", tmp_path / "t.jsonl", console=Console(file=io.StringIO()))
