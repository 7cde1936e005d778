"""Importers of public agent corpora (WEKA Claude Code traces, OpenTelemetry GenAI spans,
Mini-SWE-agent / SWE-agent trajectories), on fixtures written in those formats."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay.errors import ReplayError, TraceError, UsageError
from replay.importers.base import ImportOptions
from replay.importers.otel import import_otel
from replay.importers.registry import run_import
from replay.importers.swe import import_swe
from replay.importers.weka import _Seeds, block_content, block_parts, import_weka
from replay.record.tokens import tokens
from replay.trace import materialize, read_trace, recorded_reply, validate

DATA = Path(__file__).parent.parent / "data" / "record"
FUNC = [HealthCheck.function_scoped_fixture]


def words(trace, req) -> list[str]:
    msgs = materialize(req, recorded_reply(trace.by_id()))
    return [
        w for m in msgs for w in tokens(m["content"] if isinstance(m["content"], str) else str(m["content"]))
    ]


def texts(trace, req) -> list[str]:
    from replay.trace.materialize import text_of

    return [text_of(m.get("content")) for m in materialize(req, recorded_reply(trace.by_id()))]


# ---- WEKA ---------------------------------------------------------------------------------------------


def test_weka_sessions_subagents_sizes_and_gaps(tmp_path: Path) -> None:
    counts = import_weka(DATA / "weka.jsonl", tmp_path / "t.jsonl")
    assert counts == {
        "traces": 2,
        "sessions": 3,
        "subagents": 1,
        "joins": 1,
        "requests": 7,
        "blocks": 20,
        "filtered": 0,
    }
    validate(tmp_path / "t.jsonl")
    trace = read_trace(tmp_path / "t.jsonl")
    reqs = trace.requests
    assert [r.session for r in reqs] == ["w1", "w1", "w1.a1", "w1.a1", "w1", "w2", "w2"]
    assert [len(tokens(texts(trace, r)[0])) for r in reqs] == [150, 200, 100, 140, 300, 64, 128]  # `in`
    assert [r.reply["output_tokens"] for r in reqs] == [20, 30, 10, 12, 25, 5, 5]
    assert [r.t for r in reqs] == [0.0, 5.0, 7.5, 9.0, 400.0, 0.0, 3.0]
    # the subagent's first request follows the parent request before it (t 5 + api_time 1.5 -> 7.5)
    assert reqs[2].after == {"request": 2, "delay_s": 1.0, "spawn": True}
    # the parent's next request waited for the subagent (returned at 7 + 6 s): its gap runs from there
    assert reqs[4].after == {"request": 2, "delay_s": 387.0, "waits": [4]}
    assert reqs[3].after == {"request": 3, "delay_s": 0.5}
    assert reqs[1].after == {"request": 1, "delay_s": 3.0}
    sessions = (
        {s.id: s for s in trace.sessions.values()}
        if isinstance(trace.sessions, dict)
        else {s.id: s for s in trace.sessions}
    )
    assert sessions["w1.a1"].role == "subagent" and sessions["w1.a1"].labels["parent"] == "w1"
    t = [tokens(texts(trace, r)[0]) for r in reqs]
    assert t[0][:64] == t[1][:64] == t[2][:64] == t[4][:64]  # block 1 in parent and subagent
    assert t[1][:190] == t[4][:190]  # blocks 1 2 4, and 5 (partial in request 2) begins block 5
    assert t[0][128:140] != t[1][128:140]  # block 3 vs 4
    assert t[5][:64] != t[0][:64]  # hash ids are per trace: trace 2's block 1 is other text


def test_weka_gap_cap_shortens_idle_gaps(tmp_path: Path) -> None:
    import_weka(DATA / "weka.jsonl", tmp_path / "t.jsonl", options=ImportOptions(gap_cap=30.0))
    reqs = read_trace(tmp_path / "t.jsonl").requests
    assert [r.t for r in reqs] == [0.0, 5.0, 7.5, 9.0, 39.0, 0.0, 3.0]  # 391 s of idle shortened to 30
    assert reqs[4].after == {"request": 2, "delay_s": 30.0, "waits": [4]}


def test_weka_session_filter_and_cli(tmp_path: Path) -> None:
    line = run_import("weka", DATA / "weka.jsonl", tmp_path / "t.jsonl", ImportOptions(sessions=("w2",)))
    assert "2 requests in 1 sessions from weka" in line
    with pytest.raises(UsageError, match="no wall-clock"):
        run_import("weka", DATA / "weka.jsonl", tmp_path / "u.jsonl", ImportOptions(since=5.0))


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (b"{not json", "bad JSON"),
        (b'{"id": "x", "block_size": 64}', "no 'requests' list"),
        (b'{"id": "x", "block_size": 0, "requests": []}', "block_size must be"),
        (b'{"block_size": 4, "requests": [{"t": 0, "type": "q"}]}', "request 0: unknown type 'q'"),
        (b'{"block_size": 4, "requests": [{"t": 0, "type": "n", "in": -1, "out": 1}]}', "'in' must be"),
        (
            b'{"block_size": 4, "requests": [{"t": 0, "type": "subagent", "requests": [{"t": 1, "type": "n", "in": 2}]}]}',
            "request 0 (subagent) request 0: 'out' must be",
        ),
        (
            b'{"block_size": 4, "requests": [{"t": 0, "type": "n", "in": 4, "out": 1, "hash_ids": ["a"]}]}',
            "hash_ids",
        ),
    ],
)
def test_weka_bad_input_names_file_and_line(tmp_path: Path, line: bytes, problem: str) -> None:
    good = orjson.dumps(
        {"id": "g", "block_size": 4, "requests": [{"t": 0, "type": "n", "in": 4, "out": 1, "hash_ids": [1]}]}
    )
    src = tmp_path / "w.jsonl"
    src.write_bytes(good + b"\n\n" + line + b"\n")
    with pytest.raises(TraceError) as err:
        import_weka(src, tmp_path / "t.jsonl")
    assert err.value.line == 3 and problem in str(err.value) and str(src) in str(err.value)


@st.composite
def weka_traces(draw: st.DrawFn) -> list[dict]:
    out = []
    for _ in range(draw(st.integers(1, 3))):
        block = draw(st.integers(2, 16))
        reqs = []
        t = 0.0
        for _ in range(draw(st.integers(1, 5))):
            ids = draw(st.lists(st.integers(0, 5), max_size=6))
            n = draw(st.integers(0, block * (len(ids) + 1)))
            t += draw(st.floats(0, 100))
            row = {
                "t": t,
                "type": draw(st.sampled_from(["n", "s"])),
                "model": "m",
                "in": n,
                "out": draw(st.integers(0, 9)),
                "hash_ids": ids,
                "api_time": draw(st.floats(0, 10)),
            }
            if draw(st.booleans()):
                row = {
                    "t": t,
                    "type": "subagent",
                    "agent_id": draw(st.sampled_from(["a", "b"])),
                    "requests": [dict(row, type="n", t=t + 0.1)],
                }
            reqs.append(row)
        out.append({"id": draw(st.sampled_from(["x", "y", "z"])), "block_size": block, "requests": reqs})
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=FUNC)
@given(weka_traces(), st.one_of(st.none(), st.floats(0, 50)))
def test_weka_property_sizes_and_sharing(tmp_path: Path, rows: list[dict], cap: float | None) -> None:
    src = tmp_path / "w.jsonl"
    src.write_bytes(b"\n".join(orjson.dumps(r) for r in rows))
    wanted: list[dict] = []  # the request rows in the order the importer writes them
    for tr in rows:
        flat = [
            dict(sub, block=tr["block_size"])
            for r in tr["requests"]
            for sub in (r["requests"] if r["type"] == "subagent" else [r])
        ]
        wanted += [row for _, row in sorted(enumerate(flat), key=lambda x: (x[1]["t"], x[0]))]
    try:
        import_weka(src, tmp_path / "t.jsonl", options=ImportOptions(gap_cap=cap))
    except UsageError:
        assert not wanted
        return
    validate(tmp_path / "t.jsonl")
    trace = read_trace(tmp_path / "t.jsonl")
    got = [tokens(texts(trace, r)[0]) for r in trace.requests]
    assert [len(g) for g in got] == [w["in"] for w in wanted]  # every prompt at its recorded size
    assert [r.reply["output_tokens"] for r in trace.requests] == [w["out"] for w in wanted]
    if cap is not None:
        assert all(r.after is None or r.after["delay_s"] <= cap for r in trace.requests)
    # fan-out: a spawned session follows a request of its parent; a parent waits for its own subagents
    by_id = {r.id: r for r in trace.requests}
    for r in trace.requests:
        after = r.after or {}
        if after.get("spawn"):
            assert by_id[after["request"]].session == r.session.split(".")[0] != r.session
        for w in after.get("waits", ()):
            assert by_id[w].session.startswith(r.session + ".") and by_id[w].t <= r.t
    # within a trace, requests whose first k ids are equal (as whole blocks) share k blocks of text
    trace_of = [r.session.split(".")[0] for r in trace.requests]
    for i, a in enumerate(wanted):
        for j in range(i):
            b = wanted[j]
            if trace_of[i] != trace_of[j]:
                continue
            k = 0
            bs = a["block"]
            while k < min(len(a["hash_ids"]), len(b["hash_ids"])) and a["hash_ids"][k] == b["hash_ids"][k]:
                k += 1
            whole = min(k, a["in"] // bs, b["in"] // bs)
            assert got[i][: whole * bs] == got[j][: whole * bs]


@given(st.lists(st.integers(0, 9), max_size=8), st.integers(1, 32), st.integers(0, 300))
def test_block_parts_property(ids: list[int], block: int, length: int) -> None:
    parts = block_parts(ids, length, block, tail_seed=7)
    text = materialize_parts(parts)
    assert len(tokens(text)) == length
    # two id lists with a common prefix of whole blocks give a common prefix of text
    other = block_parts([*ids[:1], 99], length, block, tail_seed=8)
    if ids and length >= block:
        assert tokens(materialize_parts(other))[:block] == tokens(text)[:block]


@given(
    st.lists(st.integers(-(2**70), 2**70), max_size=40),
    st.integers(1, 70),
    st.integers(0, 3000),
    st.integers(0, 3),
)
def test_block_content_writes_what_block_parts_builds(
    ids: list[int], block: int, length: int, reuse: int
) -> None:
    """The importer's fast path (each block id's JSON cached, only the ends built as dicts) writes
    exactly the bytes of `block_parts`, whatever the ids, the block size, the prompt length (fewer
    tokens than the ids cover, or more: a tail), and ids seen before in the same trace."""
    seeds = _Seeds("trace-1", block)
    for _ in range(reuse + 1):  # the second time round, every middle block comes from the cache
        fast = block_content(ids, length, block, 7, seeds)
        assert (
            orjson.dumps([fast])
            == b"[" + orjson.dumps(block_parts(ids, length, block, 7, _Seeds("trace-1"))) + b"]"
        )


def materialize_parts(parts: list[dict]) -> str:
    from replay.trace.materialize import text_of

    return text_of(parts)


FUZZ_KEYS = [
    "id",
    "block_size",
    "requests",
    "t",
    "type",
    "in",
    "out",
    "hash_ids",
    "api_time",  # weka
    "resourceSpans",
    "scopeSpans",
    "spans",
    "attributes",
    "key",
    "value",
    "stringValue",
    "name",  # otel
    "startTimeUnixNano",
    "start_time",
]


@pytest.mark.parametrize("importer", ["weka", "otel", "swe-agent"])
def test_fuzzed_lines_fail_cleanly(tmp_path: Path, importer: str) -> None:
    """Any JSON line imports to a valid trace or fails with a one-line error at file:1."""
    convert = {"weka": import_weka, "otel": import_otel, "swe-agent": import_swe}[importer]
    leaves = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats() | st.text(max_size=3)

    @settings(max_examples=80, deadline=None)
    @given(
        st.recursive(
            leaves,
            lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(FUZZ_KEYS), c, max_size=6),
            max_leaves=20,
        )
    )
    def run(obj: object) -> None:
        src = tmp_path / "f.jsonl"
        src.write_bytes(orjson.dumps(obj))
        try:
            convert(src, tmp_path / "t.jsonl")
        except (TraceError, UsageError) as exc:
            assert isinstance(exc, ReplayError)
            if isinstance(exc, TraceError):
                assert exc.line == 1
        else:
            validate(tmp_path / "t.jsonl")

    run()


def cli(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replay", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_cli_imports_weka_with_gap_cap_and_names_a_bad_line(tmp_path: Path) -> None:
    res = cli("import", "weka", DATA / "weka.jsonl", tmp_path / "t.jsonl", "--gap-cap", "30")
    assert res.returncode == 0, res.stderr
    assert "7 requests in 3 sessions from weka" in " ".join(res.stdout.split())
    assert read_trace(tmp_path / "t.jsonl").requests[4].t == 39.0
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes((DATA / "weka.jsonl").read_bytes() + b'{"block_size": 4, "requests": 3}\n')
    res = cli("import", "weka", bad, tmp_path / "u.jsonl")
    assert (
        res.returncode == 2
        and f"{bad}:3: not a WEKA trace" in " ".join(res.stderr.split())
        and not (tmp_path / "u.jsonl").exists()
    )


# ---- OpenTelemetry GenAI spans --------------------------------------------------------------------


def test_otel_conversations_tool_calls_usage_and_gaps(tmp_path: Path) -> None:
    counts = import_otel(DATA / "otel.jsonl", tmp_path / "t.jsonl")
    assert counts == {
        "spans": 5,
        "no_prompt": 1,
        "dropped_parts": 1,
        "sessions": 2,
        "requests": 4,
        "compactions": 0,
        "filtered": 0,
    }
    validate(tmp_path / "t.jsonl")
    trace = read_trace(tmp_path / "t.jsonl")
    reqs = trace.requests
    assert [r.session for r in reqs] == ["conv-1", "t2", "conv-1", "conv-1"]
    assert [r.t for r in reqs] == [0.0, 1.0, 3.0, 65.0]
    assert trace.sessions["conv-1"].api == "anthropic" and trace.sessions["t2"].api == "openai"
    first = messages_of(trace, reqs[0])
    assert [m["role"] for m in first] == ["system", "user"]
    third = messages_of(trace, reqs[2])
    assert [m["role"] for m in third] == ["system", "user", "assistant", "tool"]
    assert third[2]["tool_calls"] == [{"id": "c1", "name": "read_file", "arguments": '{"path":"parser.py"}'}]
    assert reqs[2].append[0] == {"$reply": 1}  # the recorded reply is the history: live replies splice in
    assert reqs[2].after == {"request": 1, "delay_s": 1.0} and reqs[3].after == {
        "request": 3,
        "delay_s": 61.0,
    }
    assert reqs[2].usage == {"prompt_tokens": 160, "cached_tokens": 110, "output_tokens": 14}
    assert reqs[0].reply["finish"] == "tool_calls"
    assert messages_of(trace, reqs[1]) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]
    assert reqs[1].params["temperature"] == 0.2
    tools = reqs[0].params["tools"]
    assert tools[0]["function"]["name"] == "read_file" and "parameters" in tools[0]["function"]


def test_otel_gap_cap_and_flat_spans(tmp_path: Path) -> None:
    import_otel(DATA / "otel.jsonl", tmp_path / "t.jsonl", options=ImportOptions(gap_cap=5.0))
    reqs = read_trace(tmp_path / "t.jsonl").requests
    # the 61.5 s between the last two span starts (3.5, a span without a prompt, and 65) becomes 5
    assert [r.t for r in reqs] == [0.0, 1.0, 3.0, 8.5] and reqs[3].after == {"request": 3, "delay_s": 4.5}
    flat = {
        "trace_id": "x",
        "spans": [
            {
                "span_id": "a",
                "start_time": "2026-02-25T10:00:00",
                "end_time": "2026-02-25T10:00:02",
                "name": "chat gpt-4",
                "attributes": {
                    "exgentic.session.id": "s",
                    "gen_ai.request.model": "gpt-4",
                    "gen_ai.input.messages": '[{"role": "user", "content": "Q?"}]',
                    "gen_ai.output.text": "A.",
                },
            },
            {
                "span_id": "b",
                "start_time": "2026-02-25T10:00:03",
                "end_time": "2026-02-25T10:00:04",
                "name": "chat gpt-4",
                "attributes": {
                    "exgentic.session.id": "s",
                    "gen_ai.input.messages": '[{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A."}, {"role": "user", "content": "More."}]',
                },
            },
        ],
    }
    src = tmp_path / "flat.json"
    src.write_bytes(orjson.dumps(flat))
    assert import_otel(src, tmp_path / "f.jsonl")["requests"] == 2
    reqs = read_trace(tmp_path / "f.jsonl").requests
    assert reqs[1].append[0] == {"$reply": 1} and reqs[1].after == {"request": 1, "delay_s": 1.0}


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (b"[1, 2", "bad JSON"),
        (b'{"foo": 1}', "not OTLP JSON"),
        (b'{"spans": [{"span_id": "z", "name": "chat m", "attributes": {}}]}', "span 'z': no start time"),
        (
            b'{"spans": [{"span_id": "z", "start_time": "2026-01-01T00:00:00", "name": "chat m", "attributes": {"gen_ai.input.messages": "[{"}}]}',
            "span 'z': gen_ai.input.messages is not JSON",
        ),
        (
            b'{"spans": [{"span_id": "z", "start_time": "2026-01-01T00:00:00", "name": "chat m", "attributes": {"gen_ai.input.messages": "[{\\"role\\": \\"robot\\"}]"}}]}',
            "span 'z': unknown role 'robot'",
        ),
    ],
)
def test_otel_bad_input_names_file_and_line(tmp_path: Path, line: bytes, problem: str) -> None:
    src = tmp_path / "o.jsonl"
    src.write_bytes((DATA / "otel.jsonl").read_bytes() + line + b"\n")
    with pytest.raises(TraceError) as err:
        import_otel(src, tmp_path / "t.jsonl")
    assert err.value.line == 3 and problem in str(err.value) and str(src) in str(err.value)


_roles = st.sampled_from(["user", "assistant", "tool"])


@st.composite
def otel_lines(draw: st.DrawFn) -> list[dict]:
    lines = []
    for _ in range(draw(st.integers(1, 3))):
        spans = []
        for _ in range(draw(st.integers(0, 4))):
            conv = draw(st.sampled_from(["a", "b", "c"]))
            msgs = [
                {"role": draw(_roles), "parts": [{"type": "text", "content": draw(st.text(max_size=8))}]}
                for _ in range(draw(st.integers(0, 4)))
            ]
            start = draw(st.integers(0, 10**12))
            attrs = [
                {
                    "key": "gen_ai.operation.name",
                    "value": {"stringValue": draw(st.sampled_from(["chat", "embeddings"]))},
                },
                {"key": "gen_ai.conversation.id", "value": {"stringValue": conv}},
                {"key": "gen_ai.input.messages", "value": {"stringValue": orjson.dumps(msgs).decode()}},
                {"key": "gen_ai.usage.output_tokens", "value": {"intValue": str(draw(st.integers(0, 99)))}},
            ]
            spans.append(
                {
                    "traceId": "t",
                    "spanId": f"s{len(spans)}",
                    "name": "chat",
                    "startTimeUnixNano": str(start),
                    "endTimeUnixNano": str(start + draw(st.integers(0, 10**10))),
                    "attributes": attrs,
                }
            )
        lines.append({"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": spans}]}]})
    return lines


@settings(max_examples=60, deadline=None, suppress_health_check=FUNC)
@given(otel_lines(), st.one_of(st.none(), st.floats(0, 20)))
def test_otel_property_every_chat_span_with_a_prompt_is_a_request(
    tmp_path: Path, lines: list[dict], cap: float | None
) -> None:
    src = tmp_path / "o.jsonl"
    src.write_bytes(b"\n".join(orjson.dumps(x) for x in lines))
    spans = [
        s
        for x in lines
        for s in x["resourceSpans"][0]["scopeSpans"][0]["spans"]
        if s["attributes"][0]["value"]["stringValue"] == "chat"
    ]
    with_prompt = [s for s in spans if orjson.loads(s["attributes"][2]["value"]["stringValue"])]
    try:
        counts = import_otel(src, tmp_path / "t.jsonl", options=ImportOptions(gap_cap=cap))
    except UsageError:
        assert not with_prompt
        return
    validate(tmp_path / "t.jsonl")
    trace = read_trace(tmp_path / "t.jsonl")
    assert counts["requests"] == len(with_prompt) and counts["no_prompt"] == len(spans) - len(with_prompt)
    # each request's messages are its span's, in order, and times never go backwards
    want = sorted(
        (
            int(s["startTimeUnixNano"]),
            [m["role"] for m in orjson.loads(s["attributes"][2]["value"]["stringValue"])],
        )
        for s in with_prompt
    )
    got = [[m["role"] for m in messages_of(trace, r)] for r in trace.requests]
    assert sorted(got) == sorted(w for _, w in want)
    ts = [r.t for r in trace.requests]
    assert ts == sorted(ts)
    if cap is not None:
        assert all(r.after is None or r.after["delay_s"] <= cap for r in trace.requests)


def messages_of(trace, req) -> list[dict]:
    return materialize(req, recorded_reply(trace.by_id()))


# ---- Mini-SWE-agent / SWE-agent -------------------------------------------------------------------


def test_swe_agent_mini_and_classic_runs(tmp_path: Path) -> None:
    counts = import_swe(DATA / "swe", tmp_path / "t.jsonl")
    assert counts == {
        "files": 2,
        "timed": 3,
        "no_query": 0,
        "dropped_parts": 0,
        "sessions": 2,
        "requests": 6,
        "compactions": 0,
        "filtered": 0,
    }
    validate(tmp_path / "t.jsonl")
    trace = read_trace(tmp_path / "t.jsonl")
    reqs = trace.requests
    assert [r.session for r in reqs] == [
        "astropy-7",
        "django-1234",
        "astropy-7",
        "astropy-7",
        "django-1234",
        "django-1234",
    ]
    # mini: sent at the completion's `created`, the gap is from the previous reply's arrival
    assert [r.t for r in reqs] == [0.0, 0.0, 2.5, 3.0, 5.0, 127.0]
    assert reqs[4].after == {"request": 2, "delay_s": 2.5} and reqs[5].after == {
        "request": 5,
        "delay_s": 120.0,
    }
    assert reqs[4].usage == {"prompt_tokens": 1000, "cached_tokens": 896, "output_tokens": 30}
    assert reqs[5].reply["finish"] == "stop"
    # every reply is the next request's history, so live replies splice in
    assert [r.append[0] for r in reqs[2:]] == [{"$reply": 1}, {"$reply": 3}, {"$reply": 2}, {"$reply": 5}]
    last = messages_of(trace, reqs[5])
    assert [m["role"] for m in last] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert last[3]["tool_call_id"] == "call_1" and "extra" not in last[2]
    assert [t["function"]["name"] for t in reqs[1].params["tools"]] == ["bash"]  # stand-in, every request
    # SWE-agent: spaced by the tool times; the tool message keeps its call id
    classic = messages_of(trace, reqs[3])
    assert classic[-1] == {"role": "tool", "content": "edited", "tool_call_id": "t1"}
    assert reqs[3].after == {"request": 3, "delay_s": 0.5}
    capped = tmp_path / "c.jsonl"
    import_swe(DATA / "swe", capped, options=ImportOptions(gap_cap=10.0))
    assert [r.t for r in read_trace(capped).requests] == [0.0, 0.0, 2.5, 3.0, 5.0, 15.0]


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"{", "bad JSON"),
        (b'{"info": {}}', "no 'messages' or 'trajectory' list"),
        (
            b'{"messages": [{"role": "user", "content": "a"}, {"role": "wizard", "content": "b"}]}',
            "messages[1]: unknown role 'wizard'",
        ),
        (b'{"messages": [{"role": "user", "content": 3}]}', "content must be text"),
        (
            b'{"trajectory": [{"query": [{"role": "user", "content": "x"}, 7]}]}',
            "trajectory[0].query[1] must be an object",
        ),
    ],
)
def test_swe_bad_input_names_the_file(tmp_path: Path, body: bytes, problem: str) -> None:
    src = tmp_path / "x.traj.json"
    src.write_bytes(body)
    with pytest.raises(TraceError) as err:
        import_swe(src, tmp_path / "t.jsonl")
    assert err.value.line == 1 and problem in str(err.value) and str(src) in str(err.value)


@settings(max_examples=60, deadline=None, suppress_health_check=FUNC)
@given(
    st.lists(st.sampled_from(["user", "assistant", "tool", "exit"]), max_size=12),
    st.lists(st.floats(0, 500), min_size=12, max_size=12),
    st.one_of(st.none(), st.floats(0, 30)),
)
def test_swe_mini_property_one_request_per_reply(
    tmp_path: Path, roles: list[str], gaps: list[float], cap: float | None
) -> None:
    msgs: list[dict] = [{"role": "system", "content": "s"}]
    clock = 1_700_000_000.0
    for k, role in enumerate(roles):
        m: dict = {"role": role, "content": f"m{k}"}
        if role == "tool":
            m["tool_call_id"] = f"c{k}"
        if role == "assistant":
            clock += gaps[k]
            m["extra"] = {
                "response": {"created": clock, "usage": {"completion_tokens": k}},
                "timestamp": clock + 1,
            }
            clock += 1
        msgs.append(m)
    src = tmp_path / "r.traj.json"
    src.write_bytes(orjson.dumps({"messages": msgs, "trajectory_format": "mini-swe-agent-1.1"}))
    try:
        import_swe(src, tmp_path / "t.jsonl", options=ImportOptions(gap_cap=cap))
    except UsageError:
        assert "assistant" not in roles
        return
    validate(tmp_path / "t.jsonl")
    trace = read_trace(tmp_path / "t.jsonl")
    kept = [m for m in msgs if m["role"] != "exit"]
    replies = [i for i, m in enumerate(kept) if m["role"] == "assistant"]
    assert len(trace.requests) == len(replies)
    for req, i in zip(trace.requests, replies, strict=True):
        assert [m["content"] for m in messages_of(trace, req)] == [m["content"] for m in kept[:i]]
        assert req.reply["message"]["content"] == kept[i]["content"]
        if cap is not None and req.after is not None:
            assert req.after["delay_s"] <= cap
    ts = [r.t for r in trace.requests]
    assert ts == sorted(ts)


def test_a_long_trajectory_hashes_each_message_once(tmp_path: Path, monkeypatch) -> None:
    """Each request of a session extends the last one: the writer takes the keys of the messages
    they share from it, so 300 steps hash each message about once (hashing the whole history twice
    on every request was 180,599 hashes here, and kept a 2 GB corpus near 1 MB/s)."""
    import replay.trace.writer as writer

    calls = 0
    real = writer.visible_key

    def counted(msg: dict) -> int:
        nonlocal calls
        calls += 1
        return real(msg)

    monkeypatch.setattr(writer, "visible_key", counted)
    msgs: list[dict] = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    for k in range(300):
        created = 1_700_000_000.0 + 10 * k
        extra = {
            "response": {"created": created, "usage": {"completion_tokens": 3}},
            "timestamp": created + 1,
        }
        msgs += [
            {"role": "assistant", "content": f"a{k}", "extra": extra},
            {"role": "user", "content": f"o{k}"},
        ]
    src = tmp_path / "r.traj.json"
    src.write_bytes(orjson.dumps({"messages": msgs, "trajectory_format": "mini-swe-agent-1.1"}))
    assert import_swe(src, tmp_path / "t.jsonl")["requests"] == 300
    assert calls <= 3 * len(msgs)
    trace = read_trace(tmp_path / "t.jsonl")
    assert [m["content"] for m in messages_of(trace, trace.requests[-1])] == [m["content"] for m in msgs[:-2]]


# ---- subagent fan-out from Claude Code transcripts ------------------------------------------------


def test_claude_code_subagents_are_spawned_and_waited_for(tmp_path: Path) -> None:
    from replay.importers.claude_code import import_claude_code

    import_claude_code(DATA / "claude_code", tmp_path / "t.jsonl")
    reqs = read_trace(tmp_path / "t.jsonl").requests
    after = {r.id: r.after for r in reqs}
    # the inline sidechain (10 s) follows main request 2; main's next request (16 s) waits for it
    assert after[3] == {"request": 2, "delay_s": 1.0, "spawn": True}
    assert after[5] == {"request": 2, "delay_s": 1.0, "waits": [4]}
    # the subagents/agent-*.jsonl agent (120 s) follows main request 6; main's next (330 s) waits for it
    assert after[7] == {"request": 6, "delay_s": 56.0, "spawn": True}
    assert after[8] == {"request": 6, "delay_s": 204.0, "waits": [7]}


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 100), st.floats(0, 5)), min_size=1, max_size=6),
    st.lists(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 5)), min_size=1, max_size=3), max_size=3),
)
def test_link_subagents_property(
    main: list[tuple[float, float]], subs: list[list[tuple[float, float]]]
) -> None:
    from replay.importers.base import SessionInfo, Step, link_subagents

    m_info = SessionInfo(key="m")
    steps = [Step(session=m_info, t=t, messages=[], done=t + d) for t, d in main]
    for k, group in enumerate(subs):
        info = SessionInfo(key=f"s{k}", role="subagent")
        steps += [Step(session=info, t=t, messages=[], done=t + d) for t, d in group]
    link_subagents(steps)
    marks = {s.mark: s for s in steps if s.mark is not None}
    for s in steps:
        if s.spawned_by is not None:  # spawned by a main step whose reply was in by then
            spawner = marks[s.spawned_by]
            assert spawner.session.role != "subagent" and spawner.done <= s.t
            assert s.t == min(x.t for x in steps if x.session is s.session)
        for w in s.waits:  # a main step waits only for subagents' last steps that had returned
            last = marks[w]
            assert s.session.role != "subagent" and last.session.role == "subagent" and last.done <= s.t
            assert last.t == max(x.t for x in steps if x.session is last.session)


def test_otel_json_document_is_streamed_and_errors_name_it(tmp_path: Path) -> None:
    """A `.json` OTLP document (ijson, span by span) imports as the same lines do as JSONL."""
    lines = (DATA / "otel.jsonl").read_bytes().splitlines()
    merged = orjson.loads(lines[0])
    merged["resourceSpans"] += orjson.loads(lines[1])["resourceSpans"]
    doc = tmp_path / "otlp.json"
    doc.write_bytes(orjson.dumps(merged, option=orjson.OPT_INDENT_2))
    a = import_otel(doc, tmp_path / "a.jsonl")
    b = import_otel(DATA / "otel.jsonl", tmp_path / "b.jsonl")
    assert a == b
    ta, tb = read_trace(tmp_path / "a.jsonl"), read_trace(tmp_path / "b.jsonl")
    assert [messages_of(ta, r) for r in ta.requests] == [messages_of(tb, r) for r in tb.requests]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("otel-")]  # the spill is gone
    bad = tmp_path / "bad.json"
    bad.write_bytes(orjson.dumps(merged)[:-40])
    with pytest.raises(TraceError, match="bad JSON") as err:
        import_otel(bad, tmp_path / "c.jsonl")
    assert err.value.path == str(bad) and err.value.line == 1
    broken = orjson.loads(orjson.dumps(merged))
    broken["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"][7]["value"]["stringValue"] = "[{"
    bad.write_bytes(orjson.dumps(broken))
    with pytest.raises(TraceError, match="span 's1': gen_ai.input.messages is not JSON") as err:
        import_otel(bad, tmp_path / "c.jsonl")
    assert err.value.path == str(bad) and err.value.line == 1
