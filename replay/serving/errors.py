"""Errors in each API's own shape, so an agent's SDK shows the message instead of a parse failure.

OpenAI: `{"error": {"message", "type", "param", "code"}}`. Anthropic: `{"type": "error", "error":
{"type", "message"}}`; its inner object is the same as ds4's, whose errors are OpenAI-shaped on
every route, so a client reading `error.message` reads both.
"""

from __future__ import annotations

from typing import Any

import orjson

_ANTHROPIC_KINDS = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "request_too_large",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
}


def api_of_path(path: str) -> str:
    """Which API's error shape a path gets: Anthropic for `/v1/messages`, OpenAI for the rest."""
    return "anthropic" if path.rstrip("/").endswith("/messages") else "openai"


def error_payload(
    api: str, message: str, status: int = 400, kind: str | None = None, param: str | None = None
) -> dict[str, Any]:
    message = " ".join(message.split())  # one line, whatever the exception said
    if api == "anthropic":
        return {
            "type": "error",
            "error": {
                "type": kind or _ANTHROPIC_KINDS.get(status, "invalid_request_error"),
                "message": message,
            },
        }
    default = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind or default, "param": param, "code": None}}


def error_bytes(api: str, message: str, status: int = 400, kind: str | None = None) -> bytes:
    return orjson.dumps(error_payload(api, message, status, kind))
