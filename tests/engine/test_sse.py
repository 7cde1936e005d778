"""The SSE parser: every framing a server may use, split at every possible byte."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from replay.engine.sse import SseEvent, SseParser


def feed_all(chunks: list[bytes]) -> tuple[list[SseEvent], SseParser]:
    parser = SseParser()
    events: list[SseEvent] = []
    for chunk in chunks:
        events += parser.feed(chunk)
    return events, parser


def test_plain_data_events() -> None:
    events, _ = feed_all([b'data: {"a":1}\n\ndata: [DONE]\n\n'])
    assert events == [SseEvent("message", b'{"a":1}'), SseEvent("message", b"[DONE]")]


def test_comment_lines_are_skipped_and_counted() -> None:
    stream = b": prefill\n\n: prefill\n\ndata: x\n: inline comment\n\n"
    events, parser = feed_all([stream])
    assert events == [SseEvent("message", b"x")]
    assert parser.comments == 3


def test_event_names_including_error() -> None:
    stream = b'event: message_start\ndata: {}\n\nevent: error\ndata: {"error":{"message":"boom"}}\n\n'
    events, _ = feed_all([stream])
    assert [e.event for e in events] == ["message_start", "error"]
    assert events[1].data == b'{"error":{"message":"boom"}}'


def test_multi_line_data_joins_with_newline() -> None:
    events, _ = feed_all([b"data: one\ndata: two\ndata:three\n\n"])
    assert events == [SseEvent("message", b"one\ntwo\nthree")]


def test_only_one_leading_space_is_stripped() -> None:
    events, _ = feed_all([b"data:  two spaces\n\n"])
    assert events[0].data == b" two spaces"


def test_crlf_and_lone_cr_line_endings() -> None:
    crlf, _ = feed_all([b"event: a\r\ndata: 1\r\n\r\ndata: 2\r\n\r\n"])
    cr, _ = feed_all([b"event: a\rdata: 1\r\rdata: 2\r\r"])
    assert crlf == cr == [SseEvent("a", b"1"), SseEvent("message", b"2")]


def test_crlf_split_between_chunks_is_one_line_end() -> None:
    events, _ = feed_all([b"data: 1\r", b"\n\r", b"\ndata: 2\r\n", b"\r\n"])
    assert events == [SseEvent("message", b"1"), SseEvent("message", b"2")]


def test_blank_line_split_between_chunks() -> None:
    events, _ = feed_all([b"data: 1\n", b"\n", b"data: 2", b"\n", b"\n"])
    assert events == [SseEvent("message", b"1"), SseEvent("message", b"2")]


def test_event_without_data_is_not_dispatched() -> None:
    events, _ = feed_all([b"event: ping\n\nid: 7\nretry: 10\n\ndata: x\n\n"])
    assert events == [SseEvent("message", b"x")]


def test_field_without_colon_and_empty_data() -> None:
    events, _ = feed_all([b"data\n\n"])
    assert events == [SseEvent("message", b"")]


def test_utf8_bom_at_stream_start_is_ignored() -> None:
    events, _ = feed_all([b"\xef\xbb\xbfdata: x\n\n"])
    assert events == [SseEvent("message", b"x")]


def test_incomplete_event_stays_pending() -> None:
    events, parser = feed_all([b"data: 1\n\ndata: half"])
    assert events == [SseEvent("message", b"1")]
    assert parser.pending == b"data: half"
    assert parser.finish() == []  # a half line is never dispatched


def test_finish_dispatches_complete_lines_without_blank_line() -> None:
    events, parser = feed_all([b"data: [DONE]\n"])
    assert events == []
    assert parser.finish() == [SseEvent("message", b"[DONE]")]
    assert parser.pending == b""


def test_multibyte_utf8_split_across_chunks() -> None:
    payload = '{"t":"žluťoučký 🐎"}'.encode()
    stream = b"data: " + payload + b"\n\n"
    events, _ = feed_all([stream[:9], stream[9:10], stream[10:]])
    assert events == [SseEvent("message", payload)]


# --- property: chunking never changes the events -------------------------------------

_text = st.text(
    alphabet=st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=20
)
_name = st.sampled_from([None, "message_start", "content_block_delta", "error", "ping"])
_event = st.tuples(_name, st.lists(_text, min_size=1, max_size=3), st.lists(_text, max_size=2))


def _render(
    events: list[tuple[str | None, list[str], list[str]]], eol: bytes
) -> tuple[bytes, list[SseEvent]]:
    """A valid stream and the events a correct parser must return, built independently."""
    out = b""
    expected = []
    for name, data_lines, comments in events:
        for c in comments:
            out += b":" + c.encode() + eol
        if name is not None:
            out += b"event: " + name.encode() + eol
        for line in data_lines:
            out += b"data: " + line.encode() + eol
        out += eol
        expected.append(SseEvent(name or "message", "\n".join(data_lines).encode()))
    return out, expected


@settings(max_examples=200, deadline=None)
@given(
    events=st.lists(_event, max_size=8),
    eol=st.sampled_from([b"\n", b"\r\n", b"\r"]),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12),
)
def test_any_chunking_gives_the_same_events(
    events: list[tuple[str | None, list[str], list[str]]], eol: bytes, cuts: list[int]
) -> None:
    stream, expected = _render(events, eol)
    points = sorted({c % (len(stream) + 1) for c in cuts})
    chunks = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    got, parser = feed_all(chunks)
    assert got == expected
    assert parser.comments == sum(len(c) for _, _, c in events)
    assert parser.pending == b""


@settings(max_examples=60, deadline=None)
@given(events=st.lists(_event, min_size=1, max_size=5), eol=st.sampled_from([b"\n", b"\r\n", b"\r"]))
def test_byte_by_byte_equals_one_chunk(
    events: list[tuple[str | None, list[str], list[str]]], eol: bytes
) -> None:
    stream, expected = _render(events, eol)
    got, _ = feed_all([stream[i : i + 1] for i in range(len(stream))])
    assert got == expected
