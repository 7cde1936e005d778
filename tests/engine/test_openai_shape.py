"""The OpenAI reader's learnt content shape: chunks read without decoding are read exactly as the
general path reads them, whatever bytes a server sends."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.engine.decode import BadPayload
from replay.engine.openai import OpenAIReader
from replay.engine.sse import SseEvent
from replay.metrics.record import RequestRecord

_MARK = "\x00MARK\x00"  # never in a generated text: JSON escapes the NULs


def _chunk(
    fields: list[tuple[str, Any]], text: str, finish: str | None = None, key: str = "content"
) -> dict[str, Any]:
    choice = {"index": 0, "delta": {key: text}, "finish_reason": finish}
    return {**dict(fields), "choices": [choice]}


def _shape(fields: list[tuple[str, Any]], key: str = "content") -> tuple[bytes, bytes]:
    """A content (or reasoning) chunk's bytes before and after its text, as a server frames them."""
    head, foot = orjson.dumps(_chunk(fields, _MARK, key=key)).split(orjson.dumps(_MARK)[1:-1])
    return head, foot


_KEYS = ("content", "reasoning_content", "reasoning")


_fields = st.lists(
    st.sampled_from(
        [
            ("id", "chatcmpl-1"),
            ("object", "chat.completion.chunk"),
            ("created", 1_700_000_000),
            ("model", "m"),
            ("model", "tok"),  # a field that equals a token's text
            ("system_fingerprint", None),
            ("logprobs", None),
        ]
    ),
    unique_by=lambda f: f[0],
    max_size=5,
)
_text = st.text(max_size=8) | st.sampled_from(["tok", " tok", "Q", "Z", '"', "\\", "\n", "\xa0", ""])
_middle = st.binary(max_size=8) | st.sampled_from(
    [b'"', b"\\", b"\xff", b"\xed\xa0\x80", b'","x":"', b"\x7f"]
)


def _events(fields: list[tuple[str, Any]]) -> st.SearchStrategy[bytes]:
    shapes = [_shape(fields, key) for key in _KEYS]
    return st.one_of(
        st.tuples(_text, st.sampled_from(_KEYS)).map(lambda t: orjson.dumps(_chunk(fields, t[0], key=t[1]))),
        st.tuples(_middle, st.sampled_from(shapes)).map(lambda m: m[1][0] + m[0] + m[1][1]),
        _text.map(lambda t: orjson.dumps(_chunk(fields, t, "stop"))),
        st.just(orjson.dumps({**dict(fields), "choices": [], "usage": {"completion_tokens": 3}})),
        st.just(orjson.dumps({**dict(fields), "choices": [{"delta": {"content": "a", "reasoning": "b"}}]})),
        st.sampled_from(
            [b"[DONE]", b"", b"{", b"[]", *(h for h, _ in shapes), shapes[0][0] + shapes[0][1][:-1]]
        ),
    )


def _outcome(reader: OpenAIReader, data: bytes, name: str) -> Any:
    try:
        return reader.event(SseEvent(name, data))
    except BadPayload as exc:
        return (type(exc).__name__, str(exc), exc.evidence)


def _read(stream: list[tuple[str, bytes]], learn: bool) -> tuple[list[Any], dict[str, Any]]:
    reader = OpenAIReader()
    if not learn:
        reader._learn = 0  # never learns a shape: every chunk takes the general path
    outcomes = [_outcome(reader, data, name) for name, data in stream]
    res = RequestRecord()
    reader.fill(res)
    return outcomes, {"message": res.message, "finish": res.finish, "usage": res.usage}


def test_a_thinking_stream_learns_its_reasoning_shape_then_its_content_shape() -> None:
    fields = [("id", "chatcmpl-1"), ("model", "m")]
    reader = OpenAIReader()
    stream = [("reasoning_content", t) for t in ("Let", " me", " think")] + [
        ("content", t) for t in ("Hi", "!")
    ]
    assert all(reader.event(SseEvent("message", orjson.dumps(_chunk(fields, t, key=k)))) for k, t in stream)
    assert reader.reasoning == ["Let", " me", " think"] and reader.content == ["Hi", "!"]
    assert (reader._head, reader._foot) == _shape(fields, "content")
    assert reader._learn == 1  # one proof for each shape


@settings(max_examples=300, deadline=None)
@given(data=st.data(), fields=_fields)
def test_the_learnt_shape_reads_every_chunk_as_the_general_path_does(
    data: st.DataObject, fields: list[tuple[str, Any]]
) -> None:
    names = st.sampled_from(["message", "message", "message", "error", "delta"])
    stream = data.draw(st.lists(st.tuples(names, _events(fields)), max_size=12))
    assert _read(stream, learn=True) == _read(stream, learn=False)


def test_a_served_stream_is_learnt_and_read_without_decoding() -> None:
    fields = [("id", "chatcmpl-1"), ("object", "chat.completion.chunk"), ("created", 1), ("model", "m")]
    reader = OpenAIReader()
    texts = ["Hello", ", ", "wörld", ' "quoted"', "\n", "!"]
    read = [reader.event(SseEvent("message", orjson.dumps(_chunk(fields, t)))) for t in texts]
    assert read == [True] * len(texts)
    assert reader._head == _shape(fields)[0] and reader._foot == _shape(fields)[1]
    assert reader._learn == 2  # learnt from the first chunk, then every chunk fit or was read whole
    assert "".join(reader.content) == "".join(texts)


def test_bytes_that_are_not_json_in_the_learnt_shape_are_still_refused_with_evidence() -> None:
    fields = [("id", "x"), ("model", "m")]
    head, foot = _shape(fields)
    reader = OpenAIReader()
    assert reader.event(SseEvent("message", orjson.dumps(_chunk(fields, "a"))))
    bad = head + b"\xff" + foot
    try:
        reader.event(SseEvent("message", bad))
    except BadPayload as exc:
        assert exc.evidence == bad
    else:
        raise AssertionError("invalid UTF-8 inside a content string was read")


def test_a_shape_that_fails_the_proof_is_not_learnt() -> None:
    # The text also stands as the model's name after the content: the last match is not the
    # content, and replacing it does not change what the chunk reads as.
    chunk = b'{"choices":[{"index":0,"delta":{"content":"tok"},"finish_reason":null}],"model":"tok"}'
    reader = OpenAIReader()
    assert reader.event(SseEvent("message", chunk))
    assert reader._head == b"" and reader._learn == 2
