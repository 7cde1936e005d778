"""Importers of what agents leave on disk (Hermes, OpenCode, Codex CLI, Claude Code as real files
are) and Mooncake session inference, on stores written in the agents' own shapes (agentstores)."""

from __future__ import annotations

import contextlib
import datetime as _dt
import sqlite3
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay.engine.plans import make_plan
from replay.engine.run import EngineConfig
from replay.errors import TraceError, UsageError
from replay.importers.base import ImportOptions, SessionInfo, Step, iso_seconds, write_trace
from replay.importers.claude_code import import_claude_code
from replay.importers.codex import import_codex
from replay.importers.hermes import import_hermes
from replay.importers.mooncake import import_mooncake
from replay.importers.opencode import import_opencode
from replay.importers.registry import list_formats, run_import
from replay.runs.pipeline import run_trace
from replay.sim.model.render import render
from replay.trace import materialize, read_trace, recorded_reply, validate
from tests.support.agentstores import (
    HERMES_SYSTEM,
    MORNING,
    OC_T0,
    REVIEW,
    HermesSession,
    codex_rollout,
    opencode_events,
    opencode_session,
    slow_morning_hermes,
    words,
    write_hermes,
    write_opencode_db,
    write_opencode_storage,
)


def msgs(trace, req):
    return materialize(req, recorded_reply(trace.by_id()))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "replay", *map(str, args)], capture_output=True, text=True)


def api_valid(messages: list[dict]) -> bool:
    """What a chat API insists on: a user message before any reply, a tool call before each result."""
    body = [m for m in messages if m["role"] != "system"]
    if not body or body[0]["role"] != "user":
        return False
    called: set[str] = set()
    for m in body:
        called.update(c["id"] for c in m.get("tool_calls") or ())
        if m["role"] == "tool" and m["tool_call_id"] not in called:
            return False
    return True


# ---- Hermes ---------------------------------------------------------------------------------------


@pytest.fixture
def morning_db(tmp_path: Path) -> Path:
    return slow_morning_hermes(tmp_path / "state.db")


def test_hermes_sessions_compression_cron_and_review(morning_db: Path, tmp_path: Path) -> None:
    counts = import_hermes(morning_db, tmp_path / "t.jsonl")
    assert counts == {"conversations": 3, "sessions": 4, "requests": 40, "compactions": 1, "filtered": 0}
    validate(tmp_path / "t.jsonl")
    trace = read_trace(tmp_path / "t.jsonl")
    roles = {sid: s.role for sid, s in trace.sessions.items()}
    main = "hermes-20261130_064500_a1b2c3"
    assert roles == {
        main: "interactive",
        "hermes-cron_fin1_20261130_064600": "cron",
        "hermes-cron_fin2_20261130_070000": "cron",
        f"{main}-review": "review",
    }
    assert trace.sessions["hermes-cron_fin1_20261130_064600"].labels["job"] == "fin1"
    # the compression continuation is the same conversation; its first call is the compaction
    mine = [r for r in trace.requests if r.session == main]
    compaction = next(r for r in mine if r.tag == "compaction")
    m = msgs(trace, compaction)
    assert compaction.is_compaction and [x["role"] for x in m] == ["system", "user", "user"]
    assert m[0]["content"] == HERMES_SYSTEM and m[1]["content"].startswith("[CONTEXT COMPACTION]")
    assert trace.sessions[main].labels["hermes_id"] == "20261130_064500_a1b2c3"
    # reviews fork off the main conversation at the end of a turn and run alongside the next one
    reviews = [r for r in trace.requests if r.session.endswith("-review")]
    assert len(reviews) == 4 and all(r.tag == "review" and not r.is_compaction for r in reviews)
    for review in reviews:
        base = review.parent
        assert base is not None and base.session == main and review.keep == base.n_messages
        assert review.append[0] == {"$reply": base.id} and review.append[1]["content"] == REVIEW
        assert review.after == {"request": base.id, "delay_s": 0.0}
        nxt = next(r for r in mine if r.id > review.id)
        assert nxt.parent is base and nxt.t - review.t == pytest.approx(2.0)  # sent while the review runs
    assert not any(
        x.get("content") == REVIEW for r in mine for x in msgs(trace, r)
    )  # the main conversation never sees the harness prompt
    # cron jobs grow by a tool result per call; usage as Hermes counted it; tools are stand-ins
    fin1 = [r for r in trace.requests if "fin1" in r.session]
    sizes = [len(msgs(trace, r)) for r in fin1]
    assert sizes == list(range(2, 2 * len(fin1) + 1, 2))
    assert fin1[0].reply["output_tokens"] == 12 and fin1[0].reply["finish"] == "tool_calls"
    assert [t["function"]["name"] for t in fin1[0].params["tools"]] == ["run_command"]
    assert [r.t for r in trace.requests] == sorted(r.t for r in trace.requests)
    first_main = mine[0]
    assert first_main.t == 0.0 and mine[1].after == {"request": first_main.id, "delay_s": 60.0}
    # t = 0 is when the first call went out (its user message, 06:44:55): reports show clock times
    assert trace.header.start == _dt.datetime.fromtimestamp(MORNING - 5).isoformat(timespec="seconds")


def test_hermes_old_store_without_newer_columns(tmp_path: Path) -> None:
    s = HermesSession("20250101_090000_aaaaaa", "telegram", "You are Hermes. " * 20)
    s.add(
        MORNING,
        "user",
        '[{"type": "text", "text": "hello"}, {"type": "image_url", "image_url": {"url": "x"}}]',
    )
    s.call(MORNING + 3, "c1", "web_search", {"q": "weather"})
    s.result(MORNING + 4, "c1", "web_search", "sunny")
    s.reply(MORNING + 6, "It is sunny.")
    write_hermes(tmp_path / "old.db", [s], old=True)
    counts = import_hermes(tmp_path / "old.db", tmp_path / "t.jsonl")
    assert counts["requests"] == 2
    trace = read_trace(tmp_path / "t.jsonl")
    first, second = trace.requests
    assert msgs(trace, first)[0] == {
        "role": "system",
        "content": "You are Hermes. " * 20,
    }  # the legacy column
    assert second.append[0] == {"$reply": first.id} and msgs(trace, second)[-1]["tool_call_id"] == "c1"
    assert first.reply["output_tokens"] >= 1  # estimated: an old store kept no token counts
    assert trace.sessions[first.session].labels["hermes_source"] == "telegram"


def wire_tools(n: int, seed: int) -> list[dict]:
    """Tool definitions as an agent sends them (what its store leaves out)."""
    return [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": words(300 + 40 * i, seed + i),
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
        }
        for i in range(n)
    ]


