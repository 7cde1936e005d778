"""A small HTTP/1.1 client for plain-http targets: stamped connections, fresh or kept open.

httpx -> httpcore -> h11 cost several async layers per network chunk (most of the engine's CPU
per streamed request); here the stamped socket reader's callback (`transport.StampedSocket`, the
one httpx's plain-http path uses too) receives each network read with its kernel receive stamp,
parses the response head and de-frames the body (Content-Length, chunked or close-delimited) in
one pass, and queues the payload with that stamp for the reader. A connection says whether it may
carry another request (`reusable`); whether it does is `replay.engine.connections`' decision, and
a request is never re-sent once any byte of it went out.
"""

from __future__ import annotations

import asyncio
import functools
import socket
from urllib.parse import urlsplit

from replay import __version__, clock
from replay.engine import transport
from replay.engine.chunks import ChunkError, Dechunker

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


class NotSent(WriteError):
    """The connection refused the request's first byte: nothing of it went out."""


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


def request_head(
    method: str, target: str, authority: str, headers: dict[str, str], length: int, keep: bool = False
) -> bytes:
    """The request line and headers; Host, User-Agent and Content-Length are ours unless given.

    Connection is always ours: `Connection: close` unless the connection is to be `keep`t.
    """
    lines = [f"{method} {target} HTTP/1.1", f"Host: {authority}"]
    given = {k.lower() for k in headers}
    if "user-agent" not in given:
        lines.append(f"User-Agent: {_USER_AGENT}")
    for key, value in headers.items():
        low = key.lower()
        if low in ("host", "content-length", "transfer-encoding", "connection"):
            continue
        if "\r" in value or "\n" in value or "\r" in key or "\n" in key or ":" in key:
            raise LocalProtocolError(f"header {key!r} cannot be sent as given")
        lines.append(f"{key}: {value}")
    if not keep:
        lines.append("Connection: close")
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


