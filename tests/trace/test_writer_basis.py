"""The writer encodes against message keys, not messages: its lines must be the ones comparing the
messages themselves gave, byte for byte, and read back to the messages given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.trace.keys import visible_key
from replay.trace.writer import Basis, TraceWriter

_VISIBLE = ("role", "content", "tool_calls", "tool_call_id")


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a is b or all(a.get(k) == b.get(k) for k in _VISIBLE)


def _oracle(
    requests: list[tuple[str, list[dict[str, Any]], dict[str, Any] | None, int | None]],
) -> list[dict]:
    """The writer as it was: each request compared by value against the one it extends."""
    last: dict[str, tuple[int | None, list[dict[str, Any]], dict[str, Any] | None]] = {}
    written: dict[int, tuple[int | None, list[dict[str, Any]], dict[str, Any] | None]] = {}
    out = []
    for rid, (sid, messages, reply, base) in enumerate(requests, start=1):
        parent, prev, prev_reply = written[base] if base is not None else last.get(sid, (None, [], None))
        keep = 0
        while keep < len(prev) and keep < len(messages) and _same(prev[keep], messages[keep]):
            keep += 1
        append: list[Any] = list(messages[keep:])
        reply_next = keep == len(prev) and append and prev_reply is not None and parent is not None
        if reply_next and _same(append[0], prev_reply):
            append[0] = {"$reply": parent}
        obj: dict[str, Any] = {"kind": "request", "id": rid, "session": sid, "t": 0.0}
        if parent is not None and keep:
            obj["parent"] = parent
            obj["keep"] = keep
        obj["append"] = append
        obj["params"] = {}
        if reply is not None:
            obj["reply"] = {"message": reply}
        obj["tag"] = "turn"
        out.append(obj)
        last[sid] = written[rid] = (rid, list(messages), reply)
    return out


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.sampled_from([1.0, -1.0, 2.5, 2**61 - 1, 0])
    | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("abc"), inner, max_size=3),
    max_leaves=6,
)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool"])},
    optional={
        "content": st.none() | st.sampled_from(["", "hi", "yes"]) | st.lists(_json, max_size=2),
        "tool_calls": st.lists(
            st.fixed_dictionaries({"id": st.sampled_from(["1", "2"])}, optional={"x": _json}), max_size=2
        ),
        "tool_call_id": st.sampled_from(["1", "2"]),
        "reasoning": st.text(max_size=2),
    },
)


@st.composite
def _requests(draw: st.DrawFn) -> list[tuple[str, list[dict[str, Any]], dict[str, Any] | None, int | None]]:
    pool = draw(st.lists(_message, min_size=1, max_size=6))
    pick = st.sampled_from(pool)  # few distinct messages: prefixes and replies recur
    out: list[tuple[str, list[dict[str, Any]], dict[str, Any] | None, int | None]] = []
    for _ in range(draw(st.integers(1, 8))):
        sid = draw(st.sampled_from(["a", "b"]))
        earlier = [i + 1 for i, r in enumerate(out) if r[0] == sid]
        if earlier and draw(st.booleans()):  # extend the session's last request, often with its reply
            prev = out[earlier[-1] - 1]
            head = prev[1][: draw(st.integers(0, len(prev[1])))]
            tail = [dict(prev[2])] if prev[2] is not None and draw(st.booleans()) else []
            # the same message objects (a generator's history) or copies (a recorder's, parsed anew)
            head = list(head) if draw(st.booleans()) else [dict(m) for m in head]
            messages = head + tail + draw(st.lists(pick, max_size=2))
        else:
            messages = draw(st.lists(pick, max_size=4))
        base = draw(st.sampled_from(earlier)) if earlier and draw(st.booleans()) else None
        out.append((sid, messages, draw(st.none() | pick), base))
    return out


def _write(
    path: Path,
    requests: list[tuple[str, list[dict[str, Any]], dict[str, Any] | None, int | None]],
    shared_messages: bool = False,
) -> list[dict]:
    bases: dict[int, Basis] = {}
    with TraceWriter(
        path, source="test", created="2026-01-01T00:00:00+00:00", shared_messages=shared_messages
    ) as w:
        for sid in ("a", "b"):
            w.session(sid)
        for rid, (sid, messages, reply, base) in enumerate(requests, start=1):
            w.request(
                sid,
                0.0,
                messages,
                reply=None if reply is None else {"message": reply},
                base=None if base is None else bases[base],
            )
            basis = w.last(sid)
            assert basis is not None and basis.rid == rid
            bases[rid] = basis
    lines = [orjson.loads(x) for x in path.read_bytes().splitlines()]
    return [x for x in lines if x["kind"] == "request"]


@settings(max_examples=300, deadline=None)
@given(_requests())
def test_lines_match_comparing_messages(tmp_path_factory: Any, requests: Any) -> None:
    path = tmp_path_factory.mktemp("w") / "t.jsonl"
    got = _write(path, requests)
    assert [orjson.dumps(x) for x in got] == [orjson.dumps(x) for x in _oracle(requests)]


@settings(max_examples=300, deadline=None)
@given(_requests())
def test_taking_keys_of_shared_message_objects_writes_the_same_lines(
    tmp_path_factory: Any, requests: Any
) -> None:
    path = tmp_path_factory.mktemp("w") / "t.jsonl"
    got = _write(path, requests, shared_messages=True)
    assert [orjson.dumps(x) for x in got] == [orjson.dumps(x) for x in _oracle(requests)]


def test_a_long_generated_session_is_not_hashed_again_and_again(tmp_path: Path, monkeypatch: Any) -> None:
    """2,000 turns of one growing history: each message's key is taken once (quadratic: 2 million)."""
    import replay.trace.writer as writer

    calls = 0

    def counted(msg: dict[str, Any]) -> int:
        nonlocal calls
        calls += 1
        return visible_key(msg)

    def write(path: Path, shared: bool) -> bytes:
        history: list[dict[str, Any]] = [{"role": "system", "content": "s"}]
        with TraceWriter(path, source="test", created="2026-01-01", shared_messages=shared) as w:
            w.session("a")
            for i in range(2000):
                history.append({"role": "user", "content": f"turn {i}"})
                w.request("a", float(i), history, reply={"message": {"role": "assistant", "content": str(i)}})
                history.append({"role": "assistant", "content": str(i)})
                if i % 500 == 499:  # a compaction: a new list, the system prompt kept
                    history = [history[0], {"role": "user", "content": f"summary {i}"}]
        return path.read_bytes()

    monkeypatch.setattr(writer, "visible_key", counted)
    shared = write(tmp_path / "shared.jsonl", True)
    assert calls < 3 * 2000 + 10
    assert shared == write(tmp_path / "whole.jsonl", False)


