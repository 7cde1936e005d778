"""A whole run against a real server (uvicorn, at 127.0.0.1): connections kept where the server
keeps them, one per request where it closes them, as the results file and the server both say."""

from __future__ import annotations

from pathlib import Path

import pytest

from replay.engine import connections
from replay.engine.plans import make_plan
from replay.engine.run import EngineConfig, check_options
from replay.errors import UsageError
from replay.metrics.results import read_results
from replay.runs.options import ReplayOptions
from replay.runs.recording import run_trace
from replay.trace import TraceWriter, read_trace
from tests.support.scripted_server import Script


@pytest.fixture(autouse=True)
def short_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connections, "PROBE_S", 0.02)


def _trace(path: Path, sessions: int) -> Path:
    with TraceWriter(path, source="test") as w:
        for s in range(sessions):
            w.session(f"s{s}")
            w.request(f"s{s}", 0.0, [{"role": "user", "content": f"hi {s}"}], {"max_tokens": 3})
    return path


def _run(server, tmp_path: Path, mode: str, sessions: int = 30) -> list[dict]:
    config = EngineConfig(base_url=server.url, timeout_s=10.0, run_id="c", connections=mode)
    out = tmp_path / f"{mode}.jsonl"
    trace = read_trace(_trace(tmp_path / "t.jsonl", sessions))
    outcome = run_trace(trace, make_plan("overlap", concurrency=2), config, out, {"kind": "scripted"})
    assert outcome.errors == 0
    return read_results(out).requests


def test_auto_keeps_connections_to_a_server_that_keeps_them(scripted_server, tmp_path):
    scripted_server.default = Script(first_token_delay_s=0.005, tokens=3)
    lines = _run(scripted_server, tmp_path, "auto")
    reused = [line for line in lines if line["reused"]]
    assert len(reused) >= 20  # all but those sent while the target was being judged
    assert all(line["connect_s"] == 0.0 for line in reused)
    assert all(line["connect_s"] > 0 for line in lines if not line["reused"])
    ports = {seen.client_port for seen in scripted_server.seen}
    assert len(ports) == len(lines) - len(reused)  # one server-side connection per fresh request
    assert all(line["client_queue_s"] is not None and line["client_queue_s"] >= 0 for line in lines)


def test_auto_opens_one_per_request_to_a_server_closing_after_each(scripted_server, tmp_path):
    # llama-server: the headers say keep-alive, the socket closes after the stream.
    scripted_server.default = Script(first_token_delay_s=0.005, tokens=3, close_after=True)
    lines = _run(scripted_server, tmp_path, "auto")
    assert not any(line["reused"] for line in lines)
    assert len({seen.client_port for seen in scripted_server.seen}) == len(lines) == 30


def test_auto_takes_connection_close_at_its_word(scripted_server, tmp_path):
    scripted_server.default = Script(tokens=3, connection_close=True)  # ds4
    lines = _run(scripted_server, tmp_path, "auto", sessions=10)
    assert not any(line["reused"] for line in lines)
    # Once known, the requests themselves ask for the close.
    assert scripted_server.seen[-1].headers.get("connection") == "close"


def test_forced_fresh_against_a_server_that_keeps_them(scripted_server, tmp_path):
    scripted_server.default = Script(tokens=3)
    lines = _run(scripted_server, tmp_path, "fresh", sessions=10)
    assert not any(line["reused"] for line in lines)
    assert len({seen.client_port for seen in scripted_server.seen}) == 10
    assert all(seen.headers.get("connection") == "close" for seen in scripted_server.seen)


def test_forced_reuse_from_the_first_response(scripted_server, tmp_path):
    scripted_server.default = Script(tokens=3)
    lines = _run(scripted_server, tmp_path, "reuse", sessions=10)
    assert sum(1 for line in lines if line["reused"]) >= 8  # two opened at the start (2 in flight)
    assert len({seen.client_port for seen in scripted_server.seen}) <= 2


def test_the_mode_is_checked_before_anything_starts():
    with pytest.raises(UsageError, match="--connections must be one of auto, reuse, fresh"):
        check_options("live", "off", None, connections="pooled")
    with pytest.raises(UsageError, match="--connections"):
        ReplayOptions(connections="always").check()