def test_hermes_requests_rebuilt_at_the_size_the_agent_sent(tmp_path: Path) -> None:
    """Hermes 0.19 stores no tool definitions (28, ~14K tokens a call) and no per-call usage, but its
    session sums (uncached input + cache reads + cache writes) are every call's prompt added up:
    the imported requests, rendered, are the size the wire carried (within 2%), tools marked
    synthetic. Before sizing, the imported prompts were a tenth of what Hermes sent."""
    s = HermesSession("20261204_124151_46ba85", "cli", HERMES_SYSTEM, model="sim-model")
    s.add(MORNING, "user", "Read README.md and say in one line what it is about.")
    s.call(MORNING + 1, "c1", "search_files", {"pattern": "README*"})
    s.result(MORNING + 2, "c1", "search_files", words(60, 3))
    s.call(MORNING + 3, "c2", "read_file", {"path": "README.md"})
    s.result(MORNING + 4, "c2", "read_file", words(200, 4))
    s.reply(MORNING + 6, words(120, 5))
    s.add(MORNING + 60, "user", "Now list the files next to it and summarise.")
    s.reply(MORNING + 62, words(80, 6))
    tools = wire_tools(28, 100)
    trace_path = tmp_path / "t.jsonl"
    # What the wire carried: the system prompt, the tools, every earlier row.
    write_hermes(tmp_path / "probe.db", [s])
    import_hermes(tmp_path / "probe.db", trace_path)
    probe = read_trace(trace_path)
    wire = [len(render(msgs(probe, req), tools)) for req in probe.requests]
    s.usage = {"input_tokens": 0, "cache_read_tokens": sum(wire) - wire[0], "cache_write_tokens": wire[0]}
    s.usage["api_call_count"] = len(wire)
    write_hermes(tmp_path / "state.db", [s])
    import_hermes(tmp_path / "state.db", trace_path)
    trace = read_trace(trace_path)
    got = [len(render(msgs(trace, r), r.params.get("tools"))) for r in trace.requests]
    assert len(got) == len(wire) == 4
    assert all(abs(g - w) <= 0.02 * w for g, w in zip(got, wire, strict=True)), (got, wire)
    sent = trace.requests[0].params["tools"]
    assert {"read_file", "search_files"} <= {t["function"]["name"] for t in sent}
    assert trace.sessions["hermes-20261204_124151_46ba85"].labels["synthetic"] == ["tools"]
    # the same tools on every call of the session: a cached prefix, as Hermes' own
    assert all(r.params["tools"] == sent for r in trace.requests)
    # no usage sums (an older store): the named stand-ins, not marked
    s.usage = {"input_tokens": 0}
    write_hermes(tmp_path / "plain.db", [s])
    import_hermes(tmp_path / "plain.db", trace_path)
    trace = read_trace(trace_path)
    assert {t["function"]["name"] for t in trace.requests[0].params["tools"]} == {"read_file", "search_files"}
    assert "synthetic" not in trace.sessions["hermes-20261204_124151_46ba85"].labels


def test_hermes_subagent_children_and_filters(tmp_path: Path) -> None:
    parent = HermesSession("20261130_080000_p", "cli", "sys")
    parent.add(MORNING, "user", "delegate this")
    parent.reply(MORNING + 30, "done")
    child = HermesSession(
        "20261130_080005_c", "cli", "sub", parent=parent.id, model_config={"_delegate_from": parent.id}
    )
    child.add(MORNING + 5, "user", "the delegated task")
    child.reply(MORNING + 20, "sub result")
    later = HermesSession("20261201_080000_l", "cli", "sys")
    later.add(MORNING + 86400, "user", "next day")
    later.reply(MORNING + 86410, "ok")
    write_hermes(tmp_path / "s.db", [parent, child, later])
    import_hermes(tmp_path / "s.db", tmp_path / "t.jsonl")
    trace = read_trace(tmp_path / "t.jsonl")
    assert {s.role for s in trace.sessions.values()} == {"interactive", "subagent"}
    assert trace.sessions["hermes-20261130_080005_c"].role == "subagent"
    # --since/--until cut a window; --session keeps one conversation
    day = ImportOptions(since=MORNING - 60, until=MORNING + 3600)
    counts = import_hermes(tmp_path / "s.db", tmp_path / "day.jsonl", day)
    assert counts["requests"] == 2 and counts["filtered"] == 1
    counts = import_hermes(tmp_path / "s.db", tmp_path / "one.jsonl", ImportOptions(sessions=("20261201",)))
    assert counts["requests"] == 1 and list(read_trace(tmp_path / "one.jsonl").sessions) == [
        "hermes-20261201_080000_l"
    ]
    with pytest.raises(UsageError, match="left out"):
        import_hermes(tmp_path / "s.db", tmp_path / "none.jsonl", ImportOptions(sessions=("nope",)))


def test_hermes_reads_a_live_wal_store_without_touching_it(tmp_path: Path) -> None:
    db = slow_morning_hermes(tmp_path / "state.db")
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("BEGIN IMMEDIATE")  # the running agent holds the write lock mid-transaction
    conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('x', 'user', 'y', 0)")
    before = db.read_bytes()
    counts = import_hermes(db, tmp_path / "t.jsonl")
    assert counts["requests"] == 40
    assert db.read_bytes() == before
    conn.rollback()
    conn.close()


def test_hermes_wrong_input_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "x.db").write_text("not a database\n")
    with pytest.raises(TraceError, match="not a Hermes state database"):
        import_hermes(tmp_path / "x.db", tmp_path / "t.jsonl")
    other = sqlite3.connect(tmp_path / "other.db")
    other.execute("CREATE TABLE session (id TEXT)")
    other.close()
    with pytest.raises(TraceError, match="no table sessions, messages"):
        import_hermes(tmp_path / "other.db", tmp_path / "t.jsonl")


# ---- OpenCode -------------------------------------------------------------------------------------


@pytest.fixture
def opencode(tmp_path: Path) -> dict[str, Path]:
    main = opencode_session()
    child = opencode_session("ses_02child", parent="ses_01main", t0=OC_T0 + 20_000)
    (tmp_path / "export.json").write_bytes(orjson.dumps(main))
    (tmp_path / "events.jsonl").write_bytes(opencode_events(main))
    return {
        "storage": write_opencode_storage(tmp_path / "data" / "storage", [main, child]),
        "db": write_opencode_db(tmp_path / "opencode.db", [main, child]),
        "export": tmp_path / "export.json",
        "events": tmp_path / "events.jsonl",
    }