class Connection(transport.StampedSocket):
    """One request's connection: the stamped socket reader, framing the body in its callback.

    Body payloads queue as (arrival stamp, bytes), one entry per network read; the consumer
    takes them with `next()`. The data ends where the body's framing says it does.
    """

    __slots__ = (
        "_head",
        "_mode",
        "_left",
        "_chunks_in",
        "_keep",
        "_trailer",
        "status",
        "headers",
        "t_head",
        "key",
        "served",
        "idle_since",
        "t_gone",
        "opened_ns",
        "_idle",
    )

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(sock, loop)
        self._head = bytearray()
        self._mode = ""  # "chunked" | "length" | "close", once the head is parsed
        self._left = 0  # bytes still due of a Content-Length body
        self._chunks_in = Dechunker()  # a chunked body's framing state
        self._keep = False  # the response lets the connection carry another request
        self._trailer: bytes | None = None  # a chunked body's trailer section, until its blank line
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.t_head: int | None = None  # arrival stamp of the read that completed the head
        self.key: tuple[str, int] = ("", 0)  # the target it is connected to
        self.served = 0  # responses read on it before the current request
        self.idle_since = 0  # when it was last put back idle
        self.t_gone: int | None = None  # when the peer closed it or broke it after a response
        self.opened_ns = clock.now_ns()  # made right after the connect completed
        self._idle = False  # between a response and the next request on it

    @property
    def reused(self) -> bool:
        return self.served > 0

    @property
    def says_close(self) -> bool:
        """The last response refused keep-alive (`Connection: close`, HTTP/1.0, or a body to EOF)."""
        return self.status is not None and not self._keep

    @property
    def reusable(self) -> bool:
        """The response ended where its framing said, cleanly, and the server allowed another."""
        return (
            self._keep
            and self._ended
            and self._trailer is None
            and self._exc is None
            and self.t_gone is None
            and not self._closed
        )

    def recycle(self, now: int) -> None:
        """Make ready for the next request on the same socket (after a `reusable` response)."""
        self._head.clear()
        self._mode = ""
        self._left = 0
        self._chunks_in.reset()
        self._keep = False
        self._trailer = None
        self.status = None
        self.headers = {}
        self.t_head = None
        self._ended = False
        self._chunks.clear()
        self._buffered = 0
        self.served += 1
        self.idle_since = now
        self._idle = True
        if not self._reading:
            self._resume_reading()  # an idle connection listens for the server closing it

    def alive(self) -> bool:
        """Ask the socket itself, just before reusing it: False if the peer closed or wrote."""
        if self.t_gone is not None or self._exc is not None or self._closed:
            return False
        try:
            self._sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        return False  # EOF, or bytes nobody asked for: either way not reusable

    # --- the loop's side ------------------------------------------------------------

    def _read_error(self, text: str) -> Exception:
        return ReadError(text)

    def _on_data(self, stamp: int, data: bytes) -> None:
        if self._idle:  # bytes no request asked for (a 408 before an idle close): never reuse it
            self._gone(stamp)
            return
        try:
            self._frame(stamp, data)
        except RemoteProtocolError as exc:
            self._fail(exc)

    def _frame(self, stamp: int, data: bytes) -> None:
        if self._ended:
            if self._trailer is not None:
                self._end_trailer(data)
            else:  # bytes after the body's end: nothing more may be read from this connection
                self._gone(stamp)
            return
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
                self._ended = True
        else:
            payload = data
        if payload:
            self._push(stamp, payload)
        if self._ended and not self._keep:
            self._stop_reading()  # a kept connection goes on listening, for the server closing it

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
        self._settle_send_stamp()  # the answer is here: a send stamp still missing comes too late
        tokens = headers.get("connection", "").lower()
        self._keep = version == "HTTP/1.1" and "close" not in tokens and status != 101
        coding = headers.get("transfer-encoding", "")
        length = headers.get("content-length")
        if status in (204, 304):
            self._mode, self._ended = "length", True
        elif coding and coding.rsplit(",", 1)[-1].strip().lower() == "chunked":
            self._mode = "chunked"
        elif length is not None and not coding:
            try:
                self._left = int(length.split(",")[0])
            except ValueError:
                raise RemoteProtocolError(f"bad Content-Length {length!r}") from None
            if self._left < 0:
                raise RemoteProtocolError(f"bad Content-Length {length!r}")
            self._mode, self._ended = "length", self._left == 0
        else:
            self._mode = "close"  # the body runs to the end of the connection
            self._keep = False

    def _dechunk(self, data: bytes) -> bytes:
        """The chunk payloads in one network read (`chunks.Dechunker`); after the last chunk, the
        trailer section."""
        body = self._chunks_in
        try:
            payload = body.feed(data)
        except ChunkError as exc:
            raise RemoteProtocolError(str(exc)) from None
        if body.done:
            self._ended = True
            self._trailer = b""
            self._end_trailer(body.rest)
        return payload

    def _end_trailer(self, data: bytes) -> None:
        """Read the trailer section up to its blank line; anything after it spoils the connection."""
        seen = (self._trailer or b"") + data
        if seen.startswith(b"\r\n") or seen.startswith(b"\n"):
            rest = seen[2 if seen[:1] == b"\r" else 1 :]
        else:
            end = seen.find(b"\r\n\r\n")
            if end < 0:
                self._trailer = seen if len(seen) <= _HEAD_MAX else None
                if self._trailer is None:
                    self._keep = False
                return
            rest = seen[end + 4 :]
        self._trailer = None
        if rest:
            self._keep = False

    def _gone(self, stamp: int) -> None:
        self._keep = False
        if self.t_gone is None:
            self.t_gone = stamp
        self._stop_reading()

    def _fail(self, exc: Exception) -> None:
        if self._ended or self._idle:
            self._gone(clock.now_ns())
        super()._fail(exc)

    def _on_eof(self) -> None:
        if self._ended or self._idle:
            self._gone(clock.now_ns())  # closed after its response: not reusable
            return
        if self.status is None:
            self._exc = RemoteProtocolError("Server disconnected without sending a response.")
        elif self._mode == "close":
            self._ended = True
        elif self._mode == "chunked":
            self._exc = RemoteProtocolError(
                "peer closed connection without sending complete message body: incomplete chunked read"
            )
        else:
            self._exc = RemoteProtocolError(
                f"peer closed connection without sending complete message body: {self._left} bytes missing"
            )

    # --- the request's side ---------------------------------------------------------

    async def send(self, data: bytes) -> None:
        """Write the whole request; a partial write waits for the socket, it is never repeated."""
        self._idle = False
        try:
            await self._send(data)
        except transport.NothingSent as exc:
            raise NotSent(str(exc) or type(exc).__name__) from None
        except OSError as exc:
            raise WriteError(str(exc) or type(exc).__name__) from None

    async def response(self) -> None:
        """Wait for the response head (status and headers)."""
        while self.status is None:
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
        if self._ended or self._exc is not None:
            return
        try:
            async with asyncio.timeout(limit_s):
                while await self.next() is not None:
                    pass
        except (TimeoutError, TransportError):
            pass
