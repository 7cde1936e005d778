"""End to end: `python -m replay.sim` as a child process on a free port, driven over HTTP.

Each test starts its own server (explicit PID, 127.0.0.1, `--port 0`), waits for ds4's
`listening on` line, and stops it with one SIGTERM by PID. Time runs 1000x faster than modelled.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from replay.sim.model.config import config_for
from replay.sizing import SweepRequest, jobs_from_requests, sweep
from replay.trace.synth import synth_text

pytestmark = pytest.mark.e2e

TOOLS = [
    {"type": "function", "function": {"name": "bash", "description": "run", "parameters": {"type": "object"}}}
]
ANTHROPIC_TOOLS = [{"name": "bash", "description": "run", "input_schema": {"type": "object"}}]
LISTENING = re.compile(r"^\d{4} \d{2}:\d{2}:\d{2} ds4-server: listening on http://127\.0\.0\.1:(\d+)$")


class SimServer:
    """One simulator child process; its stderr (the ds4 log) is collected line by line."""

    def __init__(self, *args: str, scale: float = 1000.0) -> None:
        cmd = [sys.executable, "-m", "replay.sim", "--port", "0", "--time-scale", str(scale), *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        port = self.wait_for(LISTENING, timeout=30).group(1)
        self.base = f"http://127.0.0.1:{port}"

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: re.Pattern[str] | str, timeout: float = 10.0) -> re.Match[str]:
        rx = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if m := rx.search(line):
                    return m
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.01)
        raise AssertionError(f"no line matching {rx.pattern!r}; log:\n" + "\n".join(self.lines))

    def messages(self) -> list[str]:
        return [line.split(" ds4-server: ", 1)[1] for line in self.lines if " ds4-server: " in line]

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        rc = self.proc.wait(timeout)
        self._reader.join(5)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    servers: list[SimServer] = []

    def _start(*args: str, scale: float = 1000.0) -> SimServer:
        server = SimServer(*args, scale=scale)
        servers.append(server)
        return server

    yield _start
    for server in servers:
        server.kill()


def sse_events(response: httpx.Response) -> tuple[list[str], list[tuple[str | None, Any]]]:
    """(comment lines, [(event name, data)]) of an SSE response."""
    comments, events, name = [], [], None
    for line in response.iter_lines():
        if not line:
            continue
        if line.startswith(":"):
            comments.append(line)
        elif line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data = line[6:]
            events.append((name, data if data == "[DONE]" else orjson.loads(data)))
            name = None
    return comments, events


def conversation(system_tokens: int = 3_000, user_tokens: int = 5_000, seed: int = 1) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": synth_text(system_tokens, seed)},
        {"role": "user", "content": synth_text(user_tokens, seed + 1)},
    ]


def openai_stream(
    base: str, messages: list[dict[str, Any]], max_tokens: int, tools: Any = TOOLS, **headers: str
) -> tuple[list[str], list[Any], httpx.Headers]:
    body = {"model": "m", "messages": messages, "tools": tools, "max_tokens": max_tokens, "stream": True}
    body["stream_options"] = {"include_usage": True}
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, headers=headers, timeout=60) as r:
        assert r.status_code == 200
        comments, events = sse_events(r)
        return comments, [data for _, data in events], r.headers


def test_openai_stream_tool_call_usage_and_live_continuation(start: Any, tmp_path: Path) -> None:
    server = start("--kv-disk-dir", str(tmp_path / "kv"))
    messages = conversation()
    _, chunks, headers = openai_stream(server.base, messages, 40, **{"X-Replay-Finish": "tool_calls"})
    assert headers["connection"] == "close" and headers["content-type"].startswith("text/event-stream")
    assert chunks[-1] == "[DONE]"
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    calls = [
        c["choices"][0]["delta"]["tool_calls"][0]
        for c in chunks[:-2]
        if "tool_calls" in c["choices"][0]["delta"]
    ]
    call_id, name = calls[0]["id"], calls[0]["function"]["name"]
    arguments = "".join(c["function"].get("arguments", "") for c in calls)
    assert name == "bash" and isinstance(orjson.loads(arguments), dict)
    assert chunks[-3]["choices"][0]["finish_reason"] == "tool_calls"
    usage_chunk = chunks[-2]
    assert usage_chunk["choices"] == []
    usage, x_sim = usage_chunk["usage"], usage_chunk["x_sim"]
    prompt = usage["prompt_tokens"]
    assert usage["completion_tokens"] == 40 and usage["total_tokens"] == prompt + 40
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": prompt}
    assert set(x_sim) == {
        "queue_s",
        "restore_s",
        "evict_save_s",
        "prefill_s",
        "decode_s",
        "total_s",
        "cache_source",
        "slot",
    }
    assert x_sim["cache_source"] == "none"
    assert prompt / 510.0 < x_sim["prefill_s"] < prompt / 510.0 + 0.2  # plus the mid-prefill cold save
    # the agent sends the reply back (live history) plus a tool result: a live hit
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": synth_text(2_000, 9)},
    ]
    _, chunks, _ = openai_stream(server.base, messages, 30)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-2] if c["choices"])
    assert len(text.split()) == 30
    second = chunks[-2]
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == prompt + 40
    assert second["x_sim"]["cache_source"] == "live"
    server.wait_for(rf"chat ctx={prompt + 40}\.\.\d+:\d+ gen=30 TOOLS finish=stop")
    log = server.messages()
    assert f"chat ctx=0..{prompt}:{prompt} TOOLS prompt start" in log
    assert any(m.startswith("tool calls ctx=") and f"ids=[{call_id}] names=[bash]" in m for m in log)
    assert server.stop() == 0


def test_anthropic_messages_usage_tool_use_and_shared_rendering(start: Any, tmp_path: Path) -> None:
    server = start()
    messages = conversation()
    body = {
        "model": "claude",
        "system": messages[0]["content"],
        "messages": [{"role": "user", "content": messages[1]["content"]}],
        "tools": ANTHROPIC_TOOLS,
        "max_tokens": 40,
    }
    r = httpx.post(
        f"{server.base}/v1/messages", json=body, headers={"X-Replay-Finish": "tool_calls"}, timeout=60
    )
    assert r.status_code == 200 and r.headers["connection"] == "close"
    msg = r.json()
    assert msg["stop_reason"] == "tool_use" and msg["usage"]["input_tokens"] == 0
    prompt = msg["usage"]["cache_creation_input_tokens"]
    assert msg["usage"]["cache_read_input_tokens"] == 0 and msg["usage"]["output_tokens"] == 40
    (tool_use,) = [b for b in msg["content"] if b["type"] == "tool_use"]
    assert isinstance(tool_use["input"], dict) and msg["x_sim"]["cache_source"] == "none"
    body["messages"] += [
        {"role": "assistant", "content": msg["content"]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": tool_use["id"], "content": synth_text(500, 4)}
            ],
        },
    ]
    body["stream"] = True
    with httpx.stream("POST", f"{server.base}/v1/messages", json=body, timeout=60) as resp:
        _, events = sse_events(resp)
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    start_usage = events[0][1]["message"]["usage"]
    assert start_usage["cache_read_input_tokens"] == prompt + 40  # the tool_use round trip is byte-exact
    assert start_usage["input_tokens"] == 0 and start_usage["output_tokens"] == 0
    delta = events[-2][1]
    assert delta["usage"] == {"output_tokens": 40} and delta["x_sim"]["cache_source"] == "live"
    assert "text_delta" in {d["delta"]["type"] for n, d in events if n == "content_block_delta"}
    # an OpenAI client continuing the same conversation renders to the same prompt: still live
    last_text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    oa = [
        {"role": "system", "content": body["system"]},
        {"role": "user", "content": messages[1]["content"]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": tool_use["id"],
                    "type": "function",
                    "function": {"name": "bash", "arguments": orjson.dumps(tool_use["input"]).decode()},
                }
            ],
        },
        {"role": "tool", "tool_call_id": tool_use["id"], "content": synth_text(500, 4)},
        {"role": "assistant", "content": last_text},
        {"role": "user", "content": "thanks"},
    ]
    _, chunks, _ = openai_stream(server.base, oa, 5)
    assert chunks[-2]["x_sim"]["cache_source"] == "live"
    assert server.stop() == 0


def test_prefill_keepalives_and_prefill_only_requests(start: Any, tmp_path: Path) -> None:
    server = start("--kv-disk-dir", str(tmp_path / "kv"), scale=200.0)
    messages = [{"role": "user", "content": synth_text(11_724, 3)}]
    comments, chunks, _ = openai_stream(server.base, messages, 0, tools=None)
    assert len(comments) >= 3 and set(comments) == {": prefill"}  # ~23 s of prefill, one per >= 5 s
    usage = chunks[-2]["usage"]
    assert usage["completion_tokens"] == 0 and chunks[-3]["choices"][0]["finish_reason"] == "length"
    server.wait_for(r"kv cache stored tokens=10240 trimmed=1492 reason=cold key=token-text")
    assert len(list((tmp_path / "kv").glob("*.kv"))) == 1
    _, chunks, _ = openai_stream(server.base, messages, 10, tools=None)  # the real turn after the pre-warm
    assert chunks[-2]["usage"]["prompt_tokens_details"]["cached_tokens"] == 11_732
    assert server.stop() == 0


def test_bad_requests_get_ds4_errors_and_the_server_keeps_serving(start: Any) -> None:
    server = start("-c", "4096")
    r = httpx.post(f"{server.base}/v1/chat/completions", content=b"{not json", timeout=10)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(f"{server.base}/v1/chat/completions", json={"messages": "nope"}, timeout=10)
    assert r.status_code == 400
    r = httpx.post(
        f"{server.base}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": synth_text(5_000, 1)}]},
        timeout=10,
    )
    assert r.status_code == 400 and "context" in r.json()["error"]["message"]
    r = httpx.post(
        f"{server.base}/v1/messages",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1},
        timeout=10,
    )
    assert r.status_code == 400
    r = httpx.get(f"{server.base}/v1/nothing", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["message"] == "unknown endpoint"
    assert r.headers["connection"] == "close"
    health = httpx.get(f"{server.base}/health", timeout=10).json()
    assert health["status"] == "ok" and health["model"] == "qwen3.8-flash-next"
    models = httpx.get(f"{server.base}/v1/models", timeout=10).json()
    assert models["data"][0]["context_length"] == 4096
    r = httpx.post(
        f"{server.base}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        timeout=10,
    )
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
    stats = httpx.get(f"{server.base}/stats", timeout=10).json()
    assert stats["requests"] == 1 and stats["cache"]["cold"] == 1 and stats["ctx_size"] == 4096
    fill = stats["x_sim"]["tokenizer_cache"]
    assert 0 < fill["texts"] <= fill["max_texts"] and 0 < fill["chars"] <= fill["max_chars"]
    assert server.stop() == 0


def test_one_slot_queues_the_second_request_and_two_slots_do_not(start: Any) -> None:
    def overlap(server: SimServer) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []

        def send(seed: int) -> None:
            body = {"messages": conversation(1_000, 20_000, seed), "max_tokens": 20}
            out.append(
                httpx.post(f"{server.base}/v1/chat/completions", json=body, timeout=60).json()["x_sim"]
            )

        threads = [threading.Thread(target=send, args=(s,)) for s in (1, 50)]
        for t in threads:
            t.start()
            time.sleep(0.02)
        for t in threads:
            t.join()
        return sorted(out, key=lambda x: x["queue_s"])

    # 50x: the ~42 s first prefill lasts ~0.85 s of wall time, far more than thread start-up jitter
    single = overlap(start(scale=50.0))
    assert single[0]["queue_s"] < 0.5 and single[1]["queue_s"] > 25  # waited for a ~42 s prefill
    both = overlap(start("--batched-session", "2", scale=50.0))
    assert {x["slot"] for x in both} == {0, 1} and all(x["queue_s"] < 0.5 for x in both)


def test_sigterm_persists_the_slot_and_a_restart_restores_it(start: Any, tmp_path: Path) -> None:
    kv = tmp_path / "kv"
    server = start("--kv-disk-dir", str(kv))
    messages = conversation()
    _, chunks, _ = openai_stream(server.base, messages, 40, **{"X-Replay-Finish": "tool_calls"})
    prompt = chunks[-2]["usage"]["prompt_tokens"]
    call = next(
        c["choices"][0]["delta"]["tool_calls"][0]
        for c in chunks[:-2]
        if c["choices"] and "tool_calls" in c["choices"][0]["delta"]
    )
    arguments = "".join(
        c["choices"][0]["delta"]["tool_calls"][0]["function"].get("arguments", "")
        for c in chunks[:-2]
        if c["choices"] and "tool_calls" in c["choices"][0]["delta"]
    )
    assert server.stop() == 0
    log = server.messages()
    i = log.index("shutdown requested, draining requests")
    assert log[i + 1] == f"persisting current KV cache before shutdown tokens={prompt + 40}"
    assert re.fullmatch(
        rf"kv cache stored tokens={prompt + 40} trimmed=0 reason=shutdown key=token-text size=[\d.]+ MiB save=[\d.]+ ms",
        log[i + 2],
    )
    assert len(list(kv.glob("*.kv"))) == 2  # the cold anchor and the shutdown file

    again = start("--kv-disk-dir", str(kv))
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call["id"], "type": "function", "function": {"name": "bash", "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": call["id"], "content": synth_text(300, 7)},
    ]
    _, chunks, _ = openai_stream(again.base, messages, 10)
    assert chunks[-2]["usage"]["prompt_tokens_details"]["cached_tokens"] == prompt + 40
    assert chunks[-2]["x_sim"]["cache_source"] == "disk" and chunks[-2]["x_sim"]["restore_s"] > 0
    again.wait_for(
        rf"kv cache hit text tokens={prompt + 40} text=\d+ quant=2 key=token-text load=[\d.]+ ms file={re.escape(str(kv))}/[0-9a-f]{{40}}\.kv"
    )
    assert again.stop() == 0


def test_hidden_reasoning_shutdown_file_of_a_tool_conversation_never_matches(
    start: Any, tmp_path: Path
) -> None:
    """ds4 issue 1053: the token-text key holds reasoning the client never resends."""
    kv = tmp_path / "kv"
    flags = ("--kv-disk-dir", str(kv), "--hidden-reasoning", "--visible-key", "no-tools")
    server = start(*flags)
    messages = conversation()
    body = {"messages": messages, "tools": TOOLS, "max_tokens": 60}
    reply = httpx.post(
        f"{server.base}/v1/chat/completions", json=body, headers={"X-Replay-Finish": "tool_calls"}, timeout=60
    ).json()
    message = reply["choices"][0]["message"]
    assert message["reasoning_content"] and message["tool_calls"]
    prompt = reply["usage"]["prompt_tokens"]
    assert server.stop() == 0
    again = start(*flags)
    messages += [
        {"role": "assistant", "content": None, "tool_calls": message["tool_calls"]},
        {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": synth_text(300, 7)},
    ]
    body = {"messages": messages, "tools": TOOLS, "max_tokens": 10}
    second = httpx.post(f"{again.base}/v1/chat/completions", json=body, timeout=60).json()
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] < prompt  # only the cold anchor
    assert again.stop() == 0


def neutral(message: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI wire message in the neutral trace format (what a trace would hold)."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    flat = [
        {"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in calls
    ]
    return {**message, "tool_calls": flat}


def test_the_server_and_the_offline_sweep_agree(start: Any, tmp_path: Path) -> None:
    """`replay size sweep` runs the server's own model: same requests, same cached tokens."""
    server = start("--kv-disk-dir", str(tmp_path / "kv"), "--kv-disk-space-mb", "1024")
    sessions = {"a": conversation(2_000, 9_000, 1), "b": conversation(2_000, 12_000, 1)}
    sessions["b"][1] = {"role": "user", "content": synth_text(12_000, 5)}
    sent: list[SweepRequest] = []
    cached: list[int] = []
    for turn, name in enumerate("ababab"):
        messages = sessions[name]
        finish = "tool_calls" if turn % 3 else "stop"
        body = {"messages": messages, "tools": TOOLS, "max_tokens": 50}
        r = httpx.post(
            f"{server.base}/v1/chat/completions", json=body, headers={"X-Replay-Finish": finish}, timeout=60
        ).json()
        sent.append(SweepRequest(name, [neutral(m) for m in messages], 50, tools=TOOLS, finish=finish))
        cached.append(r["usage"]["prompt_tokens_details"]["cached_tokens"])
        msg = r["choices"][0]["message"]
        reply = {
            "role": "assistant",
            "content": msg["content"] or "",
            "tool_calls": msg.get("tool_calls") or [],
        }
        sessions[name] = [*messages, reply, {"role": "user", "content": synth_text(1_500, 40 + turn)}]
    assert server.stop() == 0
    cfg = config_for("qwen38-q2", kv_disk_space_mb=1024)
    row = sweep(jobs_from_requests(sent, cfg), [1024 * 2**20], cfg=cfg).rows[0]
    finishes = (re.match(r"chat ctx=(\d+)\.\.(\d+):\d+ gen=\d+.* finish=", x) for x in server.messages())
    log_spans = [(int(m.group(1)), int(m.group(2))) for m in finishes if m]
    assert [c for c, _ in log_spans] == cached
    assert row.reprocessed_tokens == sum(p - c for c, p in log_spans)


def test_log_file_flag_and_sigterm_exit_code(tmp_path: Path) -> None:
    """With `--log FILE` the ds4 lines go to the file (drivers tail it), nothing to stderr."""
    log = tmp_path / "ds4.log"
    cmd = [
        sys.executable,
        "-m",
        "replay.sim",
        "--port",
        "0",
        "--log",
        str(log),
        "--kv-disk-dir",
        str(tmp_path / "kv"),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        port = None
        while port is None and time.monotonic() < deadline:
            text = log.read_text() if log.exists() else ""
            if m := re.search(r"listening on http://127\.0\.0\.1:(\d+)", text):
                port = m.group(1)
            time.sleep(0.02)
        assert port is not None
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            timeout=30,
        )
        assert r.status_code == 200
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(20) == 0
        assert proc.stderr is not None and "ds4-server:" not in proc.stderr.read()
        lines = log.read_text().splitlines()
        assert lines[-1].endswith(
            "ds4-server: shutdown requested, draining requests"
        )  # 12 tokens < min: no save
        assert any(" finish=stop " in line for line in lines)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