def test_opencode_call_in_flight_kept_and_requests_at_their_recorded_size(
    tmp_path: Path, scripted_server
) -> None:
    """Issue 36: OpenCode 1.18 imports dropped the call still in flight when the agent stopped (262 of
    263): its assistant message holds a `step-start` and nothing after. It was sent, so it is a
    request (no reply). And each request renders at the prompt tokens its step-finish recorded: the
    system stand-in is sized against the rendered request, not a bare token count."""
    exp = opencode_session()
    last = exp["messages"][-1]
    last["parts"] = last["parts"][:1]  # step-start only: the stream never answered
    del last["info"]["time"]["completed"]
    write_opencode_db(tmp_path / "opencode.db", [exp])
    counts = import_opencode(tmp_path / "opencode.db", tmp_path / "t.jsonl")
    assert counts["requests"] == 5  # four answered, one in flight (was four)
    validate(tmp_path / "t.jsonl")
    trace = read_trace(tmp_path / "t.jsonl")
    main = [r for r in trace.requests if r.session == "oc-ses_01main"]
    flying = main[-1]
    assert flying.reply is None and [m["role"] for m in msgs(trace, flying)][-1] == "user"
    assert msgs(trace, flying)[-1]["content"] == "Now fix it."
    first = main[0]
    assert len(render(msgs(trace, first), first.params.get("tools"))) == first.usage["prompt_tokens"] == 2100
    # and it replays: sent like any other request
    config = EngineConfig(base_url=scripted_server.url, timeout_s=10.0, run_id="fly")
    outcome = run_trace(trace, make_plan("alternate"), config, tmp_path / "r.jsonl", {})
    assert outcome.exit_code == 0 and outcome.requests == 5


def test_opencode_steps_tools_usage_and_compaction(opencode: dict[str, Path], tmp_path: Path) -> None:
    counts = import_opencode(opencode["db"], tmp_path / "t.jsonl")
    assert counts == {"conversations": 2, "sessions": 3, "requests": 9, "compactions": 2, "filtered": 0}
    trace = read_trace(tmp_path / "t.jsonl")
    assert {s: x.role for s, x in trace.sessions.items()} == {
        "oc-ses_01main": "interactive",
        "oc-ses_01main-title": "title",
        "oc-ses_02child": "subagent",
    }
    # the title call OpenCode made but did not store: made up from the title it got
    (title,) = [r for r in trace.requests if r.session.endswith("-title")]
    assert title.tag == "title" and title.reply["message"]["content"] == "Parser fields"
    assert [m["role"] for m in msgs(trace, title)] == ["system", "user", "user"]  # as OpenCode 1.18 sends it
    assert msgs(trace, title)[2] == {"role": "user", "content": '"Find where the parser splits fields."'}
    main = [r for r in trace.requests if r.session == "oc-ses_01main"]
    assert [r.tag for r in main] == ["turn", "turn", "turn", "compaction"]
    first, second, summary, after = main
    # two steps of one assistant message: two requests; the tool part is a call and a result
    assert first.reply["message"]["tool_calls"] == [
        {"id": "call_main1", "name": "read", "arguments": '{"filePath":"parse.py"}'}
    ]
    assert first.reply["finish"] == "tool_calls" and second.reply["finish"] == "stop"
    m2 = msgs(trace, second)
    assert [x["role"] for x in m2] == ["system", "user", "assistant", "tool"] and m2[3][
        "tool_call_id"
    ] == "call_main1"
    assert first.usage == {
        "prompt_tokens": 2100,
        "cached_tokens": 1200,
        "output_tokens": 30,
        "raw": {"input": 900, "output": 30, "reasoning": 0, "cache": {"read": 1200, "write": 0}},
    }
    # the stand-in system prompt: sized from the first step's usage, one per kind of session
    assert isinstance(m2[0]["content"], str) and len(m2[0]["content"].split()) > 1500
    # after the summary only it and what follows are sent
    assert [x["content"] for x in msgs(trace, after)[1:]] == [
        "What did we do so far?",
        "Summary: we found parse_line splits on commas.",
        "Now fix it.",
    ]
    assert summary.tag == "turn" and after.is_compaction


def test_opencode_every_store_gives_the_same_requests(opencode: dict[str, Path], tmp_path: Path) -> None:
    def main_messages(src: Path) -> list[list[dict]]:
        out = tmp_path / f"{src.name}.trace.jsonl"
        import_opencode(src, out)
        trace = read_trace(out)
        return [msgs(trace, r) for r in trace.requests if r.session == "oc-ses_01main"]

    db = main_messages(opencode["db"])
    assert main_messages(opencode["storage"]) == db
    assert main_messages(opencode["storage"].parent) == db  # the data folder holding storage/
    assert main_messages(opencode["export"]) == db
    # an event stream carries no user prompts: made up, and listed as synthetic
    import_opencode(opencode["events"], tmp_path / "ev.jsonl")
    lines = [orjson.loads(x) for x in (tmp_path / "ev.jsonl").read_bytes().splitlines()]
    requests = [x for x in lines if x["kind"] == "request"]
    assert len(requests) == 4 and requests[0]["synthetic"] == [1]
    events = read_trace(tmp_path / "ev.jsonl")
    assert all(api_valid(msgs(events, r)) for r in events.requests)


def test_opencode_malformed_event_line_names_file_and_line(opencode: dict[str, Path], tmp_path: Path) -> None:
    lines = opencode["events"].read_bytes().splitlines()
    lines.insert(2, b'{"type": "step_start", "part": ')
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\n".join(lines))
    with pytest.raises(TraceError, match=r"bad\.jsonl:3: bad JSON"):
        import_opencode(bad, tmp_path / "t.jsonl")
    res = cli("import", "opencode", bad, tmp_path / "t.jsonl")
    assert res.returncode == 2 and "bad.jsonl:3:" in res.stderr


# ---- Codex CLI ------------------------------------------------------------------------------------


