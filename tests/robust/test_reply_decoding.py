"""The checked decoding layer: any JSON value at any position of a reply is the request's failure at
worst (`BadPayload`), never another exception, and what is read is always well typed."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay.engine.anthropic import AnthropicReader
from replay.engine.decode import BadPayload, BadShape, ReplyFields, check_counts, load_object
from replay.engine.openai import OpenAIReader
from replay.engine.responses import ResponsesReader
from replay.engine.sse import SseParser
from replay.engine.usage import COUNT_PATHS
from replay.metrics.record import RequestRecord as ApiResult
from tests.support.replies import (
    ANTHROPIC_BODY,
    ANTHROPIC_EVENTS,
    OPENAI_BODY,
    OPENAI_CHUNKS,
    RESPONSES_BODY,
    RESPONSES_EVENTS,
    body_bytes,
    sse,
    stream_frames,
)

READERS = {"openai": OpenAIReader, "anthropic": AnthropicReader, "openai-responses": ResponsesReader}


def assert_well_typed(res: ApiResult) -> None:
    """What a reader hands on is what the session splices into the next request: typed."""
    msg = res.message
    if msg is not None:
        assert msg["role"] == "assistant" and isinstance(msg["content"], str)
        assert isinstance(msg.get("reasoning", ""), str)
        for call in msg.get("tool_calls", ()):
            assert all(isinstance(call[k], str) for k in ("id", "name", "arguments")), call
    assert res.finish is None or isinstance(res.finish, str)
    for name in (
        "prompt_tokens",
        "cached_tokens",
        "cache_write_tokens",
        "output_tokens",
        "reprocessed_tokens",
    ):
        value = getattr(res.usage, name)
        assert value is None or (type(value) is int and 0 <= value < 2**54), (name, value)
    assert res.x_sim is None or isinstance(res.x_sim, dict)
    orjson.dumps(res.x_sim)


def read_stream(api: str, frames: list[bytes]) -> tuple[ApiResult, BadPayload | None]:
    reader = READERS[api]()
    parser = SseParser()
    failure: BadPayload | None = None
    try:
        for frame in frames:
            for ev in parser.feed(frame):
                reader.event(ev)
    except BadPayload as exc:
        failure = exc
    res = ApiResult()
    try:
        reader.fill(res)
    except BadPayload as exc:
        failure = failure or exc
    return res, failure


def read_body(api: str, data: bytes) -> tuple[ApiResult, BadPayload | None]:
    reader = READERS[api]()
    failure: BadPayload | None = None
    try:
        reader.body(load_object(data, "response body"))
    except BadPayload as exc:
        failure = exc
    res = ApiResult()
    try:
        reader.fill(res)
    except BadPayload as exc:
        failure = failure or exc
    return res, failure


@pytest.mark.parametrize("api", sorted(READERS))
def test_unmutated_replies_read_whole(api: str) -> None:
    if api == "openai":
        frames = [sse(c) for c in OPENAI_CHUNKS] + [b"data: [DONE]\n\n"]
        body = OPENAI_BODY
    elif api == "anthropic":
        frames = [sse(obj, name) for name, obj in ANTHROPIC_EVENTS]
        body = ANTHROPIC_BODY
    else:
        frames = [sse(obj, obj["type"]) for obj in RESPONSES_EVENTS]
        body = RESPONSES_BODY
    for res, failure in (read_stream(api, frames), read_body(api, orjson.dumps(body))):
        assert failure is None
        assert res.message is not None and res.message["content"] == "hi"
        assert res.message["reasoning"] == "hmm"
        assert [c["name"] for c in res.message["tool_calls"]] == ["read"]
        assert res.finish == "tool_calls"
        assert res.usage.prompt_tokens == 10 and res.usage.cached_tokens == 3
        assert res.x_sim is not None and res.x_sim["prefill_s"] == 0.5


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(api=st.sampled_from(sorted(READERS)), data=st.data())
def test_any_json_anywhere_in_a_stream_is_read_or_refused_as_bad_payload(
    api: str, data: st.DataObject
) -> None:
    res, failure = read_stream(api, data.draw(stream_frames(api)))
    assert_well_typed(res)
    if failure is not None:
        assert "\n" not in str(failure)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(api=st.sampled_from(sorted(READERS)), data=st.data())
def test_any_json_anywhere_in_a_body_is_read_or_refused_as_bad_payload(api: str, data: st.DataObject) -> None:
    res, failure = read_body(api, data.draw(body_bytes(api)))
    assert_well_typed(res)


WRONG_SHAPES = [
    b'{"choices":"notalist"}',
    b'{"choices":[1]}',
    b'{"choices":[{"delta":"str"}]}',
    b'{"choices":[{"delta":{"content":5}}]}',
    b'{"choices":[{"delta":{"tool_calls":"x"}}]}',
    b'{"choices":[{"delta":{"tool_calls":[{"function":"f"}]}}]}',
    b'{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":7}}]}}]}',
    b'{"choices":[],"usage":{"prompt_tokens":"x"}}',
    b'{"choices":[],"usage":{"prompt_tokens":-1}}',
    b'{"choices":[],"usage":{"prompt_tokens":1e308}}',
    b'{"choices":[],"x_sim":{"prefill_s":"slow"}}',
    b"[1, 2]",
]


@pytest.mark.parametrize("chunk", WRONG_SHAPES)
def test_the_wrong_shapes_of_the_issue_are_bad_shape_naming_the_path(chunk: bytes) -> None:
    res, failure = read_stream("openai", [sse(OPENAI_CHUNKS[0]), b"data: " + chunk + b"\n\n"])
    assert isinstance(failure, BadShape), failure
    assert str(failure).startswith("$")


def test_absent_and_null_fields_read_as_not_said() -> None:
    obj = ReplyFields({"a": None})
    assert obj.text("a") is None and obj.count("b") is None and list(obj.objects("a")) == []
    assert obj.first_object("b") is None and obj.obj("a") is None


def test_a_count_must_be_a_non_negative_integer_below_2_53() -> None:
    assert ReplyFields({"n": 3.0}).count("n") == 3
    for bad in (-1, 2**53, 1.5, "3", True):
        with pytest.raises(BadShape, match=r"\$\.n must be a count"):
            ReplyFields({"n": bad}).count("n")
    with pytest.raises(BadShape, match=r"\$\.usage must be an object"):
        check_counts({"usage": [1]}, COUNT_PATHS, "$")


def test_not_json_is_bad_payload_with_the_bytes_as_evidence() -> None:
    with pytest.raises(BadPayload) as caught:
        load_object(b"{not json\n at all")
    assert not isinstance(caught.value, BadShape)
    assert caught.value.evidence == b"{not json\n at all"
    assert "\n" not in str(caught.value)


def test_deeply_nested_garbage_does_not_crash_the_snippet() -> None:
    value: Any = 1
    for _ in range(200):
        value = [value]
    with pytest.raises(BadShape) as caught:
        ReplyFields({"choices": value}).first_object("choices")
    assert len(str(caught.value)) < 300
