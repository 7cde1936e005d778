"""What one client can hold of either server: body size, slow heads and bodies, idle connections,
concurrent requests; and a client that leaves mid-body leaves no traceback behind."""

from __future__ import annotations

import socket
import time

import httpx
import orjson
import pytest

from tests.support.serverkit import Child, raw_exchange, status_of

pytestmark = pytest.mark.e2e

CHAT = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})


def _servers(sim: Child, proxy: Child) -> list[Child]:
    return [sim, proxy]


def _still_serves(server: Child) -> None:
    r = httpx.post(
        server.url + "/v1/chat/completions", content=CHAT, headers={"content-type": "application/json"}
    )
    assert r.status_code == 200, r.text


def _head(path: str, length: int | None, extra: str = "") -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode()


@pytest.mark.parametrize("which", ["sim", "proxy"])
def test_a_declared_body_over_the_limit_is_answered_413_before_any_of_it_is_sent(sim, proxy, which):
    server = sim if which == "sim" else proxy
    for path, shape in (("/v1/chat/completions", "error"), ("/v1/messages", "type")):
        raw, _ = raw_exchange(server.port, _head(path, 10 * 2**30))  # 10 GiB announced, none sent
        assert status_of(raw) == 413, raw[:300]
        body = orjson.loads(raw.split(b"\r\n\r\n", 1)[1])
        assert shape in body and "larger than the limit of 1048576 bytes" in raw.decode()
    _still_serves(server)


@pytest.mark.parametrize("which", ["sim", "proxy"])
def test_a_chunked_body_is_cut_off_with_413_as_it_crosses_the_limit(sim, proxy, which):
    server = sim if which == "sim" else proxy
    sent = [0]

    def chunks():
        for _ in range(64):  # 4 MiB offered, 1 MiB allowed
            sent[0] += 1
            yield b" " * 65536

    try:
        r = httpx.post(server.url + "/v1/chat/completions", content=chunks(), timeout=10)
        assert r.status_code == 413
    except httpx.TransportError:
        pass  # the server may close while the client is still writing: it read no further
    _still_serves(server)


@pytest.mark.parametrize("which", ["sim", "proxy"])
def test_a_request_head_never_finished_is_cut_off(sim, proxy, which):
    server = sim if which == "sim" else proxy
    raw, took = raw_exchange(server.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
    assert status_of(raw) == 408 and took < 5  # --header-timeout 1
    raw, took = raw_exchange(server.port, b"")  # connects, never says anything
    assert raw == b"" and took < 5
    _still_serves(server)


@pytest.mark.parametrize("which", ["sim", "proxy"])
def test_a_body_shorter_than_its_content_length_is_answered_408(sim, proxy, which):
    server = sim if which == "sim" else proxy
    raw, took = raw_exchange(server.port, _head("/v1/messages", 100) + b'{"messages"')
    assert status_of(raw) == 408 and took < 5, raw[:300]  # --body-timeout 1
    body = orjson.loads(raw.split(b"\r\n\r\n", 1)[1])
    assert (
        body["type"] == "error" and "not received within 1 s (11 bytes arrived)" in body["error"]["message"]
    )
    _still_serves(server)


def test_an_idle_keep_alive_connection_is_closed(proxy: Child):
    get = b"GET /_replay/openapi.json HTTP/1.1\r\nHost: x\r\n\r\n"
    raw, took = raw_exchange(proxy.port, get)  # keep-alive: the server closes it once idle
    assert status_of(raw) == 200 and took < 5  # --keep-alive-timeout 1


@pytest.mark.parametrize("which", ["sim", "proxy"])
def test_a_client_leaving_mid_body_leaves_no_traceback(sim, proxy, which):
    server = sim if which == "sim" else proxy
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            s.sendall(_head("/v1/chat/completions", 1000) + b'{"messages": [')
            time.sleep(0.1)
    time.sleep(0.3)
    _still_serves(server)
    log = server.log()
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-3000:]


@pytest.mark.parametrize("which", ["sim", "proxy"])
def test_requests_beyond_the_connection_cap_get_503(sim, proxy, which):
    server = sim if which == "sim" else proxy
    held = []
    try:
        for _ in range(8):  # --max-connections 8, each waiting for the rest of its body
            s = socket.create_connection(("127.0.0.1", server.port))
            s.sendall(_head("/v1/chat/completions", 100) + b"{")
            held.append(s)
        time.sleep(0.2)
        raw, _ = raw_exchange(server.port, _head("/v1/chat/completions", len(CHAT)) + CHAT)
        assert status_of(raw) == 503, raw[:200]
    finally:
        for s in held:
            s.close()
    time.sleep(1.5)  # their body deadline passes, the slots free
    _still_serves(server)
