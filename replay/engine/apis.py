"""One async request function per wire API, behind one registry (`APIS`).

Every function takes an `ApiCall` (neutral messages, see the brief) and returns an
`ApiResult`: it never raises for anything the server or the network did; the
failure is the result's `status` and one-line `error`, with whatever was received
kept. Only cancellation from the caller propagates.

Timing: each moment is a named `time.perf_counter_ns()` stamp on the result. Network
chunks carry the time they arrived (the kernel's receive stamp on Linux), never the
time the parser got to them, so neither parsing nor a busy event loop shows up as
TTFT. TTFT runs from the moment the request starts going out (connection setup is
`connect_s`) to the first event that carries content, reasoning or a tool call;
role-only chunks, keep-alive comments and usage-only chunks do not count.

Connections: `make_client()` opens a fresh connection per request and never pools
or retries, because llama-server closes the connection after each stream while
saying keep-alive, and ds4 closes after every response; reusing one would fail or
silently re-send a request whose body already went out.
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
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import anyio
import httpcore
import httpx
import orjson

from replay.engine.sse import SseEvent, SseParser
from replay.engine.usage import Usage, parse_usage

try:
    import sniffio  # noqa: F401
except ImportError:
    # httpcore runs `import sniffio` on every request; without the package each failed
    # import rescans sys.path (~0.3 ms per request, twice). Cache the miss; httpcore then
    # assumes asyncio, which is what we run on.
    sys.modules.setdefault("sniffio", None)  # type: ignore[arg-type]

Think = Literal["off", "on", "auto"]
Status = Literal["ok", "http_error", "timeout", "connect_error", "stream_broken", "server_error"]
State = Literal["waiting", "prefill", "decoding", "done"]
OnState = Callable[[State], None] | None

# Request fields that switch a model's thinking on or off, per API. Each set is one that
# no server we target rejects: ds4 reads `thinking`; llama.cpp, vLLM and SGLang read
# `chat_template_kwargs` (Qwen3-style templates) and ignore unknown fields. Not sent:
# `reasoning_effort: "none"` (vLLM/SGLang validate it against low|medium|high and answer 400).
THINK_FIELDS: dict[str, dict[Think, dict[str, Any]]] = {
    "openai": {
        "off": {"thinking": {"type": "disabled"}, "chat_template_kwargs": {"enable_thinking": False}},
        "on": {"chat_template_kwargs": {"enable_thinking": True}},
        "auto": {},
    },
    "anthropic": {
        "off": {"thinking": {"type": "disabled"}},
        "on": {"thinking": {"type": "enabled", "budget_tokens": 1024}},
        "auto": {},
    },
}

_ANTHROPIC_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
}
_ERROR_TEXT_MAX = 300
_DRAIN_S = 0.5  # how long the body may go on after [DONE] / message_stop


@dataclass(slots=True)
class ApiCall:
    """One request, fully materialised; the engine builds it, the API function sends it."""

    base_url: str  # without /v1
    model: str
    messages: list[dict[str, Any]]  # neutral format, content is str
    max_tokens: int
    tools: list[dict[str, Any]] | None = None  # OpenAI function tools
    temperature: float | None = None
    stream: bool = True
    think: Think = "auto"
    extra_body: dict[str, Any] = field(default_factory=dict)  # merged into the body last
    headers: dict[str, str] = field(default_factory=dict)  # e.g. X-Request-ID, X-Replay-*
    timeout_s: float | None = None  # whole request, send to last byte
    connect_timeout_s: float = 10.0

    @property
    def name(self) -> str:
        """How error messages name this request: by X-Request-ID when the engine set one."""
        for key, value in self.headers.items():
            if key.lower() == "x-request-id":
                return f"request {value}"
        return "request"


@dataclass(slots=True)
class ApiResult:
    """What came back, stamped; fields stay None for moments that were never reached."""

    status: Status = "ok"
    http_status: int | None = None
    error: str | None = None  # one line, names the request
    t_start: int | None = None  # the call began: before connecting
    t_connected: int | None = None  # TCP connection open
    t_sent: int | None = None  # request headers start going out: TTFT's zero
    t_headers: int | None = None  # response headers received
    t_first_byte: int | None = None  # first body chunk (may be a keep-alive or role chunk)
    t_first_token: int | None = None  # first content / reasoning / tool-call event
    t_last_token: int | None = None
    t_done: int | None = None  # terminal event / last body byte arrived; else when we gave up
    message: dict[str, Any] | None = None  # neutral assistant message
    finish: str | None = None  # OpenAI vocabulary: stop | length | tool_calls | ...
    usage: Usage = field(default_factory=Usage)
    raw_usage: dict[str, Any] | None = None  # usage object as the server sent it
    timings: dict[str, Any] | None = None  # llama.cpp `timings`
    x_sim: dict[str, Any] | None = None  # simulator's modelled times
    n_events: int = 0  # SSE events dispatched
    n_token_events: int = 0  # of which carried a token
    n_comments: int = 0  # keep-alive comment lines

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def _span(self, start: int | None, end: int | None) -> float | None:
        return None if start is None or end is None else (end - start) / 1e9

    @property
    def connect_s(self) -> float | None:
        return self._span(self.t_start, self.t_connected)

    @property
    def ttft_s(self) -> float | None:
        return self._span(self.t_sent, self.t_first_token)

    @property
    def headers_s(self) -> float | None:
        return self._span(self.t_sent, self.t_headers)

    @property
    def first_byte_s(self) -> float | None:
        return self._span(self.t_sent, self.t_first_byte)

    @property
    def latency_s(self) -> float | None:
        return self._span(self.t_sent, self.t_done)

    @property
    def decode_s(self) -> float | None:
        return self._span(self.t_first_token, self.t_last_token)

    @property
    def decode_tps(self) -> float | None:
        """Tokens per second after the first token (the first one is prefill's)."""
        n = self.usage.output_tokens
        span = self.decode_s
        if n is None or n < 2 or not span:
            return None
        return (n - 1) / span


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


class _StampedStream(httpcore.AsyncNetworkStream):
    """A plain TCP stream for httpcore; `rx_ns` is when the bytes last returned by read() arrived.

    Reading is eager: the loop's reader callback receives data as soon as the socket
    is readable and queues it with its stamp, so even the fallback stamp is not
    delayed by the consuming task's scheduling.
    """

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        self._sock = sock
        self._fd = sock.fileno()
        self._loop = loop
        self._kernel_stamps = False
        if _SO_TIMESTAMPNS is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
                self._kernel_stamps = True
            except OSError:
                pass
        self._chunks: deque[tuple[int, bytes]] = deque()
        self._buffered = 0
        self._eof = False
        self._exc: OSError | None = None
        self._wake: asyncio.Future[None] | None = None
        self._reading = True
        self._closed = False
        self.rx_ns: int | None = None
        loop.add_reader(self._fd, self._on_readable)

    def _on_readable(self) -> None:
        try:
            data, anc, _flags, _addr = self._sock.recvmsg(_RECV_BYTES, 64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._exc = exc
            data, anc = b"", []
        now = time.perf_counter_ns()
        if not data:
            self._eof = True
            self._stop_reading()
        else:
            stamp = now
            for level, kind, raw in anc:
                if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(raw) >= _TIMESPEC.size:
                    sec, nsec = _TIMESPEC.unpack_from(raw)
                    # Kernel stamps are wall-clock; move them onto the monotonic clock.
                    kernel = sec * 1_000_000_000 + nsec - (time.time_ns() - now)
                    if now - 60_000_000_000 < kernel <= now:  # else the wall clock stepped
                        stamp = kernel
            self._chunks.append((stamp, data))
            self._buffered += len(data)
            if self._buffered > _PAUSE_AT:
                self._stop_reading()
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def _stop_reading(self) -> None:
        if self._reading:
            self._reading = False
            self._loop.remove_reader(self._fd)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if not self._chunks and not self._eof:
            self._wake = self._loop.create_future()
            try:
                async with asyncio.timeout(timeout):
                    await self._wake
            except TimeoutError:
                raise httpcore.ReadTimeout("read timed out") from None
            finally:
                self._wake = None
        if self._chunks:
            stamp, data = self._chunks.popleft()
            if len(data) > max_bytes:
                self._chunks.appendleft((stamp, data[max_bytes:]))
                data = data[:max_bytes]
            self._buffered -= len(data)
            if not self._reading and not self._eof and not self._closed and self._buffered <= _PAUSE_AT:
                self._reading = True
                self._loop.add_reader(self._fd, self._on_readable)
            self.rx_ns = stamp
            return data
        if self._exc is not None:
            raise httpcore.ReadError(str(self._exc) or type(self._exc).__name__)
        return b""

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if self._closed:
            raise httpcore.WriteError("connection closed before the request was written")
        try:
            async with asyncio.timeout(timeout):
                await self._loop.sock_sendall(self._sock, buffer)
        except TimeoutError:
            raise httpcore.WriteTimeout("write timed out") from None
        except OSError as exc:
            raise httpcore.WriteError(str(exc) or type(exc).__name__) from None

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._stop_reading()
            self._loop.remove_writer(self._fd)  # a cancelled sock_sendall unregisters only later
            self._sock.close()

    async def start_tls(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("TLS is served by httpx's default transport (https:// mount)")

    def get_extra_info(self, info: str) -> Any:
        if info == "socket":
            return self._sock
        if info == "is_readable":
            # httpcore asks before reusing an idle connection; we never reuse, but answer truly.
            return bool(self._chunks) or self._eof
        if info in ("client_addr", "server_addr"):
            try:
                return self._sock.getsockname() if info == "client_addr" else self._sock.getpeername()
            except OSError:
                return None
        return None


async def _resolve(loop: asyncio.AbstractEventLoop, host: str, port: int) -> list[Any]:
    """Addresses to try; an IP literal skips getaddrinfo, which asyncio runs in a thread."""
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    return [(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (str(ip), port))]


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
                infos = await _resolve(loop, host, port)
                sock = await self._connect(loop, infos, local_address, socket_options)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"connect to {host}:{port} timed out") from None
        except OSError as exc:
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from None
        return _StampedStream(sock, loop)

    @staticmethod
    async def _connect(
        loop: asyncio.AbstractEventLoop, infos: list[Any], local_address: str | None, socket_options: Any
    ) -> socket.socket:
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
        mounts={"https://": httpx.AsyncHTTPTransport(limits=limits, retries=0, verify=_tls_context())},
        timeout=httpx.Timeout(None, connect=connect_timeout_s),
        trust_env=False,
        follow_redirects=False,
    )


def _rx_clock(response: httpx.Response) -> Callable[[], int]:
    """Arrival stamp of the bytes just read, or the current time on transports without one."""
    stream = response.extensions.get("network_stream")
    if isinstance(stream, _StampedStream):
        return lambda: stream.rx_ns or time.perf_counter_ns()
    return time.perf_counter_ns


# --- shared exchange ------------------------------------------------------------------


class _Reader(Protocol):
    """Per-API interpretation of a response; the exchange does HTTP, timing and faults."""

    terminal: str  # what a complete stream ends with, for the error message
    done: bool  # terminal event seen
    error: str | None  # the server reported an error inside the stream

    def event(self, ev: SseEvent) -> bool: ...  # True when the event carried a token
    def body(self, obj: dict[str, Any]) -> None: ...  # whole non-stream response
    def fill(self, res: ApiResult) -> None: ...  # message, finish, usage from what was read


class _BadPayload(Exception):
    """The server sent bytes that are not the JSON the protocol promises."""


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _ERROR_TEXT_MAX else text[: _ERROR_TEXT_MAX - 3] + "..."


def _error_text(payload: bytes) -> str:
    """The human part of an error body: `error.message`, `error`, `detail`, or the text."""
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return _one_line(payload.decode("utf-8", "replace")) or "(empty body)"
    if isinstance(obj, dict):
        err = obj.get("error", obj.get("detail"))
        if isinstance(err, dict):
            err = err.get("message") or err.get("type") or err
        if err is not None:
            return _one_line(err if isinstance(err, str) else orjson.dumps(err).decode())
    return _one_line(orjson.dumps(obj).decode())


def _transport_text(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return _one_line(f"{type(exc).__name__}: {text}")


class _SendStamps:
    """httpcore trace hook: stamps the moment the request starts going out.

    TTFT counts from there, so connection setup (a fresh TCP connect per request,
    see `make_client`) is measured as `connect_s` and never inflates TTFT.
    """

    __slots__ = ("res",)

    def __init__(self, res: ApiResult) -> None:
        self.res = res

    async def __call__(self, name: str, info: Mapping[str, Any]) -> None:
        if name == "http11.send_request_headers.started" or name == "http2.send_request_headers.started":
            self.res.t_sent = time.perf_counter_ns()
        elif name == "connection.connect_tcp.complete":
            self.res.t_connected = time.perf_counter_ns()


async def _exchange(
    client: httpx.AsyncClient,
    call: ApiCall,
    path: str,
    body: dict[str, Any],
    headers: dict[str, str],
    reader: _Reader,
    on_state: OnState,
) -> ApiResult:
    res = ApiResult()
    where = f"{call.name} POST {path}"
    parser = SseParser()
    if on_state:
        on_state("waiting")
    payload = orjson.dumps(body)
    request = client.build_request(
        "POST",
        call.base_url.rstrip("/") + path,
        content=payload,
        headers={**headers, **call.headers},
        timeout=httpx.Timeout(None, connect=call.connect_timeout_s),
        extensions={"trace": _SendStamps(res)},
    )
    try:
        with anyio.fail_after(call.timeout_s):
            await _talk(client, request, call.stream, res, reader, parser, on_state, where)
    except TimeoutError:
        if res.t_done is None:  # else only the drain after a complete response was cut short
            res.status, res.error = "timeout", f"{where}: no complete response after {call.timeout_s:g}s"
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol) as exc:
        res.status, res.error = "connect_error", f"{where}: {_transport_text(exc)}"
    except httpx.TransportError as exc:
        phase = "before response headers" if res.t_headers is None else f"after {res.n_events} events"
        res.status, res.error = "stream_broken", f"{where}: connection failed {phase}: {_transport_text(exc)}"
    except _BadPayload as exc:
        res.status, res.error = "stream_broken", f"{where}: {exc}"
    if res.t_done is None:
        res.t_done = time.perf_counter_ns()
    res.n_comments = parser.comments
    reader.fill(res)
    if on_state:
        on_state("done")
    return res


async def _talk(
    client: httpx.AsyncClient,
    request: httpx.Request,
    stream: bool,
    res: ApiResult,
    reader: _Reader,
    parser: SseParser,
    on_state: OnState,
    where: str,
) -> None:
    res.t_start = time.perf_counter_ns()
    response = await client.send(request, stream=True)
    if res.t_sent is None:  # a transport without httpcore's trace hook
        res.t_sent = res.t_start
    clock = _rx_clock(response)
    try:
        res.t_headers = clock()
        res.http_status = response.status_code
        if response.status_code >= 400:
            res.status = "http_error"
            text = _error_text(await response.aread())
            res.error = f"{where}: HTTP {response.status_code}: {text}"
            return
        if on_state:
            on_state("prefill")
        is_sse = response.headers.get("content-type", "").startswith("text/event-stream")
        if stream and is_sse:
            await _read_stream(response, clock, res, reader, parser, on_state, where)
        else:
            await _read_body(response, clock, res, reader)
    finally:
        await response.aclose()


async def _read_body(
    response: httpx.Response, clock: Callable[[], int], res: ApiResult, reader: _Reader
) -> None:
    chunks: list[bytes] = []
    async for chunk in response.aiter_raw():
        if res.t_first_byte is None:
            res.t_first_byte = clock()
        chunks.append(chunk)
    res.t_done = clock()
    try:
        obj = orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError as exc:
        raise _BadPayload(f"response body is not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise _BadPayload("response body is not a JSON object")
    reader.body(obj)


async def _read_stream(
    response: httpx.Response,
    clock: Callable[[], int],
    res: ApiResult,
    reader: _Reader,
    parser: SseParser,
    on_state: OnState,
    where: str,
) -> None:
    feed = parser.feed
    event = reader.event
    chunks = response.aiter_raw()
    async for chunk in chunks:
        now = clock()
        if res.t_first_byte is None:
            res.t_first_byte = now
        for ev in feed(chunk):
            res.n_events += 1
            if event(ev):
                res.n_token_events += 1
                if res.t_first_token is None:
                    res.t_first_token = now
                    if on_state:
                        on_state("decoding")
                res.t_last_token = now
            if reader.done or reader.error is not None:
                break
        if reader.done or reader.error is not None:
            res.t_done = now
            break
    else:
        for ev in parser.finish():
            res.n_events += 1
            reader.event(ev)
            if reader.done or reader.error is not None:
                break
    if reader.error is not None:
        res.status, res.error = "server_error", f"{where}: server error in stream: {reader.error}"
    elif not reader.done:
        got = len(parser.pending)
        res.status = "stream_broken"
        res.error = f"{where}: stream ended without {reader.terminal} after {res.n_events} events" + (
            f" ({got} bytes of an unfinished event dropped)" if got else ""
        )
    if res.t_done is not None:
        await _drain(chunks)


async def _drain(chunks: AsyncIterator[bytes]) -> None:
    """Read the body to its end after the terminal event, briefly.

    Leaving the async-for early would strand httpx's chain of async generators for the
    garbage collector, which finalises each through a new task (about five per
    request). Whatever happens after the terminal event (a close without the last
    chunk, a reset) no longer concerns the request.
    """
    with anyio.move_on_after(_DRAIN_S):
        try:
            async for _ in chunks:
                pass
        except httpx.TransportError:
            pass


def _loads(data: bytes) -> dict[str, Any]:
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise _BadPayload(
            f"event data is not JSON: {_one_line(data[:120].decode('utf-8', 'replace'))}"
        ) from None
    if not isinstance(obj, dict):
        raise _BadPayload("event data is not a JSON object")
    return obj


def _stream_error(obj: Any) -> str:
    err = obj.get("error", obj) if isinstance(obj, dict) else obj
    if isinstance(err, dict):
        err = err.get("message") or err.get("type") or orjson.dumps(err).decode()
    return _one_line(str(err))


def _message(content: list[str], reasoning: list[str], tool_calls: list[dict[str, str]]) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
    if tool_calls:
        msg["tool_calls"] = tool_calls
    if reasoning:
        msg["reasoning"] = "".join(reasoning)
    return msg


# --- OpenAI chat completions ----------------------------------------------------------


def openai_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Neutral -> OpenAI wire; only assistant turns with tool calls or reasoning change."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.get("role") != "assistant" or ("tool_calls" not in m and "reasoning" not in m):
            out.append(m)
            continue
        wire = {k: v for k, v in m.items() if k not in ("tool_calls", "reasoning")}
        if m.get("tool_calls"):
            wire["tool_calls"] = [
                {
                    "id": tc["id"],
                    "type": "function",
                    "function": {"name": tc["name"], "arguments": tc["arguments"]},
                }
                for tc in m["tool_calls"]
            ]
        out.append(wire)
    return out


def openai_body(call: ApiCall) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": call.model,
        "messages": openai_messages(call.messages),
        "max_tokens": call.max_tokens,
        "stream": call.stream,
    }
    if call.stream:
        body["stream_options"] = {"include_usage": True}
    if call.temperature is not None:
        body["temperature"] = call.temperature
    if call.tools:
        body["tools"] = call.tools
    body.update(THINK_FIELDS["openai"][call.think])
    body.update(call.extra_body)
    return body


class _OpenAIReader:
    terminal = "[DONE]"

    def __init__(self) -> None:
        self.done = False
        self.error: str | None = None
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tools: dict[int, dict[str, str]] = {}
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None
        self.timings: dict[str, Any] | None = None
        self.meta_info: dict[str, Any] | None = None
        self.x_sim: dict[str, Any] | None = None

    def _tail(self, obj: dict[str, Any]) -> None:
        # Usage, timings and x_sim may ride on any chunk; the last one that carries them wins.
        usage = obj.get("usage")
        if usage:
            self.usage = usage
        timings = obj.get("timings")
        if timings:
            self.timings = timings
        meta = obj.get("meta_info")
        if meta:
            self.meta_info = meta
        x_sim = obj.get("x_sim")
        if x_sim:
            self.x_sim = x_sim

    def event(self, ev: SseEvent) -> bool:
        data = ev.data
        if data == b"[DONE]":
            self.done = True
            return False
        obj = _loads(data)
        if ev.event == "error" or ("error" in obj and not obj.get("choices")):
            self.error = _stream_error(obj)
            return False
        if "usage" in obj or "timings" in obj or "x_sim" in obj or "meta_info" in obj:
            self._tail(obj)
        token = False
        for choice in obj.get("choices") or ():
            delta = choice.get("delta")
            if delta:
                text = delta.get("content")
                if text:
                    self.content.append(text)
                    token = True
                text = delta.get("reasoning_content") or delta.get("reasoning")
                if text:
                    self.reasoning.append(text)
                    token = True
                calls = delta.get("tool_calls")
                if calls:
                    self._tool_deltas(calls)
                    token = True
            reason = choice.get("finish_reason")
            if reason:
                self.finish = reason
        return token

    def _tool_deltas(self, calls: list[dict[str, Any]]) -> None:
        for pos, tc in enumerate(calls):
            index = tc.get("index", pos)
            entry = self.tools.get(index)
            if entry is None:
                entry = self.tools[index] = {"id": "", "name": "", "arguments": ""}
            if tc.get("id"):
                entry["id"] = tc["id"]
            fn = tc.get("function") or {}
            name = fn.get("name")
            # Most servers send the name once; some repeat it on every delta, a few split it.
            if name and name != entry["name"]:
                entry["name"] += name
            args = fn.get("arguments")
            if args:
                entry["arguments"] += args

    def body(self, obj: dict[str, Any]) -> None:
        self.done = True
        self._tail(obj)
        choices = obj.get("choices") or [{}]
        choice = choices[0]
        msg = choice.get("message") or {}
        if msg.get("content"):
            self.content.append(msg["content"])
        reasoning = msg.get("reasoning_content") or msg.get("reasoning")
        if reasoning:
            self.reasoning.append(reasoning)
        for i, tc in enumerate(msg.get("tool_calls") or ()):
            fn = tc.get("function") or {}
            self.tools[i] = {
                "id": tc.get("id", ""),
                "name": fn.get("name", ""),
                "arguments": fn.get("arguments", ""),
            }
        self.finish = choice.get("finish_reason")

    def fill(self, res: ApiResult) -> None:
        tool_calls = [self.tools[i] for i in sorted(self.tools)]
        if self.content or self.reasoning or tool_calls or self.done:
            res.message = _message(self.content, self.reasoning, tool_calls)
        res.finish = self.finish
        res.raw_usage = self.usage
        res.timings = self.timings
        res.x_sim = self.x_sim
        res.usage = parse_usage({"usage": self.usage, "timings": self.timings, "meta_info": self.meta_info})


_OPENAI_HEADERS = {"content-type": "application/json", "accept-encoding": "identity", "connection": "close"}


async def openai_chat(client: httpx.AsyncClient, call: ApiCall, on_state: OnState = None) -> ApiResult:
    """POST /v1/chat/completions."""
    headers = {**_OPENAI_HEADERS, "accept": "text/event-stream" if call.stream else "application/json"}
    return await _exchange(
        client, call, "/v1/chat/completions", openai_body(call), headers, _OpenAIReader(), on_state
    )


# --- Anthropic messages ---------------------------------------------------------------


def _tool_input(arguments: str) -> Any:
    """Tool-call arguments are JSON text in the neutral format, an object on this wire."""
    try:
        return orjson.loads(arguments) if arguments else {}
    except orjson.JSONDecodeError:
        # A recorded call cut short by max_tokens: keep the text rather than drop the call.
        return {"_raw_arguments": arguments}


def anthropic_messages_wire(messages: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """Neutral -> Anthropic wire: (system text, turns).

    System messages become the `system` parameter; tool results become `tool_result`
    blocks in a user turn; tool calls become `tool_use` blocks. Consecutive turns of the
    same role merge, since the API wants user and assistant to alternate.
    """
    system: list[str] = []
    turns: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]] | str) -> None:
        if turns and turns[-1]["role"] == role:
            prev = turns[-1]["content"]
            if isinstance(prev, str):
                prev = [{"type": "text", "text": prev}]
            new = [{"type": "text", "text": blocks}] if isinstance(blocks, str) else blocks
            turns[-1]["content"] = prev + new
        else:
            turns.append({"role": role, "content": blocks})

    for m in messages:
        role = m.get("role")
        content = m.get("content") or ""
        if role == "system":
            system.append(content)
        elif role == "tool":
            add(
                "user",
                [{"type": "tool_result", "tool_use_id": m.get("tool_call_id", ""), "content": content}],
            )
        elif role == "assistant" and m.get("tool_calls"):
            blocks: list[dict[str, Any]] = [{"type": "text", "text": content}] if content else []
            blocks += [
                {
                    "type": "tool_use",
                    "id": tc["id"],
                    "name": tc["name"],
                    "input": _tool_input(tc["arguments"]),
                }
                for tc in m["tool_calls"]
            ]
            add("assistant", blocks)
        else:
            add("user" if role != "assistant" else "assistant", content)
    return ("\n\n".join(system) if system else None), turns


