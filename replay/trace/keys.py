"""Message identities as hashes, so nothing that compares requests has to hold their text.

Python's own hashing (64 bits, per process) rather than a digest: these run over the whole
conversation on every request, and the keys never leave memory. Two kinds:
- `message_key` / `prefix_chain`: a message as an agent would resend it (session inference; lenient:
  absent and empty content, or a tool call's extra fields, do not tell messages apart).
- `visible_key`: the trace writer's identity, equal exactly when the message's visible fields are
  equal (`==`), so its delta encoding is what comparing the messages themselves would give.
"""

from __future__ import annotations

from typing import Any

from replay.trace.model import Message

VISIBLE = ("role", "content", "tool_calls", "tool_call_id")


def frozen(value: Any) -> Any:
    """A hashable copy of JSON-like data (content lists, tool calls)."""
    if isinstance(value, list | tuple):
        return tuple(frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, frozen(v)) for k, v in value.items())
    return value


def message_key(msg: Message) -> int:
    """A message as an agent would resend it: reasoning (never resent) is left out."""
    calls = msg.get("tool_calls") or ()
    content = msg.get("content")
    return hash(
        (
            msg.get("role"),
            "" if content is None else frozen(content),
            tuple((c.get("id"), c.get("name"), c.get("arguments")) for c in calls),
            msg.get("tool_call_id"),
        )
    )


def prefix_chain(messages: list[Message]) -> list[int]:
    """chain[i] identifies messages[:i]; equal chains mean equal prefixes."""
    chain = [0]
    for i, msg in enumerate(messages):
        chain.append(hash((chain[-1], i, message_key(msg))))
    return chain


def _exact(value: Any) -> Any:
    """A hashable form of JSON-like data that two values share exactly when they are `==`: dicts
    in key order, lists and tuples told apart, and numbers by their exact ratio written out (so
    1 == 1.0 == True share one, and -1 and -2, or ints equal modulo 2**61-1, do not collide as
    their hashes would)."""
    if isinstance(value, str) or value is None:
        return value
    if isinstance(value, bool | int | float):
        try:
            n, d = value.as_integer_ratio()
        except (OverflowError, ValueError):  # inf, nan: no JSON has them
            return ("#", repr(value))
        return ("#", str(n), str(d))
    if isinstance(value, list):
        return ("[", *(_exact(v) for v in value))
    if isinstance(value, tuple):
        return ("(", *(_exact(v) for v in value))
    if isinstance(value, dict):
        return ("{", *sorted((str(k), type(k).__name__, _exact(v)) for k, v in value.items()))
    return ("?", type(value).__name__, repr(value))


def visible_key(msg: Message) -> int:
    """The message's visible fields (what a client sends back: not its reasoning), exactly."""
    return hash(tuple(_exact(msg.get(k)) for k in VISIBLE))
