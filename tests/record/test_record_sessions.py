"""Session inference rules, one at a time, and the recorder's ordering and delta encoding."""

from __future__ import annotations

import orjson

from replay.engine.usage import Usage
from replay.record.recorder import Outcome, Recorder
from replay.record.sessions import Label, SessionInference, user_id_scope
from replay.record.wire import TapResult
from replay.trace import TraceWriter, read_trace, validate
from tests.support.recordkit import FixedWall

S = 1_000_000_000
SYS = {"role": "system", "content": "You are helpful."}


def u(text):
    return {"role": "user", "content": text}


def a(text):
    return {"role": "assistant", "content": text}


class Clock:
    def __init__(self) -> None:
        self.ns = 0

    def __call__(self, seconds: float) -> int:
        self.ns += int(seconds * S)
        return self.ns


def inference(**kw) -> SessionInference:
    return SessionInference(wall_clock=kw.pop("wall", FixedWall(30.0)), **kw)


def turn(inf, clock, msgs, gap=1.0, dur=1.0, reply="ok", **kw):
    got = inf.arrive(msgs, kw.pop("api", "openai"), "m", clock(gap), **kw)
    inf.done(got, clock(dur), rid=got.session.requests, reply=a(reply), status="ok")
    return got


def test_longest_prefix_wins():
    inf, clock = inference(rhythm_floor_s=0, rhythm_factor=0), Clock()
    x = turn(inf, clock, [SYS, u("a"), a("r"), u("b")], gap=0)
    y = turn(inf, clock, [SYS, u("a")], gap=100)  # out of rhythm: not a compaction of x's session
    assert (x.session.id, y.session.id, y.tag) == ("s1", "s2", "turn")
    z = turn(inf, clock, [SYS, u("a"), a("r"), u("b"), a("r2"), u("c")])
    assert z.session.id == "s1" and z.tag == "turn" and z.base is x.head
    w = turn(inf, clock, [SYS, u("a"), a("ok"), u("d")])
    assert w.session.id == "s2" and w.base is y.head


def test_compaction_in_rhythm_and_not_out_of_it():
    inf, clock = inference(rhythm_floor_s=5.0), Clock()
    turn(inf, clock, [SYS, u("a")], gap=0)
    turn(inf, clock, [SYS, u("a"), a("ok"), u("b")])
    c = turn(inf, clock, [SYS, u("summary of a and b")], gap=2.0)
    assert (c.session.id, c.tag) == ("s1", "compaction")
    assert c.after is not None and c.delay_s == 2.0
    late = turn(inf, clock, [SYS, u("something new")], gap=60.0)
    assert (late.session.id, late.tag, late.new_session) == ("s2", "turn", True)


def test_compaction_that_carries_the_reply_is_found_out_of_rhythm():
    inf, clock = inference(rhythm_floor_s=1.0), Clock()
    turn(inf, clock, [SYS, u("a")], gap=0)
    summary = "The user asked about a; we read three files and fixed the parser bug in module x."
    turn(inf, clock, [SYS, u("a"), a("ok"), u("summarise")], reply=summary)
    c = turn(inf, clock, [{"role": "system", "content": "Another prompt"}, u(summary + "\nGo on.")], gap=600)
    assert (c.session.id, c.tag) == ("s1", "compaction")


def test_cron_time_starts_a_cron_session_instead_of_a_rhythm_compaction():
    wall = FixedWall(30.0)
    inf, clock = inference(wall=wall, rhythm_floor_s=60.0), Clock()
    turn(inf, clock, [SYS, u("a")], gap=0)
    turn(inf, clock, [SYS, u("a"), a("ok"), u("b")])
    wall.t = 7 * 60 + 0.5  # 00:07:00.5
    job = turn(inf, clock, [SYS, u("run the nightly backup")])
    assert (job.session.id, job.session.role, job.tag) == ("s2", "cron", "turn")
    again = turn(inf, clock, [SYS, u("run the nightly backup"), a("ok"), u("step 2")])
    assert again.session is job.session


def test_concurrent_turn_and_rewind():
    inf, clock = inference(), Clock()
    first = turn(inf, clock, [SYS, u("a")], gap=0)
    second = inf.arrive([SYS, u("a"), a("ok"), u("b")], "openai", "m", clock(1))
    review = inf.arrive([SYS, u("a"), a("ok"), u("review")], "openai", "m", clock(0.1))
    assert review.session is second.session and review.tag == "concurrent" and review.base is first.head
    inf.done(second, clock(1), 2, a("b done"), "ok")
    inf.done(review, clock(1), 3, a("reviewed"), "ok")
    nxt = turn(inf, clock, [SYS, u("a"), a("ok"), u("b"), a("b done"), u("c")])
    assert nxt.tag == "turn" and nxt.base is second.head and nxt.after is second.head
    edit = turn(inf, clock, [SYS, u("a"), a("ok"), u("b, edited")])
    assert edit.session is first.session and edit.tag == "compaction"


def test_explicit_labels_and_role_hints():
    inf, clock = inference(), Clock()
    x = turn(inf, clock, [SYS, u("a")], label=Label("cron-hourly", "path"))
    y = turn(inf, clock, [SYS, u("a")], label=Label("agent 7", "header"), role_hint="subagent")
    z = turn(inf, clock, [SYS, u("totally different")], label=Label("cron-hourly", "path"))
    assert (x.session.id, x.session.role) == ("cron-hourly", "cron")
    assert (y.session.id, y.session.role) == ("agent-7", "subagent")
    assert z.session is x.session and z.tag == "compaction"
    plain = turn(inf, clock, [SYS, u("a"), a("ok"), u("more")])
    assert plain.session.id == "s1"  # labelled sessions never absorb unlabelled requests
    taken = turn(inf, clock, [SYS, u("x")], label=Label("s2", "header"))
    other = turn(inf, clock, [SYS, u("y")], gap=100)
    clash = turn(inf, clock, [SYS, u("z")], label=Label("s1", "header"))
    assert (taken.session.id, other.session.id, clash.session.id) == ("s2", "s3", "s1-labelled")


