"""Session inference through its indexes: what an all-day recorder keeps, and what it still finds.

The rules are those of test_record_sessions; here, what a session left idle keeps (no text, a
prefix hash or two) and that a conversation resumed the next morning, or compacted with its last
reply carried over, is still matched from that little.
"""

from __future__ import annotations

from array import array

from hypothesis import given, settings
from hypothesis import strategies as st

from replay.record.sessions import Head, SessionInference
from tests.support.recordkit import FixedWall

S = 1_000_000_000
HOUR = 3600.0
SYS = {"role": "system", "content": "You are a careful coding agent."}


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


def turn(inf, clock, msgs, gap=1.0, reply="ok"):
    got = inf.arrive(msgs, "openai", "m", clock(gap))
    inf.done(got, clock(1.0), rid=got.session.requests, reply=a(reply), status="ok")
    return got


def reply_of(session: int, n: int) -> str:
    return f"Session {session} turn {n}: read the files, fixed the bug, all tests pass now."


def conversation(inf, clock, session: int, turns: int):
    msgs = [SYS, u(f"task {session}")]
    got = None
    for n in range(turns):
        got = turn(inf, clock, list(msgs), reply=reply_of(session, n))
        msgs += [a(reply_of(session, n)), u(f"go on {n}")]
    return got, msgs


def texts_held(inf: SessionInference) -> list[str]:
    """Every string the inference holds about its sessions, apart from names and labels."""
    out = []
    for s in inf.sessions.values():
        out.extend(v for v in (s.reply or ()) if isinstance(v, str))
        for head in s.heads:
            out.extend(getattr(head, f) for f in Head.__slots__ if isinstance(getattr(head, f), str))
    return out


def test_an_idle_session_keeps_only_its_latest_heads_and_is_resumed_next_morning():
    inf, clock = (
        SessionInference(wall_clock=FixedWall(30.0), idle_after_s=HOUR, rhythm_floor_s=0, rhythm_factor=0),
        Clock(),
    )
    first, msgs = conversation(inf, clock, 1, turns=20)
    session = first.session
    assert len(session.heads) == inf.max_heads
    other, _ = conversation(inf, clock, 2, turns=2)  # activity elsewhere, the next day
    clock(20 * HOUR)
    turn(inf, clock, [SYS, u("an unrelated new task")], gap=0)  # idle sessions are trimmed on arrival
    assert session.heads == [session.last]
    assert len([k for k, h in inf._index.items() if h.session is session]) == 1
    assert all(t in ("ok", "turn") for t in texts_held(inf))  # tags only: no message or reply text
    resumed = turn(inf, clock, [*msgs, u("good morning, next step")], gap=0)
    assert (resumed.session, resumed.tag, resumed.new_session) == (session, "turn", False)
    assert resumed.base is first.head


def test_a_compaction_carrying_an_idle_sessions_last_reply_is_found_without_its_text():
    inf, clock = (
        SessionInference(wall_clock=FixedWall(30.0), idle_after_s=HOUR, rhythm_floor_s=0, rhythm_factor=0),
        Clock(),
    )
    for s in range(50):
        conversation(inf, clock, s, turns=3)
    clock(10 * HOUR)
    turn(inf, clock, [SYS, u("unrelated")], gap=0)
    summary = reply_of(17, 2)
    got = turn(inf, clock, [{"role": "system", "content": "Summarise"}, u(f"Summary: {summary}\nGo on.")])
    assert (got.session.id, got.tag) == ("s18", "compaction")
    # One reply key per session (its latest reply, when long enough), not one per request seen:
    # 50 conversations, less s18 whose latest reply ("ok") is now too short to carry over.
    assert sum(len(bucket) for bucket in inf._replies["openai|"].values()) == 49


