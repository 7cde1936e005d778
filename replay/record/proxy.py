"""The recording proxy: passes every request and reply through unchanged, taps the recorded routes.

Replies are relayed chunk by chunk as they come off the upstream socket (keep-alive comments and
all), each chunk sent to the agent before the recorder looks at it, so recording never delays a
token. The upstream client has no read timeout (a long non-streamed prefill may take minutes),
opens a fresh connection per request (servers that close after each response while saying
keep-alive cannot break a pooled one), and never retries.

Failures are the agent's to see, unchanged: an upstream HTTP error is relayed as is; an upstream
that resets mid-stream makes the proxy drop the agent's connection the same way; an upstream that
cannot be reached gets the agent a 502 with a JSON error. An agent that goes away mid-stream
closes the upstream request at once (a real server stops generating), and is recorded as such.
Credentials (Authorization, x-api-key, cookies) are forwarded upstream and never recorded: the
recorder only ever sees the body.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import anyio
import httpx
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from replay.engine.apis import make_client
from replay.record.calls import CallLog
from replay.record.recorder import Outcome, Pending, Recorder
from replay.record.sessions import Label
from replay.record.wire import ReplyTap

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
    }
)
_NOT_FORWARDED = HOP_BY_HOP | {b"host", b"content-length", b"expect", b"x-replay-session", b"x-replay-role"}
RECORDED_ROUTES = {
    "/v1/chat/completions": "openai",
    "/chat/completions": "openai",
    "/v1/messages": "anthropic",
    "/v1/responses": "openai-responses",
    "/responses": "openai-responses",
}
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]
log = logging.getLogger("replay.record")


class UpstreamBroke(Exception):
    """Raised after the reply started, so the server drops the agent's connection as upstream did."""


