"""The Python floor: the least a client on asyncio can spend per streamed request, for scale.

wrk shows what the server can take; this shows what any Python client on this host could drive:
a bare `asyncio.Protocol` that opens a fresh connection per request (as the engine does), writes
the request bytes, de-chunks each network read in one pass, feeds the engine's own `SseParser`
and decodes every event with orjson. The gap between this and the engine is the engine's own
overhead (HTTP stack, records, plans), which is where a faster engine has to come from.
"""

from __future__ import annotations

import asyncio
import resource
import time
from dataclasses import dataclass, field

import orjson

from bench.server import RunningServer
from bench.stats import ErrorStats, ttft_errors
from replay.engine.sse import SseParser
from replay.trace.synth import synth_text


class _Stream(asyncio.Protocol):
    """One request's connection: the response head, chunked framing, SSE events, first-token stamp."""

    def __init__(self, done: asyncio.Future[int | None]) -> None:
        self.done = done
        self.head: bytes | None = None
        self.buf = bytearray()
        self.parser = SseParser()
        self.t_first: int | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        self.buf += data
        if self.head is None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            self.head = bytes(self.buf[:end])
            del self.buf[: end + 4]
        payload, finished = self._dechunk()
        if payload:
            for ev in self.parser.feed(payload):
                if ev.data == b"[DONE]":
                    continue
                obj = orjson.loads(ev.data)
                choices = obj.get("choices")
                if self.t_first is None and choices and (choices[0].get("delta") or {}).get("content"):
                    self.t_first = now
        if finished:
            self._finish()

    def _dechunk(self) -> tuple[bytes, bool]:
        buf, pos, parts = self.buf, 0, []
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(buf[pos:eol], 16)
            if size == 0:
                del buf[:]
                return b"".join(parts), True
            if len(buf) < eol + 2 + size + 2:
                break
            parts.append(bytes(buf[eol + 2 : eol + 2 + size]))
            pos = eol + 2 + size + 2
        del buf[:pos]
        return b"".join(parts), False

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(self.t_first)
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(self.t_first)


@dataclass(slots=True)
class FloorPoint:
    concurrency: int
    requests: int = 0
    rate: float = 0.0
    cpu_ms_per_request: float = 0.0
    error: ErrorStats = field(default_factory=ErrorStats)

    def to_json(self) -> dict[str, object]:
        return {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "rate": self.rate,
            "cpu_ms_per_request": self.cpu_ms_per_request,
            "ttft_error": self.error.to_json(),
        }


async def _drive(host: str, port: int, concurrency: int, requests: int, label: str) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    content = synth_text(200, 1)
    sem = asyncio.Semaphore(concurrency)
    ttfts: dict[str, float] = {}

    async def one(i: int) -> None:
        rid = f"{label}-{i}"
        body = orjson.dumps(
            {
                "model": "ref",
                "messages": [{"role": "user", "content": content}],
                "stream": True,
                "max_tokens": 64,
                "stream_options": {"include_usage": True},
            }
        )
        head = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
            b"Accept: text/event-stream\r\nConnection: close\r\nX-Request-ID: %s\r\nContent-Length: %d\r\n\r\n"
        ) % (host.encode(), rid.encode(), len(body))
        async with sem:
            done: asyncio.Future[int | None] = loop.create_future()
            transport, _ = await loop.create_connection(lambda: _Stream(done), host, port)
            t_sent = time.perf_counter_ns()
            transport.write(head + body)
            t_first = await done
            if t_first is not None:
                ttfts[rid] = (t_first - t_sent) / 1e6

    await asyncio.gather(*(one(i) for i in range(requests)))
    return ttfts


def floor_point(srv: RunningServer, concurrency: int, requests: int) -> FloorPoint:
    """Closed loop at `concurrency` against the reference server; CPU is this process's own."""
    host, port = srv.url.removeprefix("http://").rsplit(":", 1)
    label = f"floor-c{concurrency}"
    srv.clear()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    ttfts = asyncio.run(_drive(host, int(port), concurrency, requests, label))
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    truth = srv.truth(clear=True)
    rows = [truth[k] for k in ttfts if k in truth and truth[k][4] is not None]
    point = FloorPoint(concurrency=concurrency, requests=len(rows), error=ttft_errors(ttfts, truth))
    if rows:
        span = (max(r[4] for r in rows) - min(r[2] for r in rows)) / 1e9
        point.rate = round(len(rows) / span, 1) if span > 0 else 0.0
        cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
        point.cpu_ms_per_request = round(cpu / len(rows) * 1e3, 3)
    return point
