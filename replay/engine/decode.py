"""Checked reading of server replies: every field goes through a typed accessor.

A server may send any JSON at all. Reading `obj.get("choices")[0].get("delta")` trusts it and turns
`{"choices": [1]}` into an AttributeError that escapes the request; reading through `ReplyFields` turns
it into `BadShape`, which the exchange records as that request's `bad_payload` failure with the
offending bytes kept as evidence. Absent keys and JSON null read as "not said" (None / empty):
servers omit and null optional fields freely, and that is not a fault. Unknown keys are ignored.

Public API: `ReplyFields` (a JSON object and where it sits), `BadShape`, `BadPayload`, `load_object`
(`load_json` and `as_object`, its two halves), `check_counts`. The recorder and the simulator can
read wire JSON with the same accessors.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import orjson

from replay.serving.counts import COUNT_RULE, as_count

_SNIPPET_MAX = 120


class BadPayload(Exception):
    """The server sent bytes that are not the JSON the protocol promises.

    `evidence` holds the bytes at fault (an event's data, a whole body), set by whoever has them.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        # Set here, not as a class default: a compiled exception has no class-level defaults.
        self.evidence: bytes | None = None


class BadShape(BadPayload):
    """Valid JSON of the wrong type or shape at `path`."""

    def __init__(self, path: str, expected: str, got: Any) -> None:
        self.path = path
        super().__init__(f"{path} must be {expected}, got {_snippet(got)}")


def _snippet(value: Any) -> str:
    try:
        text = orjson.dumps(value).decode()
    except TypeError:
        text = repr(value)
    return text if len(text) <= _SNIPPET_MAX else text[: _SNIPPET_MAX - 3] + "..."


class ReplyFields:
    """A JSON object from a server with typed accessors; `path` names it in error messages."""

    __slots__ = ("raw", "path")

    def __init__(self, value: Any, path: str = "$") -> None:
        if type(value) is not dict:
            raise BadShape(path, "an object", value)
        self.raw: dict[str, Any] = value
        self.path = path

    def __contains__(self, key: str) -> bool:
        return key in self.raw

    def _at(self, key: str) -> str:
        return f"{self.path}.{key}"

    def value(self, key: str) -> Any:
        """Any JSON value, unchecked: for fields kept as they are (never looked inside)."""
        return self.raw.get(key)

    def text(self, key: str) -> str | None:
        value = self.raw.get(key)
        if value is None or type(value) is str:
            return value
        raise BadShape(self._at(key), "a string", value)

    def integer(self, key: str) -> int | None:
        value = self.raw.get(key)
        if value is None or (type(value) is int):
            return value
        raise BadShape(self._at(key), "an integer", value)

    def count(self, key: str) -> int | None:
        """A token count, by the one rule of `serving.counts` (3.0 reads as 3)."""
        value = self.raw.get(key)
        if value is None:
            return None
        n = as_count(value)
        if n is None:
            raise BadShape(self._at(key), f"a count ({COUNT_RULE})", value)
        return n

    def obj(self, key: str) -> ReplyFields | None:
        value = self.raw.get(key)
        return None if value is None else ReplyFields(value, self._at(key))

    def objects(self, key: str) -> Iterator[ReplyFields]:
        """Each element of a list of objects; absent or null is an empty list."""
        value = self.raw.get(key)
        if value is None:
            return iter(())
        if type(value) is not list:
            raise BadShape(self._at(key), "a list", value)
        at = self._at(key)
        return (ReplyFields(item, f"{at}[{i}]") for i, item in enumerate(value))

    def first_object(self, key: str) -> ReplyFields | None:
        """The first element of a list of objects (a non-stream reply's first choice)."""
        for item in self.objects(key):
            return item
        return None


def load_json(data: bytes, what: str = "event data") -> Any:
    """Bytes that must hold JSON; anything else is a `BadPayload` carrying the bytes.

    The value is unchecked: a reader's fast path looks inside the dict itself, and hands anything
    else to `as_object`."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        shown = " ".join(data[:_SNIPPET_MAX].decode("utf-8", "replace").split())
        exc = BadPayload(f"{what} is not JSON: {shown}")
        exc.evidence = data
        raise exc from None


def as_object(value: Any, data: bytes) -> ReplyFields:
    """`load_json`'s value as the object it must be, else `BadShape` carrying the bytes."""
    try:
        return ReplyFields(value, "$")
    except BadShape as exc:
        exc.evidence = data
        raise


def load_object(data: bytes, what: str = "event data") -> ReplyFields:
    """Bytes that must hold one JSON object; anything else is a `BadPayload` carrying the bytes."""
    return as_object(load_json(data, what), data)


def check_counts(obj: dict[str, Any], paths: Iterable[tuple[str, ...]], where: str) -> None:
    """Every path that is present in `obj` leads through objects to a count (or null).

    Usage rule tables read nested paths leniently; this makes a count of the wrong type or range
    (`"prompt_tokens": "x"`, `-1`, `1e308`) a failure rather than a silently missing figure.
    """
    for path in paths:
        cur: Any = obj
        at = where
        for key in path:
            if cur is None:
                break
            if type(cur) is not dict:
                raise BadShape(at, "an object", cur)
            cur = cur.get(key)
            at = f"{at}.{key}"
        else:
            if cur is not None and as_count(cur) is None:
                raise BadShape(at, f"a count ({COUNT_RULE})", cur)


def check_modelled(x_sim: ReplyFields) -> dict[str, Any]:
    """The simulator's `x_sim` object, kept as the record's `modelled`: its `*_s` figures must be
    non-negative numbers (reports add them up), `slot` an integer, `cache_source` a string."""
    for key, value in x_sim.raw.items():
        if value is None:
            continue
        if key.endswith("_s") and not (type(value) in (int, float) and value >= 0):
            raise BadShape(f"{x_sim.path}.{key}", "a number of seconds >= 0", value)
    x_sim.integer("slot")
    x_sim.text("cache_source")
    return x_sim.raw
