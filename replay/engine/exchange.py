"""One request's call, and the HTTP exchange every wire API shares.

Every API function takes an `ApiCall` (neutral messages) and fills a `RequestRecord` (the
engine's, or a fresh one): it never raises for anything the server or the network did; the
failure is the record's `status` and one-line `error`, with whatever was received kept. Only
cancellation from the caller propagates, leaving the stamps reached so far. Each moment is a named
`clock.now_ns()` stamp (replay/clock.py) on the record. TTFT runs from the moment the request starts going
out (connection setup is `connect_s`) to the first event that carries content, reasoning or a tool
call; role-only chunks, keep-alive comments and usage-only chunks do not count.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import anyio
import httpx
import orjson

from replay import clock
from replay.engine import http1
from replay.engine.connections import FRESH, Connections
from replay.engine.decode import BadPayload, BadShape, ReplyFields, load_object
from replay.engine.sse import SseEvent, SseParser
from replay.engine.transport import rx_clock
from replay.metrics.record import RequestRecord

Think = Literal["off", "on", "auto"]
Status = Literal[
    "ok", "http_error", "timeout", "connect_error", "stream_broken", "server_error", "bad_payload"
]
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
    # The Responses API has no switch every server accepts for "off" (OpenAI rejects unknown
    # fields, vLLM validates `reasoning.effort`): the trace's own `reasoning` settings decide.
    "openai-responses": {"off": {}, "on": {"reasoning": {"effort": "medium"}}, "auto": {}},
}


_ERROR_TEXT_MAX = 300
EVIDENCE_MAX = 2048  # bytes of a bad reply kept with its record
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
    # Responses API chains: the server holds the first `previous_messages` messages as this response.
    previous_response_id: str | None = None
    previous_messages: int = 0
    # Anthropic prompt caching: (message index, cache_control value), the mark on that message's last block.
    cache_marks: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    connections: Connections | None = None  # the run's kept connections; None: a fresh one

    @property
    def name(self) -> str:
        """How error messages name this request: by X-Request-ID when the engine set one."""
        for key, value in self.headers.items():
            if key.lower() == "x-request-id":
                return f"request {value}"
        return "request"


# --- shared exchange ------------------------------------------------------------------


class Reader(Protocol):
    """Per-API interpretation of a response; the exchange (or the recorder) does HTTP, timing and faults."""

    terminal: str  # what a complete stream ends with, for the error message
    done: bool  # terminal event seen
    error: str | None  # the server reported an error inside the stream

    def event(self, ev: SseEvent) -> bool: ...  # True when the event carried a token; may raise BadPayload
    def body(self, obj: ReplyFields) -> None: ...  # whole non-stream response; may raise BadPayload
    def fill(self, res: RequestRecord) -> None: ...  # message, finish, usage from what was read


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _ERROR_TEXT_MAX else text[: _ERROR_TEXT_MAX - 3] + "..."


def error_text(payload: bytes) -> str:
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

    def __init__(self, res: RequestRecord) -> None:
        self.res = res

    async def __call__(self, name: str, info: Mapping[str, Any]) -> None:
        if name == "http11.send_request_headers.started" or name == "http2.send_request_headers.started":
            self.res.t_sent = clock.now_ns()
        elif name == "connection.connect_tcp.complete":
            self.res.t_connected = clock.now_ns()


async def exchange(
    client: httpx.AsyncClient,
    call: ApiCall,
    path: str,
    body: dict[str, Any],
    headers: dict[str, str],
    reader: Reader,
    on_state: OnState,
    rec: RequestRecord | None = None,
) -> RequestRecord:
    """POST `body` and read the answer into `rec` (or a new record); plain http on our own
    HTTP/1.1 client, https through `client`."""
    res = RequestRecord() if rec is None else rec
    where = f"{call.name} POST {path}"
    parser = SseParser()
    if on_state:
        on_state("waiting")
    payload = orjson.dumps(body)
    url = call.base_url.rstrip("/") + path
    all_headers = {**headers, **call.headers}
    deadline = _Deadline.start(call.timeout_s)
    try:
        try:
            if url[:7].lower() == "http://":
                await _talk_http1(url, payload, all_headers, call, res, reader, parser, on_state, where)
            else:
                request = client.build_request(
                    "POST",
                    url,
                    content=payload,
                    headers=all_headers,
                    timeout=httpx.Timeout(None, connect=call.connect_timeout_s),
                    extensions={"trace": _SendStamps(res)},
                )
                await _talk(client, request, call.stream, res, reader, parser, on_state, where)
        except BaseException as exc:
            ours = deadline is not None and deadline.expired()
            if ours and isinstance(exc, asyncio.CancelledError):
                raise TimeoutError from None
            raise
        else:
            if deadline is not None:
                deadline.expired()  # a cancellation it asked for too late is taken back
        finally:
            if deadline is not None:
                deadline.handle.cancel()
    except TimeoutError:
        if res.t_end is None:  # else only the drain after a complete response was cut short
            res.status, res.error = "timeout", f"{where}: no complete response after {call.timeout_s:g}s"
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol, http1.ConnectError) as exc:
        res.status, res.error = "connect_error", f"{where}: {_transport_text(exc)}"
    except (httpx.TransportError, http1.TransportError) as exc:
        phase = "before response headers" if res.t_headers is None else f"after {res.n_events} events"
        res.status, res.error = "stream_broken", f"{where}: connection failed {phase}: {_transport_text(exc)}"
        if res.reused:
            res.error += " (on a kept connection; not re-sent: the server may have begun it)"
    except BadShape as exc:
        res.status, res.error = "bad_payload", f"{where}: wrong reply shape: {exc}"
        res.evidence = _evidence(exc.evidence)
    except BadPayload as exc:  # bytes that are not JSON at all: the stream itself is broken
        res.status, res.error = "stream_broken", f"{where}: {exc}"
        res.evidence = _evidence(exc.evidence)
    except (AttributeError, TypeError, KeyError, IndexError, ValueError) as exc:
        # Last line of defence: a reply shape the checked readers missed is still this request's
        # failure, never the run's. The readers' property tests keep this branch unreached.
        res.status, res.error = "bad_payload", f"{where}: reply could not be read: {_transport_text(exc)}"
    if res.t_end is None:
        res.t_end = clock.now_ns()
    res.n_comments = parser.comments
    try:
        reader.fill(res)
    except BadPayload as exc:  # the pieces read are each well typed, but do not fit together
        res.status, res.error = "bad_payload", f"{where}: wrong reply shape: {exc}"
    if on_state:
        on_state("done")
    return res


class _Deadline:
    """The request's timeout, by `asyncio.timeout`'s rules (a timer cancels the task; that
    cancellation, and only that one, becomes `TimeoutError`) at a third of its cost: asyncio's
    is Python code that looks the running loop up three times (each a getpid() on 3.11), and
    anyio's `fail_after` adds a cancel scope (client CPU per request)."""

    __slots__ = ("task", "cancelling", "fired", "handle")

    def __init__(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any], delay: float) -> None:
        self.task = task
        self.cancelling = task.cancelling()  # cancellations already asked for are not ours
        self.fired = False
        self.handle = loop.call_later(delay, self._fire)

    @staticmethod
    def start(delay: float | None) -> _Deadline | None:
        if delay is None:
            return None
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        return None if task is None else _Deadline(loop, task, delay)

    def _fire(self) -> None:
        self.fired = True
        self.task.cancel()

    def expired(self) -> bool:
        """Whether the timer fired, taking its cancellation back; True when no other came since."""
        return self.fired and self.task.uncancel() <= self.cancelling