def test_codex_0171_rollout_rebuilt_at_the_size_codex_sent(tmp_path: Path) -> None:
    """Issue 36: Codex 0.171 requests replayed from the rollout at 5,421 / 5,693 prompt tokens against
    6,667 / 6,939 on the wire (-19%): its 9 tool definitions are not stored, and the per-call usage
    moved to `token_usage_record` lines (a `token_count` event now comes after the tool output, so
    the first calls had none). Rebuilt: base instructions as the first developer message (as 0.171
    sends them), tools sized from the first call's usage, every call at its wire size."""
    sid = "01a2411c-31d2-7532-955d-14df1e82ae63"
    base = words(900, 31)
    lines: list[dict] = []

    def add(dt: float, kind: str, payload: dict) -> None:
        stamp = _dt.datetime.fromtimestamp(MORNING + dt, _dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        lines.append({"timestamp": stamp, "type": kind, "payload": payload})

    def item(role: str, text: str) -> dict:
        return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}

    add(0, "session_meta", {"id": sid, "timestamp": "x", "cli_version": "0.171.0", "source": "exec",
                            "base_instructions": {"text": base}})  # fmt: skip
    add(0.1, "response_item", item("developer", "<skills_instructions> " + words(120, 32)))
    add(0.1, "response_item", item("user", "<environment_context> " + words(40, 33)))
    add(0.2, "world_state", {"full": True, "state": {"current_date": "2026-12-04"}})
    add(0.3, "turn_context", {"model": "sim-model", "summary": "auto"})
    add(1.0, "response_item", item("user", "Read README.md and say in one line what it is about."))
    add(2.0, "response_item", {"type": "function_call", "name": "exec_command", "call_id": "call_1",
                               "arguments": '{"cmd": "cat README.md"}'})  # fmt: skip
    add(2.0, "token_usage_record", {"response_id": "resp_1", "usage": {}})  # filled below
    add(2.1, "response_item", {"type": "function_call_output", "call_id": "call_1", "output": words(30, 34)})
    add(2.1, "event_msg", {"type": "token_count", "info": {"last_token_usage": {}}})
    add(3.0, "response_item", {"type": "message", "role": "assistant",
                               "content": [{"type": "output_text", "text": words(60, 35)}]})  # fmt: skip
    add(3.0, "token_usage_record", {"response_id": "resp_2", "usage": {}})
    path = tmp_path / "rollout-2026-12-04T12-51-36-a.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(x) for x in lines) + b"\n")
    # What the wire carried: the same items and Codex's tool definitions.
    import_codex(path, tmp_path / "probe.jsonl")
    probe = read_trace(tmp_path / "probe.jsonl")
    wire = [len(render(msgs(probe, r), wire_tools(9, 200))) for r in probe.requests]
    records = [x for x in lines if x["type"] == "token_usage_record"]
    for rec, size in zip(records, wire, strict=True):
        rec["payload"]["usage"] = {"input_tokens": size, "cached_input_tokens": 0, "output_tokens": 29}
    count = next(x for x in lines if x["type"] == "event_msg")
    count["payload"]["info"]["last_token_usage"] = records[0]["payload"]["usage"]
    path.write_bytes(b"\n".join(orjson.dumps(x) for x in lines) + b"\n")
    import_codex(path, tmp_path / "t.jsonl")
    trace = read_trace(tmp_path / "t.jsonl")
    first, second = trace.requests
    assert [m["role"] for m in msgs(trace, first)] == ["developer", "developer", "user", "user"]
    assert first.usage["prompt_tokens"] == wire[0] and second.usage["prompt_tokens"] == wire[1]
    got = [len(render(msgs(trace, r), r.params.get("tools"))) for r in trace.requests]
    assert all(abs(g - w) <= 0.02 * w for g, w in zip(got, wire, strict=True)), (got, wire)
    assert trace.sessions[f"codex-{sid}"].labels["synthetic"] == ["tools"]


def test_codex_rollout_calls_usage_and_compaction(tmp_path: Path) -> None:
    home = tmp_path / ".codex" / "sessions"
    codex_rollout(home / "2026" / "11" / "30" / "rollout-2026-11-30T06-45-00-a.jsonl")
    counts = import_codex(home, tmp_path / "t.jsonl")
    assert counts == {"files": 1, "sessions": 1, "requests": 4, "compactions": 1, "filtered": 0}
    trace = read_trace(tmp_path / "t.jsonl")
    ((sid, session),) = trace.sessions.items()
    assert sid == "codex-0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b" and session.model == "gpt-oss-20b"
    assert session.api == "openai-responses"  # as Codex speaks it
    assert r_params(trace) == {"reasoning": {"effort": "medium", "summary": "auto"}}
    r1, r2, r3, r4 = trace.requests
    m1 = msgs(trace, r1)
    assert [x["role"] for x in m1] == [
        "system",
        "developer",
        "user",
        "user",
    ]  # instructions, developer, context, prompt
    assert r1.reply["message"]["tool_calls"] == [
        {"id": "call_1", "name": "shell", "arguments": '{"command":["ls","tests"]}'}
    ]
    assert r1.reply["message"]["reasoning"] == "Need to list."
    assert (
        r1.usage["prompt_tokens"] == 1200
        and r2.usage["cached_tokens"] == 1200
        and r3.usage["output_tokens"] == 8
    )
    assert r2.append[0] == {"$reply": r1.id} and r2.append[1]["tool_call_id"] == "call_1"
    assert [r.t for r in trace.requests] == [0.0, 4.0, 19.0, 60.0]
    assert r3.reply["message"]["content"] == "Both tests pass." and r3.reply["finish"] == "stop"
    assert r4.tag == "compaction" and r4.is_compaction
    assert [x["content"] for x in msgs(trace, r4)[1:]] == [
        "Summary: listed tests, both pass.",
        "Now add a test for empty input.",
    ]


def r_params(trace) -> dict:
    return trace.requests[0].params["extra"]


def test_codex_rejects_other_files_at_their_line(tmp_path: Path) -> None:
    path = codex_rollout(tmp_path / "rollout-x.jsonl")
    lines = path.read_bytes().splitlines()
    # a line kind of a newer Codex, in the rollout wrapper, is skipped
    lines.insert(3, b'{"timestamp": "2026-11-30T06:45:00.500Z", "type": "world_state", "payload": {"k": 1}}')
    path.write_bytes(b"\n".join(lines))
    assert import_codex(path, tmp_path / "t.jsonl")["requests"] == 4
    lines.insert(4, b'{"type": "chat", "text": "hi"}')
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(TraceError, match=r"rollout-x\.jsonl:5: not a Codex rollout line"):
        import_codex(path, tmp_path / "t.jsonl")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.one_of(st.binary(max_size=40), st.dictionaries(st.text(max_size=8), st.text(max_size=8))),
        max_size=6,
    )
)
def test_codex_and_opencode_parsers_fail_only_with_trace_errors(tmp_path: Path, lines: list) -> None:
    raw = b"\n".join(x if isinstance(x, bytes) else orjson.dumps(x) for x in lines)
    src = tmp_path / "rollout-h.jsonl"
    src.write_bytes(raw)
    for convert in (import_codex, import_opencode):
        with contextlib.suppress(TraceError, UsageError):
            convert(src, tmp_path / "t.jsonl")


# ---- Claude Code as real files are ------------------------------------------------------------------


