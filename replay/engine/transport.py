"""The HTTP transport under the API clients: stamps where bytes arrive and where a request leaves.

Network chunks carry the time they arrived (the kernel's receive stamp on Linux), never the time
the parser got to them, so neither parsing nor a busy event loop shows up as TTFT. A send carries
the time its last byte left (the kernel's transmit stamp on Linux, read from the socket's error
queue; elsewhere the moment send() took the last byte), so TTFT runs between two kernel stamps.
`make_client()` opens a fresh connection per request and never pools or retries, because
llama-server closes the connection after each stream while saying keep-alive, and ds4 closes
after every response; reusing one would fail or silently re-send a request whose body went out.
The engine's API clients send plain http through `replay.engine.http1` (a `StampedSocket` that
frames HTTP/1.1 itself) and only https through `make_client()`, whose plain-http streams are
`StampedSocket`s too; the recording proxy uses it for both.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
import ssl
import struct
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import httpcore
import httpx

from replay import clock

# --- transport: stamps taken where bytes arrive ---------------------------------------

# Linux stamps every received packet in the kernel when SO_TIMESTAMPNS is set, and TCP
# hands the stamp of the newest packet read to recvmsg() (kernel >= 4.13). With it a
# token's arrival time no longer depends on when our event loop got round to reading
# it: a GC pause or hundreds of busy streams in the same loop do not move TTFT.
# Elsewhere (or if the option is refused) the stamp is taken in the loop's read callback.
_SO_TIMESTAMPNS = 35 if sys.platform.startswith("linux") else None  # == SCM_TIMESTAMPNS
_TIMESPEC = struct.Struct("@ll")
_RECV_BYTES = 256 * 1024
_PAUSE_AT = 4 << 20  # stop reading when this many bytes wait for the reader


# The send side: SO_TIMESTAMPING asks the kernel to stamp the moment the last byte of each
# send() call is handed to the device (SND; loopback and most drivers stamp it). The stamps come
# back on the socket's error queue, each with the byte offset it is for (OPT_ID counts a TCP
# socket's bytes from 0), so the one for a request's last byte can be told apart. The queueing
# discipline's stamp (SCHED) is not asked for: it would cost a second read per request.
_SO_TIMESTAMPING = 37 if sys.platform.startswith("linux") else None  # == SCM_TIMESTAMPING
# TX_SOFTWARE | SOFTWARE | OPT_ID | OPT_TSONLY
_TX_FLAGS = (1 << 1) | (1 << 4) | (1 << 7) | (1 << 11)
_MSG_ERRQUEUE = getattr(socket, "MSG_ERRQUEUE", 0x2000)
_RECVERR = ((getattr(socket, "SOL_IP", 0), 11), (getattr(socket, "SOL_IPV6", 41), 25))  # IP(V6)_RECVERR
_EXTENDED_ERR = struct.Struct("=IBBBBII")  # sock_extended_err: errno origin type code pad info data
_ORIGIN_TIMESTAMPING = 4
_TSTAMP_SND = 0  # the stamp taken as the bytes go to the device


def enable_send_stamps(sock: socket.socket) -> bool:
    """Ask the kernel to stamp when each send's last byte leaves; False where it cannot."""
    if _SO_TIMESTAMPING is None:
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPING, _TX_FLAGS)
    except OSError:
        return False
    return True


