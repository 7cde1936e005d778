"""The simulator keeps no per-request state: with a fixed set of active conversations, what the
process retains after warm-up does not grow with the requests served (issue #23, item 3).

Requests go through the app in-process (runtime, model, tokenizer, starlette); the tokenizer's text
cache is shrunk so that its bound is reached during warm-up. Counts, not timings: a leak of one
object per request adds 2N objects between the two counts, noise is a few dozen.
"""

from __future__ import annotations

import gc
import os
import sys
from collections import OrderedDict
from typing import Any

import anyio
import httpx
import orjson
import pytest

from replay.sim.model import tokenizer
from replay.sim.server.app import create_app
from replay.sim.server.options import parse
from replay.sim.server.runtime import LogSink, SimRuntime

pytestmark = pytest.mark.anyio

ACTIVE = 4
TURNS = 6
N = 300


def conversation(index: int, generation: int, replies: list[str]) -> list[dict[str, str]]:
    """As the soak's clients send it: a start, then every reply with the tool result after it."""
    msgs = [
        {"role": "system", "content": "You are a coding agent. " * 20},
        {"role": "user", "content": f"conversation {index}.{generation}: fix the failing test"},
    ]
    for i, reply in enumerate(replies):
        msgs.append({"role": "assistant", "content": reply})
        msgs.append({"role": "user", "content": f"tool result {i} of {index}.{generation}"})
    return msgs


class Pool:
    """`ACTIVE` conversations, each restarted with a new generation after `TURNS` turns."""

    def __init__(self) -> None:
        self.generation = [0] * ACTIVE
        self.replies: list[list[str]] = [[] for _ in range(ACTIVE)]

    async def turn(self, client: httpx.AsyncClient, index: int, stream: bool) -> None:
        body = {
            "model": "sim",
            "messages": conversation(index, self.generation[index], self.replies[index]),
            "max_tokens": 16,
            "stream": stream,
        }
        resp = await client.post("/v1/chat/completions", json=body)
        assert resp.status_code == 200, resp.text
        if stream:
            deltas = [
                orjson.loads(line[6:])["choices"][0]["delta"]
                for line in resp.text.splitlines()
                if line.startswith("data: {")
            ]
            text = "".join(d.get("content") or "" for d in deltas)
        else:
            text = resp.json()["choices"][0]["message"]["content"]
        self.replies[index].append(text)
        if len(self.replies[index]) >= TURNS:
            self.generation[index] += 1
            self.replies[index] = []

    async def run(self, client: httpx.AsyncClient, requests: int) -> None:
        """`requests` turns, the conversations served concurrently, half of them streamed."""
        for start in range(0, requests, ACTIVE):
            async with anyio.create_task_group() as tg:
                for index in range(min(ACTIVE, requests - start)):
                    tg.start_soon(self.turn, client, index, (start // ACTIVE + index) % 2 == 0)


def retained() -> dict[str, int]:
    gc.collect()
    return {
        "objects": len(gc.get_objects()),
        "blocks": sys.getallocatedblocks(),
        # The text cache's table (and node index): settled, it no longer grows (issue #23's step).
        "cache_table_bytes": sys.getsizeof(tokenizer._cache),
    }


async def test_retained_objects_do_not_grow_with_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokenizer, "_CACHE_SIZE", 256)
    # A cache of its own: one left large by earlier tests would shrink its table during the count.
    monkeypatch.setattr(tokenizer, "_cache", OrderedDict())
    monkeypatch.setattr(tokenizer, "_cached_chars", [0])
    monkeypatch.setattr(tokenizer, "_evicted", [0])
    cfg, opts = parse(["--time-scale", "100000"])
    with open(os.devnull, "w", encoding="utf-8") as devnull:
        runtime = SimRuntime(cfg, kv_dir=None, time_scale=opts.time_scale, log=LogSink(devnull))
        await runtime.start()
        transport = httpx.ASGITransport(app=create_app(runtime))
        pool = Pool()
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
                await pool.run(client, N)  # warm-up: the text cache reaches its bound and settles
                fill = runtime.stats_json()["x_sim"]["tokenizer_cache"]
                assert isinstance(fill, dict) and fill["texts"] == 256 and fill["settled"], fill
                first = retained()
                await pool.run(client, 2 * N)
                second = retained()
        finally:
            await runtime.close()
    assert runtime.stats.requests == 3 * N
    grown: dict[str, Any] = {key: second[key] - first[key] for key in first}
    # One object kept per request would add 2N = 600 objects (and more blocks).
    assert grown["objects"] < N // 3, (first, second)
    assert grown["blocks"] < N, (first, second)
    assert grown["cache_table_bytes"] == 0, (first, second)
    assert not runtime.handles