def _cc(tmp: Path, name: str, rows: list[dict]) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / name
    path.write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n")
    return path


def _entry(sid: str, kind: str, uuid: str, parent: str | None, t: int, content, **extra) -> dict:
    msg = {"role": kind, "content": content}
    if kind == "assistant":
        msg |= {"id": f"msg_{uuid}", "model": "claude-sonnet-4", "stop_reason": extra.pop("stop", "end_turn"),
                "usage": {"input_tokens": 10, "cache_read_input_tokens": 3000, "output_tokens": 20}}  # fmt: skip
    return {"sessionId": sid, "type": kind, "uuid": uuid, "parentUuid": parent, "isSidechain": False,
            "timestamp": _stamp(t), "message": msg, **extra}  # fmt: skip


def _stamp(t: float) -> str:
    return _dt.datetime.fromtimestamp(1748772000 + t, _dt.UTC).isoformat().replace("+00:00", "Z")


def test_claude_code_mid_session_files_still_send_valid_requests(tmp_path: Path) -> None:
    sid = "5e55aa00-0000-4000-8000-000000000001"
    use = [{"type": "tool_use", "id": "toolu_9", "name": "Bash", "input": {"command": "ls"}}]
    result = [{"type": "tool_result", "tool_use_id": "toolu_8", "content": "a.txt"}]
    project = tmp_path / "projects" / "-home-dev-proj"
    _cc(project, f"{sid}.jsonl", [  # resumed: begins with a tool result, then an assistant record
        _entry(sid, "user", "r0", "gone-1", 1, result),
        _entry(sid, "assistant", "a1", "r0", 3, use, stop="tool_use"),
        _entry(sid, "user", "r1", "a1", 4, [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "b.txt"}]),
        _entry(sid, "assistant", "a2", "r1", 6, "Two files."),
    ])  # fmt: skip
    sid2 = "5e55aa00-0000-4000-8000-000000000002"
    _cc(project, f"{sid2}.jsonl", [_entry(sid2, "assistant", "b1", "gone-2", 8, "Where was I?")])
    counts = import_claude_code(project, tmp_path / "t.jsonl")
    assert counts["sessions"] == 2 and counts["requests"] == 3
    lines = [orjson.loads(x) for x in (tmp_path / "t.jsonl").read_bytes().splitlines()]
    requests = [x for x in lines if x["kind"] == "request"]
    # made up after the system stand-in (three blocks); a later request of the session still carries them
    assert sorted(str(r.get("synthetic")) for r in requests) == ["[3, 4]", "[3, 4]", "[3]"]
    trace = read_trace(tmp_path / "t.jsonl")
    for r in trace.requests:
        assert api_valid(msgs(trace, r)), msgs(trace, r)
    first = msgs(trace, trace.requests[0])
    assert first[4]["tool_calls"][0]["id"] == "toolu_8" and first[5]["tool_call_id"] == "toolu_8"


def test_claude_code_rewind_is_no_compaction_and_subagent_files_join(tmp_path: Path) -> None:
    sid = "7e77bb00-0000-4000-8000-000000000001"
    project = tmp_path / "-home-dev-proj"
    _cc(project, f"{sid}.jsonl", [
        _entry(sid, "user", "u1", None, 1, "write a haiku"),
        _entry(sid, "assistant", "a1", "u1", 3, "Leaves fall."),
        _entry(sid, "user", "u2", "a1", 5, "longer please"),
        _entry(sid, "assistant", "a2", "u2", 7, "Leaves fall slowly down."),
        _entry(sid, "user", "u3", "a1", 9, "no, about rain"),  # rewound to after a1: a branch
        _entry(sid, "assistant", "a3", "u3", 11, "Rain on the roof."),
    ])  # fmt: skip
    agent = {"isSidechain": True, "agentId": "ab12cd34"}
    _cc(project / sid / "subagents", "agent-ab12cd34.jsonl", [
        _entry(sid, "user", "s1", None, 4, "check the syllables", **agent),
        _entry(sid, "assistant", "s2", "s1", 6, "5-7-5.", **agent),
    ])  # fmt: skip
    counts = import_claude_code(project, tmp_path / "t.jsonl")
    assert counts["compactions"] == 0 and counts["sessions"] == 2
    trace = read_trace(tmp_path / "t.jsonl")
    main = [r for r in trace.requests if r.session == "cc-7e77bb00"]
    assert [r.tag for r in main] == ["turn", "turn", "turn"] and not any(r.is_compaction for r in main)
    rewound = main[2]
    assert rewound.parent is main[0] and rewound.append[0] == {"$reply": main[0].id}  # branches off the first
    assert trace.sessions["cc-7e77bb00-agent-ab12cd34"].role == "subagent"


def test_claude_code_changed_system_prompt_is_a_prefix_rewrite_and_listings_kept(tmp_path: Path) -> None:
    """Issue 36: Claude Code 2.1's second request of a session changed its system prompt and was
    re-read in full, but the import called it an ordinary turn (the replay cached 18,591 tokens
    there). Its usage says so: a cache read under half the previous prompt, seconds later. The
    agent and skill listings (stored as `attachment` entries) are the `role: system` entry of
    `messages` the wire carries after the first prompt."""
    sid = "9e99cc00-0000-4000-8000-000000000001"
    listing = {"type": "agent_listing_delta", "addedLines": ["- Explore: " + words(40, 1)], "isInitial": True}
    skills = {"type": "skill_listing", "content": "- review: " + words(30, 2)}

    def usage(prompt: int, read: int) -> dict:
        return {"input_tokens": 5, "cache_read_input_tokens": read, "cache_creation_input_tokens": prompt - read - 5,
                "output_tokens": 20}  # fmt: skip

    rows = [
        _entry(sid, "user", "u1", None, 1, "read the README"),
        {"sessionId": sid, "type": "attachment", "uuid": "t1", "parentUuid": "u1", "isSidechain": False,
         "timestamp": _stamp(1), "attachment": listing},
        {"sessionId": sid, "type": "attachment", "uuid": "t2", "parentUuid": "t1", "isSidechain": False,
         "timestamp": _stamp(1), "attachment": skills},
        _entry(sid, "assistant", "a1", "t2", 3, "It is a demo."),
        _entry(sid, "user", "u2", "a1", 5, "and the notes?"),
        _entry(sid, "assistant", "a2", "u2", 7, "Nothing there."),
        _entry(sid, "user", "u3", "a2", 9, "thanks"),
        _entry(sid, "assistant", "a3", "u3", 11, "Welcome."),
    ]  # fmt: skip
    rows[3]["message"]["usage"] = usage(20000, 0)
    rows[5]["message"]["usage"] = usage(20300, 400)  # re-read in full: the system prompt changed
    rows[7]["message"]["usage"] = usage(20400, 20300)
    _cc(tmp_path / "p", f"{sid}.jsonl", rows)
    counts = import_claude_code(tmp_path / "p", tmp_path / "t.jsonl")
    assert counts["requests"] == 3 and counts["compactions"] == 1
    trace = read_trace(tmp_path / "t.jsonl")
    first, changed, after = trace.requests
    assert [r.tag for r in trace.requests] == ["turn", "compaction", "turn"]
    roles = [m["role"] for m in msgs(trace, first)]
    assert roles == ["system", "system", "system", "user", "system"]  # billing, identity, prompt; listings
    sent = msgs(trace, first)
    assert "<system-reminder>" in sent[3]["content"] and sent[3]["content"].endswith("read the README")
    assert "Explore" in sent[4]["content"] and "review" in sent[4]["content"]
    assert msgs(trace, changed)[0] != sent[0] and msgs(trace, after)[:3] == msgs(trace, changed)[:3]
    for req, want in zip(trace.requests, (20000, 20300, 20400), strict=True):
        got = len(render(msgs(trace, req), req.params.get("tools")))
        assert abs(got - want) <= 0.02 * want, (got, want)
    # a server that never caches reads 0 on every call: no rewrite
    for row in (rows[3], rows[5], rows[7]):
        row["message"]["usage"] = usage(row["message"]["usage"]["input_tokens"] + 20000, 0)
    _cc(tmp_path / "q", f"{sid}.jsonl", rows)
    assert import_claude_code(tmp_path / "q", tmp_path / "q.jsonl")["compactions"] == 0


