"""Checked reading of request bodies: every field an agent sent goes through a typed accessor.

A client may send any JSON at all. `m.get("tool_calls")[0].get("function")` trusts it and turns
`"tool_calls": ["x"]` into an AttributeError (a 500, a lost recording); reading through `RequestFields`
turns it into `FieldError`, whose message names the field (`messages[2].tool_calls[0].function
must be an object, got "x"`). Absent keys and JSON null read as "not said" (None / empty), as
servers treat them; unknown keys are ignored. The same method names as the engine's reply-side
`ReplyFields` (`text`, `count`, `obj`, `objects`, `value`), so one reads like the other.
"""

from __future__ import annotations

from typing import Any

import orjson

from replay.serving.counts import COUNT_MAX, as_count

_SNIPPET_MAX = 80


class FieldError(ValueError):
    """A request field of the wrong type, shape or range; `path` names it ("" is the whole body)."""

    def __init__(self, path: str, expected: str, got: Any = None, *, missing: bool = False) -> None:
        self.path = path
        if missing:
            message = f"'{path}' is required ({expected})"
        elif path:
            message = f"'{path}' must be {expected}, got {snippet(got)}"
        else:
            message = f"the request body must be {expected}, got {snippet(got)}"
        super().__init__(message)


class NotJson(FieldError):
    """The body does not parse as JSON at all."""

    def __init__(self, why: str) -> None:
        ValueError.__init__(self, f"the request body is not valid JSON ({why})")
        self.path = ""


def snippet(value: Any) -> str:
    """A short, one-line JSON rendering of a value for an error message."""
    try:
        text = orjson.dumps(value).decode()
    except TypeError:
        text = repr(value)
    return text if len(text) <= _SNIPPET_MAX else text[: _SNIPPET_MAX - 3] + "..."


def join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def load_body(data: bytes) -> RequestFields:
    """A request body that must be one JSON object."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise NotJson(str(exc)) from None
    return RequestFields(value, "")


class RequestFields:
    """A JSON object from a client with typed accessors; `path` names it in error messages."""

    __slots__ = ("path", "raw")

    def __init__(self, value: Any, path: str = "") -> None:
        if type(value) is not dict:
            raise FieldError(path, "an object", value)
        self.raw: dict[str, Any] = value
        self.path = path

    def __contains__(self, key: str) -> bool:
        return key in self.raw

    def at(self, key: str | int) -> str:
        return join(self.path, key)

    def value(self, key: str) -> Any:
        """Any JSON value, unchecked: for fields kept as they are (never looked inside)."""
        return self.raw.get(key)

    def _required(self, key: str, expected: str) -> Any:
        value = self.raw.get(key)
        if value is None:
            raise FieldError(self.at(key), expected, missing=True)
        return value

    def text(self, key: str, *, required: bool = False) -> str | None:
        value = self._required(key, "a string") if required else self.raw.get(key)
        if value is None or type(value) is str:
            return value
        raise FieldError(self.at(key), "a string", value)

    def choice(self, key: str, choices: tuple[str, ...], *, required: bool = False) -> str | None:
        """A string from a fixed set (a role, a block type)."""
        value = self.text(key, required=required)
        if value is not None and value not in choices:
            expected = "one of " + ", ".join(repr(c) for c in choices)
            raise FieldError(self.at(key), expected, value)
        return value

    def boolean(self, key: str) -> bool | None:
        """true or false: "false" is a string, not a boolean (bool("false") is True)."""
        value = self.raw.get(key)
        if value is None or type(value) is bool:
            return value
        raise FieldError(self.at(key), "true or false", value)

    def number(self, key: str) -> float | int | None:
        value = self.raw.get(key)
        if value is None or type(value) in (int, float):
            return value
        raise FieldError(self.at(key), "a number", value)

    def count(self, key: str, most: int = COUNT_MAX, what: str = "") -> int | None:
        """A count up to `most`, by the one rule of `serving.counts` (3.0 reads as 3); `what` says
        where a lower bound than COUNT_MAX comes from (the context size)."""
        value = self.raw.get(key)
        if value is None:
            return None
        n = as_count(value, most)
        if n is None:
            bound = ("2^53 - 1" if most == COUNT_MAX else f"{most}") + (f" ({what})" if what else "")
            raise FieldError(self.at(key), f"an integer from 0 to {bound}", value)
        return n

    def obj(self, key: str, *, required: bool = False) -> RequestFields | None:
        value = self._required(key, "an object") if required else self.raw.get(key)
        return None if value is None else RequestFields(value, self.at(key))

    def items(self, key: str, *, required: bool = False) -> list[Any]:
        """A list of anything; absent or null is an empty list."""
        value = self._required(key, "an array") if required else self.raw.get(key)
        if value is None:
            return []
        if type(value) is not list:
            raise FieldError(self.at(key), "an array", value)
        return value

    def objects(self, key: str, *, required: bool = False) -> list[RequestFields]:
        """Each element of a list of objects; absent or null is an empty list."""
        at = self.at(key)
        return [RequestFields(item, join(at, i)) for i, item in enumerate(self.items(key, required=required))]
