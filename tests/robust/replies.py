"""Well-formed replies of both APIs, and hypothesis strategies that put any JSON value anywhere in them."""

from __future__ import annotations

import copy
from typing import Any

import orjson
from hypothesis import strategies as st

# Any JSON value orjson can write: no NaN/inf (not JSON), ints within 64 bits.
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)

X_SIM = {"queue_s": 0.0, "prefill_s": 0.5, "decode_s": 0.1, "total_s": 0.6, "cache_source": "live", "slot": 0}

OPENAI_CHUNKS: list[dict[str, Any]] = [
    {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
    },
    {"choices": [{"index": 0, "delta": {"reasoning_content": "hmm"}}]},
    {"choices": [{"index": 0, "delta": {"content": "hi"}}]},
    {
        "choices": [
            {
                "index": 0,
                "delta": {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "read", "arguments": '{"p"'},
                        }
                    ]
                },
            }
        ]
    },
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}}]},
    {
        "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
        "timings": {"prompt_n": 7, "cache_n": 3, "predicted_n": 2},
    },
    {
        "choices": [],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 3}},
        "x_sim": X_SIM,
    },
]

OPENAI_BODY: dict[str, Any] = {
    "id": "c",
    "object": "chat.completion",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "hi",
                "reasoning_content": "hmm",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 3}},
    "timings": {"prompt_n": 7, "cache_n": 3, "predicted_n": 2},
    "x_sim": X_SIM,
}

ANTHROPIC_EVENTS: list[tuple[str, dict[str, Any]]] = [
    (
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": "m",
                "role": "assistant",
                "content": [],
                "usage": {
                    "input_tokens": 0,
                    "cache_read_input_tokens": 3,
                    "cache_creation_input_tokens": 7,
                    "output_tokens": 1,
                },
            },
        },
    ),
    (
        "content_block_start",
        {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
    ),
    (
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}},
    ),
    (
        "content_block_start",
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
    ),
    (
        "content_block_delta",
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "hi"}},
    ),
    (
        "content_block_start",
        {
            "type": "content_block_start",
            "index": 2,
            "content_block": {"type": "tool_use", "id": "t1", "name": "read", "input": {}},
        },
    ),
    (
        "content_block_delta",
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "input_json_delta", "partial_json": '{"p": 1}'},
        },
    ),
    ("content_block_stop", {"type": "content_block_stop", "index": 2}),
    (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use"},
            "usage": {"output_tokens": 2},
            "x_sim": X_SIM,
        },
    ),
    ("message_stop", {"type": "message_stop"}),
]

ANTHROPIC_BODY: dict[str, Any] = {
    "id": "m",
    "type": "message",
    "role": "assistant",
    "content": [
        {"type": "thinking", "thinking": "hmm"},
        {"type": "text", "text": "hi"},
        {"type": "tool_use", "id": "t1", "name": "read", "input": {"p": 1}},
    ],
    "stop_reason": "tool_use",
    "usage": {
        "input_tokens": 0,
        "cache_read_input_tokens": 3,
        "cache_creation_input_tokens": 7,
        "output_tokens": 2,
    },
    "x_sim": X_SIM,
}


def positions(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every position in a JSON value, the root included."""
    out = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            out += positions(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out += positions(item, (*path, i))
    return out


@st.composite
def mutated(draw: st.DrawFn, value: Any) -> Any:
    """`value` with one position replaced by any JSON value, or a key added or removed there."""
    value = copy.deepcopy(value)
    path = draw(st.sampled_from(positions(value)))
    new = draw(JSON)
    if not path:
        return new
    parent = value
    for key in path[:-1]:
        parent = parent[key]
    how = draw(st.sampled_from(["replace", "replace", "add", "remove"]))
    if how == "replace" or not isinstance(parent, dict):
        parent[path[-1]] = new
    elif how == "add":
        parent[draw(st.sampled_from(["content", "delta", "usage", "index", "type", "choices", "x_sim"]))] = (
            new
        )
    else:
        del parent[path[-1]]
    return value


def sse(obj: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(obj) + b"\n\n"


@st.composite
def openai_stream(draw: st.DrawFn) -> list[bytes]:
    """OpenAI stream frames with one chunk mutated."""
    chunks = list(OPENAI_CHUNKS)
    i = draw(st.integers(0, len(chunks) - 1))
    chunks[i] = draw(mutated(chunks[i]))
    return [sse(c) for c in chunks] + [b"data: [DONE]\n\n"]


@st.composite
def anthropic_stream(draw: st.DrawFn) -> list[bytes]:
    """Anthropic stream frames with one event mutated."""
    events = list(ANTHROPIC_EVENTS)
    i = draw(st.integers(0, len(events) - 1))
    name, obj = events[i]
    events[i] = (name, draw(mutated(obj)))
    return [sse(obj, name) for name, obj in events]


def stream_frames(api: str) -> st.SearchStrategy[list[bytes]]:
    return openai_stream() if api == "openai" else anthropic_stream()


def body_bytes(api: str) -> st.SearchStrategy[bytes]:
    body = OPENAI_BODY if api == "openai" else ANTHROPIC_BODY
    return mutated(body).map(orjson.dumps)
