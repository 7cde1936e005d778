"""The start barrier of a sharded run: every shard begins its schedule at one wall-clock instant.

Shards on N hosts share no clock but the wall clock, so the barrier is an instant of it
(`--start-at 2026-12-01T16:30:00Z`), the one place where this tool reads wall time for timing.
Each shard sleeps until the instant, notes when it really began, and writes both into its results
header; `replay report` of the merged shards shows the spread. A shard that reaches the instant
only after it passed (its pod was scheduled late, or started again after a node drain) also says
by how much in its log, as it starts: its load does not overlap the others' as planned.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from replay.errors import UsageError

_SPIN_S = 0.002  # the last stretch is waited out in short sleeps: a long sleep may overshoot
# Later than this after the instant is worth a warning: shards that start on time are a few ms
# apart (the namespace e2e holds them within 100 ms), so a second is a pod that was not there.
LATE_WARNING_S = 1.0


def parse_instant(text: str, what: str = "--start-at") -> float:
    """An ISO 8601 instant with its UTC offset (`2026-12-01T16:30:00Z`), as epoch seconds. Hosts
    must agree on it, so a local time without an offset is refused."""
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(
            f"{what} must be an ISO 8601 time such as 2026-12-01T16:30:00Z, not {text!r}"
        ) from None
    if moment.tzinfo is None:
        raise UsageError(
            f"{what} {text!r} has no UTC offset: add Z or +HH:MM so every host reads one instant"
        )
    return moment.timestamp()


def wait_until(start_at: float) -> dict[str, Any]:
    """Sleep until `start_at` (epoch seconds); the results header's `start` record: planned,
    actual, and how late this process began (negative never: an instant already past starts now)."""
    while (left := start_at - time.time()) > 0:
        time.sleep(left - _SPIN_S if left > 2 * _SPIN_S else min(left, _SPIN_S / 4))
    actual = time.time()
    return {
        "planned": _iso(start_at),
        "actual": _iso(actual),
        "late_s": round(max(0.0, actual - start_at), 6),
    }


def late_notice(start_at: float, now: float | None = None) -> str | None:
    """The warning for a run that begins more than `LATE_WARNING_S` after its instant (None if on time)."""
    late = (time.time() if now is None else now) - start_at
    if late <= LATE_WARNING_S:
        return None
    return (
        f"this shard starts {late:,.1f} s after --start-at {_iso(start_at)}: its schedule begins "
        "now, not with the other shards' (a pod scheduled or started again late?); its results "
        "header records by how much (start.late_s)"
    )


def spread_s(headers: list[dict[str, Any]]) -> float | None:
    """How far apart the shards' actual starts were (None unless every header has a start)."""
    starts = [(h.get("start") or {}).get("actual") for h in headers]
    if len(starts) < 2 or not all(isinstance(s, str) for s in starts):
        return None
    moments = [dt.datetime.fromisoformat(s).timestamp() for s in starts]
    return round(max(moments) - min(moments), 6)


def _iso(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat(timespec="microseconds")
