"""Trace reader/validator: every validation error names file:line; delta reconstruction."""

from __future__ import annotations

import gc
import io

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from replay.errors import TraceError
from replay.trace import (
    Request,
    TraceWriter,
    iter_requests,
    last_references,
    materialize,
    read_trace,
    recorded_reply,
    validate,
)
from replay.trace.materialize import plain_message
from replay.trace.reader import _lines

HEADER = {"kind": "trace", "format": "agent-replay-trace/1", "created": "", "source": "test"}
SESSION = {"kind": "session", "id": "a"}


def write_lines(path, objs) -> str:
    with open(path, "wb") as f:
        for obj in objs:
            f.write(obj if isinstance(obj, bytes) else orjson.dumps(obj))
            f.write(b"\n")
    return str(path)


def req(rid, **kw):
    base = {
        "kind": "request",
        "id": rid,
        "session": "a",
        "t": 0,
        "append": [{"role": "user", "content": "hi"}],
    }
    base.update(kw)
    return base


@pytest.mark.parametrize(
    ("objs", "line", "problem"),
    [
        ([HEADER, b"{not json"], 2, "bad JSON"),
        ([SESSION], 1, "first line must be the 'trace' header"),
        ([{**HEADER, "format": "other/9"}], 1, "unsupported format"),
        ([HEADER, {"kind": "turn"}], 2, "unknown kind 'turn'"),
        ([HEADER, {"kind": "session"}], 2, "missing field 'id'"),
        (
            [HEADER, SESSION, {"kind": "request", "id": 1, "session": "a", "append": []}],
            3,
            "missing field 't'",
        ),
        ([HEADER, SESSION, req(1, t="soon")], 3, "field 't' must be"),
        ([HEADER, SESSION, req(1, session="b")], 3, "session 'b', not defined"),
        ([HEADER, SESSION, req(2), req(2)], 4, "not greater than the previous id 2"),
        ([HEADER, SESSION, req(1, parent=7, keep=1)], 3, "parent 7 is not a request defined"),
        (
            [HEADER, SESSION, req(1), req(2, parent=1, keep=2)],
            4,
            "keep 2 is larger than parent 1's 1 messages",
        ),
        (
            [HEADER, SESSION, req(1, append=[{"role": "user", "content": {"$blob": "x"}}])],
            3,
            "unknown blob 'x'",
        ),
        ([HEADER, SESSION, req(1, append=[{"$reply": 4}])], 3, "$reply refers to request 4"),
        ([HEADER, SESSION, req(1, append=[{"role": "boss", "content": "x"}])], 3, "role must be one of"),
        ([HEADER, SESSION, req(1, append=[{"role": "tool", "content": "x"}])], 3, "tool_call_id"),
        (
            [HEADER, SESSION, req(1, append=[{"role": "user", "content": {"synth": {"tokens": -1}}}])],
            3,
            "synth",
        ),
        ([HEADER, SESSION, req(1, append=[])], 3, "has no messages"),
        ([HEADER, {**SESSION, "api": "grpc"}], 2, "api must be one of"),
        ([HEADER, SESSION, SESSION], 3, "defined twice"),
        ([HEADER, HEADER], 2, "second 'trace' header"),
        ([{**HEADER, "start": 645}], 1, "field 'start' must be a string"),
        ([{**HEADER, "start": "quarter to seven"}], 1, "ISO 8601 time or HH:MM"),
        ([], 0, "empty trace"),
    ],
)
def test_validation_errors_name_file_and_line(tmp_path, objs, line, problem):
    path = write_lines(tmp_path / "bad.jsonl", objs)
    with pytest.raises(TraceError) as info:
        validate(path)
    assert info.value.line == line
    assert problem in info.value.problem
    assert str(info.value).startswith(f"{path}:{line}: ")


def test_missing_file_is_a_trace_error(tmp_path):
    with pytest.raises(TraceError, match="cannot open"):
        validate(tmp_path / "nope.jsonl")


