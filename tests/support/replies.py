"""Well-formed replies of each API, and hypothesis strategies that put any JSON value anywhere in them."""

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


RESPONSES_USAGE: dict[str, Any] = {
    "input_tokens": 10,
    "input_tokens_details": {"cached_tokens": 3},
    "output_tokens": 2,
    "output_tokens_details": {"reasoning_tokens": 1},
    "total_tokens": 12,
}

_RESPONSE_HEAD: dict[str, Any] = {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}

_CALL_ITEM: dict[str, Any] = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "read"}

RESPONSES_EVENTS: list[dict[str, Any]] = [
    {"type": "response.created", "sequence_number": 0, "response": _RESPONSE_HEAD},
    {"type": "response.in_progress", "sequence_number": 1, "response": _RESPONSE_HEAD},
    {
        "type": "response.output_item.added",
        "output_index": 0,
        "item": {"type": "reasoning", "id": "rs_1", "summary": [], "content": []},
    },
    {"type": "response.reasoning_text.delta", "output_index": 0, "content_index": 0, "delta": "hmm"},
    {
        "type": "response.output_item.added",
        "output_index": 1,
        "item": {"type": "message", "id": "msg_1", "role": "assistant", "content": []},
    },
    {
        "type": "response.content_part.added",
        "output_index": 1,
        "content_index": 0,
        "part": {"type": "output_text", "text": "", "annotations": []},
    },
    {"type": "response.output_text.delta", "output_index": 1, "content_index": 0, "delta": "hi"},
    {"type": "response.output_item.added", "output_index": 2, "item": {**_CALL_ITEM, "arguments": ""}},
    {"type": "response.function_call_arguments.delta", "output_index": 2, "delta": '{"p"'},
    {"type": "response.function_call_arguments.delta", "output_index": 2, "delta": ": 1}"},
    {"type": "response.output_item.done", "output_index": 2, "item": {**_CALL_ITEM, "arguments": '{"p": 1}'}},
    {
        "type": "response.completed",
        "response": {
            "id": "resp_1",
            "object": "response",
            "status": "completed",
            "incomplete_details": None,
            "usage": RESPONSES_USAGE,
            "x_sim": X_SIM,
        },
    },
]

RESPONSES_BODY: dict[str, Any] = {
    "id": "resp_1",
    "object": "response",
    "status": "completed",
    "incomplete_details": None,
    "output": [
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "hmm"}],
        },
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "hi", "annotations": []}],
        },
        {**_CALL_ITEM, "arguments": '{"p": 1}'},
    ],
    "usage": RESPONSES_USAGE,
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


# Keys a mutation may add: the ones the readers look for.
KEYS_ADDED = [
    "content",
    "delta",
    "usage",
    "index",
    "type",
    "choices",
    "x_sim",
    "output_index",
    "item",
    "response",
]


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
        parent[draw(st.sampled_from(KEYS_ADDED))] = new
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


@st.composite
def responses_stream(draw: st.DrawFn) -> list[bytes]:
    """Responses stream frames (named events, as OpenAI sends them) with one event mutated."""
    events = list(RESPONSES_EVENTS)
    i = draw(st.integers(0, len(events) - 1))
    events[i] = draw(mutated(events[i]))
    return [sse(obj, RESPONSES_EVENTS[j]["type"]) for j, obj in enumerate(events)]


def stream_frames(api: str) -> st.SearchStrategy[list[bytes]]:
    if api == "openai":
        return openai_stream()
    return anthropic_stream() if api == "anthropic" else responses_stream()


BODIES = {"openai": OPENAI_BODY, "anthropic": ANTHROPIC_BODY, "openai-responses": RESPONSES_BODY}


def body_bytes(api: str) -> st.SearchStrategy[bytes]:
    return mutated(BODIES[api]).map(orjson.dumps)
