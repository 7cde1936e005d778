"""One rule for a count in JSON (`replay.serving.counts`), and every reader of counts keeps it: the
engine reading a server's reply, our servers reading a client's request, and the trace reader. One
table, every side."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from replay.engine.decode import BadShape, ReplyFields, check_counts
from replay.errors import TraceError
from replay.serving.counts import COUNT_MAX, as_count
from replay.serving.fields import FieldError, RequestFields
from replay.trace import reader

# (value, the count it reads as, or None: not a count)
TABLE: list[tuple[Any, int | None]] = [
    (0, 0),
    (3, 3),
    (3.0, 3),  # JSON does not tell 3 from 3.0; servers read it as 3
    (-0.0, 0),
    (2**53 - 1, 2**53 - 1),
    (float(2**53 - 1), 2**53 - 1),
    (2**53, None),  # 2^53 + 1 reads as 2^53 in a double: no longer exact
    (float(2**53), None),
    (1e308, None),
    (-1, None),
    (-1.0, None),
    (1.5, None),
    (float("nan"), None),
    (float("inf"), None),
    ("3", None),
    (True, None),  # a bool is an int to Python, never a count
    (False, None),
    ([3], None),
    ({"n": 3}, None),
]


def _reply(value: Any) -> int:
    n = ReplyFields({"n": value}).count("n")
    assert n is not None
    return n


def _reply_usage(value: Any) -> int:
    check_counts({"usage": {"n": value}}, [("usage", "n")], "$")
    n = as_count(value)
    assert n is not None
    return n


def _request(value: Any) -> int:
    n = RequestFields({"n": value}).count("n")
    assert n is not None
    return n


def _trace(value: Any) -> int:
    n = reader._count(reader._Checker("t.jsonl"), {"n": value}, "n", 1, "usage")
    assert n is not None
    return n


SIDES: dict[str, tuple[Callable[[Any], int], type[Exception]]] = {
    "reply field": (_reply, BadShape),
    "reply usage": (_reply_usage, BadShape),
    "request field": (_request, FieldError),
    "trace field": (_trace, TraceError),
}


@pytest.mark.parametrize("side", sorted(SIDES))
@pytest.mark.parametrize(("value", "count"), TABLE, ids=[repr(v) for v, _ in TABLE])
def test_every_side_reads_a_count_by_the_one_rule(side: str, value: Any, count: int | None) -> None:
    read, error = SIDES[side]
    if count is None:
        with pytest.raises(error):
            read(value)
    else:
        n = read(value)
        assert n == count and type(n) is int


def test_an_absent_or_null_count_is_not_said_on_any_side() -> None:
    assert ReplyFields({"n": None}).count("n") is None
    assert ReplyFields({}).count("n") is None
    assert RequestFields({"n": None}).count("n") is None
    assert reader._count(reader._Checker("t.jsonl"), {}, "n", 1, "usage") is None
    check_counts({"usage": {"n": None}}, [("usage", "n")], "$")


def test_a_request_count_may_have_a_lower_bound_of_its_own() -> None:
    assert RequestFields({"n": 100.0}).count("n", 100, "ctx") == 100
    with pytest.raises(FieldError, match=r"'n' must be an integer from 0 to 100 \(ctx\), got 101"):
        RequestFields({"n": 101}).count("n", 100, "ctx")
    with pytest.raises(FieldError, match=r"from 0 to 2\^53 - 1, got"):
        RequestFields({"n": 2**53}).count("n")
    assert as_count(COUNT_MAX) == COUNT_MAX and as_count(COUNT_MAX + 1) is None
