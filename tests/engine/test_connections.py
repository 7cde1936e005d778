"""Kept connections per target, on real sockets at 127.0.0.1: reuse where the server keeps them,
fresh where it closes them (detected or forced), and never a request sent twice."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import orjson
import pytest

from replay.engine import connections, http1, transport
from replay.engine.apis import ApiCall, openai_chat
from replay.engine.connections import Connections
from replay.metrics.record import RequestRecord

pytestmark = pytest.mark.anyio

_EVENTS = (
    b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def short_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connections, "PROBE_S", 0.05)


@dataclass
class Behaviour:
    """What the server does with a connection after each response."""

    say_close: bool = False  # `Connection: close` (ds4), then close
    close_after: bool = False  # close while the headers said keep-alive (llama-server)
    idle_drop_s: float | None = None  # close a connection idle this long (uvicorn's keep-alive timeout)
    drop_request: int | None = None  # on this request of a connection (1 = first): read it, close, no reply
    chunked: bool = True  # else Content-Length


@dataclass
class Server:
    behaviour: Behaviour
    port: int = 0
    connections: int = 0
    requests: list[tuple[int, str]] = field(default_factory=list)  # (connection number, X-Request-ID)
    recv_ns: dict[str, int] = field(default_factory=dict)
    asked_close: list[bool] = field(default_factory=list)  # the request said `Connection: close`

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number, served = self.connections, 0
        how = self.behaviour
        try:
            while True:
                try:
                    if how.idle_drop_s is not None:
                        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), how.idle_drop_s)
                    else:
                        head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
                    return
                lines = head.decode().split("\r\n")
                headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}
                await reader.readexactly(int(headers.get("content-length", "0")))
                rid = headers.get("x-request-id", "")
                self.recv_ns[rid] = time.perf_counter_ns()
                self.requests.append((number, rid))
                served += 1
                if how.drop_request == served:
                    return
                self.asked_close.append(headers.get("connection", "").lower() == "close")
                closing = how.say_close or self.asked_close[-1]
                conn = b"close" if closing else b"keep-alive"
                if how.chunked:
                    body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(_EVENTS), _EVENTS)
                    framing = b"transfer-encoding: chunked"
                else:
                    body = _EVENTS
                    framing = b"content-length: %d" % len(body)
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n%s\r\nconnection: %s\r\n\r\n%s"
                    % (framing, conn, body)
                )
                await writer.drain()
                if closing or how.close_after:
                    return
        finally:
            writer.close()


@pytest.fixture
async def serve() -> AsyncIterator[object]:
    servers: list[asyncio.Server] = []

    async def start(behaviour: Behaviour) -> Server:
        server = Server(behaviour)
        srv = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        server.port = srv.sockets[0].getsockname()[1]
        servers.append(srv)
        return server

    yield start
    for srv in servers:
        srv.close()


async def ask(server: Server, pool: Connections, rid: str) -> RequestRecord:
    call = ApiCall(
        base_url=server.url,
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        headers={"X-Request-ID": rid},
        timeout_s=10.0,
        connections=pool,
    )
    return await openai_chat(None, call)  # type: ignore[arg-type]


async def sequence(server: Server, pool: Connections, n: int, gap_s: float = 0.0) -> list[RequestRecord]:
    out = []
    for i in range(n):
        out.append(await ask(server, pool, f"r{i}"))
        if gap_s:
            await asyncio.sleep(gap_s)
    return out


def ok(records: list[RequestRecord]) -> None:
    for rec in records:
        assert rec.status == "ok", rec.error
        assert rec.message == {"role": "assistant", "content": "hi"}


@pytest.mark.parametrize("chunked", [True, False])
async def test_auto_reuses_a_server_that_keeps_connections(serve: object, chunked: bool) -> None:
    server = await serve(Behaviour(chunked=chunked))  # type: ignore[operator]
    pool = Connections("auto")
    first = await sequence(server, pool, 2)
    assert pool.state("127.0.0.1", server.port) == "unknown"  # kept aside, not yet trusted
    await asyncio.sleep(0.08)
    later = await sequence(server, pool, 5)
    ok(first + later)
    assert pool.state("127.0.0.1", server.port) == "reuse"
    assert [r.reused for r in first] == [False, False]
    assert [r.reused for r in later] == [True] * 5
    assert server.connections == 2  # the two fresh ones; every later request rode the newest
    for rec in later:
        assert rec.t_connected == rec.t_start and rec.connect_s == 0.0
        assert rec.t_start is not None and rec.t_sent is not None and rec.t_sent >= rec.t_start
    assert [rid for _, rid in server.requests] == ["r0", "r1"] + [f"r{i}" for i in range(5)]
    pool.close()


async def test_auto_goes_fresh_for_a_server_closing_after_each_response(serve: object) -> None:
    server = await serve(Behaviour(close_after=True))  # type: ignore[operator]
    pool = Connections("auto")
    records = await sequence(server, pool, 3, gap_s=0.03) + await sequence(server, pool, 4)
    ok(records)
    assert pool.state("127.0.0.1", server.port) == "fresh"
    assert all(r.reused is False for r in records)
    assert server.connections == len(server.requests) == 7
    assert server.asked_close[0] is False and server.asked_close[-1] is True  # told, once known


async def test_auto_goes_fresh_when_the_server_says_close(serve: object) -> None:
    server = await serve(Behaviour(say_close=True))  # type: ignore[operator]
    pool = Connections("auto")
    records = await sequence(server, pool, 1)
    assert pool.state("127.0.0.1", server.port) == "fresh"
    records += await sequence(server, pool, 3)
    ok(records)
    assert server.connections == 4 and not any(r.reused for r in records)


async def test_forced_fresh_never_keeps_one(serve: object) -> None:
    server = await serve(Behaviour())  # type: ignore[operator]
    pool = Connections("fresh")
    records = await sequence(server, pool, 4, gap_s=0.06)
    ok(records)
    assert server.connections == 4 and not any(r.reused for r in records)
    assert all(r.connect_s is not None and r.connect_s > 0 for r in records)
    assert server.asked_close == [True] * 4  # the server need not keep them either


async def test_forced_reuse_keeps_one_from_the_first_response(serve: object) -> None:
    server = await serve(Behaviour())  # type: ignore[operator]
    pool = Connections("reuse")
    records = await sequence(server, pool, 4)
    ok(records)
    assert server.connections == 1
    assert [r.reused for r in records] == [False, True, True, True]
    assert pool.reused == 3 and pool.opened == 1
    assert server.asked_close == [False] * 4


async def test_a_connection_dropped_while_idle_is_replaced_not_failed(serve: object) -> None:
    server = await serve(Behaviour(idle_drop_s=0.05))  # type: ignore[operator]
    pool = Connections("reuse")
    records = await sequence(server, pool, 3, gap_s=0.15)
    ok(records)
    assert [r.reused for r in records] == [False, False, False]
    assert server.connections == 3 and len(server.requests) == 3


async def test_a_connection_dropped_at_the_instant_of_reuse_is_never_resent(serve: object) -> None:
    # The server reads the second request on the kept connection, then closes without a reply: it
    # may have begun it, so the request fails and is not sent again.
    server = await serve(Behaviour(drop_request=2))  # type: ignore[operator]
    pool = Connections("reuse")
    first, second = await sequence(server, pool, 2)
    ok([first])
    assert second.reused is True
    assert second.status == "stream_broken"
    assert second.error is not None and "kept connection" in second.error and "not re-sent" in second.error
    assert [rid for _, rid in server.requests] == ["r0", "r1"]
    third = await ask(server, pool, "r2")
    ok([third])
    assert third.reused is False


async def test_a_kept_connection_refusing_the_first_byte_goes_fresh_once(serve: object) -> None:
    server = await serve(Behaviour())  # type: ignore[operator]
    pool = Connections("reuse")
    ok(await sequence(server, pool, 1))
    (kept,) = pool.targets[("127.0.0.1", server.port)].idle
    kept._sock.shutdown(socket.SHUT_WR)  # still readable, so it looks alive; its first write fails
    rec = await ask(server, pool, "again")
    ok([rec])
    assert rec.reused is False
    assert [rid for _, rid in server.requests] == ["r0", "again"]
    assert server.connections == 2


async def test_idle_connections_are_bounded_per_target(serve: object) -> None:
    server = await serve(Behaviour())  # type: ignore[operator]
    pool = Connections("reuse", idle_max=2)
    records = await asyncio.gather(*(ask(server, pool, f"p{i}") for i in range(5)))
    ok(list(records))
    assert len(pool.targets[("127.0.0.1", server.port)].idle) == 2
    pool.close()
    assert not pool.targets[("127.0.0.1", server.port)].idle


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="auto, reuse, fresh"):
        Connections("sometimes")


async def test_send_is_stamped_when_its_last_byte_left(serve: object) -> None:
    server = await serve(Behaviour())  # type: ignore[operator]
    pool = Connections("reuse")
    records = await sequence(server, pool, 3)
    ok(records)
    for rec in records:
        assert rec.t_connected is not None and rec.t_sent is not None and rec.t_first_token is not None
        assert rec.t_connected <= rec.t_sent <= server.recv_ns[f"r{records.index(rec)}"]
        assert rec.t_first_token_read is not None and rec.t_first_token_read >= rec.t_first_token
        assert rec.client_queue_s is not None and 0 <= rec.client_queue_s < 1.0


async def test_send_stamps_name_the_last_byte_of_each_send() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    peer, _ = listener.accept()
    try:
        if not transport.enable_send_stamps(client):
            pytest.skip("this kernel refuses SO_TIMESTAMPING (the send time is then send()'s return)")
        client.sendall(b"x" * 1000)
        client.sendall(b"y" * 500)
        await asyncio.sleep(0.01)
        stamps = transport.send_stamps(client)
        ids = {(kind, ident) for kind, ident, _wall in stamps}
        assert ids == {(0, 999), (0, 1499)}  # SND for the last byte of each send
        assert transport.send_stamps(client) == []  # drained
    finally:
        for s in (client, peer, listener):
            s.close()


async def test_connection_stamps_its_send_on_the_kernel_clock() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    loop = asyncio.get_running_loop()
    sock = await transport.connect_socket(loop, await transport.resolve(loop, *listener.getsockname()[:2]))
    peer, _ = listener.accept()
    conn = http1.Connection(sock, loop)
    try:
        before = time.perf_counter_ns()
        await conn.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        after = time.perf_counter_ns()
        assert before <= conn.sent_ns <= after
        if conn._tx:
            assert conn._tx_kind == 0  # the device's stamp (SND) came
        assert peer.recv(100).startswith(b"GET /")
        peer.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await conn.response()
        assert await conn.read() == b"ok"
        assert conn.reusable
    finally:
        conn.close()
        peer.close()
        listener.close()


def test_results_line_says_reused_and_client_queue() -> None:
    from replay.metrics.results import request_line

    rec = RequestRecord(t_origin=0, t_start=10, t_connected=10, t_sent=20, t_first_token=2_000_020)
    rec.t_first_token_read = 2_300_020
    rec.reused = True
    line = request_line(rec)
    assert line["reused"] is True and line["connect_s"] == 0.0
    assert line["client_queue_s"] == 0.0003
    assert orjson.loads(orjson.dumps(line))["client_queue_s"] == 0.0003


async def test_a_send_stamp_later_than_the_replys_head_falls_back_to_sends_return(
    serve: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel send stamp moved across a step of the wall clock can land after the reply's own
    head; no reply arrives before its request left, so send()'s return is taken instead."""
    taken = []

    def late_stamp(sock: socket.socket, until: int = -1) -> list[tuple[int, int, int]]:
        transport.send_stamps.__wrapped__(sock, until)  # drain the real ones
        taken.append(until)
        if len(taken) == 1:
            return []  # not there yet when send() returns
        return [(0, until, time.time_ns())]  # comes with the head: now, after the head's stamp

    late_stamp.__wrapped__ = transport.send_stamps  # type: ignore[attr-defined]
    monkeypatch.setattr(transport, "send_stamps", late_stamp)
    server = await serve(Behaviour())  # type: ignore[operator]
    pool = Connections("fresh")
    before = time.perf_counter_ns()
    records = await sequence(server, pool, 1)
    ok(records)
    rec = records[0]
    assert len(taken) >= 2  # the late stamp was offered after the head arrived
    assert rec.t_sent is not None and rec.t_headers is not None
    assert before <= rec.t_sent <= rec.t_headers  # send()'s return, not the stamp taken with the head
