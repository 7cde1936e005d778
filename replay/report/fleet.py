"""A run over several backends (`--target URL1,URL2`, `replicas = N`, a router): what each replica
served, and what it cost a conversation to move from one replica to another.

A *move* is a request whose session's previous request was served by another backend: the new
replica does not hold the conversation's KV, so it re-reads what the old one held. Its cost is the
request's re-read (reprocessed) tokens, set beside what a request that stayed re-read.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from replay.report.view import RequestView, RunView


@dataclass(slots=True)
class Moves:
    """How often sessions moved replica, and what the moves and the stays re-read."""

    moved: list[RequestView] = field(default_factory=list)  # a session's request on a new replica
    stayed: list[RequestView] = field(default_factory=list)  # on the replica of its previous request
    sessions_moved: int = 0  # sessions that moved at least once
    sessions: int = 0

    @property
    def continuing(self) -> int:
        return len(self.moved) + len(self.stayed)

    @property
    def stay_share(self) -> float | None:
        """Of the requests that continue a session, the share that stayed on its replica."""
        return len(self.stayed) / self.continuing if self.continuing else None

    @staticmethod
    def _mean(views: list[RequestView]) -> float | None:
        done = [v.reprocessed for v in views if v.status == "ok"]
        return statistics.fmean(done) if done else None

    @property
    def reread_per_move(self) -> float | None:
        return self._mean(self.moved)

    @property
    def reread_per_stay(self) -> float | None:
        return self._mean(self.stayed)

    @property
    def reread_moved(self) -> int:
        return sum(v.reprocessed for v in self.moved if v.status == "ok")


def backends(run: RunView) -> list[str]:
    """The backends the run's requests went to, in the order they were first used."""
    return list(dict.fromkeys(r.backend for r in run.requests if r.backend is not None))


def moves(run: RunView) -> Moves:
    """Every request that continues a session, split by whether it stayed on its replica (in the
    order the requests were sent)."""
    out = Moves()
    last: dict[str, str] = {}
    moved_sessions: set[str] = set()
    for r in sorted(run.requests, key=lambda v: v.seq):
        if r.backend is None:
            continue
        before = last.get(r.session)
        last[r.session] = r.backend
        if before is None:
            continue
        if before == r.backend:
            out.stayed.append(r)
        else:
            out.moved.append(r)
            moved_sessions.add(r.session)
    out.sessions = len(last)
    out.sessions_moved = len(moved_sessions)
    return out


def replica_rows(run: RunView) -> list[list[str]]:
    """One row per backend: requests, each switch class, failures, TTFT p50, re-read tokens."""
    rows = []
    for backend in backends(run):
        served = [r for r in run.requests if r.backend == backend]
        ok = [r for r in served if r.status == "ok"]
        classes: dict[str, int] = {}
        for r in served:
            for flag in r.switch:
                classes[flag] = classes.get(flag, 0) + 1
        ttft = statistics.median(r.ttft for r in ok) if ok else None
        rows.append(
            [
                backend,
                str(len(served)),
                ", ".join(f"{k} {v}" for k, v in sorted(classes.items())),
                str(len(served) - len(ok)),
                "–" if ttft is None else f"{ttft:.3f}",
                f"{sum(r.reprocessed for r in ok):,}",
            ]
        )
    return rows


REPLICA_HEADER = ["backend", "requests", "by switch class", "failed", "TTFT p50 (s)", "re-read tokens"]


def move_lines(run: RunView) -> list[str]:
    """What the moves cost, in a few sentences."""
    m = moves(run)
    if not m.continuing:
        return ["No session sent a second request."]
    share = m.stay_share or 0.0
    per_move, per_stay = m.reread_per_move, m.reread_per_stay
    return [
        f"{len(m.stayed):,} of {m.continuing:,} continuing requests ({share:.1%}) stayed on their replica; "
        f"{len(m.moved):,} moved ({m.sessions_moved} of {m.sessions} sessions moved at least once).",
        "Re-read tokens per move: "
        + ("–" if per_move is None else f"{per_move:,.0f}")
        + f" ({m.reread_moved:,} in all); per request that stayed: "
        + ("–" if per_stay is None else f"{per_stay:,.0f}")
        + ".",
    ]