def test_writer_delta_encodes_and_reader_rebuilds(tmp_path):
    path = tmp_path / "t.jsonl"
    system = {"role": "system", "content": {"synth": {"tokens": 50, "seed": 1}}}
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "f", "arguments": "{}"}]}
    full: list[list[dict]] = []
    with TraceWriter(path, source="test") as w:
        w.session("a")
        msgs = [system, {"role": "user", "content": "go"}]
        for turn in range(5):
            reply = {"message": {**call, "tool_calls": [{"id": f"c{turn}", "name": "f", "arguments": "{}"}]}}
            w.request("a", float(turn), list(msgs), {"max_tokens": 4}, reply=reply)
            full.append(list(msgs))
            msgs = msgs + [
                reply["message"],
                {"role": "tool", "tool_call_id": f"c{turn}", "content": f"r{turn}"},
            ]
        compacted = [system, {"role": "user", "content": "summary"}]
        w.request("a", 9.0, compacted, {}, tag="compaction")
        full.append(compacted)
    lines = [orjson.loads(x) for x in path.read_bytes().splitlines()]
    requests = [x for x in lines if x["kind"] == "request"]
    # Each turn appends only its two new messages, the first being a reference to the reply.
    assert [len(r["append"]) for r in requests] == [2, 2, 2, 2, 2, 1]
    assert requests[1]["append"][0] == {"$reply": 1}
    assert requests[5]["keep"] == 1
    trace = read_trace(path)
    by_id = trace.by_id()
    for request, expected in zip(trace.requests, full, strict=True):
        assert materialize(request, recorded_reply(by_id)) == [plain_message(m) for m in expected]
    assert trace.requests[-1].is_compaction and not trace.requests[-2].is_compaction


def test_messages_are_shared_by_reference_not_copied(tmp_path):
    path = tmp_path / "t.jsonl"
    with TraceWriter(path, source="test") as w:
        w.session("a")
        msgs = [{"role": "user", "content": "x" * 1000}]
        for turn in range(50):
            w.request("a", float(turn), list(msgs), {})
            msgs = msgs + [{"role": "user", "content": f"turn {turn}"}]
    trace = read_trace(path)
    first = trace.requests[0].messages()[0]
    # Every request's list holds the very same first message object: memory grows with content.
    assert all(r.messages()[0] is first for r in trace.requests)
    assert trace.requests[-1].n_messages == 50


def test_blobs_resolve_to_one_shared_object(tmp_path):
    path = write_lines(
        tmp_path / "t.jsonl",
        [
            HEADER,
            SESSION,
            {"kind": "blob", "id": "tools", "value": [{"type": "function", "function": {"name": "f"}}]},
            req(1, params={"tools": {"$blob": "tools"}}),
            req(2, params={"tools": {"$blob": "tools"}}),
        ],
    )
    trace = read_trace(path)
    assert trace.requests[0].params["tools"] is trace.requests[1].params["tools"]
    assert trace.requests[0].params["tools"][0]["function"]["name"] == "f"


def test_sample_trace_is_valid():
    counts = validate("traces/sample.jsonl")
    assert counts["requests"] == 9 and counts["sessions"] == 2


def test_last_references_name_the_last_line_that_needs_each_request(tmp_path):
    path = write_lines(
        tmp_path / "t.jsonl",
        [
            HEADER,  # line 1
            SESSION,
            {"kind": "session", "id": "b"},
            req(1),  # line 4
            req(2, session="b"),
            req(3, parent=1, keep=1),  # names 1 as its parent
            {"kind": "blob", "id": "r2", "value": {"$reply": 2}},
            req(4, parent=3, keep=1, append=[{"$reply": 3}, {"$blob": "r2"}]),  # line 8: 3 (twice), 2
            req(5, session="b", after={"request": 4}),  # line 9: 4
            req(6, session="b"),  # names nothing
        ],
    )
    assert last_references(path) == ({1: 6, 3: 8, 2: 8, 4: 9}, 10)