def anthropic_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for t in tools:
        fn = t.get("function", t)
        tool = {
            "name": fn["name"],
            "input_schema": fn.get("parameters") or {"type": "object", "properties": {}},
        }
        if fn.get("description"):
            tool["description"] = fn["description"]
        out.append(tool)
    return out


def anthropic_body(call: ApiCall) -> dict[str, Any]:
    system, turns = anthropic_messages_wire(call.messages)
    body: dict[str, Any] = {
        "model": call.model,
        "messages": turns,
        "max_tokens": call.max_tokens,
        "stream": call.stream,
    }
    if system is not None:
        body["system"] = system
    if call.temperature is not None:
        body["temperature"] = call.temperature
    if call.tools:
        body["tools"] = anthropic_tools(call.tools)
    body.update(THINK_FIELDS["anthropic"][call.think])
    body.update(call.extra_body)
    return body


class _AnthropicReader:
    terminal = "message_stop"

    def __init__(self) -> None:
        self.done = False
        self.error: str | None = None
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tools: dict[int, dict[str, str]] = {}
        self.stop_reason: str | None = None
        self.usage: dict[str, Any] = {}
        self.x_sim: dict[str, Any] | None = None

    def event(self, ev: SseEvent) -> bool:
        obj = _loads(ev.data)
        kind = obj.get("type") or ev.event
        if kind == "content_block_delta":
            delta = obj.get("delta") or {}
            dtype = delta.get("type")
            if dtype == "text_delta":
                text = delta.get("text")
                if text:
                    self.content.append(text)
                    return True
            elif dtype == "thinking_delta":
                text = delta.get("thinking")
                if text:
                    self.reasoning.append(text)
                    return True
            elif dtype == "input_json_delta":
                part = delta.get("partial_json")
                entry = self.tools.get(obj.get("index", -1))
                if part and entry is not None:
                    entry["arguments"] += part
                    return True
            return False
        if kind == "content_block_start":
            return self._block_start(obj.get("index", len(self.tools)), obj.get("content_block") or {})
        if kind == "message_delta":
            delta = obj.get("delta") or {}
            if delta.get("stop_reason"):
                self.stop_reason = delta["stop_reason"]
            self._merge_usage(obj.get("usage"))
            if obj.get("x_sim"):
                self.x_sim = obj["x_sim"]
            return False
        if kind == "message_start":
            msg = obj.get("message") or {}
            self._merge_usage(msg.get("usage"))
            return False
        if kind == "message_stop":
            self.done = True
            return False
        if kind == "error" or ev.event == "error":
            self.error = _stream_error(obj)
        return False  # ping, content_block_stop, signature deltas, future event types

    def _block_start(self, index: int, block: dict[str, Any]) -> bool:
        btype = block.get("type")
        if btype == "tool_use":
            # The name arrives here, as it does in OpenAI's first tool-call delta: a token.
            self.tools[index] = {"id": block.get("id", ""), "name": block.get("name", ""), "arguments": ""}
            return True
        if btype == "text" and block.get("text"):
            self.content.append(block["text"])
            return True
        if btype == "thinking" and block.get("thinking"):
            self.reasoning.append(block["thinking"])
            return True
        return False

    def _merge_usage(self, usage: Mapping[str, Any] | None) -> None:
        # message_start carries the prompt counts, message_delta the final output count.
        if usage:
            self.usage.update((k, v) for k, v in usage.items() if v is not None)

    def body(self, obj: dict[str, Any]) -> None:
        self.done = True
        for i, block in enumerate(obj.get("content") or ()):
            btype = block.get("type")
            if btype == "text":
                self.content.append(block.get("text", ""))
            elif btype == "thinking":
                self.reasoning.append(block.get("thinking", ""))
            elif btype == "tool_use":
                args = orjson.dumps(block.get("input", {})).decode()
                self.tools[i] = {"id": block.get("id", ""), "name": block.get("name", ""), "arguments": args}
        self.stop_reason = obj.get("stop_reason")
        self._merge_usage(obj.get("usage"))
        self.x_sim = obj.get("x_sim")

    def fill(self, res: ApiResult) -> None:
        tool_calls = [self.tools[i] for i in sorted(self.tools)]
        for tc in tool_calls:
            tc["arguments"] = tc["arguments"] or "{}"
        if self.content or self.reasoning or tool_calls or self.done:
            res.message = _message(self.content, self.reasoning, tool_calls)
        reason = self.stop_reason
        res.finish = _ANTHROPIC_FINISH.get(reason, reason) if reason else None
        res.raw_usage = self.usage or None
        res.x_sim = self.x_sim
        res.usage = parse_usage({"usage": self.usage})


_ANTHROPIC_HEADERS = {**_OPENAI_HEADERS, "anthropic-version": "2023-06-01"}


async def anthropic_messages(client: httpx.AsyncClient, call: ApiCall, on_state: OnState = None) -> ApiResult:
    """POST /v1/messages."""
    headers = {**_ANTHROPIC_HEADERS, "accept": "text/event-stream" if call.stream else "application/json"}
    return await _exchange(
        client, call, "/v1/messages", anthropic_body(call), headers, _AnthropicReader(), on_state
    )


ApiFunction = Callable[[httpx.AsyncClient, ApiCall, OnState], Awaitable[ApiResult]]

APIS: dict[str, ApiFunction] = {"openai": openai_chat, "anthropic": anthropic_messages}
