"""`Request.reply`: a bare recorded reply is held as its values and read back exactly as written."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from replay.trace import Request, TraceWriter, read_trace
from replay.trace.select import split_workers


def _request(reply):
    return Request(1, "s", 0.0, None, 0, ({"role": "user", "content": "hi"},), {}, reply=reply)


BARE = [
    {"message": {"role": "assistant", "content": "done"}, "finish": "length", "output_tokens": 16},
    {"message": {"role": "assistant", "content": ""}},
    {"message": {"role": "assistant", "content": "x"}, "output_tokens": 0},
    {"message": {"role": "assistant", "content": "x"}, "finish": "stop"},
]
OTHER = [
    None,
    {},
    {"finish": "length"},
    {"output_tokens": 16, "message": {"role": "assistant", "content": "x"}},  # another order
    {"message": {"role": "assistant", "content": "x"}, "output_tokens": 3, "finish": "stop"},
    {"message": {"content": "x", "role": "assistant"}},
    {"message": {"role": "assistant", "content": None}},
    {"message": {"role": "assistant", "content": "x"}, "finish": None},
    {"message": {"role": "assistant", "content": "x"}, "output_tokens": True},
    {"message": {"role": "assistant", "content": "x"}, "output_tokens": 5.0},
    {"message": {"role": "assistant", "content": "x", "tool_calls": []}},
    {"message": {"role": "assistant", "content": "x"}, "status": "timeout"},
]


@pytest.mark.parametrize("reply", BARE)
def test_a_bare_reply_is_held_as_its_values_and_read_back_as_written(reply):
    req = _request(reply)
    assert type(req._reply) is tuple  # three values, not two dicts: ~300 bytes a loaded request
    assert orjson.dumps(req.reply) == orjson.dumps(reply)
    assert req.reply is not req.reply  # built on each read: nothing shared to change in place


@pytest.mark.parametrize("reply", OTHER)
def test_any_other_reply_is_held_as_it_is(reply):
    req = _request(reply)
    assert req.reply is reply


@given(
    st.dictionaries(
        st.sampled_from(["message", "finish", "output_tokens", "status"]),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(0, 5),
            st.sampled_from(["stop", 1.0]),
            st.fixed_dictionaries(
                {"role": st.sampled_from(["assistant", "user"]), "content": st.text(max_size=3)}
            ),
        ),
    )
)
def test_whatever_a_reply_holds_it_reads_back_the_same(reply):
    assert orjson.dumps(_request(reply).reply) == orjson.dumps(reply)


def test_a_request_with_another_after_keeps_its_reply(tmp_path):
    reply = BARE[0]
    req = _request(reply)
    moved = req.replaced(after={"delay_s": 1.0})
    assert moved.after == {"delay_s": 1.0} and moved.reply == reply and moved.append is req.append
    assert type(moved._reply) is tuple


def test_a_loaded_trace_holds_bare_replies_as_values_and_shards_keep_them(tmp_path):
    path = tmp_path / "t.jsonl"
    with TraceWriter(path, source="test") as w:
        for s in ("a", "b"):
            w.session(s)
            reply = {
                "message": {"role": "assistant", "content": f"re {s}"},
                "finish": "stop",
                "output_tokens": 2,
            }
            w.request(s, 0.0, [{"role": "user", "content": "go"}], {"max_tokens": 4}, reply)
            after = {"request": 1, "delay_s": 0.5} if s == "b" else None  # across shards: dropped
            w.request(s, 1.0, [{"role": "user", "content": "on"}], {}, reply, after=after)
    trace = read_trace(path)
    assert all(type(r._reply) is tuple for r in trace.requests)
    assert [r.reply["message"]["content"] for r in trace.requests] == ["re a", "re a", "re b", "re b"]
    assert trace.requests[0].max_tokens == 4 and trace.requests[1].max_tokens == 2
    parts = split_workers(trace, 2)
    b_after = [r.after for p in parts for r in p.requests if r.session == "b"]
    assert b_after == [None, {"delay_s": 0.5}]  # `replaced` made it
    for part in parts:
        for r in part.requests:
            assert r.reply == {
                "message": {"role": "assistant", "content": f"re {r.session}"},
                "finish": "stop",
                "output_tokens": 2,
            }
