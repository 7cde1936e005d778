"""Switch classification: what the server was doing just before a request was sent.

A request carries a small set of flags rather than one label, because the situations combine: a
compaction can also be a switch, and any request can be sent while another is in flight.
"""

from __future__ import annotations

from dataclasses import dataclass, field

COLD = "cold"
CONTINUE = "continue"
SWITCH = "switch"
COMPACTION = "compaction"
CONCURRENT = "concurrent"
CLASSES = (COLD, CONTINUE, SWITCH, COMPACTION, CONCURRENT)


@dataclass(slots=True)
class Switch:
    flags: tuple[str, ...]
    from_session: str | None


@dataclass(slots=True)
class SwitchTracker:
    """Classifies each request at the moment it is sent, in send order."""

    last_session: str | None = None
    seen: set[str | None] = field(default_factory=set)
    in_flight: int = 0
    # The sessions not sent yet, when they are known up front (a replay's trace): this set
    # shrinks as they start, where `seen` would grow by one entry per session for the whole run.
    cold: set[str | None] | None = None

    def on_send(self, session: str | None, compaction: bool) -> Switch:
        flags: list[str] = []
        from_session = None
        if self.cold is not None and session in self.cold:
            flags.append(COLD)
            self.cold.discard(session)
        elif self.cold is None and session not in self.seen:
            flags.append(COLD)
            self.seen.add(session)
        elif self.last_session == session:
            flags.append(CONTINUE)
        else:
            flags.append(SWITCH)
            from_session = self.last_session
        if compaction and COLD not in flags:
            flags.append(COMPACTION)
        if self.in_flight:
            flags.append(CONCURRENT)
        self.last_session = session
        self.in_flight += 1
        return Switch(tuple(flags), from_session)

    def on_done(self) -> None:
        self.in_flight -= 1