class _Body(Protocol):
    """A response body as stamped payloads, whichever client read it."""

    async def next(self) -> tuple[int, bytes] | None: ...  # (arrival stamp, bytes); None at the end
    async def read(self) -> bytes: ...  # the rest, for an error body
    async def drain(self, limit_s: float) -> None: ...


async def _talk_http1(
    url: str,
    payload: bytes,
    headers: dict[str, str],
    call: ApiCall,
    res: RequestRecord,
    reader: Reader,
    parser: SseParser,
    on_state: OnState,
    where: str,
) -> None:
    host, port, authority, target = http1.split_url(url)
    pool = call.connections or FRESH
    head = http1.request_head("POST", target, authority, headers, len(payload), pool.keeps(host, port))
    res.t_start = clock.now_ns()
    try:
        conn = await pool.send(host, port, head + payload, call.connect_timeout_s)
    except http1.WriteError:
        res.t_sent = res.t_connected = clock.now_ns()
        raise
    try:
        # A kept connection took no time to open; TTFT counts from the request's last byte leaving.
        res.reused = conn.reused
        res.t_connected = res.t_start if conn.reused else conn.opened_ns
        res.t_sent = conn.sent_ns
        await conn.response()
        res.t_sent = conn.sent_ns  # the kernel's stamp, if it came only after the send returned
        if conn.t_head is not None and res.t_sent > conn.t_head:
            # No reply arrives before its request has left: a kernel stamp this late was moved
            # across a step of the wall clock. send()'s return is the next best stamp.
            res.t_sent = min(conn.returned_ns, conn.t_head)
        res.t_headers = conn.t_head
        content_type = conn.headers.get("content-type", "")
        await _respond(
            conn.status or 0, content_type, conn, call.stream, res, reader, parser, on_state, where
        )
    finally:
        pool.done(conn)


async def _talk(
    client: httpx.AsyncClient,
    request: httpx.Request,
    stream: bool,
    res: RequestRecord,
    reader: Reader,
    parser: SseParser,
    on_state: OnState,
    where: str,
) -> None:
    res.t_start = clock.now_ns()
    response = await client.send(request, stream=True)
    if res.t_sent is None:  # a transport without httpcore's trace hook
        res.t_sent = res.t_start
    body = _HttpxBody(response)
    try:
        res.t_headers = body.clock()
        content_type = response.headers.get("content-type", "")
        await _respond(response.status_code, content_type, body, stream, res, reader, parser, on_state, where)
    finally:
        await response.aclose()


