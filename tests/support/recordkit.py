"""Helpers for the recorder tests: an agent that keeps its history, and trace lookups."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from replay.engine.apis import APIS, ApiCall
from replay.metrics.record import RequestRecord
from replay.trace import materialize, recorded_reply
from replay.trace.model import Trace

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file from the workspace",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]


class FixedWall:
    """A wall clock that always says the same second of the minute."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@dataclass
class Agent:
    """One conversation as an agent keeps it: sends its history, appends the server's reply."""

    client: httpx.AsyncClient
    base_url: str
    api: str
    system: str
    stream: bool = True
    tools: list[dict[str, Any]] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.messages = [{"role": "system", "content": self.system}]

    async def send(
        self, rid: str, *new: dict[str, Any], history: list[dict[str, Any]] | None = None
    ) -> RequestRecord:
        """Append `new` and send; `history` sends from another snapshot (a concurrent turn)."""
        base = self.messages if history is None else history
        msgs = [*base, *new]
        call = ApiCall(
            base_url=self.base_url,
            model="m",
            messages=msgs,
            max_tokens=32,
            tools=self.tools,
            stream=self.stream,
            headers={"X-Request-ID": rid, **self.headers},
        )
        res = await APIS[self.api].send(self.client, call, None)
        assert res.ok, res.error
        if history is None:
            self.messages = [*msgs, res.message]
        return res


@contextmanager
def child(argv: list[str], ready: str, stream: str = "stdout") -> Iterator[re.Match[str]]:
    """A child process (own PID, stopped by that PID) and the match of its readiness line."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pipe = proc.stdout if stream == "stdout" else proc.stderr
        assert pipe is not None
        line = pipe.readline()
        match = re.search(ready, line)
        assert match, f"{argv[:3]} said {line!r}"
        yield match
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(5)


def settle(recording, timeout: float = 5.0) -> None:
    """Wait until the proxy has recorded every request it relayed (recording follows the reply)."""
    deadline = time.monotonic() + timeout
    while recording.proxy.in_flight:
        assert time.monotonic() < deadline, "requests still in flight"
        time.sleep(0.01)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def tool(call_id: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def last_text(msgs: list[dict[str, Any]]) -> str:
    return str(msgs[-1].get("content"))


def by_last_message(trace: Trace) -> dict[str, Any]:
    """Each request of a trace, keyed by the text of its last message (unique in these tests)."""
    replies = recorded_reply(trace.by_id())
    out = {}
    for req in trace.requests:
        key = last_text(materialize(req, replies))
        assert key not in out, f"two requests end with {key!r}"
        out[key] = req
    return out


def jsonl(path) -> list[dict[str, Any]]:
    with open(path, "rb") as f:
        return [orjson.loads(line) for line in f if line.strip()]
