"""The plain-http client's response framing: heads, chunked / Content-Length / close bodies, EOFs."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest

from replay.engine import http1

pytestmark = pytest.mark.anyio

EVENTS = [b'data: {"n": %d}\n\n' % i for i in range(5)]
CHUNKED = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    + b"".join(b"%x;ext=1\r\n%s\r\n" % (len(e), e) for e in EVENTS)
    + b"0\r\nx-trailer: 1\r\n\r\n"
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def pair() -> AsyncIterator[tuple[http1.Connection, socket.socket]]:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    conn = http1.Connection(ours, asyncio.get_running_loop())
    yield conn, theirs
    conn.close()
    theirs.close()


async def body_of(conn: http1.Connection) -> bytes:
    await conn.response()
    return await conn.read()


@pytest.mark.parametrize("cut", range(0, len(CHUNKED), 7))
async def test_chunked_body_split_anywhere(pair: tuple[http1.Connection, socket.socket], cut: int) -> None:
    conn, _ = pair
    conn._on_data(1, CHUNKED[:cut])
    conn._on_data(2, CHUNKED[cut:])
    assert await body_of(conn) == b"".join(EVENTS)
    assert conn.headers["content-type"] == "text/event-stream"
    assert conn.t_head == (1 if CHUNKED.index(b"\r\n\r\n") + 4 <= cut else 2)


async def test_chunked_body_byte_by_byte(pair: tuple[http1.Connection, socket.socket]) -> None:
    conn, _ = pair
    for i in range(len(CHUNKED)):
        conn._on_data(i, CHUNKED[i : i + 1])
    assert await body_of(conn) == b"".join(EVENTS)


async def test_interim_response_is_skipped_and_length_is_honoured(
    pair: tuple[http1.Connection, socket.socket],
) -> None:
    conn, theirs = pair
    theirs.sendall(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello, and more"
    )
    assert await asyncio.wait_for(body_of(conn), 2) == b"hello"
    assert conn.status == 200


async def test_close_delimited_body_ends_at_eof(pair: tuple[http1.Connection, socket.socket]) -> None:
    conn, theirs = pair
    theirs.sendall(b"HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n{}")
    theirs.shutdown(socket.SHUT_WR)
    assert await asyncio.wait_for(body_of(conn), 2) == b"{}"


@pytest.mark.parametrize(
    ("sent", "words"),
    [
        (b"", "without sending a response"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", "incomplete chunked read"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nab", "7 bytes missing"),
        (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1.x response"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
    ],
)
async def test_broken_responses_fail_after_what_arrived(
    pair: tuple[http1.Connection, socket.socket], sent: bytes, words: str
) -> None:
    conn, theirs = pair
    theirs.sendall(sent)
    theirs.shutdown(socket.SHUT_WR)
    with pytest.raises(http1.RemoteProtocolError, match=words):
        await asyncio.wait_for(body_of(conn), 2)
    if b"ab" in sent:
        assert conn.status == 200


def test_request_head_and_url() -> None:
    assert http1.split_url("http://[::1]:8080/x/v1/messages?a=1") == (
        "::1",
        8080,
        "[::1]:8080",
        "/x/v1/messages?a=1",
    )
    assert http1.split_url("http://example.com/v1") == ("example.com", 80, "example.com", "/v1")
    with pytest.raises(http1.ConnectError):
        http1.split_url("http://host:port/v1")
    head = http1.request_head("POST", "/v1", "h:1", {"X-Request-ID": "r1", "Content-Length": "9"}, 5)
    assert head.startswith(b"POST /v1 HTTP/1.1\r\nHost: h:1\r\n") and head.endswith(b"\r\n\r\n")
    assert b"X-Request-ID: r1\r\n" in head and head.count(b"Content-Length") == 1
    assert b"Content-Length: 5\r\n" in head
    assert b"Connection: close\r\n" in head
    kept = http1.request_head("POST", "/v1", "h", {"connection": "close", "X-A": "1"}, 0, keep=True)
    assert b"onnection" not in kept and b"X-A: 1\r\n" in kept
    with pytest.raises(http1.LocalProtocolError):
        http1.request_head("POST", "/", "h", {"X-Bad": "a\r\nb"}, 0)