def test_requests_read_in_a_window_are_the_requests_read_whole(tmp_path):
    path = tmp_path / "t.jsonl"
    with TraceWriter(path, source="test") as w:
        for s in range(30):  # conversations one after another, one coming back at the end
            w.session(f"s{s}")
        history = {f"s{s}": [{"role": "user", "content": f"start {s}"}] for s in range(30)}
        for name in [*(f"s{s}" for s in range(30) for _ in range(3)), "s0", "s0"]:
            reply = {"message": {"role": "assistant", "content": f"ok {len(history[name])}"}}
            w.request(name, 0.0, list(history[name]), {}, reply=reply)
            history[name] = [*history[name], reply["message"], {"role": "user", "content": "more"}]
    whole = read_trace(path)
    by_id = whole.by_id()
    tracked = len([o for o in gc.get_objects() if isinstance(o, Request)])
    alive = []
    for got, want in zip(iter_requests(path, last_references(path).last), whole.requests, strict=True):
        assert (got.id, got.line, got.n_messages) == (want.id, want.line, want.n_messages)
        assert materialize(got, recorded_reply(by_id)) == materialize(want, recorded_reply(by_id))
        alive.append(len([o for o in gc.get_objects() if isinstance(o, Request)]) - tracked)
    # Only what a later line names is kept: the conversation in progress and the one that comes
    # back (s0's last request), not the 92 requests read so far.
    assert max(alive) <= 6


@given(
    lines=st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"")), max_size=12),
    end=st.booleans(),
    block=st.integers(1, 16),
)
def test_lines_read_in_blocks_are_the_file_s_lines(lines: list[bytes], end: bool, block: int) -> None:
    """However the blocks cut the file, each line comes out whole, once, in order."""
    data = b"\n".join(lines) + (b"\n" if end and lines else b"")
    expected = data.split(b"\n")
    if expected[-1] == b"":
        expected.pop()
    assert list(_lines(io.BytesIO(data), block)) == expected


@pytest.mark.parametrize("start", ["06:45", "2026-11-28T06:45:00", "2026-11-28T06:45:00+01:00"])
def test_a_trace_may_carry_the_wall_clock_time_of_its_start(tmp_path, start):
    path = write_lines(tmp_path / "t.jsonl", [{**HEADER, "start": start}, SESSION, req(1)])
    assert read_trace(path).header.start == start


def test_a_null_optional_field_reads_as_absent(tmp_path):
    """null is absent (FORMAT.md): the compiled model's str fields never receive a None."""
    header = {**HEADER, "created": None, "source": None, "notes": None, "start": None}
    session = {**SESSION, "role": None, "model": None, "labels": None}
    path = write_lines(tmp_path / "t.jsonl", [header, session, req(1, tag=None)])
    trace = read_trace(path)
    assert (trace.header.notes, trace.header.start) == ("", "")
    assert (trace.sessions["a"].role, trace.sessions["a"].model) == ("interactive", "default")
    assert trace.requests[0].tag == "turn"


def test_a_loaded_trace_holds_each_repeated_message_once(tmp_path):
    """Sessions resend the same texts (a system prompt, a history restated after a compaction):
    loaded, equal plain messages are one object; messages that differ in role or text are not."""
    path = tmp_path / "t.jsonl"
    prompt = "you are a careful agent " * 50
    with TraceWriter(path, source="test") as w:
        for s in ("a", "b"):
            w.session(s)
            reply = {"message": {"role": "assistant", "content": "done"}}
            w.request(
                s, 0.0, [{"role": "system", "content": prompt}, {"role": "user", "content": "go"}], {}, reply
            )
        w.session("c")
        w.request(
            "c",
            0.0,
            [{"role": "user", "content": prompt}],
            {},
            {"message": {"role": "assistant", "content": "done"}},
        )
    a, b, c = read_trace(path).requests
    assert a.append[0] is b.append[0] and a.append[1] is b.append[1]
    # A bare reply is held as its values (`Request.reply`): equal, rebuilt on each read.
    assert a.reply == b.reply == c.reply == {"message": {"role": "assistant", "content": "done"}}
    assert c.append[0] is not a.append[0] and c.append[0] == {"role": "user", "content": prompt}
    assert b.messages() == [{"role": "system", "content": prompt}, {"role": "user", "content": "go"}]


