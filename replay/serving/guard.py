"""Bounds on what one client can hold of a long-running server: bytes, time and connections.

Three layers, because uvicorn covers only part of it:
- `BodyGuard` (ASGI) reads the whole body before the app sees it: a declared Content-Length above
  the limit is answered 413 before a byte of the body is read, a chunked body is cut off with 413
  as it crosses the limit, a body that does not arrive within `body_timeout_s` (slowloris: fewer
  bytes than its Content-Length) is answered 408, and a client that leaves mid-body ends the
  request quietly (no `ClientDisconnect` traceback: there is no one left to answer).
- `guarded_protocol` (asyncio protocol): uvicorn's h11 and httptools protocols have no timeout on
  the request head; this one closes a connection whose request line and headers are not complete
  `header_timeout_s` after it opened or after its previous response (408 if some bytes came).
- uvicorn's own `timeout_keep_alive` (idle connection between requests) and `limit_concurrency`
  (a 503 beyond the cap), set from the same `Limits`.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from replay.serving.errors import api_of_path, error_bytes

MIB = 1024 * 1024
TRIM_AFTER_BYTES = 4 * MIB  # after a body this large, hand freed memory back to the OS
_TIMEOUT_408 = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-server bounds; the defaults sit well above real agents' traffic (the largest requests
    seen from coding agents are a few MiB of JSON; a 1M-token context is about 4 MiB of text)."""

    max_body_bytes: int = 64 * MIB
    header_timeout_s: float = 30.0  # request line + headers, from connect or the previous response
    body_timeout_s: float = 120.0  # the whole body, from the end of the headers
    keep_alive_s: float = 5.0  # idle keep-alive connection between requests
    max_connections: int = 1024  # beyond this, requests are answered 503

    def check(self) -> Limits:
        """Itself, if every bound is positive; else a ValueError naming the bound."""
        for name in (
            "max_body_bytes",
            "header_timeout_s",
            "body_timeout_s",
            "keep_alive_s",
            "max_connections",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        return self


ErrorBody = Callable[[Scope, int, str], bytes]


def _default_error(scope: Scope, status: int, message: str) -> bytes:
    return error_bytes(api_of_path(scope.get("path", "")), message, status)


async def send_error(send: Send, status: int, body: bytes, close: bool = True) -> None:
    """A complete JSON error response; `close` ends the connection (the rest of an unread body
    would otherwise have to be read and thrown away before the next request)."""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class BodyGuard:
    """ASGI middleware: the body in full, within its size and time limits, or an error."""

    def __init__(self, app: ASGIApp, limits: Limits, error: ErrorBody = _default_error) -> None:
        self.app = app
        self.limits = limits
        self.error = error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limits.max_body_bytes
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            message = f"request body of {declared} bytes is larger than the limit of {limit} bytes"
            await send_error(send, 413, self.error(scope, 413, message))
            return
        body = await self._read(scope, receive, send)
        if body is None:
            return
        size = len(body)
        replay = _Replay(body, receive)
        del body  # the app's request holds it now, and lets it go when it is done
        try:
            await self.app(scope, replay, send)
        finally:
            if size >= TRIM_AFTER_BYTES:  # now, and once the server's own buffers are gone too
                release_freed_memory()
                asyncio.get_running_loop().call_later(1.0, release_freed_memory)

    async def _read(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        """The whole body, or None once an error was sent (or the client left)."""
        limit = self.limits.max_body_bytes
        chunks: list[bytes] = []
        size = 0
        more = True
        with anyio.move_on_after(self.limits.body_timeout_s) as timer:
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return None  # the client left mid-body: nobody to answer
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    text = f"request body is larger than the limit of {limit} bytes"
                    await send_error(send, 413, self.error(scope, 413, text))
                    return None
                if chunk:
                    chunks.append(chunk)
                more = message.get("more_body", False)
        if timer.cancelled_caught:
            text = f"request body not received within {self.limits.body_timeout_s:g} s ({size} bytes arrived)"
            await send_error(send, 408, self.error(scope, 408, text))
            return None
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class _Replay:
    """`receive` for the app: the buffered body once (then forgotten), then the real `receive`
    (which reports the client leaving)."""

    __slots__ = ("body", "receive")

    def __init__(self, body: bytes, receive: Receive) -> None:
        self.body: bytes | None = body
        self.receive = receive

    async def __call__(self) -> Message:
        body, self.body = self.body, None
        if body is not None:
            return {"type": "http.request", "body": body, "more_body": False}
        return await self.receive()


def _malloc_trim() -> Callable[[], object]:
    """glibc keeps freed heap memory for reuse, so a server that once parsed a 60 MB body stays
    that large; `malloc_trim(0)` gives it back. Elsewhere (no glibc) a no-op."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    trim.argtypes = [ctypes.c_size_t]
    return lambda: trim(0)


_trim = _malloc_trim()


def release_freed_memory() -> None:
    """After a huge request: collect the cycles that still hold its body (a finished request's
    task, exception and closures reference each other, and nothing else may trigger the
    collector for a long while), then hand the freed memory back to the OS."""
    gc.collect()
    _trim()


def _content_length(scope: Scope) -> int | None:
    for key, value in scope.get("headers", ()):
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the HTTP parser refuses it before we get here
    return None


def guarded_protocol(base: type[asyncio.Protocol], header_timeout_s: float) -> type[asyncio.Protocol]:
    """`base` (uvicorn's H11Protocol or HttpToolsProtocol) with a deadline on each request head."""
    proto: Any = base

    class HeaderDeadline(proto):  # type: ignore[misc, valid-type]
        _head_timer: asyncio.TimerHandle | None = None
        _head_bytes = False  # bytes of the next request's head have arrived
        _bytes_in = 0  # over the connection's life: its parser's buffers grew with them

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            self._bytes_in += len(data)
            if self._waiting():
                self._head_bytes = True
            super().data_received(data)
            if not self._waiting():
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._head_bytes = False
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)
            if self._bytes_in >= TRIM_AFTER_BYTES:  # once the transport has let its buffers go
                self.loop.call_later(0.05, release_freed_memory)

        def _waiting(self) -> bool:
            """No request is being served: the connection is waiting for a request head."""
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            self._disarm()
            self._head_timer = self.loop.call_later(header_timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _expired(self) -> None:
            self._head_timer = None
            if self.transport.is_closing() or not self._waiting():
                return
            if self._head_bytes:
                self.transport.write(_TIMEOUT_408)
            self.transport.close()

    HeaderDeadline.__name__ = f"HeaderDeadline{base.__name__}"
    return HeaderDeadline


def uvicorn_options(limits: Limits, base: type[asyncio.Protocol] | None = None) -> dict[str, Any]:
    """The `uvicorn.Config` keywords that apply `limits` (the body is `BodyGuard`'s)."""
    if base is None:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        base = H11Protocol
    return {
        "http": guarded_protocol(base, limits.header_timeout_s),
        "timeout_keep_alive": limits.keep_alive_s,
        # uvicorn counts the connection asking, so N + 1 lets N be served at once
        "limit_concurrency": limits.max_connections + 1,
    }
