"""Trace writer: give it full message lists, it stores each request as a delta of the last one.

Each request is delta-encoded against its session's previous request: the longest common prefix is
kept by count, the rest is appended, and an appended message equal to the previous request's reply
becomes `{"$reply": id}` so replay can splice in the server's own reply. Every line is flushed as it
is written, so a recorder that crashes loses nothing already written.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import IO, Any

import orjson

from replay.trace.model import FORMAT, Message

_VISIBLE = ("role", "content", "tool_calls", "tool_call_id")


def _same_message(a: Message, b: Message) -> bool:
    """Equal as a client would resend them (reasoning the client never sends back is ignored)."""
    if a is b:
        return True
    return all(a.get(k) == b.get(k) for k in _VISIBLE)


class _SessionState:
    __slots__ = ("last_id", "messages", "reply")

    def __init__(self) -> None:
        self.last_id: int | None = None
        self.messages: list[Message] = []
        self.reply: Message | None = None


class TraceWriter:
    """Append-only writer of one trace file."""

    def __init__(
        self,
        path: str | Path,
        source: str,
        notes: str = "",
        created: str | None = None,
        start: str | None = None,
    ) -> None:
        self.path = str(path)
        self._out: IO[bytes] = open(self.path, "wb")  # noqa: SIM115 - closed by close()
        self._next_id = 1
        self._sessions: dict[str, _SessionState] = {}
        self._blobs: set[str] = set()
        created = created or _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        header = {"kind": "trace", "format": FORMAT, "created": created, "source": source, "notes": notes}
        if start:
            header["start"] = start  # the wall-clock time of t=0 (FORMAT.md)
        self._line(header)

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._out.closed

    def close(self) -> None:
        if not self._out.closed:
            self._out.close()

    def _line(self, obj: dict[str, Any]) -> None:
        self._out.write(orjson.dumps(obj) + b"\n")
        self._out.flush()

    def session(
        self,
        sid: str,
        role: str = "interactive",
        api: str = "openai",
        model: str = "default",
        labels: dict[str, Any] | None = None,
    ) -> None:
        self._sessions[sid] = _SessionState()
        self._line(
            {"kind": "session", "id": sid, "role": role, "api": api, "model": model, "labels": labels or {}}
        )

    def forget(self, sid: str) -> None:
        """Let go of the session's last request (kept to encode the next one against it): its next
        request, if any, is written whole. What a long-running recorder does for idle sessions."""
        state = self._sessions.get(sid)
        if state is not None:
            state.last_id, state.messages, state.reply = None, [], None

    def raw_line(self, obj: dict[str, Any]) -> None:
        """A line of a kind this writer has no method for (the recorder's `unrecorded` lines)."""
        self._line(obj)

    def blob(self, bid: str, value: Any) -> dict[str, str]:
        """Store a large shared value once; returns the reference to put where it is used."""
        if bid not in self._blobs:
            self._blobs.add(bid)
            self._line({"kind": "blob", "id": bid, "value": value})
        return {"$blob": bid}

    def rejected(self, t: float, api: str, status: int, size: int, sha256: str) -> None:
        """A request the upstream refused: when, its status, and its body's size and hash only."""
        self._line(
            {
                "kind": "rejected",
                "t": round(t, 6),
                "api": api,
                "status": status,
                "bytes": size,
                "sha256": sha256,
            }
        )

    def request(
        self,
        session: str,
        t: float,
        messages: list[Message],
        params: dict[str, Any] | None = None,
        reply: dict[str, Any] | None = None,
        usage: dict[str, Any] | None = None,
        after: dict[str, Any] | None = None,
        tag: str = "turn",
        rid: int | None = None,
        base: tuple[int, list[Message], Message | None] | None = None,
        synthetic: list[int] | None = None,
    ) -> int:
        """Write one request given its full message list; returns its id.

        It is encoded against the session's previous request, or against `base` (an earlier
        request's id, messages and reply message) when it extends another one, as a concurrent
        turn does. `synthetic`: indices of messages an importer made up (FORMAT.md).
        """
        state = self._sessions[session]
        rid = self._next_id if rid is None else rid
        self._next_id = rid + 1
        parent_id, prev, prev_reply = (
            base if base is not None else (state.last_id, state.messages, state.reply)
        )
        keep = 0
        while keep < len(prev) and keep < len(messages) and _same_message(prev[keep], messages[keep]):
            keep += 1
        append: list[Message] = list(messages[keep:])
        if (
            keep == len(prev)
            and append
            and prev_reply is not None
            and parent_id is not None
            and _same_message(append[0], prev_reply)
        ):
            append[0] = {"$reply": parent_id}
        obj: dict[str, Any] = {"kind": "request", "id": rid, "session": session, "t": round(t, 6)}
        if parent_id is not None and keep:
            obj["parent"] = parent_id
            obj["keep"] = keep
        obj["append"] = append
        obj["params"] = params or {}
        for key, value in (("reply", reply), ("usage", usage), ("after", after)):
            if value is not None:
                obj[key] = value
        obj["tag"] = tag
        if synthetic:
            obj["synthetic"] = synthetic
        self._line(obj)
        state.last_id = rid
        state.messages = list(messages)
        state.reply = (reply or {}).get("message")
        return rid
