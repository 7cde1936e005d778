"""The wire APIs the engine speaks, by name: one async request function per API.

Adding an API is adding one module with one function and one line here.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol

import httpx

from replay.engine.anthropic import (
    anthropic_body,
    anthropic_messages,
    anthropic_messages_wire,
    anthropic_tools,
)
from replay.engine.exchange import THINK_FIELDS, ApiCall, OnState, State, Status, Think
from replay.engine.openai import openai_body, openai_chat, openai_messages
from replay.engine.transport import make_client
from replay.metrics.record import RequestRecord


class ApiFunction(Protocol):
    """Sends one call and fills `rec` (or a new record), which it returns; never raises but cancellation."""

    def __call__(
        self,
        client: httpx.AsyncClient,
        call: ApiCall,
        on_state: OnState = None,
        rec: RequestRecord | None = None,
    ) -> Awaitable[RequestRecord]: ...


APIS: dict[str, ApiFunction] = {"openai": openai_chat, "anthropic": anthropic_messages}

__all__ = [
    "APIS",
    "THINK_FIELDS",
    "ApiCall",
    "ApiFunction",
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
]
