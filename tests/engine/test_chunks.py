"""The chunked-body decoder (compiled with the engine's hot path): any split of the reads gives
the same payload, and broken framing is refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replay.engine.chunks import ChunkError, Dechunker


def _encode(chunks: list[bytes], extension: bool) -> bytes:
    ext = b";x=1" if extension else b""
    body = b"".join(b"%x%s\r\n%s\r\n" % (len(c), ext, c) for c in chunks)
    return body + b"0\r\n"


@given(
    chunks=st.lists(st.binary(min_size=1, max_size=300), max_size=12),
    extension=st.booleans(),
    trailer=st.sampled_from([b"\r\n", b"X-A: 1\r\n\r\n"]),
    cuts=st.lists(st.integers(min_value=0, max_value=5000), max_size=8),
)
def test_any_split_gives_the_payload(
    chunks: list[bytes], extension: bool, trailer: bytes, cuts: list[int]
) -> None:
    wire = _encode(chunks, extension) + trailer
    marks = sorted({min(c, len(wire)) for c in cuts} | {0, len(wire)})
    body = Dechunker()
    out = []
    rest = b""
    for a, b in zip(marks, marks[1:], strict=False):
        if body.done:
            rest += wire[a:b]
            continue
        out.append(body.feed(wire[a:b]))
        if body.done:
            rest = body.rest
    assert body.done
    assert b"".join(out) == b"".join(chunks)
    assert rest == trailer


def test_reset_reads_a_second_body() -> None:
    body = Dechunker()
    assert body.feed(b"3\r\nabc\r\n0\r\n\r\n") == b"abc" and body.done and body.rest == b"\r\n"
    body.reset()
    assert not body.done and body.feed(b"2\r\nde\r\n") == b"de" and not body.done


@pytest.mark.parametrize(
    ("wire", "error"),
    [(b"zz\r\n", "bad chunk size b'zz'"), (b"1" * 5000, "chunk size line too long")],
)
def test_broken_framing_is_refused(wire: bytes, error: str) -> None:
    with pytest.raises(ChunkError, match=error):
        Dechunker().feed(wire)


def _reference(wire: bytes) -> tuple[bytes, bytes]:
    """The framing read line by line the plain way: (payload, what follows the last chunk)."""
    out, pos = [], 0
    while True:
        eol = wire.index(b"\n", pos)
        size_text = wire[pos:eol].split(b";", 1)[0].strip()
        pos = eol + 1
        if not size_text:
            continue
        size = int(size_text, 16)
        if size == 0:
            return b"".join(out), wire[pos:]
        out.append(wire[pos : pos + size])
        pos += size


_SIZE_FORMS = st.sampled_from([b"%x", b"%X", b"00%x", b"%x ", b" %x", b"%x;a=b", b"%x;"])


@given(
    chunks=st.lists(
        st.tuples(st.binary(min_size=1, max_size=200), _SIZE_FORMS, st.sampled_from([b"\r\n", b"\n"])),
        max_size=10,
    ),
    last=st.sampled_from([b"0\r\n", b"0\n", b"000\r\n", b"0;end\r\n"]),
    trailer=st.sampled_from([b"\r\n", b"X-A: 1\r\n\r\n", b""]),
    cuts=st.lists(st.integers(min_value=0, max_value=3000), max_size=10),
)
def test_every_size_line_form_reads_as_the_plain_line_reader_does(
    chunks: list[tuple[bytes, bytes, bytes]], last: bytes, trailer: bytes, cuts: list[int]
) -> None:
    """The fast path (bare hex sizes and CRLFs, read byte by byte) and the general one agree."""
    wire = b"".join((form % len(c)) + eol + c + eol for c, form, eol in chunks) + last + trailer
    payload, rest = _reference(wire)
    marks = sorted({min(c, len(wire)) for c in cuts} | {0, len(wire)})
    body = Dechunker()
    out, after = [], b""
    for a, b in zip(marks, marks[1:], strict=False):
        if body.done:
            after += wire[a:b]
        else:
            out.append(body.feed(wire[a:b]))
            after = body.rest if body.done else b""
    assert body.done
    assert b"".join(out) == payload == b"".join(c for c, _f, _e in chunks)
    assert after == rest == trailer


def test_a_size_beyond_the_fast_digits_is_read_whole() -> None:
    body = Dechunker()
    assert body.feed(b"%020x\r\nab" % 2) == b"ab"
    assert body.feed(b"\r\n0\r\n\r\n") == b"" and body.done
