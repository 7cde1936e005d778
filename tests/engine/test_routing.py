"""Several targets: client-side routing policies, and the session affinity a server-side router reads."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
import pytest

from replay.engine.plans import make_plan
from replay.engine.routing import (
    Least,
    RoundRobin,
    Sticky,
    check_routing,
    make_router,
    session_key,
    split_targets,
)
from replay.engine.run import EngineConfig
from replay.errors import UsageError
from replay.metrics.results import read_results
from replay.runs.recording import run_trace
from replay.trace import read_trace
from tests.support.scripted_server import Script, ScriptedServer

SAMPLE = Path("traces/sample.jsonl")
URLS = ("http://a:1", "http://b:2", "http://c:3")


def test_round_robin_goes_round_the_backends_whoever_sends() -> None:
    router = RoundRobin(URLS)
    assert [router.pick(s) for s in "xxxxy"] == [0, 1, 2, 0, 1]


def test_sticky_keeps_a_session_on_one_backend_the_same_in_every_run() -> None:
    first, second = Sticky(URLS), Sticky(URLS)
    sessions = [f"s{i}" for i in range(60)]
    placed = [first.pick(s) for s in sessions]
    assert placed == [second.pick(s) for s in reversed(sessions)][::-1]  # order does not matter
    assert all(first.pick(s) == i for s, i in zip(sessions, placed, strict=True))
    assert set(placed) == {0, 1, 2}  # and sessions spread
    # The value is derived from the id alone (a fixed hash, not Python's salted one).
    assert session_key("main") == session_key("main") != session_key("cron")
    assert len(session_key("main")) == 16


def test_least_takes_the_backend_with_fewest_in_flight_and_turns_on_ties() -> None:
    router = Least(URLS)
    assert [router.pick("s") for _ in range(3)] == [0, 1, 2]  # all equal: in turn
    router.done(1)
    assert router.pick("s") == 1  # the only one with a free place
    router.done(0)
    router.done(2)
    assert router.in_flight == [0, 1, 0]
    assert [router.pick("s"), router.pick("s")] == [2, 0]  # the two free ones, taking turns from 2
    assert router.in_flight == [1, 1, 1]


def test_one_target_has_no_router_and_bad_options_are_refused() -> None:
    assert make_router("round-robin", ("http://a:1",)) is None
    with pytest.raises(UsageError, match="--routing"):
        make_router("random", URLS)
    with pytest.raises(UsageError, match="--session-header"):
        check_routing("sticky", "X Session", None)
    with pytest.raises(UsageError, match="--session-field"):
        check_routing("sticky", None, "user-id")
    assert split_targets("http://a:1/, http://b:2") == ("http://a:1", "http://b:2")
    with pytest.raises(UsageError, match="named twice"):
        split_targets("http://a:1,http://a:1/")
    with pytest.raises(UsageError, match="must be a URL"):
        split_targets("http://a:1,sim")


def _run(servers: list[ScriptedServer], out: Path, routing: str, **affinity: str | None):
    config = EngineConfig(
        base_url=servers[0].url,
        backends=tuple(s.url for s in servers),
        routing=routing,
        timeout_s=5.0,
        run_id="t",
        **affinity,
    )
    return run_trace(read_trace(SAMPLE), make_plan("alternate"), config, out, {"kind": "scripted"})


@pytest.fixture
def second_server() -> ScriptedServer:
    with ScriptedServer() as server:
        yield server


def test_round_robin_over_two_servers_says_which_served_each_request(
    scripted_server: ScriptedServer, second_server: ScriptedServer, tmp_path: Path
) -> None:
    servers = [scripted_server, second_server]
    outcome = _run(servers, tmp_path / "r.jsonl", "round-robin")
    assert outcome.exit_code == 0
    lines = read_results(tmp_path / "r.jsonl").requests
    assert [line["backend"] for line in lines] == [servers[i % 2].url for i in range(len(lines))]
    assert {line["backend_source"] for line in lines} == {"client"}
    # Each server saw exactly the requests the results say it served.
    for server in servers:
        said = sorted(line["id"] for line in lines if line["backend"] == server.url)
        seen = sorted(int(s.request_id.rsplit("-", 1)[1]) for s in server.seen)
        assert said == seen and said


def test_sticky_keeps_every_session_on_one_server_and_sends_its_affinity(
    scripted_server: ScriptedServer, second_server: ScriptedServer, tmp_path: Path
) -> None:
    servers = [scripted_server, second_server]
    scripted_server.default = second_server.default = Script()
    outcome = _run(
        servers, tmp_path / "r.jsonl", "sticky", session_header="X-Session-ID", session_field="session_id"
    )
    assert outcome.exit_code == 0
    lines = read_results(tmp_path / "r.jsonl").requests
    by_session = Counter((line["session"], line["backend"]) for line in lines)
    assert len(by_session) == len({line["session"] for line in lines})  # one backend per session
    trace = read_trace(SAMPLE)
    session_of = {r.id: r.session for r in trace.requests}
    for server in servers:
        for seen in server.seen:
            session = session_of[int(seen.request_id.rsplit("-", 1)[1])]
            assert seen.headers["x-session-id"] == session_key(session)
            assert seen.body["session_id"] == session_key(session)


def test_no_affinity_is_sent_unless_asked(scripted_server: ScriptedServer, tmp_path: Path) -> None:
    config = EngineConfig(base_url=scripted_server.url, timeout_s=5.0, run_id="t")
    run_trace(read_trace(SAMPLE), make_plan("alternate"), config, tmp_path / "r.jsonl", {"kind": "scripted"})
    assert scripted_server.seen and all("x-session-id" not in s.headers for s in scripted_server.seen)
    assert all("session_id" not in s.body for s in scripted_server.seen)
    lines = [orjson.loads(x) for x in (tmp_path / "r.jsonl").read_bytes().splitlines()]
    assert {line.get("backend") for line in lines if line["kind"] == "request"} == {None}
