"""The endpoints agents probe before they talk, answered as llama.cpp's server answers them.

Claude Code checks `HEAD /`; Hermes tells servers apart by which of `/api/v1/models` (LM Studio),
`/api/tags` (Ollama), `/v1/props` or `/props` (llama.cpp) and `/version` (vLLM) answers 200, then
reads the context length from there. The simulator is one server, not four: it answers `/` and
the llama.cpp `props` (the open server whose API ds4 follows), with its model and context, and
the other servers' paths with the 404 llama.cpp gives them. An agent that detects it sizes its
requests as against that server; the recorder logs every probe either way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from replay.sim.model.config import SimConfig

BUILD = "agent-replay-sim"


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
                "build_info": BUILD,
            }
        )

    return [
        Route("/", root, methods=["GET", "HEAD"]),
        Route("/props", props, methods=["GET"]),
        Route("/v1/props", props, methods=["GET"]),
    ]
