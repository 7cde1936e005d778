"""Importers (Claude Code, Mooncake, ShareGPT) and the Mooncake exporter, on hand-written samples."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from replay.engine.plans import make_plan
from replay.engine.run import EngineConfig
from replay.errors import TraceError, UsageError
from replay.importers.base import ImportOptions, estimate_tokens
from replay.importers.claude_code import REMINDER_TOKENS, import_claude_code
from replay.importers.mooncake import BLOCK, export_mooncake, import_mooncake
from replay.importers.registry import run_export, run_import
from replay.importers.sharegpt import import_sharegpt
from replay.record.tokens import tokens
from replay.runs.pipeline import run_trace
from replay.trace import materialize, read_trace, recorded_reply, validate
from replay.trace.materialize import text_of
from tests.support.recordkit import jsonl

DATA = Path(__file__).parent.parent / "data" / "record"


def messages(trace, req):
    return materialize(req, recorded_reply(trace.by_id()))


def test_claude_code_sessions_subagents_compaction_and_tool_calls(tmp_path):
    counts = import_claude_code(DATA / "claude_code", tmp_path / "cc.jsonl")
    assert counts == {
        "files": 2,
        "bad_lines": 1,
        "sessions": 3,
        "requests": 8,
        "compactions": 1,
        "filtered": 0,
    }
    validate(tmp_path / "cc.jsonl")
    trace = read_trace(tmp_path / "cc.jsonl")
    roles = {sid: s.role for sid, s in trace.sessions.items()}
    assert roles == {
        "cc-0a1b2c3d": "interactive",
        "cc-0a1b2c3d-side-1": "subagent",
        "cc-0a1b2c3d-agent-7f3e9a01": "subagent",
    }
    assert all(s.api == "anthropic" for s in trace.sessions.values())
    main = [r for r in trace.requests if r.session == "cc-0a1b2c3d"]
    assert [r.tag for r in main] == ["turn", "turn", "turn", "turn", "compaction"]
    assert [r.t for r in main] == [0.0, 5.0, 16.0, 60.0, 330.0]  # when each request left: its last entry
    # The reply that was split over two lines (text, then tool_use) is one message, spliced by $reply.
    first, second = main[0], main[1]
    assert first.reply["message"]["content"] == "I'll read the file first."
    assert first.reply["message"]["tool_calls"] == [
        {"id": "toolu_01", "name": "Read", "arguments": '{"file_path":"/home/dev/proj/parse.py"}'}
    ]
    assert first.reply["finish"] == "tool_calls" and first.usage == {
        "prompt_tokens": 5004,
        "cached_tokens": 0,
        "output_tokens": 40,
    }
    assert second.append[0] == {"$reply": first.id} and second.append[1]["tool_call_id"] == "toolu_01"
    assert second.after == {"request": first.id, "delay_s": 1.0}
    # Thinking is kept as reasoning, not resent; the synthetic "No response requested." is no request.
    assert main[1].reply["message"]["reasoning"] == "The split ignores quotes."
    assert not any(
        "No response requested" in text_of(m.get("content"))
        for r in trace.requests
        for m in messages(trace, r)[-1:]
    )
    # The system stand-in (billing line, identity line, prompt): sized from the first call's usage
    # less the messages, the tools and the <system-reminder> stand-in before the first prompt.
    sys_blocks = messages(trace, main[0])[:3]
    sys_main = sys_blocks[0]
    tools = main[0].params["tools"]
    assert [t["function"]["name"] for t in tools] == ["Read", "Task"]  # as the transcript used them
    tool_tokens = estimate_tokens([{"role": "system", "content": orjson.dumps(tools).decode()}])
    assert [m["role"] for m in sys_blocks] == ["system"] * 3
    assert sum(len(m["content"].split()) for m in sys_blocks) == 5004 - 8 - tool_tokens - REMINDER_TOKENS
    assert messages(trace, main[0])[3]["content"].startswith("<system-reminder>")
    assert main[0].params["max_tokens"] == 40  # what the reply used, as the transcript says
    compacted = main[-1]
    msgs = messages(trace, compacted)
    assert compacted.keep == 3 and compacted.is_compaction  # the system blocks survive
    assert [m["role"] for m in msgs] == ["system", "system", "system", "user", "user"]
    assert "This session is being continued" in msgs[3]["content"]
    side = [r for r in trace.requests if r.session.endswith("side-1")]
    assert len(side) == 2 and messages(trace, side[0])[3]["content"] == "Search for all callers of parse()"
    assert side[1].append[0] == {"$reply": side[0].id}
    # One stand-in per session (Claude Code's billing line makes sessions share no prefix) ...
    agent_sys = messages(trace, next(r for r in trace.requests if "agent" in r.session))[0]["content"]
    side_sys = messages(trace, side[0])[0]["content"]
    assert len({" ".join(x.split()[:50]) for x in (agent_sys, side_sys, sys_main["content"])}) == 3
    # ... or one per kind with --shared-system.
    import_claude_code(
        DATA / "claude_code", tmp_path / "shared.jsonl", options=ImportOptions(shared_system=True)
    )
    shared = read_trace(tmp_path / "shared.jsonl")
    firsts = {r.session: messages(shared, r)[0]["content"].split()[:50] for r in shared.requests}
    assert firsts["cc-0a1b2c3d-side-1"] == firsts["cc-0a1b2c3d-agent-7f3e9a01"] != firsts["cc-0a1b2c3d"]


def test_claude_code_parallel_tool_results_on_sibling_entries(tmp_path):
    """Two tool results that both hang off the assistant entry: the next call gets both."""
    base = {"sessionId": "s", "isSidechain": False, "timestamp": "2025-06-01T10:00:00Z"}
    tool_use = [{"type": "tool_use", "id": f"t{i}", "name": "Read", "input": {"n": i}} for i in (1, 2)]
    rows = [
        {
            **base,
            "type": "user",
            "uuid": "u1",
            "parentUuid": None,
            "message": {"role": "user", "content": "go"},
        },
        {
            **base,
            "type": "assistant",
            "uuid": "a1",
            "parentUuid": "u1",
            "message": {"id": "m1", "role": "assistant", "model": "c", "content": tool_use},
        },
        {
            **base,
            "type": "user",
            "uuid": "r1",
            "parentUuid": "a1",
            "message": {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "one"}],
            },
        },
        {
            **base,
            "type": "user",
            "uuid": "r2",
            "parentUuid": "a1",
            "message": {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "two"}],
            },
        },
        {
            **base,
            "type": "assistant",
            "uuid": "a2",
            "parentUuid": "r2",
            "message": {"id": "m2", "role": "assistant", "model": "c", "content": "done"},
        },
    ]
    src = tmp_path / "s.jsonl"
    src.write_bytes(b"\n".join(orjson.dumps(r) for r in rows))
    import_claude_code(src, tmp_path / "t.jsonl", system_tokens=0)
    trace = read_trace(tmp_path / "t.jsonl")
    msgs = messages(trace, trace.requests[1])
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "tool"]
    assert [m["tool_call_id"] for m in msgs[2:]] == ["t2", "t1"]


def test_claude_code_rejects_what_is_not_a_transcript(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"hello": 1}\n')
    with pytest.raises(TraceError, match="no assistant replies"):
        import_claude_code(tmp_path / "x.jsonl", tmp_path / "t.jsonl")


def test_mooncake_import_shares_blocks_exactly_where_hash_ids_are_equal(tmp_path):
    counts = import_mooncake(DATA / "mooncake.jsonl", tmp_path / "t.jsonl")
    assert counts == {
        "requests": 5,
        "sessions": 3,
        "blocks": 17,
        "shared_blocks": 8,
        "common_blocks": 0,
        "filtered": 0,
    }
    validate(tmp_path / "t.jsonl")
    trace = read_trace(tmp_path / "t.jsonl")
    words = [list(tokens(messages(trace, r)[0]["content"])) for r in trace.requests]
    assert [len(w) for w in words] == [1536, 1300, 2000, 700, 2560]  # as many tokens as input_length
    assert [r.session for r in trace.requests] == ["mc1", "mc2", "mc1", "mc3", "mc1"]
    assert [r.t for r in trace.requests] == [0.0, 0.501, 2.519, 2.938, 5.668]
    assert [r.reply["output_tokens"] for r in trace.requests] == [52, 17, 40, 8, 31]

    def blocks(w: list[str]) -> list[list[str]]:
        return [w[i : i + BLOCK] for i in range(0, len(w), BLOCK)]

    b = [blocks(w) for w in words]
    assert b[0][:2] == b[1][:2] and b[0][2] != b[1][2][: len(b[0][2])]  # ids 46 47 shared, 48 vs 49 not
    assert b[2][:3] == b[0] and b[4][:3] == b[0]  # 46 47 48
    assert b[4][3][: len(b[2][3])] != b[2][3]  # 54 is not 50
    assert b[3][0] != b[0][0]


def renumber(rows: list[dict]) -> list[list[int]]:
    ids: dict[int, int] = {}
    return [[ids.setdefault(h, len(ids)) for h in r["hash_ids"]] for r in rows]


def test_mooncake_export_round_trips_the_import(tmp_path):
    import_mooncake(DATA / "mooncake.jsonl", tmp_path / "t.jsonl")
    counts = export_mooncake(tmp_path / "t.jsonl", tmp_path / "back.jsonl")
    assert counts == {"requests": 5, "blocks": 17}
    orig, back = jsonl(DATA / "mooncake.jsonl"), jsonl(tmp_path / "back.jsonl")
    t0 = orig[0]["timestamp"]
    assert [r["timestamp"] for r in back] == [r["timestamp"] - t0 for r in orig]
    for key in ("input_length", "output_length"):
        assert [r[key] for r in back] == [r[key] for r in orig]
    assert renumber(back) == renumber(orig)


def test_mooncake_export_of_a_conversation_shares_ids_along_its_prefix(tmp_path):
    sample = Path("traces/sample.jsonl")
    export_mooncake(sample, tmp_path / "m.jsonl")
    rows = jsonl(tmp_path / "m.jsonl")
    trace = read_trace(sample)
    assert len(rows) == len(trace.requests)
    main = [
        r
        for r, req in zip(rows, sorted(trace.requests, key=lambda q: q.t), strict=True)
        if req.session == "main"
    ]
    # main's turns extend each other: every full block of a turn is the next turn's prefix
    for prev, nxt in zip(main[:3], main[1:4], strict=True):
        full = prev["input_length"] // BLOCK
        assert (
            nxt["hash_ids"][:full] == prev["hash_ids"][:full] and nxt["input_length"] > prev["input_length"]
        )
    cron = [
        r
        for r, req in zip(rows, sorted(trace.requests, key=lambda q: q.t), strict=True)
        if req.session == "cron"
    ]
    # they share a 2000-token system prompt: three full blocks, then they part
    assert (
        main[0]["hash_ids"][:3] == cron[0]["hash_ids"][:3]
        and main[0]["hash_ids"][3] != cron[0]["hash_ids"][3]
    )
    assert all(len(r["hash_ids"]) == -(-r["input_length"] // BLOCK) for r in rows)


def test_mooncake_rejects_inconsistent_rows(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 2000, "output_length": 1, "hash_ids": [1]}\n')
    with pytest.raises(TraceError, match="does not fit"):
        import_mooncake(bad, tmp_path / "t.jsonl")


def test_sharegpt_every_turn_is_a_request(tmp_path):
    counts = import_sharegpt(DATA / "sharegpt.json", tmp_path / "t.jsonl")
    assert counts == {"conversations": 4, "skipped": 1, "requests": 7}
    validate(tmp_path / "t.jsonl")
    trace = read_trace(tmp_path / "t.jsonl")
    by_session: dict[str, list] = {}
    for r in trace.requests:
        by_session.setdefault(r.session, []).append(r)
    assert list(by_session) == ["sg-QWJhYvA_0", "sg-gpt-first", "sg-double-human", "sg-role-style"]
    tutor = by_session["sg-QWJhYvA_0"]
    assert len(tutor) == 3
    last = messages(trace, tutor[-1])
    assert [m["role"] for m in last] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert tutor[1].append[0] == {"$reply": tutor[0].id} and tutor[2].after == {
        "request": tutor[1].id,
        "delay_s": 2.0,
    }
    assert (
        tutor[-1].reply["message"]["content"] == "Yes, 2 is the only even prime."
        and tutor[-1].reply["output_tokens"] == 9
    )
    double = by_session["sg-double-human"]
    assert [len(messages(trace, r)) for r in double] == [2, 4] and double[-1].reply is None
    assert messages(trace, by_session["sg-gpt-first"][0])[0]["role"] == "assistant"
    assert [r.t for r in trace.requests] == sorted(r.t for r in trace.requests)


def test_dispatch_by_format_and_errors(tmp_path):
    line = run_import("sharegpt", DATA / "sharegpt.json", tmp_path / "t.jsonl")
    assert line.startswith(f"{tmp_path / 't.jsonl'}: 7 requests in 4 sessions")
    assert "mooncake" in run_export("mooncake", tmp_path / "t.jsonl", tmp_path / "m.jsonl")
    with pytest.raises(UsageError, match="cannot import 'csv'"):
        run_import("csv", DATA / "sharegpt.json", tmp_path / "x.jsonl")
    with pytest.raises(UsageError, match="does not exist"):
        run_import("mooncake", tmp_path / "missing.jsonl", tmp_path / "x.jsonl")


@pytest.mark.parametrize(
    ("convert", "src", "n"),
    [
        (import_claude_code, DATA / "claude_code", 8),
        (import_mooncake, DATA / "mooncake.jsonl", 5),
        (import_sharegpt, DATA / "sharegpt.json", 7),
    ],
)
def test_imported_traces_replay(scripted_server, tmp_path, convert, src, n):
    convert(src, tmp_path / "t.jsonl")
    config = EngineConfig(base_url=scripted_server.url, timeout_s=10.0, run_id="imp")
    outcome = run_trace(
        read_trace(tmp_path / "t.jsonl"), make_plan("alternate"), config, tmp_path / "r.jsonl", {}
    )
    assert outcome.exit_code == 0 and outcome.requests == n
    assert len(scripted_server.seen) == n