@settings(max_examples=200, deadline=None)
@given(_requests())
def test_read_back_gives_the_messages(tmp_path_factory: Any, requests: Any) -> None:
    path = tmp_path_factory.mktemp("w") / "t.jsonl"
    lines = _write(path, requests)
    full: dict[int, list[dict[str, Any]]] = {}
    replies: dict[int, dict[str, Any] | None] = {}
    for line, (_sid, messages, reply, _base) in zip(lines, requests, strict=True):
        head = full[line["parent"]][: line["keep"]] if "keep" in line else []
        body = [replies[m["$reply"]] if isinstance(m, dict) and "$reply" in m else m for m in line["append"]]
        full[line["id"]] = head + body
        replies[line["id"]] = reply
        assert [{k: m.get(k) for k in _VISIBLE} for m in full[line["id"]]] == [
            {k: m.get(k) for k in _VISIBLE} for m in orjson.loads(orjson.dumps(messages))
        ]


def test_keys_tell_apart_what_hashes_confuse() -> None:
    """-1 and -2 hash alike, as do ints equal modulo 2**61-1; 1, 1.0 and True are equal."""
    assert visible_key({"content": [-1]}) != visible_key({"content": [-2]})
    assert visible_key({"content": [2**61 - 1]}) != visible_key({"content": [0]})
    assert (
        visible_key({"content": [1]}) == visible_key({"content": [1.0]}) == visible_key({"content": [True]})
    )
    assert visible_key({"content": None}) != visible_key({"content": ""})
    assert visible_key({"content": {"a": 1, "b": 2}}) == visible_key({"content": {"b": 2, "a": 1}})
    assert visible_key({"role": "user", "reasoning": "x"}) == visible_key({"role": "user"})