DAY = 86400.0


def _year_of_sessions(project: Path) -> Path:
    """A session a quarter over a year, the second resumed 120 days after it began."""
    for q, start in enumerate((0, 91, 182, 273, 355)):
        sid = f"{q:08d}-0000-4000-8000-000000000000"
        rows, parent = [], None
        turns = [start * DAY, start * DAY + 10] + ([(start + 120) * DAY] if q == 1 else [])
        for k, t in enumerate(turns):
            u = _entry(sid, "user", f"u{q}-{k}", parent, t, f"question {q}.{k}")
            a = _entry(sid, "assistant", f"a{q}-{k}", u["uuid"], t + 3, f"answer {q}.{k}")
            rows += [u, a]
            parent = a["uuid"]
        _cc(project, f"{sid}.jsonl", rows)
    return project


def test_claude_code_transcripts_spanning_a_year_import_whole_and_with_since(tmp_path: Path) -> None:
    """Issue 33: such a folder wrote a `t` of 12228814.908 s that its own validator refused (then
    capped at 1e7 s, 115 days), exit 2 with a partial trace left; --since did not help."""
    project = _year_of_sessions(tmp_path / "-home-dev-proj")
    line = run_import("claude-code", project, tmp_path / "all.jsonl")
    assert "11 requests in 5 sessions" in line
    trace = read_trace(tmp_path / "all.jsonl")
    assert [round(r.t / DAY) for r in trace.requests] == [0, 0, 91, 91, 182, 182, 211, 273, 273, 355, 355]
    resumed = trace.requests[6]
    assert resumed.session == "cc-00000001" and resumed.after["delay_s"] == pytest.approx(120 * DAY - 13)
    since = _dt.datetime.fromtimestamp(1748772000 + 150 * DAY)  # local time, as the user gives it
    options = ImportOptions(since=since.timestamp())
    assert "7 requests in 4 sessions" in run_import("claude-code", project, tmp_path / "since.jsonl", options)
    kept = read_trace(tmp_path / "since.jsonl")
    assert kept.requests[0].t == 0 and [round(r.t / DAY) for r in kept.requests] == [
        0,
        0,
        29,
        91,
        91,
        173,
        173,
    ]
    first = _dt.datetime.fromtimestamp(1748772000 + 182 * DAY)
    assert kept.header.start == first.isoformat(timespec="seconds")


# ---- Mooncake ---------------------------------------------------------------------------------------


def test_mooncake_shared_system_block_does_not_join_conversations(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 0, "input_length": 512, "output_length": 5, "hash_ids": [1]},  # the system prompt alone
        {"timestamp": 10, "input_length": 1536, "output_length": 5, "hash_ids": [1, 2, 3]},
        {"timestamp": 20, "input_length": 1536, "output_length": 5, "hash_ids": [1, 4, 5]},
        {"timestamp": 30, "input_length": 2048, "output_length": 5, "hash_ids": [1, 2, 3, 6]},
        {"timestamp": 40, "input_length": 2000, "output_length": 5, "hash_ids": [1, 4, 5, 7]},
        {
            "timestamp": 50,
            "input_length": 1024,
            "output_length": 5,
            "hash_ids": [1, 2],
        },  # extends only a prefix
    ]
    src = tmp_path / "m.jsonl"
    src.write_bytes(b"\n".join(orjson.dumps(r) for r in rows))
    counts = import_mooncake(src, tmp_path / "t.jsonl")
    assert counts["common_blocks"] == 1
    trace = read_trace(tmp_path / "t.jsonl")
    assert [r.session for r in trace.requests] == ["mc1", "mc2", "mc3", "mc2", "mc3", "mc4"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=5), min_size=1, max_size=12))
def test_mooncake_continuations_extend_beyond_the_shared_blocks(tmp_path: Path, ids: list[list[int]]) -> None:
    rows = [
        {"timestamp": i, "input_length": 512 * len(h), "output_length": 1, "hash_ids": h}
        for i, h in enumerate(ids)
    ]
    src = tmp_path / "m.jsonl"
    src.write_bytes(b"\n".join(orjson.dumps(r) for r in rows))
    counts = import_mooncake(src, tmp_path / "t.jsonl")
    shared = counts["common_blocks"]
    trace = read_trace(tmp_path / "t.jsonl")
    for i, req in enumerate(trace.requests):
        earlier = [j for j in range(i) if trace.requests[j].session == req.session]
        if earlier:  # it continues: some earlier request of its session is a longer-than-shared prefix
            assert any(len(ids[j]) > shared and ids[i][: len(ids[j])] == ids[j] for j in earlier)
        else:
            assert not any(len(ids[j]) > shared and ids[i][: len(ids[j])] == ids[j] for j in range(i))


# ---- for all ------------------------------------------------------------------------------------------


