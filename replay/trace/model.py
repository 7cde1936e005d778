"""The in-memory trace: sessions and requests whose message lists share structure.

A request stores only what it adds to its parent (`parent`, `keep`, `append`), so a 200-turn
session costs linear, not quadratic, memory. `messages()` rebuilds the full list by reference: the
message dicts themselves are the ones read from the file, never copied.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FORMAT = "agent-replay-trace/2"
# Versions this tool reads. /2 added `after.spawn` and `after.waits` (subagents that fan out); a /1
# trace is read as it always was, and refused if it uses them.
READS = ("agent-replay-trace/1", FORMAT)

APIS = ("openai", "anthropic", "openai-responses")

Message = dict[str, Any]


@dataclass(slots=True)
class TraceHeader:
    format: str = FORMAT
    created: str = ""
    source: str = ""
    notes: str = ""
    start: str = ""  # wall-clock time of t=0 ("2026-11-28T06:45:00" or "06:45"), when known


@dataclass(slots=True)
class Session:
    id: str
    role: str = "interactive"
    api: str = "openai"
    model: str = "default"
    labels: dict[str, Any] = field(default_factory=dict)


class Request:
    """One request as sent. `append` may hold `{"$reply": id}`: the reply to request `id` goes there.

    Not a dataclass: `reply` is a property over a compact value (see it), which
    `dataclasses.replace` would drop; `replaced` makes a copy with changes."""

    __slots__ = (
        "id", "session", "t", "parent", "keep", "append", "params", "_reply", "usage", "after", "tag",
        "line", "n_messages",
    )  # fmt: skip

    id: int
    session: str
    t: float
    parent: Request | None
    keep: int
    append: tuple[Message, ...]
    params: dict[str, Any]
    _reply: Any  # `reply`, held compactly
    usage: dict[str, Any] | None
    after: dict[str, Any] | None
    tag: str
    line: int
    n_messages: int

    def __init__(
        self,
        id: int,  # noqa: A002 - the trace's field
        session: str,
        t: float,
        parent: Request | None,
        keep: int,
        append: tuple[Message, ...],
        params: dict[str, Any],
        reply: dict[str, Any] | None = None,
        usage: dict[str, Any] | None = None,
        after: dict[str, Any] | None = None,
        tag: str = "turn",
        line: int = 0,
    ) -> None:
        self.id = id
        self.session = session
        self.t = t
        self.parent = parent
        self.keep = keep
        self.append = append
        self.params = params
        self.reply = reply
        self.usage = usage
        self.after = after
        self.tag = tag
        self.line = line
        self.n_messages = keep + len(append)

    @property
    def reply(self) -> dict[str, Any] | None:
        """The recorded reply, as the trace wrote it. The common bare one (an assistant text
        with `finish` and `output_tokens`) is held as a tuple of its values and built anew on
        each read: a one-request session's reply is three small objects, not two dicts
        (~300 bytes a request of a loaded trace). Read it, never change it in place."""
        held = self._reply
        if type(held) is not tuple:
            return held  # type: ignore[no-any-return]
        content, finish, output_tokens = held
        reply: dict[str, Any] = {"message": {"role": "assistant", "content": content}}
        if finish is not None:
            reply["finish"] = finish
        if output_tokens is not None:
            reply["output_tokens"] = output_tokens
        return reply

    @reply.setter
    def reply(self, value: dict[str, Any] | None) -> None:
        self._reply = _compact_reply(value)

    def replaced(self, **changes: Any) -> Request:
        """This request with `changes` (the `__init__` arguments named), the rest shared: what
        `dataclasses.replace` did while a request was a dataclass, its reply included."""
        values: dict[str, Any] = {
            "id": self.id, "session": self.session, "t": self.t, "parent": self.parent,
            "keep": self.keep, "append": self.append, "params": self.params, "reply": self.reply,
            "usage": self.usage, "after": self.after, "tag": self.tag, "line": self.line,
        }  # fmt: skip
        values.update(changes)
        return Request(**values)

    def __repr__(self) -> str:
        return f"Request(id={self.id!r}, session={self.session!r}, t={self.t!r}, line={self.line!r})"

    def messages(self) -> list[Message]:
        """The full message list (unresolved: `$reply` markers and synth content left as they are)."""
        chain: list[Request] = []
        node: Request | None = self
        while node is not None:
            chain.append(node)
            node = node.parent if node.keep else None
        out: list[Message] = []
        for node in reversed(chain):
            del out[node.keep :]
            out.extend(node.append)
        return out

    @property
    def max_tokens(self) -> int | None:
        value = self.params.get("max_tokens")
        if value is None and self.reply is not None:
            value = self.reply.get("output_tokens")
        return value

    @property
    def is_compaction(self) -> bool:
        """The prefix was rewritten: fewer of the parent's messages were kept than it had."""
        return self.tag == "compaction" or (self.parent is not None and self.keep < self.parent.n_messages)


def _compact_reply(reply: Any) -> Any:
    """`reply` as `(content, finish, output_tokens)` when it is exactly
    `{"message": {"role": "assistant", "content": text}}` with `finish` (text) and
    `output_tokens` (int) present or absent, in that order; otherwise `reply` itself. A tuple
    given is taken as one made here."""
    if type(reply) is not dict or not 1 <= len(reply) <= 3:
        return reply
    keys = iter(reply)
    if next(keys) != "message":
        return reply
    message = reply["message"]
    if type(message) is not dict or len(message) != 2:
        return reply
    items = iter(message.items())
    role, content = next(items), next(items)
    if role != ("role", "assistant") or content[0] != "content" or type(content[1]) is not str:
        return reply
    finish: str | None = None
    output_tokens: int | None = None
    for key in keys:
        if key == "finish" and output_tokens is None and type(reply[key]) is str:
            finish = reply[key]
        elif key == "output_tokens" and type(reply[key]) is int:
            output_tokens = reply[key]
        else:
            return reply  # another key, a null, a bool or float count, or out of order
    return (content[1], finish, output_tokens)


@dataclass(slots=True)
class Trace:
    path: str
    header: TraceHeader
    sessions: dict[str, Session]
    requests: list[Request]
    # Calls the recorder passed through without recording (`unrecorded` lines), as written.
    unrecorded: list[dict[str, Any]] = field(default_factory=list)

    def by_id(self) -> dict[int, Request]:
        return {r.id: r for r in self.requests}
