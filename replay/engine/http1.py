"""A small HTTP/1.1 client for plain-http targets: one request per fresh connection, bytes stamped.

httpx -> httpcore -> h11 cost several async layers per network chunk (most of the engine's CPU
per streamed request); here one read callback receives each network read with its kernel
receive stamp, parses the response head and de-frames the body (Content-Length, chunked or
close-delimited) in one pass, and queues the payload with that stamp for the reader. The
connection is never pooled and a request is never re-sent: llama-server closes after each stream
while saying keep-alive, and a body that went out once must not go out twice.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import time
from collections import deque
from urllib.parse import urlsplit

from replay import __version__
from replay.engine import transport

_RECV_BYTES = 256 * 1024
_PAUSE_AT = 4 << 20  # stop reading when this many body bytes wait for the reader
_HEAD_MAX = 64 * 1024  # a response head larger than this is not an LLM server's
_USER_AGENT = f"agent-replay/{__version__}"


class TransportError(Exception):
    """The connection failed or the peer broke HTTP/1.1; the name leads the one-line error."""


class ConnectError(TransportError):
    """No connection was made: nothing of the request went out."""


class ConnectTimeout(ConnectError):
    pass


class ReadError(TransportError):
    pass


class WriteError(TransportError):
    pass


class RemoteProtocolError(TransportError):
    pass


class LocalProtocolError(TransportError):
    """The request itself cannot be written as HTTP/1.1 (a header with a line break)."""


@functools.lru_cache(maxsize=64)
def split_url(url: str) -> tuple[str, int, str, str]:
    """(host, port, Host header, request target) of an http:// URL."""
    parts = urlsplit(url)
    try:
        port = parts.port or 80
    except ValueError:
        port = -1
    if parts.scheme != "http" or not parts.hostname or port < 0:
        raise ConnectError(f"not a plain http URL: {url}")
    host = parts.hostname
    authority = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        authority += f":{port}"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return host, port, authority, target


def request_head(method: str, target: str, authority: str, headers: dict[str, str], length: int) -> bytes:
    """The request line and headers; Host, User-Agent and Content-Length are ours unless given."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {authority}"]
    given = {k.lower() for k in headers}
    if "user-agent" not in given:
        lines.append(f"User-Agent: {_USER_AGENT}")
    for key, value in headers.items():
        low = key.lower()
        if low in ("host", "content-length", "transfer-encoding"):
            continue
        if "\r" in value or "\n" in value or "\r" in key or "\n" in key or ":" in key:
            raise LocalProtocolError(f"header {key!r} cannot be sent as given")
        lines.append(f"{key}: {value}")
    lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8")


async def connect(host: str, port: int, timeout: float | None) -> Connection:
    """A fresh TCP connection (Nagle off) on the running loop, already reading."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout):
            infos = await transport.resolve(loop, host, port)
            sock = await transport.connect_socket(loop, infos)
    except TimeoutError:
        raise ConnectTimeout(f"connect to {host}:{port} timed out") from None
    except OSError as exc:
        raise ConnectError(str(exc) or type(exc).__name__) from None
    return Connection(sock, loop)


