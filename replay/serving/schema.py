"""The OpenAPI document of the simulator's and the recording proxy's endpoints.

Written out rather than generated from docstrings: the request bodies are the APIs' own (OpenAI
chat completions, Anthropic messages, and on the simulator OpenAI responses), described as far as the servers read them; fields they do
not read are allowed and passed on. The simulator serves it at `/openapi.json`, the proxy at
`/_replay/openapi.json` (every other path of the proxy belongs to the upstream).
"""

from __future__ import annotations

from typing import Any

PROXY_SCHEMA_PATH = "/_replay/openapi.json"

_TEXT_OR_PARTS = {
    "oneOf": [
        {"type": "string"},
        {"type": "array", "items": {"oneOf": [{"type": "string"}, {"type": "object"}]}},
        {"type": "null"},
    ]
}
_COUNT = {"type": "integer", "minimum": 0, "description": "at most the model's context (simulator)"}

OPENAI_CHAT: dict[str, Any] = {
    "type": "object",
    "required": ["messages"],
    "properties": {
        "model": {"type": "string"},
        "messages": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["role"],
                "properties": {
                    "role": {"enum": ["system", "developer", "user", "assistant", "tool", "function"]},
                    "content": _TEXT_OR_PARTS,
                    "tool_call_id": {"type": "string"},
                    "name": {"type": "string"},
                    "reasoning_content": {"type": ["string", "null"]},
                    "tool_calls": {
                        "type": ["array", "null"],
                        "items": {
                            "type": "object",
                            "properties": {
                                "id": {"type": "string"},
                                "type": {"type": "string"},
                                "function": {
                                    "type": "object",
                                    "properties": {
                                        "name": {"type": "string"},
                                        "arguments": {"description": "JSON text (or a JSON value)"},
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
        "tools": {
            "type": ["array", "null"],
            "items": {
                "type": "object",
                "properties": {
                    "type": {"type": "string"},
                    "function": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string"},
                            "description": {"type": "string"},
                            "parameters": {"type": "object"},
                        },
                    },
                },
            },
        },
        "max_tokens": _COUNT,
        "max_completion_tokens": _COUNT,
        "stream": {"type": ["boolean", "null"]},
        "stream_options": {
            "type": ["object", "null"],
            "properties": {"include_usage": {"type": ["boolean", "null"]}},
        },
        "temperature": {"type": ["number", "null"]},
    },
}

ANTHROPIC_MESSAGES: dict[str, Any] = {
    "type": "object",
    "required": ["messages"],
    "properties": {
        "model": {"type": "string"},
        "system": _TEXT_OR_PARTS,
        "messages": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["role"],
                "properties": {
                    "role": {"enum": ["user", "assistant", "system"]},
                    "content": {
                        "oneOf": [
                            {"type": "string"},
                            {"type": "null"},
                            {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "properties": {
                                        "type": {"type": "string"},
                                        "text": {"type": "string"},
                                        "id": {"type": "string"},
                                        "name": {"type": "string"},
                                        "input": {},
                                        "tool_use_id": {"type": "string"},
                                        "content": _TEXT_OR_PARTS,
                                    },
                                },
                            },
                        ]
                    },
                },
            },
        },
        "tools": {
            "type": ["array", "null"],
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "description": {"type": "string"},
                    "input_schema": {"type": "object"},
                },
            },
        },
        "max_tokens": _COUNT,
        "stream": {"type": ["boolean", "null"]},
        "temperature": {"type": ["number", "null"]},
    },
}

_RESPONSES_ITEM: dict[str, Any] = {
    "type": "object",
    "description": "a message (the default type), a function or custom tool call, its output, or reasoning;"
    " other item types are accepted and not read",
    "properties": {
        "type": {"type": ["string", "null"]},
        "role": {"enum": ["user", "system", "developer", "assistant"]},
        "content": _TEXT_OR_PARTS,
        "call_id": {"type": ["string", "null"]},
        "name": {"type": ["string", "null"]},
        "arguments": {"description": "JSON text (or a JSON value)"},
        "input": {"description": "a custom tool call's input: text (or a JSON value)"},
        "output": _TEXT_OR_PARTS,
    },
}

