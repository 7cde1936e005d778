"""The endpoints agents probe before they talk, answered in the shape of the server that owns each.

Claude Code checks `HEAD /`; Hermes asks `/api/v1/models` (OpenRouter and LM Studio), `/api/tags`
(Ollama), `/props` and `/v1/props` (llama.cpp), `/version` (vLLM) to learn the model's context
length. Each answer names the simulator's one model with its context, so an agent sizes its
requests as it would against the real server, and no probe ends in a 404 that hides a mistake.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from replay.sim.model.config import SimConfig

VERSION = "0.0.0-agent-replay-sim"


def probe_routes(cfg: SimConfig, json_response: Callable[[Any], Response]) -> list[Route]:
    async def root(request: Request) -> Response:
        return json_response({"status": "ok", "server": "agent-replay-sim", "model": cfg.model_id})

    async def props(request: Request) -> Response:  # llama.cpp
        return json_response(
            {
                "default_generation_settings": {"n_ctx": cfg.ctx, "params": {"n_predict": -1}},
                "total_slots": cfg.batched_sessions or 1,
                "model_path": cfg.model_id,
                "model_alias": cfg.model_id,
                "chat_template": "",
                "build_info": VERSION,
            }
        )

    async def catalog(request: Request) -> Response:  # OpenRouter / LM Studio style
        return json_response(
            {
                "data": [
                    {
                        "id": cfg.model_id,
                        "name": cfg.model_id,
                        "context_length": cfg.ctx,
                        "top_provider": {"context_length": cfg.ctx, "max_completion_tokens": cfg.ctx},
                    }
                ]
            }
        )

    async def tags(request: Request) -> Response:  # Ollama
        return json_response(
            {
                "models": [
                    {
                        "name": cfg.model_id,
                        "model": cfg.model_id,
                        "modified_at": "1970-01-01T00:00:00Z",
                        "size": 0,
                        "digest": "",
                        "details": {"format": "gguf", "family": "sim"},
                    }
                ]
            }
        )

    async def version(request: Request) -> Response:  # vLLM (Ollama: /api/version)
        return json_response({"version": VERSION})

    return [
        Route("/", root, methods=["GET", "HEAD"]),
        Route("/props", props, methods=["GET"]),
        Route("/v1/props", props, methods=["GET"]),
        Route("/api/v1/models", catalog, methods=["GET"]),
        Route("/api/tags", tags, methods=["GET"]),
        Route("/version", version, methods=["GET"]),
        Route("/api/version", version, methods=["GET"]),
    ]
