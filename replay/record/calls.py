"""Every call through the recording proxy, accounted for: none is lost without a word.

A call the recorder did not write as a request (a route it does not record, a body it could not
read) is counted per method, path and reason; at the end the counts go into the trace as
`unrecorded` lines, so a replay of it says what the recording is missing, and the recorder warns.
With a log file every call also gets a line: method, path (never the query: it may hold a key),
status, bytes relayed, recorded or not.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import orjson

from replay.trace.writer import TraceWriter


@dataclass(slots=True)
class Unrecorded:
    method: str
    path: str
    reason: str
    count: int = 0
    statuses: dict[str, int] = field(default_factory=dict)

    def line(self) -> dict[str, object]:
        return {
            "kind": "unrecorded",
            "method": self.method,
            "path": self.path,
            "count": self.count,
            "reason": self.reason,
            "statuses": self.statuses,
        }


class CallLog:
    """Counts (and optionally logs) each call as it ends; thread-unsafe by design: the proxy's
    event loop is its only caller."""

    def __init__(self, log_path: str | Path | None = None) -> None:
        self.unrecorded: dict[tuple[str, str, str], Unrecorded] = {}
        self.calls = 0
        self._log: IO[bytes] | None = None
        if log_path is not None:
            Path(log_path).parent.mkdir(parents=True, exist_ok=True)
            self._log = open(log_path, "ab")  # noqa: SIM115 - closed by close()

    def done(self, method: str, path: str, status: int | None, sent_bytes: int, reason: str | None) -> None:
        """One call ended; `reason` is None when it was recorded, else why it was not."""
        self.calls += 1
        shown = "-" if status is None else str(status)
        if reason is not None:
            entry = self.unrecorded.get((method, path, reason))
            if entry is None:
                entry = self.unrecorded[(method, path, reason)] = Unrecorded(method, path, reason)
            entry.count += 1
            entry.statuses[shown] = entry.statuses.get(shown, 0) + 1
        if self._log is not None:
            line = {
                "t": round(time.time(), 3),
                "method": method,
                "path": path,
                "status": status,
                "bytes": sent_bytes,
                "recorded": reason is None,
            }
            if reason is not None:
                line["reason"] = reason
            self._log.write(orjson.dumps(line) + b"\n")
            self._log.flush()

    @property
    def missing(self) -> int:
        return sum(u.count for u in self.unrecorded.values())

    def summary(self) -> str:
        """One line for the end of a recording: what passed through unrecorded."""
        parts = [f"{u.method} {u.path} x{u.count} ({u.reason})" for u in self.unrecorded.values()]
        return f"{self.missing} calls passed through unrecorded: " + ", ".join(parts)

    def write_to(self, writer: TraceWriter) -> None:
        for entry in self.unrecorded.values():
            writer.raw_line(entry.line())

    def close(self) -> None:
        if self._log is not None and not self._log.closed:
            self._log.close()
