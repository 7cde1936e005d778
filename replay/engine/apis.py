"""The wire APIs the engine speaks, by name: one async request function per API.

Adding an API is adding one module with one function and one line here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx

from replay.engine.anthropic import (
    anthropic_body,
    anthropic_messages,
    anthropic_messages_wire,
    anthropic_tools,
)
from replay.engine.exchange import THINK_FIELDS, ApiCall, ApiResult, OnState, State, Status, Think
from replay.engine.openai import openai_body, openai_chat, openai_messages
from replay.engine.responses import openai_responses, responses_body
from replay.engine.transport import make_client

ApiFunction = Callable[[httpx.AsyncClient, ApiCall, OnState], Awaitable[ApiResult]]

APIS: dict[str, ApiFunction] = {
    "openai": openai_chat,
    "anthropic": anthropic_messages,
    "openai-responses": openai_responses,
}

__all__ = [
    "APIS",
    "THINK_FIELDS",
    "ApiCall",
    "ApiFunction",
    "ApiResult",
    "OnState",
    "State",
    "Status",
    "Think",
    "anthropic_body",
    "anthropic_messages",
    "anthropic_messages_wire",
    "anthropic_tools",
    "make_client",
    "openai_body",
    "openai_chat",
    "openai_messages",
    "openai_responses",
    "responses_body",
]