def send_stamps(sock: socket.socket, until: int = -1) -> list[tuple[int, int, int]]:
    """Drain the error queue: (kind, byte id, wall-clock ns) of each send stamp waiting there,
    stopping early at the SND stamp of byte `until`."""
    out: list[tuple[int, int, int]] = []
    while True:
        try:
            _data, anc, _flags, _addr = sock.recvmsg(1, 512, _MSG_ERRQUEUE | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return out
        except OSError:
            return out
        wall, kind, ident = 0, -1, -1
        for level, what, raw in anc:
            if level == socket.SOL_SOCKET and what == _SO_TIMESTAMPING and len(raw) >= _TIMESPEC.size:
                sec, nsec = _TIMESPEC.unpack_from(raw)  # the first of three: the software stamp
                wall = sec * 1_000_000_000 + nsec
            elif (level, what) in _RECVERR and len(raw) >= _EXTENDED_ERR.size:
                _errno, origin, _t, _c, _p, info, data = _EXTENDED_ERR.unpack_from(raw)
                if origin == _ORIGIN_TIMESTAMPING:
                    kind, ident = info, data
        if wall and kind >= 0:
            out.append((kind, ident, wall))
            if kind == _TSTAMP_SND and ident == until:
                return out


def enable_kernel_stamps(sock: socket.socket) -> bool:
    """Ask the kernel to stamp this socket's packets; False where it cannot (then stamp on read)."""
    if _SO_TIMESTAMPNS is None:
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


_TIGHT_NS = 20_000  # two clock reads this close were not split by a thread switch
_OFFSET_TRIES = 16
_OFFSET_KEEP_NS = 100_000_000  # the clocks drift apart by microseconds a second at most


class _ClockOffset:
    """Wall clock minus the monotonic clock: what moves a kernel stamp (wall-clock) onto ours.

    Another thread, or a realtime server preempting this process, can run between two clock
    reads; a bracket split that way shifts every stamp converted with it by the switch, and
    one such shift once put a request's send stamp after its own reply's first token. So the
    offset comes from the tightest of up to 16 bracketed reads and, once one is tight, serves
    every stamp for 100 ms (one clock read per stamp instead of several). A step of the wall
    clock is caught by each stamp's own range check; a jump of our clock (`replay.clock`: a test's
    fake one) makes the next stamp measure it again.
    """

    __slots__ = ("jumps", "offset", "until")

    def __init__(self) -> None:
        self.offset = 0
        self.until = -1  # monotonic ns until which `offset` is used as it is; -1: not measured
        self.jumps = 0  # clock.jumps when `offset` was measured

    def __call__(self) -> int:
        if self.until >= 0 and clock.now_ns() < self.until and clock.jumps == self.jumps:
            return self.offset
        self.jumps = clock.jumps
        best_width, offset, after = -1, 0, 0
        for _ in range(_OFFSET_TRIES):
            before = clock.now_ns()
            wall = time.time_ns()
            after = clock.now_ns()
            if best_width < 0 or after - before < best_width:
                best_width, offset = after - before, wall - (before + after) // 2
            if best_width <= _TIGHT_NS:
                break
        self.offset = offset
        self.until = after + _OFFSET_KEEP_NS if best_width <= _TIGHT_NS else -1
        return offset

    def forget(self) -> None:
        self.until = -1


wall_minus_monotonic = _ClockOffset()


def kernel_stamp(anc: list[tuple[int, int, bytes]], now: int) -> int:
    """The monotonic arrival time in recvmsg()'s ancillary data, or `now` without a usable one."""
    for level, kind, raw in anc:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(raw) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(raw)
            # Kernel stamps are wall-clock; move them onto the monotonic clock.
            kernel = sec * 1_000_000_000 + nsec - wall_minus_monotonic()
            if now - 60_000_000_000 < kernel <= now:  # else the wall clock stepped
                return kernel
    return now


class NothingSent(OSError):
    """The socket refused the first byte of a send: none of it went out."""


class StampedSocket:
    """A connected socket read eagerly in the event loop's reader callback, every read stamped.

    The callback receives data as soon as the socket is readable, with the kernel's receive
    stamp where there is one and its own otherwise, so no stamp waits for the consuming task.
    Subclasses decide what the bytes are (`_on_data`, `_on_eof`; the default queues them as
    they came); the consumer takes (arrival stamp, bytes) with `next()`. Reading pauses while
    more than 4 MiB wait. A failure is raised only after everything that arrived before it was
    taken, so a broken stream keeps what it delivered.
    """

    __slots__ = (
        "_sock",
        "_fd",
        "_loop",
        "_kernel",
        "_chunks",
        "_buffered",
        "_ended",
        "_exc",
        "_waiter",
        "_reading",
        "_closed",
        "_tx",
        "_tx_bytes",
        "_tx_want",
        "_tx_kind",
        "sent_ns",
        "returned_ns",
    )

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        self._sock = sock
        self._fd = sock.fileno()
        self._loop = loop
        self._kernel = enable_kernel_stamps(sock)
        self._tx = enable_send_stamps(sock)
        self._tx_bytes = 0  # bytes sent so far: the kernel numbers send stamps by them
        self._tx_want = -1  # the byte id whose stamp the last send waits for
        self._tx_kind = (
            _TSTAMP_SND  # SND once the last send's stamp came (or stopped being awaited); -1 before
        )
        self.sent_ns = 0  # when the last send's last byte left: the kernel's stamp, else send()'s return
        self.returned_ns = 0  # when the last send() returned with its last byte
        self._chunks: deque[tuple[int, bytes]] = deque()
        self._buffered = 0
        self._ended = False  # nothing more will be queued: EOF, or the framing says the end came
        self._exc: Exception | None = None  # raised once the queue is empty
        self._waiter: asyncio.Future[None] | None = None
        self._reading = True
        self._closed = False
        loop.add_reader(self._fd, self._on_readable)

    # --- the loop's side ------------------------------------------------------------

    def _on_readable(self) -> None:
        if self._tx_kind != _TSTAMP_SND:  # a send stamp is still due: it may be what woke us
            self._take_send_stamps()
        try:
            if self._kernel:
                data, anc, _flags, _addr = self._sock.recvmsg(_RECV_BYTES, 64)
            else:
                data, anc = self._sock.recv(_RECV_BYTES), None
        except (BlockingIOError, InterruptedError):
            if self._tx:  # woken for the error queue (a send stamp): drain it, or this repeats
                self._take_send_stamps()
            return
        except OSError as exc:
            self._fail(self._read_error(str(exc) or type(exc).__name__))
            self._wake()
            return
        now = clock.now_ns()
        if not data:
            self._stop_reading()
            self._on_eof()
        else:
            self._on_data(kernel_stamp(anc, now) if anc else now, data)
        self._wake()

    def _on_data(self, stamp: int, data: bytes) -> None:
        self._push(stamp, data)

    def _on_eof(self) -> None:
        self._ended = True

    def _read_error(self, text: str) -> Exception:
        """The exception a failed read becomes, in the caller's vocabulary."""
        return OSError(text)

    def _push(self, stamp: int, payload: bytes) -> None:
        self._chunks.append((stamp, payload))
        self._buffered += len(payload)
        if self._buffered > _PAUSE_AT:
            self._stop_reading()

    def _fail(self, exc: Exception) -> None:
        self._stop_reading()
        self._exc = exc

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _stop_reading(self) -> None:
        if self._reading:
            self._reading = False
            self._loop.remove_reader(self._fd)

    def _resume_reading(self) -> None:
        if not (self._ended or self._closed or self._exc is not None):
            self._reading = True
            self._loop.add_reader(self._fd, self._on_readable)

    # --- the consumer's side --------------------------------------------------------

    async def _wait(self) -> None:
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def next(self) -> tuple[int, bytes] | None:
        """The next payload with its arrival stamp; None once the data has ended."""
        while True:
            chunks = self._chunks
            if chunks:
                item = chunks.popleft()
                self._buffered -= len(item[1])
                if not self._reading and self._buffered <= _PAUSE_AT:
                    self._resume_reading()
                return item
            if self._ended:
                return None
            if self._exc is not None:
                raise self._exc
            await self._wait()

    async def _send(self, data: bytes) -> None:
        """Write it all; a partial write waits for the socket, it is never repeated. Raises OSError."""
        try:
            sent = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            raise NothingSent(exc.errno, exc.strerror) from None
        if sent < len(data):
            await self._loop.sock_sendall(self._sock, memoryview(data)[sent:])
        self.sent_ns = self.returned_ns = clock.now_ns()  # every byte is the kernel's now
        if self._tx:
            self._tx_bytes += len(data)
            self._tx_want = (self._tx_bytes - 1) & 0xFFFFFFFF
            self._tx_kind = -1
            self._take_send_stamps()

    def _settle_send_stamp(self) -> None:
        """Stop looking for the last send's stamp before each read (a late one is still drained)."""
        self._tx_kind = _TSTAMP_SND

    def _take_send_stamps(self) -> None:
        """Move `sent_ns` to the kernel's stamp of the last send's last byte, once it is there
        (usually at once; later when the kernel held the bytes back)."""
        for kind, ident, wall in send_stamps(self._sock, self._tx_want):
            if ident != self._tx_want or kind != _TSTAMP_SND:
                continue
            now = clock.now_ns()
            stamp = wall - wall_minus_monotonic()
            if now - 60_000_000_000 < stamp <= now:  # else the wall clock stepped
                self.sent_ns, self._tx_kind = stamp, kind

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._stop_reading()
            self._loop.remove_writer(self._fd)  # a cancelled sock_sendall unregisters only later
            self._sock.close()


class _StampedStream(StampedSocket, httpcore.AsyncNetworkStream):
    """A plain TCP stream for httpcore; `rx_ns` is when the bytes last returned by read() arrived."""

    __slots__ = ("rx_ns",)

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(sock, loop)
        self.rx_ns: int | None = None

    def _read_error(self, text: str) -> Exception:
        return httpcore.ReadError(text)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            async with asyncio.timeout(timeout):
                item = await self.next()
        except TimeoutError:
            raise httpcore.ReadTimeout("read timed out") from None
        if item is None:
            return b""
        stamp, data = item
        if len(data) > max_bytes:
            rest = data[max_bytes:]
            self._chunks.appendleft((stamp, rest))
            self._buffered += len(rest)
            data = data[:max_bytes]
        self.rx_ns = stamp
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if self._closed:
            raise httpcore.WriteError("connection closed before the request was written")
        try:
            async with asyncio.timeout(timeout):
                await self._send(buffer)
        except TimeoutError:
            raise httpcore.WriteTimeout("write timed out") from None
        except OSError as exc:
            raise httpcore.WriteError(str(exc) or type(exc).__name__) from None

    async def aclose(self) -> None:
        self.close()

    async def start_tls(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("TLS is served by httpx's default transport (https:// mount)")

    def get_extra_info(self, info: str) -> Any:
        if info == "socket":
            return self._sock
        if info == "is_readable":
            # httpcore asks before reusing an idle connection; we never reuse, but answer truly.
            return bool(self._chunks) or self._ended or self._exc is not None
        if info in ("client_addr", "server_addr"):
            try:
                return self._sock.getsockname() if info == "client_addr" else self._sock.getpeername()
            except OSError:
                return None
        return None


async def resolve(loop: asyncio.AbstractEventLoop, host: str, port: int) -> list[Any]:
    """Addresses to try; an IP literal skips getaddrinfo, which asyncio runs in a thread."""
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    return [(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (str(ip), port))]


async def connect_socket(
    loop: asyncio.AbstractEventLoop,
    infos: list[Any],
    local_address: str | None = None,
    socket_options: Any = None,
) -> socket.socket:
    """A connected non-blocking TCP socket with Nagle off, trying each address in turn."""
    error: OSError | None = None
    for family, kind, proto, _name, addr in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for option in socket_options or ():
                sock.setsockopt(*option)
            if local_address:
                sock.bind((local_address, 0))
            await loop.sock_connect(sock, addr)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
        except BaseException:
            sock.close()
            raise
    raise error or OSError(f"no address to connect to for {infos!r}")


class _StampedBackend(httpcore.AsyncNetworkBackend):
    """Plain-TCP connects straight on the asyncio loop (an IP literal never touches a resolver thread)."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                infos = await resolve(loop, host, port)
                sock = await connect_socket(loop, infos, local_address, socket_options)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"connect to {host}:{port} timed out") from None
        except OSError as exc:
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from None
        return _StampedStream(sock, loop)

    async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not supported")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class _StampedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport with the stamping network backend under its connection pool."""

    def __init__(self, limits: httpx.Limits) -> None:
        super().__init__(limits=limits, retries=0, verify=False)  # plain TCP only: no CA bundle to load
        # httpx does not take a network backend; its pool is replaced with one built the
        # same way (httpx 0.28 keeps it in `_pool`) but on `_StampedBackend`.
        self._pool = httpcore.AsyncConnectionPool(
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            http1=True,
            http2=False,
            retries=0,
            network_backend=_StampedBackend(),
        )


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """Loading the CA bundle costs tens of milliseconds; once per process is enough."""
    return httpx.create_ssl_context()


class _TlsTransport(httpx.AsyncBaseTransport):
    """httpx's own transport for https, made at the first https request: a run against a plain
    http server (all of the bench's, most local ones) never loads the CA bundle, whose tens of
    milliseconds a worker would otherwise spend at the start of every run."""

    def __init__(self, limits: httpx.Limits) -> None:
        self._limits = limits
        self._inner: httpx.AsyncHTTPTransport | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._inner is None:
            self._inner = httpx.AsyncHTTPTransport(limits=self._limits, retries=0, verify=_tls_context())
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        if self._inner is not None:
            await self._inner.aclose()


def make_client(connect_timeout_s: float = 10.0) -> httpx.AsyncClient:
    """An AsyncClient that can never reuse a connection nor re-send a request.

    No keep-alive pool (each request opens its own connection and closes it), no
    connection cap (a cap would queue requests inside the client and hide it from
    TTFT), no retries, no proxies from the environment, no redirects. Plain http
    goes through the stamping transport; https through httpx's own (asyncio only).
    """
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    return httpx.AsyncClient(
        transport=_StampedTransport(limits),
        mounts={"https://": _TlsTransport(limits)},
        timeout=httpx.Timeout(None, connect=connect_timeout_s),
        trust_env=False,
        follow_redirects=False,
    )


def rx_clock(response: httpx.Response) -> Callable[[], int]:
    """Arrival stamp of the bytes just read, or the current time on transports without one."""
    stream = response.extensions.get("network_stream")
    if isinstance(stream, _StampedStream):
        return lambda: stream.rx_ns or clock.now_ns()
    return clock.now_ns
