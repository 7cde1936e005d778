"""Requests the upstream refused: counted per status, a short `rejected` line (no body), left out of
the sessions; `--keep-rejected` records them whole as before."""

from __future__ import annotations

import hashlib

import anyio
import httpx
import orjson
import pytest

from replay.engine.apis import make_client
from replay.errors import TraceError
from replay.record.anonymize import anonymize_trace
from replay.record.serve import RecordingServer, rejected_text
from replay.record.sessions import SessionInference
from replay.trace import validate
from tests.support.recordkit import FixedWall, jsonl, settle, user
from tests.support.scripted_server import Script


def _body(text: str) -> bytes:
    return orjson.dumps(
        {"model": "m", "stream": False, "messages": [{"role": "system", "content": "sys"}, user(text)]}
    )


def _send(base: str, bodies: list[tuple[str, bytes]]) -> list[int]:
    async def go() -> list[int]:
        out = []
        async with make_client() as client:
            for rid, body in bodies:
                r = await client.post(
                    base + "/v1/chat/completions",
                    content=body,
                    headers={"content-type": "application/json", "x-request-id": rid},
                )
                out.append(r.status_code)
        return out

    return anyio.run(go)


def test_refused_requests_are_counted_and_kept_as_short_lines_without_their_body(scripted_server, tmp_path):
    scripted_server.by_id["big"] = Script(fault="http_error", http_status=400, error_message="too long")
    scripted_server.by_id["busy"] = Script(fault="http_error", http_status=503)
    huge = _body("x " * 500_000)  # a megabyte the upstream refuses
    out = tmp_path / "t.jsonl"
    with RecordingServer(
        scripted_server.url, out, inference=SessionInference(wall_clock=FixedWall(30.0))
    ) as rec:
        statuses = _send(
            rec.url, [("ok1", _body("one")), ("big", huge), ("busy", _body("two")), ("ok2", _body("three"))]
        )
        settle(rec)
        stats = rec.recorder.stats
    assert statuses == [200, 400, 503, 200]  # the agent saw every status unchanged
    assert stats.recorded == 2 and stats.rejected == {400: 1, 503: 1} and stats.errors == 0
    assert rejected_text(stats.rejected) == "2 rejected by the upstream (HTTP 400 x1, HTTP 503 x1)"
    lines = jsonl(out)
    rejected = [line for line in lines if line["kind"] == "rejected"]
    assert [(r["status"], r["bytes"], r["sha256"]) for r in rejected] == [
        (400, len(huge), hashlib.sha256(huge).hexdigest()),
        (503, len(_body("two")), hashlib.sha256(_body("two")).hexdigest()),
    ]
    assert out.stat().st_size < 4096  # the megabyte is not in the trace
    counts = validate(out)
    assert (counts["sessions"], counts["requests"], counts["lines"]) == (2, 2, 7)  # + 2 rejected


def test_keep_rejected_records_them_whole(scripted_server, tmp_path):
    scripted_server.by_id["busy"] = Script(fault="http_error", http_status=503)
    out = tmp_path / "t.jsonl"
    with RecordingServer(scripted_server.url, out, keep_rejected=True) as rec:
        _send(rec.url, [("busy", _body("two"))])
        settle(rec)
    (req,) = [line for line in jsonl(out) if line["kind"] == "request"]
    assert req["reply"]["http_status"] == 503 and req["append"][-1]["content"] == "two"
    assert not [line for line in jsonl(out) if line["kind"] == "rejected"]


def test_a_refused_request_leaves_the_session_as_if_it_never_came():
    inf = SessionInference(wall_clock=FixedWall(30.0))
    one = [{"role": "system", "content": "s"}, user("a")]
    longer = [*one, {"role": "assistant", "content": "r"}, user("a huge paste")]
    retry = [*one, {"role": "assistant", "content": "r"}, user("b")]
    a = inf.arrive(one, "openai", "m", 1)
    inf.done(a, 2, 1, {"role": "assistant", "content": "r"}, "ok")
    refused = inf.arrive(longer, "openai", "m", 3)
    inf.withdraw(refused)
    session = a.session
    assert session.last is a.head and session.requests == 1 and session.in_flight == 0
    again = inf.arrive(retry, "openai", "m", 4)  # the agent's next try: a turn on top of `a`
    assert again.session is session and again.tag == "turn" and again.base is a.head
    alone = inf.arrive([user("never seen")], "openai", "m", 5)
    inf.withdraw(alone)
    assert alone.session.id not in inf.sessions  # a session only the refused request started is gone


def test_an_unreadable_body_the_upstream_refused_too_is_a_rejection_not_a_gap(scripted_server, tmp_path):
    scripted_server.default = Script(fault="http_error", http_status=400)
    out = tmp_path / "t.jsonl"
    bad = b'{"messages": [{"role": "assistant", "tool_calls": "x"}]}'
    with RecordingServer(scripted_server.url, out) as rec:
        assert httpx.post(rec.url + "/v1/chat/completions", content=bad).status_code == 400
        settle(rec)
        stats = rec.recorder.stats
    assert stats.unrecorded == 0 and stats.rejected == {400: 1}
    (line,) = [line for line in jsonl(out) if line["kind"] == "rejected"]
    assert line["bytes"] == len(bad)


def test_an_unreadable_body_the_upstream_accepted_is_counted_naming_the_field(scripted_server, tmp_path):
    out = tmp_path / "t.jsonl"
    bad = b'{"messages": [{"role": "assistant", "tool_calls": [{"function": "x"}]}]}'
    with RecordingServer(scripted_server.url, out) as rec:
        assert httpx.post(rec.url + "/v1/chat/completions", content=bad).status_code == 200
        settle(rec)
        stats = rec.recorder.stats
    assert stats.unrecorded == 1 and rec.proxy.internal_errors == 0
    assert "'messages[0].tool_calls[0].function' must be an object" in stats.last_problem


def test_the_validator_checks_rejected_lines_and_anonymize_rekeys_their_hash(tmp_path):
    head = b'{"kind": "trace", "format": "agent-replay-trace/1"}\n'
    good = b'{"kind": "rejected", "t": 1.5, "api": "openai", "status": 400, "bytes": 12, "sha256": "ab"}\n'
    path = tmp_path / "t.jsonl"
    path.write_bytes(head + good)
    assert validate(path)["lines"] == 2
    for bad, problem in (
        (good.replace(b'"status": 400', b'"status": 42'), "not an HTTP status"),
        (good.replace(b'"bytes": 12', b'"bytes": "12"'), "field 'bytes' must be"),
        (good.replace(b', "sha256": "ab"', b""), "missing field 'sha256'"),
    ):
        path.write_bytes(head + bad)
        with pytest.raises(TraceError, match=problem):
            validate(path)
    path.write_bytes(head + good)
    anonymize_trace(path, tmp_path / "anon.jsonl", "key")
    (line,) = [x for x in jsonl(tmp_path / "anon.jsonl") if x["kind"] == "rejected"]
    assert line["sha256"] != "ab" and line["status"] == 400 and line["bytes"] == 12
