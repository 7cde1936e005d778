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


@dataclass(slots=True, eq=False, init=False)
class Request:
    """One request as sent. `append` may hold `{"$reply": id}`: the reply to request `id` goes there."""

    id: int
    session: str
    t: float
    parent: Request | None
    keep: int
    append: tuple[Message, ...]
    params: dict[str, Any]
    reply: dict[str, Any] | None
    usage: dict[str, Any] | None
    after: dict[str, Any] | None
    tag: str
    line: int
    n_messages: int = field(init=False)

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
