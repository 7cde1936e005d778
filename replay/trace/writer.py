"""Trace writer: give it full message lists, it stores each request as a delta of the last one.

Each request is delta-encoded against its session's previous request: the longest common prefix is
kept by count, the rest is appended, and an appended message equal to the previous request's reply
becomes `{"$reply": id}` so replay can splice in the server's own reply. Every line is flushed as it
is written, so a recorder that crashes loses nothing already written.

What a request is encoded against is a `Basis`: the previous request's message identities
(`keys.visible_key`, 8 bytes a message) and its reply's, never the messages themselves, so a
recorder in front of 100,000 conversations holds no text of any of them.
"""

from __future__ import annotations

import datetime as _dt
import operator
from array import array
from pathlib import Path
from typing import IO, Any

import orjson

from replay.trace.keys import visible_key
from replay.trace.model import FORMAT, Message


class Basis:
    """A written request as the next one is encoded against it: its id, its messages' keys, and
    its reply message's key (None: no reply message)."""

    __slots__ = ("keys", "reply", "rid")

    def __init__(self, rid: int, keys: array[int], reply: int | None) -> None:
        self.rid = rid
        self.keys = keys
        self.reply = reply

    @classmethod
    def of(cls, rid: int, messages: list[Message], reply: Message | None) -> Basis:
        return cls(rid, _keys(messages), None if reply is None else visible_key(reply))


def _keys(messages: list[Message]) -> array[int]:
    return array("q", [visible_key(m) for m in messages])


class TraceWriter:
    """Append-only writer of one trace file."""

    def __init__(
        self,
        path: str | Path,
        source: str,
        notes: str = "",
        created: str | None = None,
        start: str | None = None,
        shared_messages: bool = False,
    ) -> None:
        """`shared_messages`: the caller's message lists share their message objects (never changed
        once written) from one request of a session to the next, as a generator's histories do.
        The writer then keeps each session's last list and takes the keys of the messages it
        shares from there instead of hashing the whole history again: a 3,000-turn session costs
        linear, not quadratic, time. A recorder, whose messages come fresh from each request's body
        and must not be held, leaves it off."""
        self.path = str(path)
        self._out: IO[bytes] = open(self.path, "wb")  # noqa: SIM115 - closed by close()
        self._next_id = 1
        self._sessions: dict[str, Basis | None] = {}  # session -> its last request
        self._lists: dict[str, list[Message]] | None = {} if shared_messages else None
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
        self._sessions[sid] = None
        self._line(
            {"kind": "session", "id": sid, "role": role, "api": api, "model": model, "labels": labels or {}}
        )

    def forget(self, sid: str) -> None:
        """Let go of the session's last request (kept to encode the next one against it): its next
        request, if any, is written whole. What a long-running recorder does for idle sessions."""
        if sid in self._sessions:
            self._sessions[sid] = None
        if self._lists is not None:
            self._lists.pop(sid, None)

    def last(self, sid: str) -> Basis | None:
        """The session's last request as a later one would be encoded against it."""
        return self._sessions.get(sid)

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
        base: Basis | None = None,
        synthetic: list[int] | None = None,
        same: int = 0,
    ) -> int:
        """Write one request given its full message list; returns its id.

        It is encoded against the session's previous request, or against `base` (an earlier
        request's `Basis`) when it extends another one, as a concurrent turn does.
        `synthetic`: indices of messages an importer made up (FORMAT.md).
        `same`: how many leading messages the caller found equal (`==` in their visible fields) to
        those of the request it is encoded against; their keys are taken from there instead of
        hashing them again, so an importer's long session costs linear, not quadratic, time.
        """
        if session not in self._sessions:
            raise KeyError(session)
        rid = self._next_id if rid is None else rid
        self._next_id = rid + 1
        prev = base if base is not None else self._sessions[session]
        shared = self._shared(session, prev, messages)
        if prev is not None and same > shared:
            shared = min(same, len(prev.keys), len(messages))
        keys = prev.keys[:shared] if prev is not None and shared else array("q")
        keys.extend(visible_key(m) for m in messages[shared:])
        keep = shared
        append: list[Message] = list(messages)
        if prev is not None:
            old = prev.keys
            limit = min(len(old), len(keys))
            while keep < limit and old[keep] == keys[keep]:
                keep += 1
            append = append[keep:]
            if keep == len(old) and append and prev.reply is not None and keys[keep] == prev.reply:
                append[0] = {"$reply": prev.rid}
        obj: dict[str, Any] = {"kind": "request", "id": rid, "session": session, "t": round(t, 6)}
        if prev is not None and keep:
            obj["parent"] = prev.rid
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
        message = (reply or {}).get("message")
        self._sessions[session] = Basis(rid, keys, None if message is None else visible_key(message))
        if self._lists is not None:
            self._lists[session] = list(messages)  # the caller may go on appending to its list
        return rid

    def _shared(self, session: str, prev: Basis | None, messages: list[Message]) -> int:
        """How many leading messages are the very objects of the session's last list (0 unless
        `shared_messages`, or when the request is encoded against another basis)."""
        if self._lists is None or prev is None or prev is not self._sessions[session]:
            return 0
        last = self._lists.get(session)
        if last is None:
            return 0
        limit = min(len(last), len(messages))
        same = list(map(operator.is_, messages[:limit], last[:limit]))  # at C speed: a history grows long
        return same.index(False) if False in same else limit