def test_only_the_latest_reply_is_indexed_and_a_reply_glued_to_a_word_is_not_carried():
    inf, clock = SessionInference(wall_clock=FixedWall(30.0), rhythm_floor_s=0, rhythm_factor=0), Clock()
    conversation(inf, clock, 1, turns=3)
    old = turn(inf, clock, [SYS, u(f"Summary: {reply_of(1, 0)}")], gap=50)
    assert old.new_session  # an older reply of the session is no longer a carry-over key
    glued = turn(inf, clock, [SYS, u(f"Summary:{reply_of(1, 2)}")], gap=50)
    assert glued.session.id == "s1" and glued.tag == "compaction"  # after ':' is a word boundary
    stuck = turn(inf, clock, [SYS, u(f"xx{reply_of(2, 0)}")], gap=50)
    assert stuck.new_session


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 4), st.floats(0, 300)), min_size=1, max_size=30))
def test_rhythm_through_the_index_picks_what_a_scan_of_every_session_picks(steps):
    """The rhythm rule walks sessions latest reply first and stops at the longest rhythm: it
    must pick the session a scan of all of them would (the most recent reply, ties to the oldest)."""
    inf, clock = SessionInference(wall_clock=FixedWall(30.0), rhythm_floor_s=30.0), Clock()
    for session, depth, gap in steps:
        msgs = [SYS, u(f"start {session}")]
        for n in range(depth):
            msgs += [a(f"r{n}"), u(f"more {n}")]
        clock(gap)
        probe = [SYS, u("a new request with no prefix")]
        now = clock.ns
        scan = [
            s
            for s in inf.sessions.values()
            if not s.explicit and s.last is not None and s.system_key is not None
            and s.depth > len(probe) and inf._in_rhythm(s, now)
        ]  # fmt: skip
        expected = max(scan, key=lambda s: (s.last_done.done_ns, -s.order)) if scan else None
        got = inf._rhythmic(len(probe), (scan[0].scope, scan[0].system_key), now) if scan else None
        assert got is expected
        turn(inf, clock, msgs, gap=0)


def test_the_recorder_lets_the_writer_forget_an_idle_session_and_still_records_its_resumption(tmp_path):
    import orjson

    from replay.engine.usage import Usage
    from replay.record.recorder import Outcome, Recorder
    from replay.record.wire import TapResult
    from replay.trace import TraceWriter, read_trace, validate

    def tap(text, t):
        res = TapResult(message=a(text), finish="stop", usage=Usage(prompt_tokens=10, output_tokens=2))
        return Outcome(tap=res, t_first_byte=t, t_last_byte=t, t_done=t)

    def body(*m):
        return orjson.dumps({"model": "m", "messages": list(m)})

    writer = TraceWriter(tmp_path / "t.jsonl", source="record")
    inf = SessionInference(wall_clock=FixedWall(30.0), idle_after_s=HOUR, rhythm_floor_s=0, rhythm_factor=0)
    rec = Recorder(writer, inf)
    first = rec.begin("openai", body(SYS, u("a")), None, None, 1 * S)
    rec.finish(first, tap("done a", 2 * S))
    assert writer.last("s1") is not None  # its keys, kept to encode the next request against
    later = int(2 * S + 20 * HOUR * S)
    other = rec.begin("openai", body(SYS, u("something else")), None, None, later)
    rec.finish(other, tap("ok", later + S))
    assert writer.last("s1") is None
    back = rec.begin("openai", body(SYS, u("a"), a("done a"), u("b")), None, None, later + 2 * S)
    assert back.assignment.session is first.assignment.session and back.assignment.tag == "turn"
    rec.finish(back, tap("done b", later + 3 * S))
    writer.close()
    validate(tmp_path / "t.jsonl")
    reqs = read_trace(tmp_path / "t.jsonl").requests
    assert [r.session for r in reqs] == ["s1", "s2", "s1"]
    assert [m.get("content") for m in reqs[2].messages()][-1] == "b"


def test_a_conversation_coming_back_every_quarter_hour_holds_a_bounded_number_of_heads():
    """A soak of 100,000 conversations each coming back every ~15 minutes grew by one head per turn
    (idle trimming never applied): heads older than `rewind_s` go as new ones arrive."""
    inf, clock = SessionInference(wall_clock=FixedWall(30.0), rewind_s=600.0), Clock()
    msgs = [SYS, u("task")]
    first = None
    for n in range(12):
        got = turn(inf, clock, list(msgs), gap=900.0, reply=reply_of(1, n))
        first = first or got
        assert got.session is first.session and got.tag == "turn"
        msgs += [a(reply_of(1, n)), u(f"go on {n}")]
        assert len(got.session.heads) <= 2
    assert len([h for h in inf._index.values() if h.session is first.session]) <= 2
    # Within `rewind_s`, an edit of an earlier turn is still found by its prefix.
    for n in range(12, 15):
        turn(inf, clock, list(msgs), gap=10.0, reply=reply_of(1, n))
        msgs += [a(reply_of(1, n)), u(f"go on {n}")]
    edit = turn(inf, clock, [*msgs[:-4], u("that, but edited")], gap=10.0)
    assert edit.session is first.session and edit.tag == "compaction" and edit.base is not None


