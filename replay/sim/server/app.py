"""The simulator's HTTP app: ds4-server's API surface over the cache model (starlette).

Every response carries `Connection: close` (ds4 serves one request per connection); streams send
their headers only with their first bytes (ds4 sends them at the first prefill progress event);
errors are ds4-style JSON and never crash the server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from replay import clock as _clock
from replay.serving.errors import api_of_path, error_payload
from replay.serving.fields import FieldError, load_body
from replay.serving.guard import BodyGuard, Limits
from replay.serving.schema import openapi
from replay.sim.model import events as ev
from replay.sim.model.job import ContextTooLong, build_job
from replay.sim.model.reply import Reply
from replay.sim.server import responses as rsp
from replay.sim.server.agentic import AgentOptions, tool_choice
from replay.sim.server.api import (
    PREFILL_COMMENT,
    AnthropicStream,
    BadRequest,
    ChatRequest,
    OpenAIStream,
    anthropic_body,
    openai_body,
    parse_anthropic,
    parse_openai,
)
from replay.sim.server.probes import probe_routes
from replay.sim.server.runtime import JobHandle, SimRuntime

PREFILL_COMMENT_EVERY_S = 5.0
FINISH_HEADER = "x-replay-finish"
TOOL_HEADER = "x-replay-tool"


def json_response(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def error_response(
    message: str, status: int = 400, kind: str | None = None, api: str = "openai", param: str | None = None
) -> Response:
    """An error in the API's own shape (OpenAI's is ds4's), on one line."""
    return json_response(error_payload(api, message, status, kind, param), status)


