"""The reference server: its own truth stamps, per-request pacing, and plain HTTP/1.1 behaviour."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Iterator

import httpx
import orjson
import psutil
import pytest

from bench.refserver import TRUTH_COLUMNS, Pacing, serve_in_thread
from bench.server import LISTENING
from drivers.process import ChildProcess
from replay.engine.transport import enable_kernel_stamps

COL = {name: i for i, name in enumerate(TRUTH_COLUMNS)}


@pytest.fixture(scope="module")
def ref() -> Iterator[tuple[object, str]]:
    with serve_in_thread(Pacing(first_token_ms=30.0, tokens=3)) as pair:
        yield pair


def _truth(url: str, clear: bool = True) -> dict[str, list]:
    doc = httpx.get(f"{url}/truth", params={"clear": "1"} if clear else None).json()
    assert doc["columns"] == list(TRUTH_COLUMNS)
    return {row[COL["request_id"]] or f"#{row[COL['sid']]}": row for row in doc["rows"]}


def _events(raw: bytes) -> list[bytes]:
    return [block[len(b"data: ") :] for block in raw.split(b"\n\n") if block.startswith(b"data: ")]


def test_stream_is_paced_and_stamped_by_the_server(ref):
    _srv, url = ref
    _truth(url)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 4}
    headers = {"X-Request-ID": "r-1", "X-Bench-Token-Ms": "10"}
    t_send = time.perf_counter_ns()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"] == "text/event-stream"
        assert resp.headers["x-request-id"] == "r-1"
        raw = b""
        t_first = None
        for chunk in resp.iter_raw():
            if t_first is None and b"#" in chunk:
                t_first = time.perf_counter_ns()
            raw += chunk
    events = _events(raw)
    assert events[-1] == b"[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    first = chunks[0]
    row = _truth(url)["r-1"]
    sid = row[COL["sid"]]
    # The reply text starts with the server id, and the first chunk repeats the server's stamps.
    assert first["choices"][0]["delta"]["content"] == f"#{sid}"
    assert first["x_bench"] == {
        "sid": sid,
        "arrival_ns": row[COL["arrival_ns"]],
        "first_token_ns": row[COL["first_token_ns"]],
    }
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(content) == 4  # max_tokens, not the server default of 3
    assert chunks[-1]["usage"]["completion_tokens"] == 4
    truth_ttft = row[COL["first_token_ns"]] - row[COL["arrival_ns"]]
    assert 30e6 <= truth_ttft < 130e6
    # 3 gaps of 10 ms between the 4 tokens, stamped by the server.
    assert row[COL["done_ns"]] - row[COL["first_token_ns"]] >= 30e6
    # Same clock for both processes' stamps: the client saw the token after the server sent it.
    assert t_send <= row[COL["arrival_ns"]] <= row[COL["first_token_ns"]] <= t_first


def test_arrival_is_the_kernels_stamp_not_when_the_server_got_to_it(ref):
    """A busy server reads a request late; its arrival stamp must not move with that wait, or the
    truth counts the server's queueing as the client's TTFT error."""
    srv, url = ref
    probe = socket.socket()
    if not enable_kernel_stamps(probe):
        probe.close()
        pytest.skip("this kernel refuses SO_TIMESTAMPNS: the server stamps arrivals when it reads them")
    probe.close()
    body = {"messages": [], "stream": True, "bench": {"first_token_ms": 0, "tokens": 1}}
    with httpx.Client(base_url=url) as client:
        client.get("/health")  # connected and accepted before the server is made busy
        _truth(url)
        srv.loop.call_soon_threadsafe(time.sleep, 0.3)  # the server's loop is blocked for 300 ms
        time.sleep(0.02)
        t_send = time.perf_counter_ns()
        client.post("/v1/chat/completions", json=body, headers={"X-Request-ID": "late"})
    row = _truth(url)["late"]
    assert row[COL["arrival_ns"]] - t_send < 50e6  # the kernel's stamp, taken as the bytes came
    assert row[COL["first_token_ns"]] - row[COL["arrival_ns"]] > 200e6  # the server got to it late


def test_body_field_and_defaults_set_the_timing(ref):
    _srv, url = ref
    _truth(url)
    # The body asks more than the default, not less: a wait is never shorter than asked, while
    # a busy host makes any wait longer (a 0 ms ask took 24 ms beside `stress --cpu 2`).
    body = {"messages": [], "stream": True, "bench": {"first_token_ms": 300, "tokens": 2}}
    resp = httpx.post(f"{url}/v1/chat/completions", json=body, headers={"X-Request-ID": "asked"})
    default = httpx.post(
        f"{url}/v1/chat/completions",
        json={"messages": [], "stream": True},
        headers={"X-Request-ID": "default"},
    )
    truth = _truth(url)
    assert (truth["asked"][COL["first_token_ns"]] - truth["asked"][COL["arrival_ns"]]) >= 300e6
    assert truth["asked"][COL["tokens"]] == 2
    assert 30e6 <= (truth["default"][COL["first_token_ns"]] - truth["default"][COL["arrival_ns"]]) < 300e6
    assert truth["default"][COL["tokens"]] == 3  # the server default
    assert sum(1 for e in _events(resp.content) if b'"content"' in e) == 2
    assert default.status_code == 200


def test_requests_without_an_id_are_keyed_by_server_id(ref):
    _srv, url = ref
    _truth(url)
    resp = httpx.post(
        f"{url}/v1/chat/completions", json={"messages": [], "max_tokens": 2, "bench": {"first_token_ms": 0}}
    )
    doc = resp.json()
    text = doc["choices"][0]["message"]["content"]
    assert text.startswith("#")
    assert text.split()[0] in _truth(url)


def test_truth_clear_and_routes(ref):
    _srv, url = ref
    httpx.post(
        f"{url}/v1/chat/completions", json={"messages": [], "stream": True, "bench": {"first_token_ms": 0}}
    )
    assert _truth(url, clear=False)
    assert _truth(url, clear=True)
    assert _truth(url) == {}
    assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "ref"
    assert httpx.get(f"{url}/nope").status_code == 404
    assert httpx.get(f"{url}/v1/chat/completions").status_code == 405
    assert httpx.post(f"{url}/v1/chat/completions", content=b"not json").status_code == 400


def test_keep_alive_and_pipelined_requests(ref):
    _srv, url = ref
    host, port = url.removeprefix("http://").split(":")
    body = b'{"messages":[],"stream":true,"bench":{"first_token_ms":0,"tokens":1}}'
    req = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(req + req)  # two requests in one write: the second waits for the first reply
        data = b""
        while data.count(b"0\r\n\r\n") < 2:
            more = sock.recv(65536)
            assert more, "server closed a keep-alive connection"
            data += more
    assert data.count(b"HTTP/1.1 200 OK") == 2
    assert data.count(b"data: [DONE]") == 2


def test_out_of_descriptors_the_server_waits_instead_of_spinning(tmp_path):
    """Connections beyond the server's descriptor limit wait in the backlog; accepting them
    again at once would spin the loop at a full core, so the server pauses a second and goes on."""
    limited = (
        "import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48)); "
        "from bench.refserver import main; main(['--port', '0'])"
    )
    child = ChildProcess(
        [sys.executable, "-c", limited], log_path=tmp_path / "log", stop_timeout=10.0, give_up=True
    )
    with child:
        url = child.wait_for_line(LISTENING, timeout=30.0).group(1)
        host, port = url.removeprefix("http://").split(":")
        held = [socket.create_connection((host, int(port))) for _ in range(80)]
        proc = psutil.Process(child.pid)
        time.sleep(0.3)
        cpu0 = sum(proc.cpu_times()[:2])
        time.sleep(1.0)
        assert sum(proc.cpu_times()[:2]) - cpu0 < 0.3  # not a core spinning on accept
        for s in held:
            s.close()
        time.sleep(1.2)  # the pause ends; the backlog drains
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