def test_user_id_scopes_inference_and_apis_stay_apart():
    inf, clock = inference(rhythm_floor_s=0, rhythm_factor=0), Clock()
    uid = "user_abc_account_123_session_5f2e9c1a-0000-4000-8000-000000000000"
    assert user_id_scope(uid) == "u-5f2e9c1a"
    assert user_id_scope(orjson.dumps({"session_id": "deadbeef-1"}).decode()) == "u-deadbeef"
    label = Label(user_id_scope(uid), "user_id")
    main = turn(inf, clock, [SYS, u("a")], label=label, api="anthropic")
    title = turn(
        inf, clock, [{"role": "system", "content": "Write a title"}, u("a")], label=label, api="anthropic"
    )
    other = turn(inf, clock, [SYS, u("a")], api="anthropic")
    openai = turn(inf, clock, [SYS, u("a")], api="openai")
    assert (main.session.id, title.session.id) == ("u-5f2e9c1a", "u-5f2e9c1a-2")
    assert other.session.id == "s1" and openai.session.id == "s2"
    nxt = turn(inf, clock, [SYS, u("a"), a("ok"), u("b")], label=label, api="anthropic")
    assert nxt.session is main.session


def tap(text: str, first: int, last: int) -> Outcome:
    res = TapResult(
        message=a(text), finish="stop", usage=Usage(prompt_tokens=10, output_tokens=2), t_first_token=first
    )
    return Outcome(tap=res, t_first_byte=first, t_last_byte=last, t_done=last)


def test_recorder_writes_in_completion_order_with_arrival_times(tmp_path):
    writer = TraceWriter(tmp_path / "t.jsonl", source="record")
    rec = Recorder(writer, inference())
    body = lambda *m: orjson.dumps({"model": "m", "messages": list(m)})  # noqa: E731
    one = rec.begin("openai", body(SYS, u("a")), None, None, 1 * S)
    rec.finish(one, tap("ok", int(1.2 * S), int(1.5 * S)))
    slow = rec.begin("openai", body(SYS, u("a"), a("ok"), u("b")), None, None, 2 * S)
    fast = rec.begin("openai", body(SYS, u("a"), a("ok"), u("review")), None, None, int(2.5 * S))
    assert rec.finish(fast, tap("reviewed", 3 * S, 3 * S)) == 2  # finished first, written first
    assert rec.finish(slow, tap("b done", 4 * S, 5 * S)) == 3
    nxt = rec.begin("openai", body(SYS, u("a"), a("ok"), u("b"), a("b done"), u("c")), None, None, 6 * S)
    rec.finish(nxt, tap("c done", int(6.1 * S), int(6.2 * S)))
    writer.close()
    validate(tmp_path / "t.jsonl")
    reqs = {r.id: r for r in read_trace(tmp_path / "t.jsonl").requests}
    assert [reqs[i].t for i in (1, 2, 3, 4)] == [0.0, 1.5, 1.0, 5.0]
    assert [reqs[i].tag for i in (1, 2, 3, 4)] == ["turn", "concurrent", "turn", "turn"]
    assert reqs[3].parent is reqs[1] and reqs[3].append[0] == {"$reply": 1}
    assert reqs[4].parent is reqs[3] and reqs[4].append[0] == {"$reply": 3} and not reqs[4].is_compaction
    assert reqs[4].after == {"request": 3, "delay_s": 1.0}
    assert reqs[2].after == {"request": 1, "delay_s": 1.0}
    assert reqs[1].reply["first_byte_s"] == 0.2 and reqs[1].reply["last_byte_s"] == 0.5


def test_a_request_the_trace_could_not_hold_is_counted_unrecorded_with_its_reason(tmp_path):
    # A server may accept tools a trace cannot replay (found by tests/serving/test_fuzz.py's proxy
    # run): the recorder asks the trace reader's own rules first, so its trace always validates.
    writer = TraceWriter(tmp_path / "t.jsonl", source="record")
    rec = Recorder(writer, inference())
    for tools, problem in (
        ([{"type": "function"}], "tools[0] must be a function tool with a string 'name'"),
        (
            [{"type": "function", "function": {"name": "f", "parameters": 3}}],
            "'parameters' must be an object",
        ),
        ([{"$blob": "x"}], "unknown blob"),
    ):
        body = orjson.dumps({"model": "m", "messages": [SYS, u("a")], "tools": tools})
        assert rec.begin("openai", body, None, None, 1 * S) is None
        assert problem in rec.stats.last_problem and rec.stats.last_problem.startswith("not recorded: ")
    good = rec.begin(
        "openai",
        orjson.dumps(
            {
                "model": "m",
                "messages": [SYS, u("a")],
                "tools": [{"type": "function", "function": {"name": "f"}}],
            }
        ),
        None,
        None,
        2 * S,
    )
    rec.finish(good, tap("ok", int(2.2 * S), int(2.5 * S)))
    writer.close()
    assert rec.stats.unrecorded == 3
    assert validate(tmp_path / "t.jsonl")["requests"] == 1
