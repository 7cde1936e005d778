"""What a sweep reports: one row per (budget, slots, routing), and the earlier days' files it may
start with."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from replay.sim.model.checkpoint import Checkpoint
from replay.sim.model.config import SimConfig
from replay.sim.model.seq import TokenSeq


class StaleFile(NamedTuple):
    """A checkpoint from an earlier day already on disk: unrelated content, `hits` restores, last
    used `age_s` ago (decayed hits still outrank a fresh file's zero)."""

    tokens: int
    hits: int = 2
    age_s: float = 20 * 3600.0


def stale_files(
    total_bytes: int, cfg: SimConfig, *, file_tokens: int = 81920, hits: int = 2, age_s: float = 20 * 3600.0
) -> list[StaleFile]:
    """About `total_bytes` of earlier checkpoints, as files of `file_tokens` tokens."""
    per = cfg.file_bytes(file_tokens)
    return [StaleFile(file_tokens, hits, age_s) for _ in range(max(0, round(total_bytes / per)))]


def stale_checkpoints(stale: Sequence[StaleFile], cfg: SimConfig) -> list[Checkpoint]:
    out = []
    for i, f in enumerate(stale):
        seq = TokenSeq(((f"<stale-{i}>",), ("~",) * max(0, f.tokens - 1)))
        t = -f.age_s
        out.append(
            Checkpoint(
                seq, "evict", "token-text", cfg.file_bytes(f.tokens), created=t, last_used=t, hits=f.hits
            )
        )
    return out


@dataclass(slots=True)
class SweepRow:
    """One (budget, slots, routing) run. A switch is a request whose server-previous request came
    from another session (a session's first request is cold, not a switch); waits are modelled
    seconds from send to the first generated token."""

    budget_bytes: int
    slots: int
    routing: str
    requests: int = 0
    switches: int = 0
    restores: int = 0
    live_misses: int = 0
    stores: dict[str, int] = field(default_factory=dict)
    evictions: int = 0
    evictions_zero_hits: int = 0
    reprocessed_tokens: int = 0
    reread_p50: float = 0.0
    reread_max: int = 0
    wait_p50_s: float = 0.0
    wait_max_s: float = 0.0
    peak_disk_bytes: int = 0
    modelled_s: float = 0.0


@dataclass(slots=True)
class SweepReport:
    rows: list[SweepRow]
    target_reread: int | None
    best_budget: int | None
    # Which walk served the plan ("sequential" or "event loop") and why (`sweep.walker_for`).
    walker: str = "sequential"
    why: str = ""


def switch_figures(row: SweepRow, rereads: Sequence[int], waits: Sequence[float]) -> None:
    """Re-read tokens and modelled waits per switch: median and worst."""
    if rereads:
        row.reread_p50 = statistics.median(rereads)
        row.reread_max = max(rereads)
        row.wait_p50_s = statistics.median(waits)
        row.wait_max_s = max(waits)


def best_budget(rows: Sequence[SweepRow], target_reread: int | None) -> int | None:
    """The smallest budget at which no switch re-reads more than the target."""
    if target_reread is None:
        return None
    ok = sorted(r.budget_bytes for r in rows if r.reread_max <= target_reread)
    return ok[0] if ok else None
