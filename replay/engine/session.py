"""A session's conversation as the engine replays it: which replies go back into its history.

In `live` mode the server's own reply replaces the recorded one, the way a real agent resends it,
and tool results keep pointing at the right call: recorded tool-call ids are mapped to the ids the
server issued. In `recorded` mode the trace is resent byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from replay.trace.materialize import materialize
from replay.trace.model import Message, Request, Session

LIVE = "live"
RECORDED = "recorded"
HISTORY_MODES = (LIVE, RECORDED)


@dataclass(slots=True)
class ReplaySession:
    """Replay side: one trace session as the engine sends it (its history mode, the server's
    replies so far in live mode, its tool-call ids). `record.sessions.RecordedSession` is the
    recording side's, inferred from live traffic."""

    session: Session
    mode: str = LIVE
    state: str = "idle"
    done: int = 0
    live_replies: dict[int, Message] = field(default_factory=dict)
    tool_ids: dict[str, str] = field(default_factory=dict)

    def reply_for(self, request: Request) -> Message:
        if self.mode == LIVE and request.id in self.live_replies:
            return self.live_replies[request.id]
        reply = request.reply or {}
        return reply.get("message") or {"role": "assistant", "content": ""}

    def messages(self, request: Request, by_id: dict[int, Request]) -> list[Message]:
        msgs = materialize(request, lambda rid: self.reply_for(by_id[rid]))
        if not self.tool_ids:
            return msgs
        return [_remap_tool_ids(m, self.tool_ids) for m in msgs]

    def on_reply(self, request: Request, message: Message | None) -> None:
        """Remember the server's reply (live mode) and how its tool-call ids map to the recorded ones."""
        if self.mode != LIVE or message is None:
            return
        recorded = ((request.reply or {}).get("message") or {}).get("tool_calls") or ()
        visible: Message = {"role": "assistant", "content": message.get("content") or ""}
        calls = message.get("tool_calls")
        if calls:
            visible["tool_calls"] = calls
        elif recorded:
            # The trace's next messages answer these calls; keep them so the history stays valid.
            visible["tool_calls"] = list(recorded)
        self.live_replies[request.id] = visible
        for old, new in zip(recorded, calls or (), strict=False):
            if old.get("id") and new.get("id") and old["id"] != new["id"]:
                self.tool_ids[old["id"]] = new["id"]


def _remap_tool_ids(msg: Message, ids: dict[str, str]) -> Message:
    old = msg.get("tool_call_id")
    if old is not None and old in ids:
        return {**msg, "tool_call_id": ids[old]}
    return msg


class ReplaySessions(dict[str, ReplaySession]):
    """Each session's state, made the first time one of its requests is sent: a run that stops at
    its duration reaches only part of a large trace, and building every state up front took ~0.1 s
    of CPU for a 50,000-request trace before the first request went."""

    def __init__(self, sessions: dict[str, Session], mode: str) -> None:
        super().__init__()
        self._sessions = sessions
        self._mode = mode

    def __missing__(self, sid: str) -> ReplaySession:
        state = self[sid] = ReplaySession(self._sessions[sid], mode=self._mode)
        return state
