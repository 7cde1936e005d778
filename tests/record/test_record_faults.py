"""Faults on either side of the proxy: passed through unchanged, recorded as such, never a crash."""

from __future__ import annotations

import hashlib
from pathlib import Path

import anyio
import httpx
import orjson
import pytest

from replay.engine.apis import make_client
from replay.record.serve import RecordingServer
from replay.trace import validate
from tests.support.recordkit import jsonl, settle
from tests.support.scripted_server import Script


def chat(marker: str, stream: bool = True) -> bytes:
    body = {"model": "m", "stream": stream, "messages": [{"role": "user", "content": f"fault case {marker}"}]}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return orjson.dumps(body)


async def exchange(
    base: str, marker: str, stream: bool = True, headers: dict | None = None
) -> tuple[int, bytes, str]:
    """(status, body bytes, transport error or '') as an agent would see them."""
    got = bytearray()
    hdrs = {"content-type": "application/json", "x-request-id": marker, **(headers or {})}
    async with make_client() as client:
        try:
            async with client.stream(
                "POST", base + "/v1/chat/completions", content=chat(marker, stream), headers=hdrs
            ) as resp:
                async for chunk in resp.aiter_raw():
                    got += chunk
                return resp.status_code, bytes(got), ""
        except httpx.TransportError as exc:
            return -1, bytes(got), type(exc).__name__


def records(path) -> dict[str, dict]:
    """Recorded requests keyed by their fault-case marker."""
    out = {}
    for line in jsonl(path):
        if line["kind"] == "request":
            out[line["append"][-1]["content"].rsplit(" ", 1)[1]] = line
    return out


CASES = {
    "http500": (Script(fault="http_error", http_status=500, error_message="upstream exploded"), True),
    "badjson": (Script(fault="bad_json", fault_after=2), True),
    "badbody": (Script(fault="bad_json"), False),
    "nodone": (Script(fault="no_done"), True),
    "evterror": (Script(fault="event_error", fault_after=1, error_message="overloaded"), True),
}
EXPECT = {
    "badjson": ("malformed", "not JSON"),
    "badbody": ("malformed", "not JSON"),
    "nodone": ("stream_broken", "[DONE]"),
    "evterror": ("server_error", "overloaded"),
}


def test_bad_upstream_replies_pass_through_unchanged_and_are_recorded(scripted_server, recording):
    for marker, (script, _stream) in CASES.items():
        scripted_server.by_id[marker] = script
    for marker, (_script, stream) in CASES.items():
        direct = anyio.run(exchange, scripted_server.url, marker, stream)
        proxied = anyio.run(exchange, recording.url, marker, stream)
        assert proxied == direct, marker
    recording.stop()
    validate(recording.out)
    recs = records(recording.out)
    for marker, (status, text) in EXPECT.items():
        reply = recs[marker]["reply"]
        assert reply["status"] == status, marker
        assert text in reply["error"], (marker, reply["error"])
    # the upstream refused this one: a `rejected` line (status, size, hash), not a request
    assert "http500" not in recs
    (rejected,) = [line for line in jsonl(recording.out) if line["kind"] == "rejected"]
    body = chat("http500")
    assert rejected["status"] == 500 and rejected["bytes"] == len(body)
    assert rejected["sha256"] == hashlib.sha256(body).hexdigest()
    assert recording.recorder.stats.rejected == {500: 1}
    assert recs["badjson"]["reply"]["message"]["content"] == "tok0 tok1 "  # what arrived before the bad line


def test_upstream_reset_and_client_disconnects_are_recorded_and_the_proxy_lives_on(
    scripted_server, recording
):
    scripted_server.by_id["reset"] = Script(fault="reset_mid_stream", fault_after=2)
    scripted_server.by_id["gone"] = Script(tokens=50, token_interval_s=0.02)
    scripted_server.by_id["prefill"] = Script(fault="hang", hang_s=5.0)
    scripted_server.by_id["before"] = Script(fault="reset_before_headers")

    status, got, error = anyio.run(exchange, recording.url, "reset")
    assert status == -1 and error and b"tok1" in got  # the agent sees the stream break, as upstream broke it

    async def leave_mid_stream() -> None:
        async with make_client() as client:
            hdrs = {"content-type": "application/json", "x-request-id": "gone"}
            async with client.stream(
                "POST", recording.url + "/v1/chat/completions", content=chat("gone"), headers=hdrs
            ) as r:
                n = 0
                async for _chunk in r.aiter_raw():
                    n += 1
                    if n == 3:
                        break

    anyio.run(leave_mid_stream)

    async def leave_during_prefill() -> None:
        async with make_client() as client:
            hdrs = {"content-type": "application/json", "x-request-id": "prefill"}
            with anyio.move_on_after(0.3):
                await client.post(
                    recording.url + "/v1/chat/completions", content=chat("prefill"), headers=hdrs
                )

    anyio.run(leave_during_prefill)
    status, got, _ = anyio.run(exchange, recording.url, "before")
    assert status == 502 and b"upstream" in got
    status, got, _ = anyio.run(exchange, recording.url, "fine")  # still serving
    assert status == 200 and b"[DONE]" in got

    settle(recording)
    # The upstream saw each agent leave and stopped: neither ran its full course.
    gone, prefill = scripted_server.request("gone"), scripted_server.request("prefill")
    assert gone.done_ns is not None and (gone.done_ns - gone.recv_ns) / 1e9 < 0.8
    assert prefill.done_ns is not None and (prefill.done_ns - prefill.recv_ns) / 1e9 < 2.0
    recording.stop()
    validate(recording.out)
    recs = records(recording.out)
    assert recs["reset"]["reply"]["status"] == "stream_broken"
    assert "upstream connection failed" in recs["reset"]["reply"]["error"]
    assert recs["reset"]["reply"]["message"]["content"].startswith("tok0 tok1")
    assert recs["gone"]["reply"]["status"] == "client_disconnected"
    assert recs["prefill"]["reply"]["status"] == "client_disconnected"
    assert "first_byte_s" not in recs["prefill"]["reply"]
    assert recs["before"]["reply"]["status"] == "stream_broken"
    assert recs["fine"]["reply"]["status"] == "ok"
    assert recording.proxy.internal_errors == 0