class Connection:
    """One request's connection: reads eagerly in the loop's callback, frames the body there.

    Body payloads queue as (arrival stamp, bytes), one entry per network read; the
    consumer takes them with `next()`. A failure is raised only after everything that
    arrived before it was taken, so a broken stream keeps what it delivered.
    """

    __slots__ = (
        "_sock",
        "_fd",
        "_loop",
        "_kernel",
        "_head",
        "_mode",
        "_left",
        "_line",
        "_chunks",
        "_buffered",
        "_complete",
        "_exc",
        "_waiter",
        "_reading",
        "_closed",
        "status",
        "headers",
        "t_head",
    )

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        self._sock = sock
        self._fd = sock.fileno()
        self._loop = loop
        self._kernel = transport.enable_kernel_stamps(sock)
        self._head = bytearray()
        self._mode = ""  # "chunked" | "length" | "close", once the head is parsed
        self._left = 0  # bytes still due in the current chunk / the Content-Length body
        self._line = b""  # a chunk-size line split across reads
        self._chunks: deque[tuple[int, bytes]] = deque()
        self._buffered = 0
        self._complete = False  # the body ended as its framing says
        self._exc: TransportError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._reading = True
        self._closed = False
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.t_head: int | None = None  # arrival stamp of the read that completed the head
        loop.add_reader(self._fd, self._on_readable)

    # --- the loop's side ------------------------------------------------------------

    def _on_readable(self) -> None:
        try:
            if self._kernel:
                data, anc, _flags, _addr = self._sock.recvmsg(_RECV_BYTES, 64)
            else:
                data, anc = self._sock.recv(_RECV_BYTES), None
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._stop_reading()
            self._exc = ReadError(str(exc) or type(exc).__name__)
            self._wake()
            return
        now = time.perf_counter_ns()
        if not data:
            self._stop_reading()
            self._on_eof()
        else:
            try:
                self._on_data(transport.kernel_stamp(anc, now) if anc else now, data)
            except RemoteProtocolError as exc:
                self._stop_reading()
                self._exc = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _stop_reading(self) -> None:
        if self._reading:
            self._reading = False
            self._loop.remove_reader(self._fd)

    def _resume_reading(self) -> None:
        if not (self._complete or self._closed or self._exc is not None):
            self._reading = True
            self._loop.add_reader(self._fd, self._on_readable)

    def _on_data(self, stamp: int, data: bytes) -> None:
        if self._complete:
            return  # bytes after the body's end are not ours to read
        while self.status is None:
            head = self._head
            head += data
            end = head.find(b"\r\n\r\n")
            if end < 0:
                if len(head) > _HEAD_MAX:
                    raise RemoteProtocolError("response head too large")
                return
            data = bytes(head[end + 4 :])
            self._parse_head(bytes(head[:end]), stamp)
            head.clear()
        if not data:
            return
        mode = self._mode
        if mode == "chunked":
            payload = self._dechunk(data)
        elif mode == "length":
            left = self._left
            payload = data if len(data) <= left else data[:left]
            self._left = left - len(payload)
            if not self._left:
                self._complete = True
        else:
            payload = data
        if payload:
            self._chunks.append((stamp, payload))
            self._buffered += len(payload)
            if self._buffered > _PAUSE_AT:
                self._stop_reading()
        if self._complete:
            self._stop_reading()

    def _parse_head(self, head: bytes, stamp: int) -> None:
        lines = head.decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise RemoteProtocolError(f"not an HTTP/1.x response: {lines[0][:80]!r}")
        status = int(code)
        if 100 <= status < 200 and status != 101:
            return  # an interim response (100 Continue): the real one follows
        headers: dict[str, str] = {}
        for line in lines[1:]:
            key, colon, value = line.partition(":")
            if not colon:
                raise RemoteProtocolError(f"malformed response header line: {line[:80]!r}")
            headers[key.strip().lower()] = value.strip()
        self.headers = headers
        self.t_head = stamp
        self.status = status
        coding = headers.get("transfer-encoding", "")
        length = headers.get("content-length")
        if status in (204, 304):
            self._mode, self._complete = "length", True
        elif coding and coding.rsplit(",", 1)[-1].strip().lower() == "chunked":
            self._mode = "chunked"
        elif length is not None and not coding:
            try:
                self._left = int(length.split(",")[0])
            except ValueError:
                raise RemoteProtocolError(f"bad Content-Length {length!r}") from None
            if self._left < 0:
                raise RemoteProtocolError(f"bad Content-Length {length!r}")
            self._mode, self._complete = "length", self._left == 0
        else:
            self._mode = "close"  # the body runs to the end of the connection

    def _dechunk(self, data: bytes) -> bytes:
        """The chunk payloads in one network read; the framing is consumed, the state kept."""
        parts: list[bytes] = []
        pos, end = 0, len(data)
        while pos < end:
            left = self._left
            if left:
                take = min(left, end - pos)
                parts.append(data[pos : pos + take] if take < end or pos else data)
                pos += take
                self._left = left - take
                continue
            eol = data.find(b"\n", pos)
            if eol < 0:
                self._line += data[pos:]
                if len(self._line) > 4096:
                    raise RemoteProtocolError("chunk size line too long")
                break
            line = data[pos:eol]
            if self._line:
                line, self._line = self._line + line, b""
            pos = eol + 1
            size_text = line.split(b";", 1)[0].strip()
            if not size_text:
                continue  # the CRLF that closes a chunk's data
            try:
                size = int(size_text, 16)
            except ValueError:
                raise RemoteProtocolError(f"bad chunk size {size_text[:20]!r}") from None
            if size == 0:
                self._complete = True  # trailers, if any, are not read: we close
                break
            self._left = size
        if len(parts) == 1:
            return parts[0]
        return b"".join(parts)

    def _on_eof(self) -> None:
        if self._complete:
            return
        if self.status is None:
            self._exc = RemoteProtocolError("Server disconnected without sending a response.")
        elif self._mode == "close":
            self._complete = True
        elif self._mode == "chunked":
            self._exc = RemoteProtocolError(
                "peer closed connection without sending complete message body: incomplete chunked read"
            )
        else:
            self._exc = RemoteProtocolError(
                f"peer closed connection without sending complete message body: {self._left} bytes missing"
            )

    # --- the request's side ---------------------------------------------------------

    async def _wait(self) -> None:
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def send(self, data: bytes) -> None:
        """Write the whole request; a partial write waits for the socket, it is never repeated."""
        try:
            sent = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            raise WriteError(str(exc) or type(exc).__name__) from None
        if sent < len(data):
            try:
                await self._loop.sock_sendall(self._sock, memoryview(data)[sent:])
            except OSError as exc:
                raise WriteError(str(exc) or type(exc).__name__) from None

    async def response(self) -> None:
        """Wait for the response head (status and headers)."""
        while self.status is None:
            if self._exc is not None:
                raise self._exc
            await self._wait()

    async def next(self) -> tuple[int, bytes] | None:
        """The next body payload with its arrival stamp; None once the body is complete."""
        while True:
            chunks = self._chunks
            if chunks:
                item = chunks.popleft()
                self._buffered -= len(item[1])
                if not self._reading and self._buffered <= _PAUSE_AT:
                    self._resume_reading()
                return item
            if self._complete:
                return None
            if self._exc is not None:
                raise self._exc
            await self._wait()

    async def read(self) -> bytes:
        """The rest of the body."""
        parts = []
        while (item := await self.next()) is not None:
            parts.append(item[1])
        return b"".join(parts)

    async def drain(self, limit_s: float) -> None:
        """Let the body finish for up to `limit_s` (after the terminal event); failures no longer matter."""
        if self._complete or self._exc is not None:
            return
        try:
            async with asyncio.timeout(limit_s):
                while await self.next() is not None:
                    pass
        except (TimeoutError, TransportError):
            pass

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._stop_reading()
            self._loop.remove_writer(self._fd)  # a cancelled sock_sendall unregisters only later
            self._sock.close()
