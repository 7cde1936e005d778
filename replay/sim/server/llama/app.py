"""The simulator's HTTP app when it serves llama-server: its routes and answers over the llama model.

Routes: `/health`, `/v1/models` (and `/models`), `/props`, `/slots`, `POST /slots/{id}?action=save|
restore|erase`, `/metrics` (with `--metrics`), `POST /v1/chat/completions`, `POST /completion`.
Errors are llama-server's `{"error": {"code", "message", "type"}}` (`format_error_response`).
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp

from replay.serving.fields import FieldError, load_body
from replay.serving.guard import BodyGuard, Limits
from replay.sim.model.llama import events as ev
from replay.sim.model.llama.prompt import ChatTokenizer, LlamaJob, LlamaPrompt, make_reply, render
from replay.sim.model.seq import TokenSeq
from replay.sim.server.llama.options import LlamaServeOptions
from replay.sim.server.llama.runtime import JobHandle, LlamaRuntime
from replay.sim.server.llama.slotfiles import SlotFiles
from replay.sim.server.llama.wire import (
    ChatStream,
    CompletionStream,
    LlamaRequest,
    chat_body,
    completion_body,
    parse_chat,
    parse_completion,
)

ERROR_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


def json_response(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def error_response(message: str, status: int = 400, kind: str | None = None, **extra: Any) -> Response:
    return json_response(
        {
            "error": {
                "code": status,
                "message": message,
                "type": kind or ERROR_TYPES.get(status, "server_error"),
                **extra,
            }
        },
        status,
    )


def valid_filename(name: str) -> bool:
    """`fs_validate_filename`, in short: a plain file name, no path, no dots-only, no control bytes."""
    if (
        not name
        or len(name) > 255
        or name in (".", "..")
        or name.startswith((".", " "))
        or name.endswith((" ", "."))
    ):
        return False
    return re.fullmatch(r"[^/\\:*?\"<>|\x00-\x1f]+", name) is not None


def create_app(
    runtime: LlamaRuntime, opts: LlamaServeOptions, tok: ChatTokenizer, limits: Limits | None = None
) -> ASGIApp:
    cfg = runtime.cfg
    model_name = cfg.model_id
    build = f"b{cfg.rules.build}-sim"
    files = SlotFiles(opts.slot_save_path, tok) if opts.slot_save_path else None
    chat_template = opts.model.chat_template if opts.model is not None else ""

    async def health(request: Request) -> Response:
        return json_response({"status": "ok"})

    async def models(request: Request) -> Response:
        return json_response(
            {
                "models": [
                    {"name": model_name, "model": model_name, "type": "model", "capabilities": ["completion"]}
                ],
                "object": "list",
                "data": [
                    {
                        "id": model_name,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "llamacpp",
                        "meta": {"n_ctx_train": cfg.arch.ctx_train, "sim": True},
                    }
                ],
            }
        )

    async def props(request: Request) -> Response:
        return json_response(
            {
                "default_generation_settings": {
                    "params": {"n_predict": cfg.n_predict, "cache_prompt": cfg.cache_prompt},
                    "n_ctx": cfg.n_ctx_slot,
                },
                "total_slots": cfg.n_slots,
                "model_alias": model_name,
                "model_path": opts.model.path if opts.model is not None else "",
                "modalities": {"vision": False, "video": False, "audio": False},
                "endpoint_slots": opts.slots,
                "endpoint_props": opts.props,
                "endpoint_metrics": opts.metrics,
                "chat_template": chat_template,
                "bos_token": opts.model.bos if opts.model is not None else "",
                "eos_token": opts.model.eos if opts.model is not None else "",
                "build_info": build,
                "is_sleeping": False,
            }
        )

    async def slots(request: Request) -> Response:
        if not opts.slots:
            return error_response("This server does not support slots endpoint. Start it with `--slots`", 501)
        data = runtime.slots_json()
        if request.query_params.get("fail_on_no_slot") and not any(not s["is_processing"] for s in data):
            return error_response("no slot available", 503)
        return json_response(data)

    async def slot_action(request: Request) -> Response:
        if files is None:
            return error_response(
                "This server does not support slots action. Start it with `--slot-save-path`", 501
            )
        try:
            slot = int(request.path_params["id_slot"])
        except ValueError:
            return error_response("Invalid slot ID", 400)
        action = request.query_params.get("action", "")
        if slot < 0:
            return error_response("Invalid slot ID", 400)
        if action not in ("save", "restore", "erase"):
            return error_response("Invalid action", 400)
        try:
            body = load_body(await request.body()).raw if action != "erase" else {}
        except FieldError as exc:
            return error_response(str(exc), 400)
        filename = body.get("filename", "") if isinstance(body, dict) else ""
        if action != "erase" and (not isinstance(filename, str) or not valid_filename(filename)):
            return error_response("Invalid filename", 400)
        file = None
        if action == "restore":
            file = files.read(filename, cfg.streams)
            if file is None:
                return error_response(
                    "Unable to restore slot: No available space in KV cache or invalid slot save file", 400
                )
        done, saved = await runtime.slot_action(slot, action, filename, file)
        if done.error is not None:
            return error_response(f"Unable to restore slot: {done.error}", 400)
        ms = round(done.seconds * 1000, 3)
        if action == "save":
            assert saved is not None
            files.write(filename, saved)
            return json_response(
                {
                    "id_slot": done.slot,
                    "filename": filename,
                    "n_saved": done.tokens,
                    "n_written": done.bytes,
                    "timings": {"save_ms": ms},
                }
            )
        if action == "restore":
            return json_response(
                {
                    "id_slot": done.slot,
                    "filename": filename,
                    "n_restored": done.tokens,
                    "n_read": done.bytes,
                    "timings": {"restore_ms": ms},
                }
            )
        return json_response({"id_slot": done.slot, "n_erased": done.tokens})

    async def metrics(request: Request) -> Response:
        if not opts.metrics:
            return error_response(
                "This server does not support metrics endpoint. Start it with `--metrics`", 501
            )
        return Response(
            runtime.metrics_text(),
            media_type="text/plain; version=0.0.4",
            headers={"Process-Start-Time-Unix": str(runtime.started_unix)},
        )

    def _job(req: LlamaRequest) -> LlamaJob:
        if req.messages is not None:
            prompt = render(req.messages, req.tools, tok)
        else:
            block = tok.bos + tok.fragment(req.prompt or "")
            prompt = LlamaPrompt(TokenSeq((block,)), ())
        cap = (
            req.max_tokens
            if req.max_tokens is not None
            else (cfg.n_predict if cfg.n_predict >= 0 else cfg.default_reply_tokens)
        )
        n = max(0, min(cap, cfg.n_ctx_slot - len(prompt)))
        reuse = req.n_cache_reuse if req.n_cache_reuse is not None else cfg.cache_reuse_on
        return LlamaJob(
            runtime.next_id(),
            prompt,
            make_reply(prompt, n, tok),
            cache_prompt=req.cache_prompt,
            id_slot=req.id_slot,
            n_cache_reuse=reuse,
        )

    async def chat(request: Request) -> Response:
        return await _serve(request, chat=True)

    async def completion(request: Request) -> Response:
        return await _serve(request, chat=False)

    async def _serve(request: Request, chat: bool) -> Response:
        try:
            body = load_body(await request.body()).raw
            req = parse_chat(body, cfg.n_ctx_slot) if chat else parse_completion(body, cfg.n_ctx_slot)
        except FieldError as exc:
            return error_response(str(exc), 400)
        if runtime.stopping:
            return error_response("Loading model", 503)
        job = _job(req)
        handle = runtime.submit(job)
        events = handle.events()
        # Like llama-server, a stream's status line waits for the prompt: a prompt over the
        # context is a plain 400, not an error inside a 200 stream.
        first: list[ev.Event] = []
        async for event in events:
            first.append(event)
            if isinstance(event, ev.Finished | ev.PromptDone) and (
                req.stream or isinstance(event, ev.Finished)
            ):
                break
        r = handle.result
        if r is not None and r.error is not None:
            return error_response(
                r.error,
                400,
                "exceed_context_size_error",
                n_prompt_tokens=r.prompt_tokens,
                n_ctx=cfg.n_ctx_slot,
            )
        if req.stream:
            return StreamingResponse(
                _stream(first, events, handle, req, chat), media_type="text/event-stream"
            )
        assert r is not None
        if chat:
            return json_response(chat_body(req, job.reply, r, model_name, build))
        return json_response(completion_body(job.reply, r, model_name, req.prompt or ""))

    async def _stream(
        first: list[ev.Event], rest: AsyncIterator[ev.Event], handle: JobHandle, req: LlamaRequest, chat: bool
    ) -> AsyncIterator[bytes]:
        stream: ChatStream | CompletionStream
        reply = handle.job.reply
        stream = (
            ChatStream(req, reply, model_name, build)
            if chat
            else CompletionStream(reply, model_name, req.prompt or "")
        )

        async def all_events() -> AsyncIterator[ev.Event]:
            for event in first:
                yield event
            if not any(isinstance(e, ev.Finished) for e in first):
                async for event in rest:
                    yield event

        async for event in all_events():
            match event:
                case ev.PromptDone():
                    if isinstance(stream, ChatStream):
                        yield stream.start()
                case ev.Decoded():
                    yield stream.tokens(event.gen)
                case ev.Finished():
                    yield stream.finish(event.result)

    async def not_found(request: Request) -> Response:
        return error_response("File Not Found", 404)

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/models", models, methods=["GET"]),
        Route("/props", props, methods=["GET"]),
        Route("/slots", slots, methods=["GET"]),
        Route("/slots/{id_slot}", slot_action, methods=["POST"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/chat/completions", chat, methods=["POST"]),
        Route("/completion", completion, methods=["POST"]),
        Route("/completions", completion, methods=["POST"]),
        Route("/{path:path}", not_found, methods=["GET", "POST", "PUT", "DELETE", "PATCH"]),
    ]
    app = Starlette(routes=routes)
    return BodyGuard(app, limits or Limits())