def test_blank_lines_are_skipped_and_still_counted(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", [HEADER, b"", b" \t\r", SESSION, b"\x0c", req(1), b"{bad"])
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert err.value.line == 7 and "bad JSON" in str(err.value)
    with pytest.raises(TraceError) as err:
        validate(path)
    assert err.value.line == 7


def test_equal_synthetic_messages_params_and_words_are_held_once(tmp_path):
    """Generated traces resend synthetic texts by seed and every agent repeats its settings: loaded,
    equal ones are one object; ones that differ only in type (1, 1.0, true) or role are not."""
    synth = {"synth": {"tokens": 40, "seed": 3}}
    tools = [{"type": "function", "function": {"name": "f"}}]
    path = write_lines(
        tmp_path / "t.jsonl",
        [
            HEADER,
            SESSION,
            {"kind": "blob", "id": "tools", "value": tools},
            req(1, append=[{"role": "user", "content": synth}], params={"max_tokens": 1, "stream": True}),
            req(2, append=[{"role": "user", "content": synth}], params={"max_tokens": 1, "stream": True}),
            req(3, append=[{"role": "system", "content": synth}], params={"max_tokens": 1.0, "stream": True}),
            req(4, params={"top_k": True, "tools": {"$blob": "tools"}}, tag="subagent"),
            req(5, params={"top_k": True, "tools": {"$blob": "tools"}}, tag="subagent"),
            req(6, params={"tools": tools}, reply={"finish": "length"}),
            req(7, params={"tools": tools}, reply={"finish": "length"}),
            req(8, append=[{"role": "user", "content": {"synth": {"tokens": 40, "seed": 4}}}]),
            req(9, params={"top_k": 1, "tools": {"$blob": "tools"}}),
        ],
    )
    r = read_trace(path).requests
    assert r[0].append[0] is r[1].append[0] and r[0].params is r[1].params
    assert r[2].append[0] is not r[0].append[0] and r[2].append[0]["role"] == "system"
    assert r[7].append[0] is not r[0].append[0] and r[7].append[0]["content"]["synth"]["seed"] == 4
    assert r[2].params is not r[0].params and type(r[2].params["max_tokens"]) is float
    assert r[3].params is r[4].params and r[3].params["top_k"] is True
    assert r[8].params is not r[3].params and type(r[8].params["top_k"]) is int
    assert r[3].tag is r[4].tag == "subagent" and r[0].session is r[7].session == "a"
    # A tools list written inline on each line is compared by nothing cheap: each keeps its own.
    assert r[5].params is not r[6].params and r[5].params == r[6].params == {"tools": tools}
    assert r[5].reply["finish"] is r[6].reply["finish"] == "length"
    # Read line by line (nothing kept), the same values come out.
    kept = [obj for _, obj in iter_records_of(path) if obj["kind"] == "request"]
    for loaded, line in zip(r, kept, strict=True):
        assert orjson.dumps(loaded.params) == orjson.dumps(line["params"])
        assert list(loaded.append) == line["append"]


def test_one_request_sessions_share_their_words_labels_and_repeated_appends(tmp_path):
    """A trace of one-request sessions (the ShareGPT shape) holds per session only what differs:
    role, api and model strings and an empty `labels` are one object each, and an `append` of
    messages each held once is one tuple; a message held alone (a `$reply` marker) keeps its own."""
    system = {"role": "system", "content": {"synth": {"tokens": 20, "seed": 7}}}
    user = {"role": "user", "content": "hello"}
    lines: list = [HEADER]
    for i in range(1, 4):
        lines.append({"kind": "session", "id": f"s{i}", "role": "batch", "api": "anthropic", "model": "m"})
        lines.append({**req(i, append=[system, user]), "session": f"s{i}"})
    lines.append({"kind": "session", "id": "tagged", "labels": {"job": "x"}})
    lines.append({**req(4, parent=3, keep=2, append=[{"$reply": 3}, user]), "session": "tagged"})
    lines.append({**req(5, parent=3, keep=2, append=[{"$reply": 3}, user]), "session": "tagged"})
    trace = read_trace(write_lines(tmp_path / "t.jsonl", lines))
    s1, s2, s3 = (trace.sessions[f"s{i}"] for i in range(1, 4))
    assert s1.role is s2.role is s3.role == "batch" and s1.api is s3.api == "anthropic"
    assert s1.model is s3.model == "m" and s1.labels is s3.labels == {}
    assert trace.sessions["tagged"].labels == {"job": "x"}
    r = trace.requests
    assert r[0].append is r[1].append is r[2].append and list(r[0].append) == [system, user]
    assert r[3].append is not r[4].append and r[3].append == r[4].append
    assert [m.messages() for m in r] == [[system, user]] * 3 + [[system, user, {"$reply": 3}, user]] * 2


def iter_records_of(path):
    from replay.trace.reader import iter_records

    return iter_records(path)


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"tokens": -1, "seed": 0}, "synth needs integer 'tokens'"),
        ({"tokens": True, "seed": 0}, "synth needs integer 'tokens'"),
        ({"tokens": 3, "seed": "x"}, "synth needs integer 'tokens'"),
    ],
)
def test_a_bad_synthetic_spec_is_still_refused_when_sharing(tmp_path, spec, problem):
    path = write_lines(
        tmp_path / "t.jsonl", [HEADER, SESSION, req(1, append=[{"role": "user", "content": {"synth": spec}}])]
    )
    with pytest.raises(TraceError, match=problem) as err:
        read_trace(path)
    assert err.value.line == 3


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=0, max_value=3),
    st.sampled_from([0.0, 1.0, 2.5]),
    st.sampled_from(["a", "b"]),
)