def test_import_list_shows_formats_and_default_places() -> None:
    text = list_formats()
    for name in ("hermes", "opencode", "codex", "claude-code", "mooncake", "sharegpt"):
        assert f"{name}:" in text
    assert "~/.hermes/state.db" in text and "~/.local/share/opencode/opencode.db" in text
    res = cli("import", "--list")
    assert (
        res.returncode == 0 and "Linux and macOS: ~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl" in res.stdout
    )


def test_cli_filters_and_wrong_format(morning_db: Path, tmp_path: Path) -> None:
    res = cli("import", "hermes", morning_db, tmp_path / "w.jsonl", "--since", "2026-11-30T07:40+00:00",
              "--until", "2026-11-30T08:19+00:00", "--session", "20261130_0746")  # fmt: skip
    assert res.returncode == 0, res.stderr
    trace = read_trace(tmp_path / "w.jsonl")
    assert {s.role for s in trace.sessions.values()} == {"interactive", "review"}
    assert trace.requests[0].tag == "compaction"  # 07:46, the first request in the window
    res = cli("import", "codex", morning_db, tmp_path / "x.jsonl")
    assert res.returncode == 2 and "state.db:1: bad JSON" in res.stderr
    assert iso_seconds("2026-11-30T06:45:00Z") == MORNING


@pytest.mark.e2e
@pytest.mark.parametrize(
    "fmt",
    [
        "hermes",
        "opencode-db",
        "opencode-storage",
        "opencode-export",
        "opencode-events",
        "codex",
        "claude-code",
    ],
)
def test_imported_traces_replay_on_the_simulator(fmt: str, tmp_path: Path) -> None:
    if fmt == "hermes":
        src, name = slow_morning_hermes(tmp_path / "state.db"), "hermes"
    elif fmt.startswith("opencode"):
        main, child = opencode_session(), opencode_session("ses_02child", parent="ses_01main")
        src = {
            "opencode-db": lambda: write_opencode_db(tmp_path / "opencode.db", [main, child]),
            "opencode-storage": lambda: write_opencode_storage(tmp_path / "storage", [main, child]),
            "opencode-events": lambda: _write(tmp_path / "ev.jsonl", opencode_events(main)),
            "opencode-export": lambda: _write(tmp_path / "export.json", orjson.dumps(main)),
        }[fmt]()
        name = "opencode"
    elif fmt == "codex":
        src, name = codex_rollout(tmp_path / "rollout-a.jsonl"), "codex"
    else:
        src, name = Path(__file__).parent.parent / "data" / "record" / "claude_code", "claude-code"
    line = run_import(name, src, tmp_path / "t.jsonl")
    n = len(read_trace(tmp_path / "t.jsonl").requests)
    assert f": {n} requests" in line
    res = cli("run", tmp_path / "t.jsonl", "--target", "sim", "--plan", "closed-loop", "--speed", "1000",
              "--sim-args", "--time-scale 1000", "--out", tmp_path / "r.jsonl")  # fmt: skip
    assert res.returncode == 0, res.stderr
    results = [orjson.loads(x) for x in (tmp_path / "r.jsonl").read_bytes().splitlines()]
    done = [r for r in results if r.get("kind") == "request"]
    assert len(done) == n and all(r["status"] == "ok" for r in done), [r.get("error") for r in done]


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _classes(results: Path, roles: dict[str, str]) -> dict[str, set[str]]:
    """Switch classes by session role, and ("late") those of the main conversation and its review
    after the compaction: the 07:55 window."""
    recs = [orjson.loads(raw) for raw in results.read_bytes().splitlines()]
    recs = sorted((r for r in recs if r.get("kind") == "request"), key=lambda r: r["seq"])
    by_role: dict[str, set[str]] = {"late": set()}
    compacted = False
    for rec in recs:
        assert rec["status"] == "ok", rec.get("error")
        role = roles[rec["session"]]
        by_role.setdefault(role, set()).update(rec["switch"])
        if compacted and role in ("interactive", "review"):
            by_role["late"].update(rec["switch"])
        compacted = compacted or "compaction" in rec["switch"]
    return by_role


@pytest.mark.e2e
def test_hermes_slow_morning_replays_with_the_scenarios_switch_classes(
    morning_db: Path, tmp_path: Path
) -> None:
    res = cli("import", "hermes", morning_db, tmp_path / "t.jsonl")
    assert res.returncode == 0, res.stderr
    res = cli("run", tmp_path / "t.jsonl", "--target", "sim", "--plan", "closed-loop", "--speed", "1000",
              "--sim-args", "--time-scale 1000", "--out", tmp_path / "r.jsonl")  # fmt: skip
    assert res.returncode == 0, res.stderr
    imported = read_trace(tmp_path / "t.jsonl")
    got = _classes(tmp_path / "r.jsonl", {sid: s.role for sid, s in imported.sessions.items()})
    # At 1000x, not the spec's 20x (149 s here -> 15 s): the switch classes follow the calls'
    # order, which three turns keep at 1000x too; the spec's 20x is for the seconds rows, and
    # `scenario check` holds those.
    res = cli("scenario", "run", "slow-morning", "--arm", "24G", "--param", "main_turns=3", "--param",
              "review_turns=3", "--time-scale", "1000", "--out", tmp_path / "sm")  # fmt: skip
    assert res.returncode == 0, res.stderr
    scenario = read_trace(tmp_path / "sm" / "slow-morning-24G.trace.jsonl")
    want = _classes(
        tmp_path / "sm" / "slow-morning-24G.results.jsonl",
        {sid: s.role for sid, s in scenario.sessions.items()},
    )
    assert (
        set().union(*got.values())
        == set().union(*want.values())
        == {"cold", "continue", "switch", "compaction", "concurrent"}
    )
    for role in ("interactive", "cron", "review"):
        assert {"switch"} <= got[role] and {"switch"} <= want[role]
    assert "compaction" in got["interactive"] and "compaction" in want["interactive"]
    assert {"switch", "concurrent"} <= got["late"] and {"switch", "concurrent"} <= want["late"]


# ---- bounded memory ---------------------------------------------------------------------------------