OPENAI_RESPONSES: dict[str, Any] = {
    "type": "object",
    "properties": {
        "model": {"type": "string"},
        "input": {
            "oneOf": [{"type": "string"}, {"type": "array", "items": _RESPONSES_ITEM}, {"type": "null"}],
            "description": "required unless `previous_response_id` or `instructions` give the context",
        },
        "instructions": {"type": ["string", "null"]},
        "previous_response_id": {"type": ["string", "null"]},
        "tools": {
            "type": ["array", "null"],
            "items": {
                "type": "object",
                "properties": {
                    "type": {"type": ["string", "null"]},
                    "name": {"type": ["string", "null"]},
                    "description": {"type": ["string", "null"]},
                    "parameters": {"type": ["object", "null"]},
                },
            },
        },
        "reasoning": {"type": ["object", "null"], "properties": {"effort": {"type": ["string", "null"]}}},
        "max_output_tokens": _COUNT,
        "max_tokens": _COUNT,
        "stream": {"type": ["boolean", "null"]},
        "store": {"type": ["boolean", "null"]},
        "temperature": {"type": ["number", "null"]},
    },
}

_OPENAI_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {"message": {"type": "string"}, "type": {"type": "string"}},
        }
    },
}
_ANTHROPIC_ERROR = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {"type": {"const": "error"}, "error": _OPENAI_ERROR["properties"]["error"]},
}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _chat(body: dict[str, Any], error: dict[str, Any], summary: str, recorded: bool) -> dict[str, Any]:
    errors = {
        "400": _json(error, "malformed request: the message names the field"),
        "408": _json(error, "the body did not arrive in time"),
        "413": _json(error, "the body is larger than the limit (answered before it is read)"),
    }
    if recorded:
        errors = {"502": _json(error, "the upstream cannot be reached"), **errors}
        errors["default"] = {"description": "whatever the upstream answered, relayed unchanged"}
    else:
        errors["503"] = _json(error, "the simulator is shutting down")
    ok = {
        "description": "the reply: a JSON body, or server-sent events when `stream` is true",
        "content": {"application/json": {"schema": {"type": "object"}}, "text/event-stream": {}},
    }
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
            "responses": {"200": ok, **errors},
        }
    }


def _get(summary: str) -> dict[str, Any]:
    return {"get": {"summary": summary, "responses": {"200": _json({"type": "object"}, "ok")}}}


def openapi(server: str) -> dict[str, Any]:
    """The document for `server`: "simulator" or "proxy"."""
    recorded = server == "proxy"
    chat = _chat(OPENAI_CHAT, _OPENAI_ERROR, "OpenAI chat completion", recorded)
    messages = _chat(ANTHROPIC_MESSAGES, _ANTHROPIC_ERROR, "Anthropic messages", recorded)
    if recorded:
        paths: dict[str, Any] = {
            "/v1/chat/completions": chat,
            "/chat/completions": chat,
            "/v1/messages": messages,
            "/s/{session}/v1/chat/completions": chat,
            "/s/{session}/v1/messages": messages,
            PROXY_SCHEMA_PATH: _get("this document"),
        }
        title, note = (
            "agent-replay recording proxy",
            ("Every other path and method is relayed to the upstream unchanged and not recorded."),
        )
    else:
        paths = {
            "/v1/chat/completions": chat,
            "/v1/messages": messages,
            "/v1/responses": _chat(OPENAI_RESPONSES, _OPENAI_ERROR, "OpenAI Responses API", recorded),
            "/v1/models": _get("the served model"),
            "/v1/models/{model_id}": _get("one model"),
            "/health": _get("liveness"),
            "/v1/health": _get("liveness"),
            "/stats": _get("ds4-style counters"),
            "/v1/stats": _get("ds4-style counters"),
            "/openapi.json": _get("this document"),
        }
        title, note = "agent-replay simulator", "Any other path is 404, any other method 405."
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": "1", "description": note},
        "paths": paths,
    }