@given(
    st.lists(
        st.tuples(
            st.dictionaries(st.sampled_from(["top_k", "x_flag", "x_seed"]), _scalars, max_size=3),
            st.sampled_from(["user", "system", "assistant"]),
            st.integers(min_value=0, max_value=2),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_sharing_never_changes_what_a_loaded_trace_holds(tmp_path_factory, rows):
    """Whatever repeats, each loaded request holds exactly what its line says (types included)."""
    lines: list[dict] = [HEADER, SESSION]
    for i, (params, role, seed) in enumerate(rows, 1):
        msg = {"role": role, "content": {"synth": {"tokens": 5, "seed": seed}}}
        lines.append(req(i, append=[msg], params=params))
    path = write_lines(tmp_path_factory.mktemp("share") / "t.jsonl", lines)
    for loaded, line in zip(read_trace(path).requests, lines[2:], strict=True):
        assert orjson.dumps(loaded.params) == orjson.dumps(line["params"])
        assert orjson.dumps(list(loaded.append)) == orjson.dumps(line["append"])


def test_a_trace_loaded_to_keep_is_frozen_out_of_the_collector_s_passes(tmp_path):
    """`replay run` keeps its trace until it exits: the setup's collections must not rescan it."""
    path = write_lines(tmp_path / "t.jsonl", [HEADER, SESSION, *(req(i) for i in range(1, 200))])
    gc.collect()
    before = gc.get_freeze_count()
    try:
        trace = read_trace(path, freeze=True)
        assert gc.get_freeze_count() - before >= len(trace.requests) and gc.isenabled()
    finally:
        gc.unfreeze()
    read_trace(path)
    assert gc.get_freeze_count() == 0