_PEAK = """
import resource, sys
from pathlib import Path
from replay.importers.registry import run_import
run_import(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _peak_kib(fmt: str, src: Path, out: Path) -> int:
    res = subprocess.run(
        [sys.executable, "-c", _PEAK, fmt, str(src), str(out)], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    return int(res.stdout.split()[-1])


def _many_hermes(path: Path, n: int) -> Path:
    """n conversations of 40 tool calls each, a few running at any moment (~170 KB each)."""
    blob = " ".join(["market data row"] * 130)
    sessions = []
    for i in range(n):
        s = HermesSession(f"20261130_{i:06d}", "cron" if i % 3 == 0 else "cli", "system prompt " * 500)
        t = MORNING + i * 30
        s.add(t, "user", "start " + blob)
        for k in range(40):
            s.call(t + 10 * k + 1, f"c{i}_{k}", "run_command", {"k": k})
            s.result(t + 10 * k + 2, f"c{i}_{k}", "run_command", f"{blob} {k}")
        s.reply(t + 500, "done")
        sessions.append(s)
    return write_hermes(path, sessions)


def _many_claude_code(folder: Path, n: int) -> Path:
    blob = " ".join(["source line text"] * 300)
    for i in range(n):
        sid = f"{i:08d}-0000-4000-8000-000000000000"
        rows, parent = [], None
        for k in range(30):
            t = i * 600 + k * 10  # a conversation every ten minutes
            u = _entry(sid, "user", f"u{i}-{k}", parent, t, f"{blob} {k}")
            a = _entry(sid, "assistant", f"a{i}-{k}", u["uuid"], t, f"ok {k}")
            rows += [u, a]
            parent = a["uuid"]
        _cc(folder, f"{sid}.jsonl", rows)
    return folder


@pytest.mark.parametrize("fmt", ["hermes", "claude-code"])
def test_memory_stays_bounded_as_the_store_grows(fmt: str, tmp_path: Path) -> None:
    """Three times the data must not take much more memory: conversations are read one at a time
    and let go when they end (the 2 GB figure is for the benchmark; this is the mechanism)."""
    make = _many_hermes if fmt == "hermes" else _many_claude_code
    small = make(tmp_path / ("s.db" if fmt == "hermes" else "s"), 200)
    large = make(tmp_path / ("l.db" if fmt == "hermes" else "l"), 600)
    size = (
        (lambda p: p.stat().st_size)
        if fmt == "hermes"
        else (lambda p: sum(f.stat().st_size for f in p.iterdir()))
    )
    grown_mib = (size(large) - size(small)) / 2**20
    assert grown_mib > 60
    before = _peak_kib(fmt, small, tmp_path / "s.jsonl")
    after = _peak_kib(fmt, large, tmp_path / "l.jsonl")
    assert (after - before) / 1024 < grown_mib / 4, (before, after, grown_mib)


def test_synthetic_field_is_checked_by_the_reader(tmp_path: Path) -> None:
    path = codex_rollout(tmp_path / "rollout-a.jsonl")
    import_codex(
        path, tmp_path / "t.jsonl", ImportOptions(progress=True)
    )  # the bar, asked for on a small input
    lines = (tmp_path / "t.jsonl").read_bytes().splitlines()
    first = next(i for i, x in enumerate(lines) if b'"kind":"request"' in x)
    for bad in ([99], ["x"], 3):
        obj = orjson.loads(lines[first])
        obj["synthetic"] = bad
        (tmp_path / "bad.jsonl").write_bytes(
            b"\n".join([*lines[:first], orjson.dumps(obj), *lines[first + 1 :]])
        )
        with pytest.raises(TraceError, match=rf"bad\.jsonl:{first + 1}: request 1: synthetic"):
            validate(tmp_path / "bad.jsonl")


def test_a_system_prompt_changed_within_a_session_is_a_compaction(tmp_path: Path) -> None:
    info = SessionInfo(key="s", agent_ids=("s",))
    user = {"role": "user", "content": "hi"}
    reply = {"role": "assistant", "content": "hello"}
    steps = [
        Step(info, 100.0, [{"role": "system", "content": "prompt one"}, user], reply, done=101.0),
        Step(
            info, 102.0, [{"role": "system", "content": "prompt one"}, user, reply, user], reply, done=103.0
        ),
        Step(info, 104.0, [{"role": "system", "content": "prompt two"}, user], reply, done=105.0),
    ]
    counts = write_trace(steps, tmp_path / "t.jsonl", "import:test", "", ImportOptions())
    assert counts["compactions"] == 1
    trace = read_trace(tmp_path / "t.jsonl")
    assert [r.tag for r in trace.requests] == ["turn", "turn", "compaction"]
    assert trace.requests[1].after == {"request": 1, "delay_s": 1.0}


def test_hermes_in_place_compaction_summary_row(tmp_path: Path) -> None:
    """Newer stores compact in place: a `_compressed_summary` row replaces what came before."""
    s = HermesSession("20261130_090000_z", "cli", "sys")
    s.add(MORNING, "user", "first question " * 30)
    s.reply(MORNING + 5, "first answer")
    s.add(MORNING + 60, "user", "[CONTEXT COMPACTION] summary of it", _compressed_summary=1)
    s.add(MORNING + 61, "user", "go on")
    s.reply(MORNING + 65, "going on")
    import_hermes(write_hermes(tmp_path / "s.db", [s]), tmp_path / "t.jsonl")
    trace = read_trace(tmp_path / "t.jsonl")
    first, second = trace.requests
    assert second.tag == "compaction" and second.is_compaction
    assert [m["content"] for m in msgs(trace, second)] == [
        "sys",
        "[CONTEXT COMPACTION] summary of it",
        "go on",
    ]


_ROW = st.sampled_from(["user", "review", "call", "result", "reply"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(_ROW, st.floats(0, 30)), min_size=1, max_size=25))
def test_hermes_any_row_sequence_imports_in_time_order(tmp_path: Path, rows: list[tuple[str, float]]) -> None:
    """Whatever order Hermes wrote rows in, the trace is valid, in send order, and the main
    conversation never holds a review's harness prompt."""
    s = HermesSession("20261130_100000_h", "cli", "sys")
    t = MORNING
    for n, (kind, gap) in enumerate(rows):
        t += gap
        if kind == "user":
            s.add(t, "user", f"question {n}")
        elif kind == "review":
            s.add(t, "user", REVIEW)
        elif kind == "call":
            s.call(t, f"c{n}", "read_file", {"n": n})
        elif kind == "result":
            s.result(t, f"c{n - 1}", "read_file", f"result {n}")
        else:
            s.reply(t, f"answer {n}")
    (tmp_path / "h.db").unlink(missing_ok=True)  # hypothesis reuses the folder
    db = write_hermes(tmp_path / "h.db", [s])
    try:
        import_hermes(db, tmp_path / "t.jsonl")
    except UsageError as exc:
        assert "no API calls" in str(exc)
        assert not any(k in ("call", "reply") for k, _ in rows)
        return
    validate(tmp_path / "t.jsonl")
    trace = read_trace(tmp_path / "t.jsonl")
    assert [r.t for r in trace.requests] == sorted(r.t for r in trace.requests)
    for r in trace.requests:
        if not r.session.endswith("-review"):
            assert all(m.get("content") != REVIEW for m in msgs(trace, r))