class _HttpxBody:
    """An httpx streaming response seen as a `_Body`."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.clock = rx_clock(response)
        self._chunks = response.aiter_raw()

    async def next(self) -> tuple[int, bytes] | None:
        try:
            chunk = await self._chunks.__anext__()
        except StopAsyncIteration:
            return None
        return self.clock(), chunk

    async def read(self) -> bytes:
        return await self.response.aread()

    async def drain(self, limit_s: float) -> None:
        """Read the body to its end after the terminal event, briefly.

        Leaving the iteration early would strand httpx's chain of async generators for the
        garbage collector, which finalises each through a new task (about five per
        request). Whatever happens after the terminal event (a close without the last
        chunk, a reset) no longer concerns the request.
        """
        with anyio.move_on_after(limit_s):
            try:
                async for _ in self._chunks:
                    pass
            except httpx.TransportError:
                pass


async def _respond(
    status: int,
    content_type: str,
    body: _Body,
    stream: bool,
    res: RequestRecord,
    reader: Reader,
    parser: SseParser,
    on_state: OnState,
    where: str,
) -> None:
    res.http_status = status
    if status >= 400:
        res.status = "http_error"
        text = error_text(await body.read())
        res.error = f"{where}: HTTP {status}: {text}"
        return
    if on_state:
        on_state("prefill")
    if stream and content_type.startswith("text/event-stream"):
        await _read_stream(body, res, reader, parser, on_state, where)
    else:
        await _read_body(body, res, reader)


async def _read_body(body: _Body, res: RequestRecord, reader: Reader) -> None:
    chunks: list[bytes] = []
    last = res.t_headers
    while (item := await body.next()) is not None:
        last, chunk = item
        if res.t_first_byte is None:
            res.t_first_byte = last
        chunks.append(chunk)
    res.t_end = last
    data = b"".join(chunks)
    try:
        reader.body(load_object(data, "response body"))
    except BadPayload as exc:
        if exc.evidence is None:
            exc.evidence = data
        raise


async def _read_stream(
    body: _Body,
    res: RequestRecord,
    reader: Reader,
    parser: SseParser,
    on_state: OnState,
    where: str,
) -> None:
    feed = parser.feed
    event = reader.event
    take = body.next
    while (item := await take()) is not None:
        now, chunk = item
        if res.t_first_byte is None:
            res.t_first_byte = now
        for ev in feed(chunk):
            res.n_events += 1
            try:
                carried = event(ev)
            except BadPayload as exc:
                if exc.evidence is None:
                    exc.evidence = ev.data
                raise
            if carried:
                res.n_token_events += 1
                if res.t_first_token is None:
                    res.t_first_token = now
                    res.t_first_token_read = clock.now_ns()
                    if on_state:
                        on_state("decoding")
                res.t_last_token = now
            if reader.done or reader.error is not None:
                break
        if reader.done or reader.error is not None:
            res.t_end = now
            break
    else:
        for ev in parser.finish():
            res.n_events += 1
            try:
                reader.event(ev)
            except BadPayload as exc:
                if exc.evidence is None:
                    exc.evidence = ev.data
                raise
            if reader.done or reader.error is not None:
                break
    if reader.error is not None:
        res.status, res.error = "server_error", f"{where}: server error in stream: {reader.error}"
    elif not reader.done:
        got = len(parser.pending)
        res.status = "stream_broken"
        res.evidence = _evidence(parser.pending) if got else None
        res.error = f"{where}: stream ended without {reader.terminal} after {res.n_events} events" + (
            f" ({got} bytes of an unfinished event dropped)" if got else ""
        )
    if res.t_end is not None:
        await body.drain(_DRAIN_S)


def _evidence(data: bytes | None) -> bytes | None:
    if data is None or len(data) <= EVIDENCE_MAX:
        return data
    return data[:EVIDENCE_MAX]


def load_event(data: bytes) -> ReplyFields:
    """An SSE event's data: one JSON object, else `BadPayload` (not JSON) or `BadShape`."""
    return load_object(data, "event data")


def stream_error(obj: Any) -> str:
    err = obj.get("error", obj) if isinstance(obj, dict) else obj
    if isinstance(err, dict):
        err = err.get("message") or err.get("type") or orjson.dumps(err).decode()
    return _one_line(str(err))


class ReplyParts:
    """What every API's reader gathers as a reply arrives: its text, its reasoning, its tool calls
    by index, and whether the terminal event (or an error inside the stream) came."""

    def __init__(self) -> None:
        self.done = False
        self.error: str | None = None
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tools: dict[int, dict[str, str]] = {}

    def tool_calls(self) -> list[dict[str, str]]:
        return [self.tools[i] for i in sorted(self.tools)]

    def fill_message(self, res: RequestRecord, tool_calls: list[dict[str, str]]) -> None:
        """The reply message, once anything of it (or its end) was read."""
        if self.content or self.reasoning or tool_calls or self.done:
            res.message = reply_message(self.content, self.reasoning, tool_calls)


def reply_message(
    content: list[str], reasoning: list[str], tool_calls: list[dict[str, str]]
) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
    if tool_calls:
        msg["tool_calls"] = tool_calls
    if reasoning:
        msg["reasoning"] = "".join(reasoning)
    return msg
