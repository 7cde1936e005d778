"""What the recorder reads from the Responses API and from Claude Code's Anthropic requests, and the
trace lines it writes for calls it does not record."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.engine.anthropic import anthropic_messages_wire
from replay.engine.decode import BadShape, ReplyFields
from replay.engine.exchange import ApiCall
from replay.engine.responses import ResponsesReader, responses_body
from replay.engine.sse import SseEvent
from replay.errors import TraceError
from replay.metrics.record import RequestRecord
from replay.record.anonymize import anonymize_trace
from replay.record.calls import CallLog
from replay.record.requests import parse_request
from replay.record.wire import ReplyTap, WireError
from replay.serving.fields import FieldError
from replay.sim.server.api import BadRequest
from replay.sim.server.responses import ResponseStore
from replay.sim.server.responses import parse_responses as parse_sim_responses
from replay.trace import TraceWriter, read_trace, validate

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)
call_ids = st.text("abcdef0123456789", min_size=4, max_size=8).map(lambda s: "call_" + s)
arguments = st.dictionaries(
    st.sampled_from(["path", "cmd", "n"]), st.one_of(text, st.integers(-(2**53), 2**53)), max_size=2
).map(lambda d: orjson.dumps(d).decode())


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Neutral conversations as a Responses agent has them: instructions, developer context, user
    turns, assistant turns with tool calls answered by tool results."""
    out: list[dict[str, Any]] = []
    if draw(st.booleans()):
        out.append({"role": "system", "content": draw(text)})
    out += [{"role": "developer", "content": draw(text)} for _ in range(draw(st.integers(0, 2)))]
    for _ in range(draw(st.integers(1, 4))):
        out.append({"role": "user", "content": draw(text)})
        for _ in range(draw(st.integers(0, 2))):
            ids = draw(st.lists(call_ids, min_size=1, max_size=2, unique=True))
            calls = [
                {"id": i, "name": draw(st.sampled_from(["shell", "read"])), "arguments": draw(arguments)}
                for i in ids
            ]
            out.append({"role": "assistant", "content": draw(text), "tool_calls": calls})
            out += [{"role": "tool", "tool_call_id": i, "content": draw(text)} for i in ids]
        if draw(st.booleans()):
            out.append({"role": "assistant", "content": draw(text.filter(bool))})
    return out


@settings(max_examples=200, deadline=None)
@given(conversations(), st.booleans())
def test_responses_requests_read_back_as_the_messages_they_were_made_from(
    messages: list[dict[str, Any]], stream: bool
) -> None:
    call = ApiCall("http://x", "m", messages, max_tokens=64, stream=stream, extra_body={"store": False})
    parsed = parse_request("openai-responses", orjson.dumps(responses_body(call)))
    assert parsed.api == "openai-responses" and parsed.params["max_tokens"] == 64
    assert parsed.params["extra"] == {"store": False}
    assert parsed.messages == messages
    assert parsed.has_instructions == (messages[0]["role"] == "system")