def test_an_agent_leaving_after_the_terminal_event_had_the_whole_reply(scripted_server, recording):
    """Codex hangs up on `response.completed` without waiting for the body's end: not a disconnect."""
    frames = [
        b'data: {"choices":[{"index":0,"delta":{"content":"all "}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{"content":"there"},"finish_reason":"stop"}]}\n\n',
        b"data: [DONE]\n\n",
    ]
    scripted_server.by_id["early"] = Script(raw=frames, raw_hang_s=5.0)
    scripted_server.by_id["cut"] = Script(raw=frames[:2], raw_hang_s=5.0)

    async def leave_at(marker: str, last: bytes) -> None:
        async with make_client() as client:
            hdrs = {"content-type": "application/json", "x-request-id": marker}
            async with client.stream(
                "POST", recording.url + "/v1/chat/completions", content=chat(marker), headers=hdrs
            ) as r:
                got = b""
                async for chunk in r.aiter_raw():
                    got += chunk
                    if got.endswith(last):
                        break

    anyio.run(leave_at, "early", frames[-1])
    anyio.run(leave_at, "cut", frames[1])  # the same bytes short of [DONE]: the agent did leave early
    settle(recording)
    recording.stop()
    validate(recording.out)
    recs = records(recording.out)
    assert recs["early"]["reply"]["status"] == "ok", recs["early"]["reply"]
    assert recs["early"]["reply"]["message"]["content"] == "all there"
    assert recs["cut"]["reply"]["status"] == "client_disconnected"


def test_unreachable_upstream_gets_the_agent_a_502_and_a_record(tmp_path):
    with RecordingServer("http://127.0.0.1:9", tmp_path / "t.jsonl") as rec:
        status, got, _ = anyio.run(exchange, rec.url, "nobody")
    assert status == 502 and orjson.loads(got)["error"]["type"] == "upstream_error"
    (line,) = [x for x in jsonl(tmp_path / "t.jsonl") if x["kind"] == "request"]
    assert line["reply"]["status"] == "connect_error"


def test_credentials_reach_upstream_but_never_the_trace(scripted_server, recording):
    secrets = {
        "authorization": "Bearer sk-SECRET-authz-1234",
        "x-api-key": "ak-SECRET-apikey-5678",
        "cookie": "session=ck-SECRET-cookie-9012",
    }
    status, _, _ = anyio.run(exchange, recording.url, "creds", True, secrets)
    assert status == 200
    seen = scripted_server.request("creds").headers
    for key, value in secrets.items():
        assert seen[key] == value
    assert "x-replay-session" not in seen
    recording.stop()
    data = Path(recording.out).read_bytes()
    assert b"creds" in data and b"SECRET" not in data


def test_other_routes_pass_through_and_unreadable_bodies_are_not_recorded(scripted_server, recording):
    async def go() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        async with make_client() as client:
            health = await client.get(recording.url + "/health")
            legacy = await client.post(recording.url + "/v1/completions", json={"prompt": "x"})
            junk = await client.post(
                recording.url + "/v1/chat/completions", content=b"not json", headers={"x-request-id": "junk"}
            )
            return health, legacy, junk

    health, legacy, junk = anyio.run(go)
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert legacy.status_code == 404  # the scripted server has no such route: its answer, unchanged
    assert junk.status_code == 200 and scripted_server.request("junk").body == b"not json"
    recording.stop()
    assert recording.recorder.stats.unrecorded == 1
    assert recording.proxy.passthrough == 2
    assert validate(recording.out)["requests"] == 0


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/s/nightly/v1/chat/completions", ("/v1/chat/completions", "nightly")),
        ("/s/a%20b/v1/messages", ("/v1/messages", "a b")),
        ("/v1/messages", ("/v1/messages", None)),
        ("/s/only", ("/s/only", None)),
    ],
)
def test_path_labels(path, expected):
    from replay.record.proxy import split_label

    route, label = split_label(path)
    assert (route, label.name if label else None) == expected


def test_upstream_url_joins_without_doubling_v1():
    from replay.record.proxy import upstream_url

    assert upstream_url("http://h:1/", "/v1/messages", "") == "http://h:1/v1/messages"
    assert upstream_url("http://h:1/v1", "/v1/messages", "a=1") == "http://h:1/v1/messages?a=1"
    assert upstream_url("http://h:1/api", "/v1/models", "") == "http://h:1/api/v1/models"