class QuietUpstreamBroke(logging.Filter):
    """Keeps uvicorn from logging a traceback for the deliberate UpstreamBroke."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, UpstreamBroke)


def split_label(path: str) -> tuple[str, Label | None]:
    """`/s/NAME/v1/...` -> (`/v1/...`, label NAME)."""
    if path.startswith("/s/"):
        name, sep, rest = path[3:].partition("/")
        if name and sep:
            return "/" + rest, Label(unquote(name), "path")
    return path, None


def upstream_url(base: str, path: str, query: str) -> str:
    """Join the upstream base and the request path; a base ending in /v1 takes paths without it."""
    base = base.rstrip("/")
    if urlsplit(base).path.endswith("/v1") and path.startswith("/v1/"):
        path = path[3:]
    return base + path + (f"?{query}" if query else "")


def _request_headers(raw: list[tuple[bytes, bytes]], recorded: bool) -> list[tuple[bytes, bytes]]:
    out = [(k, v) for k, v in raw if k.lower() not in _NOT_FORWARDED]
    if recorded:
        # The recorder reads the reply, so ask for it uncompressed (loopback: nothing lost).
        out = [(k, v) for k, v in out if k.lower() != b"accept-encoding"]
        out.append((b"accept-encoding", b"identity"))
    return out


def _response_headers(raw: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k.lower(), v) for k, v in raw if k.lower() not in HOP_BY_HOP]


@dataclass(slots=True)
class _State:
    complete: bool = False  # the whole reply went to the agent
    disconnected: bool = False
    abort: bool = False
    status: str | None = None
    error: str | None = None
    sent_bytes: int = 0
    http_status: int | None = None  # what the agent got
    t_first_byte: int | None = None
    t_last_byte: int | None = None


class RecordingProxy:
    """The ASGI app (`.app`); `recorder` None makes it a plain passthrough proxy."""

    def __init__(self, upstream: str, recorder: Recorder | None, connect_timeout_s: float = 10.0) -> None:
        self.upstream = upstream.rstrip("/")
        self.recorder = recorder
        self.connect_timeout_s = connect_timeout_s
        self.client: httpx.AsyncClient | None = None
        self.in_flight = 0
        self.passthrough = 0
        self.internal_errors = 0
        self.calls = CallLog()  # every call's end; replaced by one with a log file for `--log`
        self.app = Starlette(
            routes=[Route("/{path:path}", self._handle, methods=METHODS)], lifespan=self._lifespan
        )

    @asynccontextmanager
    async def _lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        async with make_client(self.connect_timeout_s) as client:
            self.client = client
            yield
        self.client = None

    async def _handle(self, request: Request) -> _Relay:
        arrived = time.perf_counter_ns()
        path, label = split_label(request.url.path)
        header_label = request.headers.get("x-replay-session")
        if label is None and header_label:
            label = Label(header_label, "header")
        body = await request.body()
        api = RECORDED_ROUTES.get(path) if request.method == "POST" else None
        begin: Callable[[], Pending | None] | None = None
        if api is not None and self.recorder is not None:
            recorder, role = self.recorder, request.headers.get("x-replay-role")
            begin = functools.partial(recorder.begin, api, body, label, role, arrived)
        else:
            self.passthrough += 1
        upstream = httpx.Request(
            request.method,
            upstream_url(self.upstream, path, request.url.query),
            headers=_request_headers(request.headers.raw, recorded=api is not None),
            content=body,
        )
        relay = _Relay(self, upstream, api, begin)
        relay.method, relay.path = request.method, path
        if begin is None:
            relay.reason = (
                "not a recorded route" if api is None or self.recorder is not None else "no recorder"
            )
        return relay

    def _internal(self, exc: Exception) -> None:
        self.internal_errors += 1
        log.error("recorder error (traffic unaffected): %s: %s", type(exc).__name__, exc)
        if self.recorder is not None:
            self.recorder.stats.last_problem = f"recorder error: {type(exc).__name__}: {exc}"[:200]


class _Relay:
    """The ASGI response for one request: relay upstream's reply, watch for the agent leaving.

    Reading the request for the trace (parsing, session inference) waits until the request has
    gone upstream, and runs while the server computes: on a 200K-token conversation it takes
    milliseconds the agent would otherwise see added to its first token.
    """

    def __init__(
        self,
        proxy: RecordingProxy,
        upstream: httpx.Request,
        api: str | None,
        begin: Callable[[], Pending | None] | None,
    ) -> None:
        self.proxy = proxy
        self.upstream = upstream
        self.api = api
        self._begin = begin
        self.pending: Pending | None = None
        self.tap: ReplyTap | None = None
        self.method, self.path = upstream.method, upstream.url.path
        self.reason: str | None = None  # why this call is not recorded, when it is not
        timeout = httpx.Timeout(None, connect=proxy.connect_timeout_s).as_dict()
        upstream.extensions = {**upstream.extensions, "timeout": timeout, "trace": self._trace}

    async def _trace(self, name: str, _info: Any) -> None:
        if name.endswith("receive_response_headers.started"):
            self._start_recording()

    def _start_recording(self) -> None:
        """Hand the request to the recorder (once): when it went upstream, or when it failed to."""
        begin, self._begin = self._begin, None
        if begin is None or self.proxy.recorder is None:
            return
        try:
            self.pending = begin()
        except Exception as exc:  # a recorder bug must never stop the traffic
            self.proxy._internal(exc)
            self.reason = f"recorder error: {type(exc).__name__}"
            return
        if self.pending is None:
            self.reason = self.proxy.recorder.stats.last_problem[:200] or "not recordable"
        if self.pending is not None and self.api is not None:
            self.tap = ReplyTap(self.api)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        state = _State()
        self.proxy.in_flight += 1
        try:
            async with anyio.create_task_group() as tg:

                async def watch() -> None:
                    while True:
                        message = await receive()
                        if message["type"] == "http.disconnect":
                            if not state.complete:
                                state.disconnected = True
                                tg.cancel_scope.cancel()
                            return

                tg.start_soon(watch)
                await self._pump(send, state)
                tg.cancel_scope.cancel()
        finally:
            self._start_recording()
            if self.pending is not None:
                self._record(state)
            self.proxy.in_flight -= 1
            try:
                reason = None if self.pending is not None else self.reason or "not recorded"
                self.proxy.calls.done(self.method, self.path, state.http_status, state.sent_bytes, reason)
            except Exception as exc:  # accounting must never take the proxy down
                self.proxy._internal(exc)
        if state.abort:
            raise UpstreamBroke(state.error)

    async def _pump(self, send: Any, state: _State) -> None:
        client = self.proxy.client
        assert client is not None, "the proxy's lifespan did not run"
        try:
            response = await client.send(self.upstream, stream=True)
        except httpx.TransportError as exc:
            connect = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
            state.status = "connect_error" if connect else "stream_broken"
            state.error = f"upstream {self.upstream.url}: {type(exc).__name__}: {exc}"
            await self._bad_gateway(send, state)
            return
        tap = self.tap
        try:
            state.http_status = response.status_code
            if tap is not None:
                tap.start(response.status_code, response.headers.get("content-type", ""))
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": _response_headers(response.headers.raw),
                }
            )
            async for chunk in response.aiter_raw():
                now = time.perf_counter_ns()
                if state.t_first_byte is None:
                    state.t_first_byte = now
                state.t_last_byte = now
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                state.sent_bytes += len(chunk)
                if tap is not None:
                    tap.feed(chunk, now)
            state.complete = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except httpx.TransportError as exc:
            state.status, state.abort = "stream_broken", True
            state.error = (
                f"upstream connection failed after {state.sent_bytes} bytes: {type(exc).__name__}: {exc}"
            )
        finally:
            with anyio.CancelScope(shield=True):
                await response.aclose()

    async def _bad_gateway(self, send: Any, state: _State) -> None:
        body = orjson.dumps({"error": {"message": f"replay record: {state.error}", "type": "upstream_error"}})
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        state.complete = True
        state.http_status = 502
        await send({"type": "http.response.start", "status": 502, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    def _record(self, state: _State) -> None:
        assert self.pending is not None and self.tap is not None and self.proxy.recorder is not None
        try:
            result = self.tap.finish()
            status, error = state.status, state.error
            if state.disconnected:
                status = "client_disconnected"
                error = f"the agent went away after {state.sent_bytes} bytes of the reply"
            outcome = Outcome(
                tap=result,
                status=status,
                error=error,
                t_first_byte=state.t_first_byte,
                t_last_byte=state.t_last_byte,
                t_done=time.perf_counter_ns(),
            )
            self.proxy.recorder.finish(self.pending, outcome)
        except Exception as exc:  # a recorder bug must never take the proxy down
            self.proxy._internal(exc)