def test_responses_items_of_one_turn_join_one_assistant_message() -> None:
    body = {
        "model": "gpt",
        "input": [
            {"type": "message", "role": "system", "content": "first, not instructions"},
            {
                "role": "user",
                "content": [{"type": "input_text", "text": "hi"}, {"type": "input_image", "image_url": "x"}],
            },
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [{"type": "summary_text", "text": "think"}],
                "encrypted_content": "zz",
            },
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "on it"}]},
            {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": '{"cmd": ["ls"]}'},
            {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"},
            {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
            {"type": "custom_tool_call_output", "call_id": "c2", "output": "done"},
            {"type": "web_search_call", "id": "ws"},
        ],
        "tools": [
            {"type": "function", "name": "shell", "parameters": {"type": "object"}},
            {"type": "custom", "name": "apply_patch"},
        ],
        "previous_response_id": "resp_9",
        "prompt_cache_key": "k",
    }
    parsed = parse_request("openai-responses", orjson.dumps(body))
    assert parsed.previous_response_id == "resp_9" and not parsed.has_instructions
    assert parsed.dropped_parts == 2  # the image and the web search call
    assert parsed.messages == [
        {"role": "system", "content": "first, not instructions", "inline": True},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "on it",
            "reasoning": "think",
            "tool_calls": [
                {"id": "c1", "name": "shell", "arguments": '{"cmd":["ls"]}'},
                {"id": "c2", "name": "apply_patch", "arguments": "*** Begin Patch", "type": "custom"},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
        {"role": "tool", "tool_call_id": "c2", "content": "done"},
    ]
    assert parsed.params["tools"] == [
        {"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}},
        {"type": "custom", "name": "apply_patch"},
    ]
    assert parsed.params["extra"] == {"prompt_cache_key": "k"}
    with pytest.raises(WireError, match="role"):
        parse_request("openai-responses", orjson.dumps({"input": [{"role": "robot", "content": "x"}]}))


def test_claude_code_request_keeps_inline_system_cache_marks_and_metadata() -> None:
    eph = {"type": "ephemeral"}
    body = {
        "model": "claude",
        "system": [
            {"type": "text", "text": "billing"},
            {"type": "text", "text": "rules", "cache_control": eph},
        ],
        "messages": [
            {"role": "system", "content": "agents: general"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<reminder>"},
                    {"type": "text", "text": "go", "cache_control": eph},
                ],
            },
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"p": 1}}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "x", "cache_control": eph}
                ],
            },
        ],
        "tools": [{"name": "Read", "input_schema": {"type": "object"}, "cache_control": eph}],
        "metadata": {"user_id": "user_1_account__session_0f9b2c1d-aaaa"},
        "max_tokens": 100,
    }
    parsed = parse_request("anthropic", orjson.dumps(body))
    assert parsed.messages == [
        {"role": "system", "content": "billing"},
        {"role": "system", "content": "rules"},
        {"role": "system", "content": "agents: general", "inline": True},
        {"role": "user", "content": ["<reminder>", "go"]},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "t1", "name": "Read", "arguments": '{"p":1}'}],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "x"},
    ]
    assert parsed.params["cache_control"] == [
        {"message": 1, "value": eph},
        {"message": 3, "value": eph},
        {"message": 5, "value": eph},
    ]
    assert parsed.params["tools"][0]["cache_control"] == eph
    assert parsed.params["extra"] == {"metadata": body["metadata"]}
    assert parsed.user_id == body["metadata"]["user_id"]
    # Sent back, the marks and the inline entry land where they were.
    plain = [
        {**m, "content": "\n".join(m["content"]) if isinstance(m["content"], list) else m["content"]}
        for m in parsed.messages
    ]
    marks = [(m["message"], m["value"]) for m in parsed.params["cache_control"]]
    system, turns = anthropic_messages_wire(plain, marks)
    assert system == [
        {"type": "text", "text": "billing"},
        {"type": "text", "text": "rules", "cache_control": eph},
    ]
    assert turns[0] == {"role": "system", "content": "agents: general"}
    assert turns[1]["content"][-1]["cache_control"] == eph
    assert turns[3]["content"][-1] == {
        "type": "tool_result",
        "tool_use_id": "t1",
        "content": "x",
        "cache_control": eph,
    }


def test_call_log_counts_what_was_not_recorded_and_the_trace_keeps_it(tmp_path: Path) -> None:
    log = CallLog(tmp_path / "calls.jsonl")
    log.done("POST", "/v1/messages", 200, 900, None)
    log.done("HEAD", "/", 200, 0, "not a recorded route")
    log.done("HEAD", "/", 503, 0, "not a recorded route")
    log.done("POST", "/v1/messages", 200, 50, "request has no messages")
    assert log.calls == 4 and log.missing == 3
    assert "HEAD / x2" in log.summary()
    with TraceWriter(tmp_path / "t.jsonl", source="record") as w:
        w.session("s", api="anthropic")
        w.request("s", 0.0, [{"role": "user", "content": "hi"}])
        log.write_to(w)
    log.close()
    assert validate(tmp_path / "t.jsonl")["unrecorded"] == 3
    lines = read_trace(tmp_path / "t.jsonl").unrecorded
    assert lines[0]["statuses"] == {"200": 1, "503": 1} and lines[1]["reason"] == "request has no messages"
    anonymize_trace(tmp_path / "t.jsonl", tmp_path / "anon.jsonl", "key")
    assert read_trace(tmp_path / "anon.jsonl").unrecorded == lines  # no text of the agent's in them
    logged = [orjson.loads(x) for x in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert [x["recorded"] for x in logged] == [True, False, False, False]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ({"kind": "unrecorded", "method": "GET", "count": 1}, "missing field 'path'"),
        ({"kind": "unrecorded", "method": "GET", "path": "/", "count": 0}, "count must be >= 1"),
        (
            {
                "kind": "request",
                "id": 2,
                "session": "s",
                "t": 0,
                "append": [{"role": "user", "content": "x"}],
                "params": {"previous_response": 9},
            },
            "previous_response 9",
        ),
    ],
)
def test_reader_refuses_bad_unrecorded_and_chain_lines(
    tmp_path: Path, line: dict[str, Any], problem: str
) -> None:
    head = [
        {"kind": "trace", "format": "agent-replay-trace/1"},
        {"kind": "session", "id": "s", "api": "openai-responses"},
        {
            "kind": "request",
            "id": 1,
            "session": "s",
            "t": 0,
            "append": [{"role": "developer", "content": "d"}],
        },
    ]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(x) for x in [*head, line]) + b"\n")
    with pytest.raises(TraceError, match=problem) as err:
        validate(path)
    assert err.value.line == 4


