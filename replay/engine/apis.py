"""The wire APIs the engine speaks, by name: per API, the async request function that sends a
call, and the reply reader that interprets what comes back (which the recorder uses too, on the
bytes it forwards).

Adding an API is adding one module with one function and one reader, and one line here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import httpx

from replay.engine.anthropic import (
    AnthropicReader,
    anthropic_body,
    anthropic_messages,
    anthropic_messages_wire,
    anthropic_tools,
)
from replay.engine.exchange import THINK_FIELDS, ApiCall, OnState, Reader, State, Status, Think
from replay.engine.openai import OpenAIReader, openai_body, openai_chat, openai_messages
from replay.engine.responses import ResponsesReader, openai_responses, responses_body
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


@dataclass(frozen=True, slots=True)
class Api:
    send: ApiFunction
    reader: Callable[[], Reader]  # a fresh reader per reply


APIS: dict[str, Api] = {
    "openai": Api(openai_chat, OpenAIReader),
    "anthropic": Api(anthropic_messages, AnthropicReader),
    "openai-responses": Api(openai_responses, ResponsesReader),
}

__all__ = [
    "APIS",
    "Api",
    "THINK_FIELDS",
    "ApiCall",
    "ApiFunction",
    "OnState",
    "Reader",
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