class LazyStreamingResponse(StreamingResponse):
    """Sends the status line and headers together with the first body bytes, not before."""

    async def stream_response(self, send: Send) -> None:
        started = False
        async for chunk in self.body_iterator:
            data = chunk if isinstance(chunk, bytes) else str(chunk).encode()
            if not data:
                continue
            if not started:
                await send(
                    {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
                )
                started = True
            await send({"type": "http.response.body", "body": data, "more_body": True})
        if not started:
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class ConnectionClose:
    """ASGI middleware adding `Connection: close` to every response, as ds4 does."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_close(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
                headers.append((b"connection", b"close"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_close)


def create_app(
    runtime: SimRuntime, agent: AgentOptions | None = None, limits: Limits | None = None
) -> ASGIApp:
    """The simulator's ASGI app; `limits` bound request bodies (see replay.serving.guard)."""
    cfg = runtime.cfg
    agent = agent or AgentOptions()
    limits = limits or Limits()
    started = _clock.monotonic()
    store = rsp.ResponseStore()

    def model_object(model_id: str) -> dict[str, Any]:
        return {
            "id": model_id,
            "object": "model",
            "created": 0,
            "owned_by": "agent-replay-sim",
            "context_length": cfg.ctx,
            "top_provider": {"context_length": cfg.ctx, "max_completion_tokens": cfg.ctx},
        }

    async def models(request: Request) -> Response:
        return json_response({"object": "list", "data": [model_object(cfg.model_id)]})

    async def model(request: Request) -> Response:
        model_id = request.path_params["model_id"]
        if model_id != cfg.model_id:
            return error_response("unknown endpoint", 404, api="openai")
        return json_response(model_object(model_id))

    async def health(request: Request) -> Response:
        return json_response(
            {"status": "ok", "model": cfg.model_id, "uptime_s": int(_clock.monotonic() - started)}
        )

    async def stats(request: Request) -> Response:
        return json_response(runtime.stats_json())

    async def chat_completions(request: Request) -> Response:
        return await _chat(request, "openai")

    async def messages(request: Request) -> Response:
        return await _chat(request, "anthropic")

    async def responses(request: Request) -> Response:
        return await _chat(request, rsp.API)

    async def _chat(request: Request, api: str) -> Response:
        try:
            raw = await request.body()
            arrived = runtime.arrived()
            body = load_body(raw).raw
            if api == rsp.API:
                creq = rsp.parse_responses(body, store, ctx=cfg.ctx)
            elif api == "openai":
                creq = parse_openai(body, ctx=cfg.ctx)
            else:
                creq = parse_anthropic(body, ctx=cfg.ctx)
        except FieldError as exc:
            return error_response(str(exc), api=api, param=exc.path or None)
        except BadRequest as exc:
            return error_response(str(exc), exc.status, api=api)
        if runtime.stopping:
            return error_response("server is shutting down", 503, api=api)
        finish = request.headers.get(FINISH_HEADER, "stop").strip().lower()
        tool_name = request.headers.get(TOOL_HEADER)
        arguments = None
        if FINISH_HEADER not in request.headers:
            picked = tool_choice(agent, creq.messages, creq.tools)
            if picked is not None:
                finish, tool_name, arguments = "tool_calls", picked[0], picked[1]
        try:
            job = build_job(
                runtime.next_id(),
                creq.messages,
                creq.tools,
                creq.max_tokens,
                cfg,
                finish=finish,
                tool_name=tool_name,
                thinking=creq.thinking,
                tool_arguments=arguments,
            )
        except ContextTooLong as exc:
            return error_response(f"{exc} (context_length_exceeded)", api=api)
        reply = job.reply
        handle = runtime.submit(job, arrived)
        rid = rsp.new_response_id()
        if creq.stream:
            return LazyStreamingResponse(
                _stream(handle, creq, reply, body, rid),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        async for _ in handle.events():
            pass
        result = handle.result
        assert result is not None
        if result.error:
            return error_response(result.error, 503, api=api)
        if api == rsp.API:
            rsp.remember(store, body, creq, reply, rid)
            return json_response(rsp.responses_body(creq, reply, result, rid))
        build = openai_body if api == "openai" else anthropic_body
        return json_response(build(creq, reply, result))

    async def _stream(
        handle: JobHandle, creq: ChatRequest, reply: Reply, body: dict[str, Any], rid: str
    ) -> AsyncIterator[bytes]:
        stream: OpenAIStream | AnthropicStream | rsp.ResponsesStream
        if creq.api == rsp.API:
            stream = rsp.ResponsesStream(creq, reply, rid)
        else:
            stream = OpenAIStream(creq, reply) if creq.api == "openai" else AnthropicStream(creq, reply)
        last_comment: float | None = None
        async for event in handle.events():
            match event:
                case ev.PromptStart():
                    yield stream.prompt_start(event.cached, event.prompt)
                case ev.PrefillChunk():
                    if last_comment is None or event.t - last_comment >= PREFILL_COMMENT_EVERY_S:
                        last_comment = event.t
                        yield PREFILL_COMMENT
                case ev.PromptDone():
                    yield stream.role()
                case ev.Decoded():
                    yield stream.progress(event.gen)
                case ev.Finished():
                    if creq.api == rsp.API and not event.result.error:
                        rsp.remember(store, body, creq, reply, rid)
                    yield stream.finish(event.result)

    async def not_found(request: Request) -> Response:
        return error_response("unknown endpoint", 404, api=api_of_path(request.url.path))

    async def http_error(request: Request, exc: Exception) -> Response:
        """Starlette's 404 and 405 (a known path, another method: OPTIONS, FOO, ...)."""
        status = getattr(exc, "status_code", 404)
        api = api_of_path(request.url.path)
        if status == 405:
            response = error_response(f"method {request.method} not allowed", 405, api=api)
            allow = (getattr(exc, "headers", None) or {}).get("Allow")
            if allow:
                response.headers["Allow"] = allow
            return response
        return error_response("unknown endpoint", status, api=api)

    async def on_error(request: Request, exc: Exception) -> Response:
        return error_response(
            f"internal error: {type(exc).__name__}: {exc}", 500, api=api_of_path(request.url.path)
        )

    async def schema(request: Request) -> Response:
        return json_response(openapi("simulator"))

    routes = [
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/v1/health", health, methods=["GET"]),
        Route("/stats", stats, methods=["GET"]),
        Route("/v1/stats", stats, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/openapi.json", schema, methods=["GET"]),
        Route("/v1/responses", responses, methods=["POST"]),
        *probe_routes(cfg, json_response),
        Route("/{path:path}", not_found, methods=["GET", "POST", "PUT", "DELETE", "PATCH"]),
    ]
    app = Starlette(routes=routes, exception_handlers={404: http_error, 405: http_error, Exception: on_error})
    return ConnectionClose(BodyGuard(app, limits))