def _soak_like(passes: int, conversations: int, every_s: float = 900.0, compact_after: int = 4):
    """The record soak's load through a Recorder, one request at a time on a simulated clock:
    `conversations` conversations sharing a system prompt, each back every `every_s` (beyond
    `rewind_s`, within `idle_after_s`), compacting after `compact_after` turns with its last reply
    carried over. Yields after each pass: the recorder, the histories, the trace path."""
    import gc
    import tempfile
    from pathlib import Path

    import orjson

    from replay.engine.usage import Usage
    from replay.record.recorder import Outcome, Recorder
    from replay.record.wire import TapResult
    from replay.trace import TraceWriter

    system = {"role": "system", "content": "You are a coding agent. " * 80}
    step = int(every_s / conversations * S)
    histories = [[system, u(f"conversation {c}: fix the failing test")] for c in range(conversations)]
    turns = [0] * conversations
    now = 1000 * S
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.jsonl"
        rec = Recorder(TraceWriter(path, source="record"), SessionInference(wall_clock=FixedWall(30.0)))
        rid = 0
        for p in range(passes):
            for c in range(conversations):
                now += step
                body = orjson.dumps({"model": "m", "messages": histories[c], "stream": True})
                pending = rec.begin("openai", body, None, None, now)
                rid += 1
                text = f"#{rid} done: read the files, fixed the bug, the tests pass now"
                tap = TapResult(message=a(text), finish="stop", usage=Usage(prompt_tokens=9, output_tokens=9))
                rec.finish(pending, Outcome(tap=tap, t_first_byte=now, t_last_byte=now, t_done=now + S // 2))
                turns[c] += 1
                if turns[c] % compact_after:
                    histories[c] = [*histories[c], a(text), u(f"tool result {turns[c]} of {c}")]
                else:
                    histories[c] = [system, u(f"Summary of earlier work:\n{text}\nContinue.")]
            gc.collect()
            yield p + 1, rec, histories, path
        rec.writer.close()


def test_a_session_waiting_for_its_next_turn_holds_one_head_pass_after_pass():
    """The 60-minute record soak grew ~600 bytes per conversation on its second pass: a session
    kept its previous head (and its index entry) until its next turn came, though older than
    `rewind_s`. Waiting sessions hold their latest head only, and every conversation is still
    matched to its own session, by prefix or by its carried-over reply."""
    n = 200
    for done, rec, _, _ in _soak_like(passes=6, conversations=n):
        inf = rec.inference
        assert len(inf.sessions) == n  # every turn and compaction found its conversation
        assert all(len(s.heads) == 1 and s.heads[0] is s.last is s.last_done for s in inf.sessions.values())
        assert len(inf._index) == n
        assert all(s.requests == done for s in inf.sessions.values())
        assert len(rec.writer._sessions) == n


def _held(rec, session) -> int:
    """Bytes a session's own objects take in the inference and the writer (not the shared tables)."""
    import sys

    size = sys.getsizeof(session) + sys.getsizeof(session.heads) + sys.getsizeof(session.gaps)
    size += sum(sys.getsizeof(h) for h in session.heads)
    size += sum(sys.getsizeof(g) for g in session.gaps if not isinstance(session.gaps, array))
    basis = rec.writer.last(session.declared)
    if basis is not None:
        size += sys.getsizeof(basis) + sys.getsizeof(basis.keys)
    return size


def test_what_a_waiting_session_holds_grows_by_its_gaps_alone():
    """Pass after pass of the same conversations (compacting every 4 turns), what each session
    holds between its turns: only the gaps kept for its rhythm grow (8 bytes each, at most 16),
    and the writer's keys follow the conversation's length (the same at the same point of its
    compaction cycle). A head kept per turn, or a gap as a float object, would show here."""
    n = 50
    held: dict[int, list[int]] = {}
    for done, rec, _, _ in _soak_like(passes=9, conversations=n):
        held[done] = [_held(rec, s) for s in rec.inference.sessions.values()]
        assert all(len(s.gaps) == done - 1 for s in rec.inference.sessions.values())
    for later in (5, 9):  # the first request after a compaction, as the first one was
        growth = [b - a for a, b in zip(held[1], held[later], strict=True)]
        assert max(growth) <= 8 * 16, growth