def _ev(obj: dict[str, Any]) -> bytes:
    return b"event: " + obj["type"].encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


RESPONSES_STREAM = b"".join(
    _ev(x)
    for x in (
        {"type": "response.created", "response": {"id": "resp_7", "status": "in_progress"}},
        {"type": "response.output_item.added", "output_index": 0, "item": {"type": "reasoning", "id": "rs"}},
        {"type": "response.reasoning_summary_text.delta", "output_index": 0, "delta": "think "},
        {"type": "response.output_item.added", "output_index": 1, "item": {"type": "message", "id": "m"}},
        {"type": "response.output_text.delta", "output_index": 1, "delta": "Hello "},
        {"type": "response.output_text.delta", "output_index": 1, "delta": "world"},
        {
            "type": "response.output_item.added",
            "output_index": 2,
            "item": {"type": "function_call", "call_id": "c1", "name": "read", "arguments": ""},
        },
        {"type": "response.function_call_arguments.delta", "output_index": 2, "delta": '{"p": '},
        {"type": "response.function_call_arguments.delta", "output_index": 2, "delta": "1}"},
        {
            "type": "response.completed",
            "response": {
                "id": "resp_7",
                "status": "completed",
                "usage": {
                    "input_tokens": 9,
                    "input_tokens_details": {"cached_tokens": 4},
                    "output_tokens": 5,
                },
            },
        },
    )
)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, len(RESPONSES_STREAM)), max_size=12))
def test_reply_tap_reads_a_responses_stream_split_anywhere(cuts: list[int]) -> None:
    tap = ReplyTap("openai-responses")
    tap.start(200, "text/event-stream")
    edges = [0, *sorted(cuts), len(RESPONSES_STREAM)]
    for i, (lo, hi) in enumerate(zip(edges, edges[1:], strict=False)):
        tap.feed(RESPONSES_STREAM[lo:hi], 1000 + i)
    res = tap.finish()
    assert res.status == "ok", res.error
    assert res.message == {
        "role": "assistant",
        "content": "Hello world",
        "tool_calls": [{"id": "c1", "name": "read", "arguments": '{"p":1}'}],
        "reasoning": "think ",
    }
    assert res.finish == "tool_calls" and res.response_id == "resp_7"
    assert (res.usage.prompt_tokens, res.usage.cached_tokens, res.usage.output_tokens) == (9, 4, 5)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
keys = st.sampled_from(
    ["type", "item", "response", "output_index", "delta", "output", "id", "usage", "status"]
)
shaped = st.dictionaries(keys, json_values, max_size=5).map(
    lambda d: {**d, "type": d.get("type") if isinstance(d.get("type"), str) else "response.output_item.added"}
)


@settings(max_examples=300, deadline=None)
@given(st.lists(shaped | st.dictionaries(st.text(max_size=6), json_values, max_size=4), max_size=6))
def test_any_responses_events_are_read_or_refused_as_bad_payload(events: list[dict[str, Any]]) -> None:
    """A reply of odd shape is never a crash: a wrong type is `BadShape` naming its path (the
    request's `bad_payload`), and what was read before it stays well typed."""
    reader = ResponsesReader()
    for obj in events:
        try:
            reader.event(SseEvent(str(obj.get("type", "message")), orjson.dumps(obj)))
        except BadShape as exc:
            assert str(exc).startswith("$") and "\n" not in str(exc)
    try:
        reader.body(ReplyFields({"output": [obj for obj in events]}))
    except BadShape as exc:
        assert str(exc).startswith("$.")
    res = RequestRecord()
    reader.fill(res)
    if res.message is not None:
        assert isinstance(res.message["content"], str)
        for call in res.message.get("tool_calls", ()):
            assert all(isinstance(call[k], str) for k in ("id", "name", "arguments")), call
    assert res.response_id is None or isinstance(res.response_id, str)
    assert res.finish is None or isinstance(res.finish, str)


request_bodies = st.dictionaries(
    st.sampled_from(
        ["input", "instructions", "tools", "previous_response_id", "max_output_tokens", "model", "store"]
    ),
    json_values
    | st.lists(
        st.dictionaries(st.sampled_from(["type", "role", "content", "call_id", "output"]), json_values),
        max_size=3,
    ),
    max_size=5,
)


@settings(max_examples=300, deadline=None)
@given(request_bodies)
def test_any_responses_body_is_read_or_refused_in_one_line(body: dict[str, Any]) -> None:
    raw = orjson.dumps(body)
    try:
        parse_request("openai-responses", raw)
    except WireError as exc:
        assert "\n" not in str(exc)
    try:
        parse_sim_responses(body, ResponseStore())
    except BadRequest as exc:
        assert exc.status == 400
    except FieldError as exc:
        assert "\n" not in str(exc)
