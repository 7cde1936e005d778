"""A scripted OpenAI (chat and Responses) + Anthropic SSE server for end-to-end tests (starlette + uvicorn).

Each request's behaviour is set by the test with a `Script`: first-token delay,
pacing, tokens, keep-alives, usage, timings, tool calls and faults. The server runs
in a background thread on 127.0.0.1 at an ephemeral port and records, per request,
the body it got and two `time.perf_counter_ns()` stamps taken on its side (arrival,
first-token send), so a test compares the client's TTFT with server truth for the
same request (matched by X-Request-ID, never by order).

Faults that need the socket itself (resets, closing after a response while the
headers say keep-alive, as llama-server does) reach uvicorn's transport through the
bound `receive` method: there is no ASGI way to reset a connection.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

Fault = Literal[
    "http_error",  # status `http_status` with an OpenAI-style error body
    "reset_before_headers",  # TCP RST after reading the request
    "reset_mid_stream",  # TCP RST after `fault_after` token events (non-stream: half a body)
    "no_done",  # clean end of body without [DONE] / message_stop
    "event_error",  # `event: error` after `fault_after` token events
    "hang",  # never answer (until the client goes away)
    "hang_mid_stream",  # stop sending after `fault_after` token events
    "bad_json",  # a data line / body that is not JSON
    "linger",  # complete stream, then the body is left open (never ends)
]

_TRANSPORT_KEY = "scripted.transport"
_RECV_KEY = "scripted.recv_ns"


@dataclass
class Script:
    """What the server does for one request; times are from its arrival."""

    first_token_delay_s: float = 0.0
    token_interval_s: float = 0.0
    tokens: int = 3  # content tokens; piece i is f"{token_text}{i} "
    token_text: str = "tok"
    reasoning_tokens: int = 0  # reasoning deltas sent before the content
    keepalives: int = 0  # `: prefill` comments spread evenly over the first-token delay
    role_chunk: bool = True  # OpenAI: a role-only chunk right after the headers
    pre_events: list[bytes] = field(default_factory=list)  # raw SSE frames sent before any token
    usage: dict[str, Any] | None = None  # OpenAI usage chunk / Anthropic message_start usage
    final_usage: dict[str, Any] | None = None  # Anthropic message_delta usage
    timings: dict[str, Any] | None = None  # llama.cpp timings on the finish and usage chunks
    extra_final: dict[str, Any] | None = None  # top-level fields of the last object (x_sim)
    finish: str | None = None  # sent verbatim; default stop / end_turn (tool_calls / tool_use)
    tool_calls: list[dict[str, str]] = field(default_factory=list)  # neutral {"id","name","arguments"}
    arg_pieces: int = 3  # deltas each tool call's arguments are split into
    fault: Fault | None = None
    fault_after: int = 0  # token events sent before a mid-stream fault
    http_status: int = 500
    error_message: str = "scripted failure"
    connection_close: bool = False  # send `Connection: close` (ds4)
    close_after: bool = False  # close the socket after the response, headers saying keep-alive
    hang_s: float = 30.0
    raw: list[bytes] | None = None  # the reply verbatim: SSE frames (a stream) or body pieces, status 200
    raw_hang_s: float = 0.0  # after `raw`, keep the body open this long (or until the client leaves)


@dataclass
class Seen:
    """One request as the server saw it."""

    path: str
    request_id: str | None
    headers: dict[str, str]
    body: Any
    recv_ns: int  # request head parsed, as the app is entered
    client_port: int | None = None  # a fresh port per connection shows connections are not reused
    first_token_ns: int | None = None  # just before the first token event was handed to the socket
    last_token_ns: int | None = None  # likewise for the last one
    done_ns: int | None = None

    @property
    def ttft_s(self) -> float | None:
        """Server truth: arrival to first-token send."""
        return None if self.first_token_ns is None else (self.first_token_ns - self.recv_ns) / 1e9


def _sse(obj: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(obj) + b"\n\n"


def _split(text: str, pieces: int) -> list[str]:
    step = max(1, -(-len(text) // max(pieces, 1)))
    return [text[i : i + step] for i in range(0, len(text), step)] or [""]


def _prompt_words(body: Any) -> int:
    """A rough prompt size for default usage: whitespace words in every message and system."""
    if not isinstance(body, dict):
        return 0
    n = len(str(body.get("system") or body.get("instructions") or "").split())
    for m in body.get("messages") or body.get("input") or ():
        content = m.get("content")
        n += len(content.split()) if isinstance(content, str) else len(orjson.dumps(content)) // 6
    return n


class _Frames:
    """Token events and the non-token frames that precede them, for pacing."""

    def __init__(self) -> None:
        self.items: list[tuple[bool, bytes]] = []

    def token(self, frame: bytes) -> None:
        self.items.append((True, frame))

    def other(self, frame: bytes) -> None:
        self.items.append((False, frame))


class ScriptedServer:
    """Start with `start()`, set `default` / `queue` / `by_id`, read `seen`; `stop()` at the end."""

    def __init__(self) -> None:
        self.default = Script()
        self.queue: deque[Script] = deque()  # consumed in arrival order, before `default`
        self.by_id: dict[str, Script] = {}  # by X-Request-ID, before `queue`
        self.by_trace_id: dict[int, Script] = {}  # by the trace request id ending X-Request-ID (`RUN-ID`)
        self.seen: list[Seen] = []
        self._sock: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reset(self) -> None:
        self.default = Script()
        self.queue.clear()
        self.by_id.clear()
        self.by_trace_id.clear()
        self.seen.clear()

    def request(self, request_id: str) -> Seen:
        """The one recorded request with this X-Request-ID."""
        found = [s for s in self.seen if s.request_id == request_id]
        assert len(found) == 1, f"{len(found)} requests with X-Request-ID {request_id}"
        return found[0]

    # --- lifecycle ---

    def _build(self, port: int = 0) -> tuple[uvicorn.Server, socket.socket]:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self._app(),
            loop="asyncio",
            http="h11",
            lifespan="off",
            log_level="critical",
            access_log=False,
            proxy_headers=False,
            timeout_graceful_shutdown=2,
            backlog=2048,
        )
        return uvicorn.Server(config), sock

    def start(self) -> ScriptedServer:
        """Serve from a background thread of this process."""
        self._server, self._sock = self._build()
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name="scripted-server", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("scripted server did not start")
            time.sleep(0.005)
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(timeout=5)
        if self._sock is not None:
            self._sock.close()
        self._server = self._thread = self._sock = None

    def __enter__(self) -> ScriptedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- app ---

    def _app(self) -> Any:
        app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._openai, methods=["POST"]),
                Route("/v1/messages", self._anthropic, methods=["POST"]),
                Route("/v1/responses", self._responses, methods=["POST"]),
                Route("/health", lambda _r: JSONResponse({"status": "ok"}), methods=["GET"]),
                Route("/_seen", self._seen, methods=["GET"]),
            ]
        )

        async def with_transport(scope: dict, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                scope[_RECV_KEY] = time.perf_counter_ns()  # request head parsed: arrival
                scope[_TRANSPORT_KEY] = receive.__self__.transport  # uvicorn's RequestResponseCycle
            await app(scope, receive, send)

        return with_transport

    async def _seen(self, _request: Request) -> JSONResponse:
        """Server-side stamps, for a client in another process (benchmarks)."""
        rows = [
            {
                "request_id": x.request_id,
                "recv_ns": x.recv_ns,
                "first_token_ns": x.first_token_ns,
                "last_token_ns": x.last_token_ns,
                "done_ns": x.done_ns,
            }
            for x in list(self.seen)
        ]
        return JSONResponse(rows)

    async def _begin(self, request: Request) -> tuple[Script, Seen]:
        recv_ns = request.scope[_RECV_KEY]
        raw = await request.body()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = raw
        rid = request.headers.get("x-request-id")
        port = request.client.port if request.client else None
        seen = Seen(request.url.path, rid, dict(request.headers), body, recv_ns, port)
        self.seen.append(seen)
        if rid is not None and rid in self.by_id:
            script = self.by_id[rid]
        elif (
            rid is not None
            and rid.rpartition("-")[2].isdigit()
            and int(rid.rpartition("-")[2]) in self.by_trace_id
        ):
            script = self.by_trace_id[int(rid.rpartition("-")[2])]
        elif self.queue:
            script = self.queue.popleft()
        else:
            script = self.default
        return script, seen

    async def _openai(self, request: Request) -> _Reply:
        script, seen = await self._begin(request)
        return _Reply(script, seen, "openai")

    async def _anthropic(self, request: Request) -> _Reply:
        script, seen = await self._begin(request)
        return _Reply(script, seen, "anthropic")

    async def _responses(self, request: Request) -> _Reply:
        script, seen = await self._begin(request)
        return _Reply(script, seen, "openai-responses")


class _Reply:
    """An ASGI response that plays one script over the raw ASGI channel."""

    def __init__(
        self, script: Script, seen: Seen, api: Literal["openai", "anthropic", "openai-responses"]
    ) -> None:
        self.s = script
        self.seen = seen
        self.api = api
        body = seen.body if isinstance(seen.body, dict) else {}
        self.stream = bool(body.get("stream"))
        self.include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self.model = body.get("model", "scripted")
        self.prompt = _prompt_words(body)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        self.scope, self.receive, self.send = scope, receive, send
        self.transport: asyncio.Transport = scope[_TRANSPORT_KEY]
        s = self.s
        try:
            if s.fault == "reset_before_headers":
                await self._reset()
            elif s.fault == "hang":
                await self._hang()
            elif s.fault == "http_error":
                err = {"error": {"message": s.error_message, "type": "server_error", "code": s.http_status}}
                await self._start(s.http_status, "application/json")
                await self.send({"type": "http.response.body", "body": orjson.dumps(err)})
            elif s.raw is not None:
                await self._raw(s.raw)
            elif self.stream:
                await self._stream()
            else:
                await self._whole()
        finally:
            self.seen.done_ns = time.perf_counter_ns()
        if s.close_after and not self.transport.is_closing():
            self.transport.close()

    # --- socket-level helpers ---

    async def _reset(self) -> None:
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()
        await self._wait_disconnect(5.0)

    async def _hang(self) -> None:
        await self._wait_disconnect(self.s.hang_s)

    async def _wait_disconnect(self, limit: float) -> None:
        """Sit until the client goes away (uvicorn then answers receive with a disconnect)."""
        try:
            async with asyncio.timeout(limit):
                while (await self.receive())["type"] != "http.disconnect":
                    pass
        except TimeoutError:
            pass

    async def _start(self, status: int, content_type: str, length: int | None = None) -> None:
        headers = [(b"content-type", content_type.encode())]
        if self.s.connection_close:
            headers.append((b"connection", b"close"))
        if length is not None:
            headers.append((b"content-length", str(length).encode()))
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def _write(self, data: bytes) -> None:
        await self.send({"type": "http.response.body", "body": data, "more_body": True})

    async def _until(self, t_ns: int) -> None:
        delay = (t_ns - time.perf_counter_ns()) / 1e9
        if delay > 0:
            await asyncio.sleep(delay)

    async def _raw(self, pieces: list[bytes]) -> None:
        """Send the script's bytes as they are, then end the body cleanly."""
        await self._start(200, "text/event-stream" if self.stream else "application/json")
        for piece in pieces:
            await self._write(piece)
        if self.s.raw_hang_s:
            await self._wait_disconnect(self.s.raw_hang_s)
        await self.send({"type": "http.response.body", "body": b"", "more_body": False})

    # --- whole (non-stream) responses ---

    async def _whole(self) -> None:
        s = self.s
        n = s.reasoning_tokens + s.tokens
        await self._until(
            self.seen.recv_ns + int((s.first_token_delay_s + max(n - 1, 0) * s.token_interval_s) * 1e9)
        )
        payload = {
            "openai": self._openai_whole,
            "anthropic": self._anthropic_whole,
            "openai-responses": self._responses_whole,
        }[self.api]()
        data = b'{"not json' if s.fault == "bad_json" else orjson.dumps(payload)
        await self._start(200, "application/json", len(data))
        self.seen.first_token_ns = time.perf_counter_ns()
        if s.fault == "reset_mid_stream":
            await self._write(data[: len(data) // 2])
            await self._reset()
            return
        await self.send({"type": "http.response.body", "body": data})

    def _content(self) -> str:
        return "".join(f"{self.s.token_text}{i} " for i in range(self.s.tokens))

    def _reasoning(self) -> str:
        return "".join(f"think{i} " for i in range(self.s.reasoning_tokens))

    def _n_output(self) -> int:
        return self.s.reasoning_tokens + self.s.tokens + len(self.s.tool_calls) * self.s.arg_pieces

    def _openai_usage(self) -> dict[str, Any]:
        if self.s.usage is not None:
            return self.s.usage
        n = self._n_output()
        return {"prompt_tokens": self.prompt, "completion_tokens": n, "total_tokens": self.prompt + n}

    def _openai_finish(self) -> str:
        return self.s.finish or ("tool_calls" if self.s.tool_calls else "stop")

    def _openai_whole(self) -> dict[str, Any]:
        s = self.s
        msg: dict[str, Any] = {"role": "assistant", "content": self._content()}
        if s.reasoning_tokens:
            msg["reasoning_content"] = self._reasoning()
        if s.tool_calls:
            msg["tool_calls"] = [
                {
                    "id": tc["id"],
                    "type": "function",
                    "function": {"name": tc["name"], "arguments": tc["arguments"]},
                }
                for tc in s.tool_calls
            ]
        out: dict[str, Any] = {
            "id": "chatcmpl-scripted",
            "object": "chat.completion",
            "model": self.model,
            "choices": [{"index": 0, "message": msg, "finish_reason": self._openai_finish()}],
            "usage": self._openai_usage(),
        }
        if s.timings is not None:
            out["timings"] = s.timings
        out.update(s.extra_final or {})
        return out

    def _anthropic_usage(self) -> dict[str, Any]:
        if self.s.usage is not None:
            return self.s.usage
        return {
            "input_tokens": self.prompt,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
            "output_tokens": 0,
        }

    def _anthropic_finish(self) -> str:
        return self.s.finish or ("tool_use" if self.s.tool_calls else "end_turn")

    def _anthropic_whole(self) -> dict[str, Any]:
        s = self.s
        blocks: list[dict[str, Any]] = []
        if s.reasoning_tokens:
            blocks.append({"type": "thinking", "thinking": self._reasoning(), "signature": ""})
        if s.tokens:
            blocks.append({"type": "text", "text": self._content()})
        for tc in s.tool_calls:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": tc["id"],
                    "name": tc["name"],
                    "input": orjson.loads(tc["arguments"]),
                }
            )
        usage = {**self._anthropic_usage(), **(s.final_usage or {"output_tokens": self._n_output()})}
        out: dict[str, Any] = {
            "id": "msg_scripted",
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": blocks,
            "stop_reason": self._anthropic_finish(),
            "stop_sequence": None,
            "usage": usage,
        }
        out.update(s.extra_final or {})
        return out

    # --- streams ---

    def _chunk(self, delta: dict[str, Any] | None, finish: str | None = None) -> dict[str, Any]:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
        return {
            "id": "chatcmpl-scripted",
            "object": "chat.completion.chunk",
            "model": self.model,
            "choices": choices,
        }

    def _openai_frames(self) -> tuple[list[bytes], _Frames, list[bytes]]:
        s = self.s
        head: list[bytes] = []
        if s.role_chunk:
            head.append(_sse(self._chunk({"role": "assistant", "content": None})))
        body = _Frames()
        for i in range(s.reasoning_tokens):
            body.token(_sse(self._chunk({"reasoning_content": f"think{i} "})))
        for i in range(s.tokens):
            body.token(_sse(self._chunk({"content": f"{s.token_text}{i} "})))
        for index, tc in enumerate(s.tool_calls):
            first = {
                "index": index,
                "id": tc["id"],
                "type": "function",
                "function": {"name": tc["name"], "arguments": ""},
            }
            body.token(_sse(self._chunk({"tool_calls": [first]})))
            for piece in _split(tc["arguments"], s.arg_pieces):
                body.token(
                    _sse(self._chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
                )
        finish = self._chunk({}, self._openai_finish())
        if s.timings is not None:
            finish["timings"] = s.timings
        tail_objs = [finish]
        if self.include_usage:
            usage_chunk = self._chunk(None)
            usage_chunk["usage"] = self._openai_usage()
            if s.timings is not None:
                usage_chunk["timings"] = s.timings
            tail_objs.append(usage_chunk)
        tail_objs[-1].update(s.extra_final or {})
        tail = [_sse(o) for o in tail_objs]
        if s.fault != "no_done":
            tail.append(b"data: [DONE]\n\n")
        return head, body, tail

    def _anthropic_frames(self) -> tuple[list[bytes], _Frames, list[bytes]]:
        s = self.s
        start = {
            "type": "message_start",
            "message": {
                "id": "msg_scripted",
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": [],
                "stop_reason": None,
                "usage": self._anthropic_usage(),
            },
        }
        head = [_sse(start, "message_start")]
        body = _Frames()
        index = 0

        def block(
            kind: str, start_block: dict[str, Any], deltas: list[dict[str, Any]], start_is_token: bool
        ) -> None:
            nonlocal index
            frame = _sse(
                {"type": "content_block_start", "index": index, "content_block": start_block},
                "content_block_start",
            )
            (body.token if start_is_token else body.other)(frame)
            for d in deltas:
                body.token(
                    _sse({"type": "content_block_delta", "index": index, "delta": d}, "content_block_delta")
                )
            body.other(_sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
            index += 1

        if s.reasoning_tokens:
            deltas = [{"type": "thinking_delta", "thinking": f"think{i} "} for i in range(s.reasoning_tokens)]
            block("thinking", {"type": "thinking", "thinking": ""}, deltas, False)
        if s.tokens:
            deltas = [{"type": "text_delta", "text": f"{s.token_text}{i} "} for i in range(s.tokens)]
            block("text", {"type": "text", "text": ""}, deltas, False)
        for tc in s.tool_calls:
            deltas = [
                {"type": "input_json_delta", "partial_json": p} for p in _split(tc["arguments"], s.arg_pieces)
            ]
            block(
                "tool_use",
                {"type": "tool_use", "id": tc["id"], "name": tc["name"], "input": {}},
                deltas,
                True,
            )
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": self._anthropic_finish(), "stop_sequence": None},
            "usage": s.final_usage if s.final_usage is not None else {"output_tokens": self._n_output()},
        }
        delta.update(s.extra_final or {})
        tail = [_sse(delta, "message_delta")]
        if s.fault != "no_done":
            tail.append(_sse({"type": "message_stop"}, "message_stop"))
        return head, body, tail

    # --- the Responses API ---

    def _responses_usage(self) -> dict[str, Any]:
        if self.s.usage is not None:
            return self.s.usage
        n = self._n_output()
        return {
            "input_tokens": self.prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": n,
            "output_tokens_details": {"reasoning_tokens": self.s.reasoning_tokens},
            "total_tokens": self.prompt + n,
        }

    def _responses_output(self) -> list[dict[str, Any]]:
        s = self.s
        out: list[dict[str, Any]] = []
        if s.reasoning_tokens:
            out.append(
                {
                    "id": "rs_1",
                    "type": "reasoning",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": self._reasoning()}],
                }
            )
        if s.tokens:
            part = {"type": "output_text", "text": self._content(), "annotations": []}
            out.append(
                {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [part],
                }
            )
        for i, tc in enumerate(s.tool_calls):
            out.append(
                {
                    "id": f"fc_{i}",
                    "type": "function_call",
                    "status": "completed",
                    "call_id": tc["id"],
                    "name": tc["name"],
                    "arguments": tc["arguments"],
                }
            )
        return out

    def _responses_object(self, status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "id": "resp_scripted",
            "object": "response",
            "created_at": 0,
            "status": status,
            "model": self.model,
            "output": output,
            "usage": None,
        }
        if status != "in_progress":
            obj["usage"] = self._responses_usage()
            if self.s.finish == "length":
                obj["status"] = "incomplete"
                obj["incomplete_details"] = {"reason": "max_output_tokens"}
            obj.update(self.s.extra_final or {})
        return obj

    def _responses_whole(self) -> dict[str, Any]:
        return self._responses_object("completed", self._responses_output())

    def _responses_frames(self) -> tuple[list[bytes], _Frames, list[bytes]]:
        s = self.s
        seq = iter(range(1 << 30))

        def ev(kind: str, **fields: Any) -> bytes:
            return _sse({"type": kind, "sequence_number": next(seq), **fields}, kind)

        created = self._responses_object("in_progress", [])
        head = [ev("response.created", response=created), ev("response.in_progress", response=created)]
        body = _Frames()
        index = 0
        if s.reasoning_tokens:
            body.other(
                ev(
                    "response.output_item.added",
                    output_index=index,
                    item={"id": "rs_1", "type": "reasoning", "summary": []},
                )
            )
            for i in range(s.reasoning_tokens):
                body.token(
                    ev(
                        "response.reasoning_text.delta",
                        item_id="rs_1",
                        output_index=index,
                        content_index=0,
                        delta=f"think{i} ",
                    )
                )
            body.other(
                ev("response.output_item.done", output_index=index, item={"id": "rs_1", "type": "reasoning"})
            )
            index += 1
        if s.tokens:
            item = {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            body.other(ev("response.output_item.added", output_index=index, item=item))
            body.other(
                ev(
                    "response.content_part.added",
                    item_id="msg_1",
                    output_index=index,
                    content_index=0,
                    part={"type": "output_text", "text": ""},
                )
            )
            for i in range(s.tokens):
                body.token(
                    ev(
                        "response.output_text.delta",
                        item_id="msg_1",
                        output_index=index,
                        content_index=0,
                        delta=f"{s.token_text}{i} ",
                    )
                )
            body.other(
                ev(
                    "response.output_text.done",
                    item_id="msg_1",
                    output_index=index,
                    content_index=0,
                    text=self._content(),
                )
            )
            body.other(
                ev("response.output_item.done", output_index=index, item={**item, "status": "completed"})
            )
            index += 1
        for i, tc in enumerate(s.tool_calls):
            item = {
                "id": f"fc_{i}",
                "type": "function_call",
                "status": "in_progress",
                "call_id": tc["id"],
                "name": tc["name"],
                "arguments": "",
            }
            body.token(ev("response.output_item.added", output_index=index, item=item))
            for piece in _split(tc["arguments"], s.arg_pieces):
                body.token(
                    ev(
                        "response.function_call_arguments.delta",
                        item_id=f"fc_{i}",
                        output_index=index,
                        delta=piece,
                    )
                )
            body.other(
                ev(
                    "response.function_call_arguments.done",
                    item_id=f"fc_{i}",
                    output_index=index,
                    arguments=tc["arguments"],
                )
            )
            body.other(
                ev(
                    "response.output_item.done",
                    output_index=index,
                    item={**item, "status": "completed", "arguments": tc["arguments"]},
                )
            )
            index += 1
        tail: list[bytes] = []
        if s.fault != "no_done":
            final = self._responses_object("completed", self._responses_output())
            kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
            tail.append(ev(kind, response=final))
        return head, body, tail

    async def _stream(self) -> None:
        s = self.s
        head, body, tail = {
            "openai": self._openai_frames,
            "anthropic": self._anthropic_frames,
            "openai-responses": self._responses_frames,
        }[self.api]()
        t0 = self.seen.recv_ns
        first_at = t0 + int(s.first_token_delay_s * 1e9)
        await self._start(200, "text/event-stream")
        for frame in head + s.pre_events:
            await self._write(frame)
        for j in range(s.keepalives):
            await self._until(t0 + int(s.first_token_delay_s * 1e9 * (j + 1) / (s.keepalives + 1)))
            await self._write(b": prefill\n\n")
        sent = 0
        mid_fault = s.fault in ("reset_mid_stream", "event_error", "hang_mid_stream", "bad_json")
        pending: list[bytes] = []  # non-token frames go out together with the next token
        for is_token, frame in body.items:
            if not is_token:
                pending.append(frame)
                continue
            if mid_fault and sent == s.fault_after:
                break
            await self._until(first_at + int(sent * s.token_interval_s * 1e9))
            if self.transport.is_closing():
                return  # the client went away
            self.seen.last_token_ns = time.perf_counter_ns()
            if sent == 0:
                self.seen.first_token_ns = self.seen.last_token_ns
            await self._write(b"".join(pending) + frame)
            pending.clear()
            sent += 1
        if mid_fault:
            await self._mid_stream_fault()
            return
        for frame in pending + tail:
            await self._write(frame)
        if s.fault == "linger":
            await self._hang()
            return
        await self.send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _mid_stream_fault(self) -> None:
        s = self.s
        if s.fault == "reset_mid_stream":
            await self._reset()
        elif s.fault == "hang_mid_stream":
            await self._hang()
        elif s.fault == "bad_json":
            await self._write(b"data: {not json\n\n")
            await self.send({"type": "http.response.body", "body": b"", "more_body": False})
        elif s.fault == "event_error":
            err = {"type": "error", "error": {"type": "server_error", "message": s.error_message}}
            await self._write(_sse(err, "error"))
            await self.send({"type": "http.response.body", "body": b"", "more_body": False})


def main() -> None:
    """Serve one default script in the foreground, so a benchmark client runs in another process."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--first-token-delay-s", type=float, default=0.02)
    ap.add_argument("--token-interval-s", type=float, default=0.0)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    scripted = ScriptedServer()
    scripted.default = Script(
        first_token_delay_s=args.first_token_delay_s,
        token_interval_s=args.token_interval_s,
        tokens=args.tokens,
    )
    server, sock = scripted._build(args.port)
    print(f"PORT {scripted.port}", flush=True)
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()
