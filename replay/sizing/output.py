"""Chains and sweeps as terminal tables and JSON."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from rich.table import Table

from replay.sim.model.config import MiB, SimConfig, config_for
from replay.sizing.chain import Chain, budget_rule
from replay.sizing.rows import SweepReport


def human_bytes(n: float) -> str:
    """Both units, because field reports mix them: `2.72 GB (2.53 GiB)`."""
    if n >= 1e9:
        return f"{n / 1e9:.2f} GB ({n / 2**30:.2f} GiB)"
    return f"{n / 1e6:.1f} MB ({n / 2**20:.1f} MiB)"


def chain_table(c: Chain, *, others: Sequence[int] = (), cfg: SimConfig | None = None) -> Table:
    cfg = cfg or config_for()
    table = Table(
        title=f"files left by reading {c.tokens:,} tokens"
        + (f" after restoring {c.start:,}" if c.start else "")
    )
    table.add_column("#", justify="right")
    table.add_column("tokens", justify="right")
    table.add_column("reason")
    table.add_column("size", justify="right")
    table.add_column("running total", justify="right")
    running = 0
    for i, f in enumerate(c.files, 1):
        running += f.bytes
        table.add_row(str(i), f"{f.tokens:,}", f.reason, human_bytes(f.bytes), human_bytes(running))
    need = budget_rule(c.tokens, others, start=c.start, cfg=cfg)
    table.caption = (
        f"chain {human_bytes(c.total_bytes)} in {len(c.files)} files; "
        f"budget rule (chain + latest copy of {len(others)} other conversation(s), +1% slack): "
        f"{human_bytes(need)} = --kv-disk-space-mb {-(-need // MiB)}"
    )
    return table


def sweep_table(report: SweepReport) -> Table:
    table = Table(title="disk KV budget sweep (modelled)")
    for name in (
        "budget",
        "slots",
        "routing",
        "switches",
        "restores",
        "live miss",
        "stores c/ct/ev/sh",
        "evicted (0 hits)",
        "re-read/switch p50",
        "max",
        "wait/switch p50",
        "max",
        "peak disk",
    ):
        table.add_column(name, justify="right")
    for r in report.rows:
        s = r.stores
        mark = " *" if report.best_budget == r.budget_bytes else ""
        table.add_row(
            f"{r.budget_bytes / 2**30:.1f} GiB{mark}",
            str(r.slots),
            r.routing,
            str(r.switches),
            str(r.restores),
            str(r.live_misses),
            f"{s.get('cold', 0)}/{s.get('continued', 0)}/{s.get('evict', 0)}/{s.get('shutdown', 0)}",
            f"{r.evictions} ({r.evictions_zero_hits})",
            f"{r.reread_p50:,.0f}",
            f"{r.reread_max:,}",
            f"{r.wait_p50_s:.1f}s",
            f"{r.wait_max_s:.1f}s",
            human_bytes(r.peak_disk_bytes),
        )
    notes = [
        f"walker: {report.walker} ({report.why})" if report.why else f"walker: {report.walker}",
        PEAK_NOTE,
    ]
    if report.target_reread is not None:
        notes.insert(
            0,
            f"smallest budget where no switch re-reads more than {report.target_reread:,} tokens: "
            + (f"{report.best_budget / 2**30:.1f} GiB (*)" if report.best_budget else "none of these"),
        )
    table.caption = "\n".join(notes)
    return table


PEAK_NOTE = (
    "peak disk: the most the directory held; ds4's May build (--eviction base) writes a checkpoint "
    "and then evicts, so it can hold one file over the budget for a moment"
)


def chain_json(c: Chain, *, others: Sequence[int] = (), cfg: SimConfig | None = None) -> dict[str, Any]:
    cfg = cfg or config_for()
    return {
        "tokens": c.tokens,
        "start": c.start,
        "files": [{"tokens": f.tokens, "bytes": f.bytes, "reason": f.reason} for f in c.files],
        "total_bytes": c.total_bytes,
        "others": list(others),
        "budget_bytes": budget_rule(c.tokens, others, start=c.start, cfg=cfg),
    }


def sweep_json(report: SweepReport) -> dict[str, Any]:
    return {
        "rows": [asdict(r) for r in report.rows],
        "target_reread": report.target_reread,
        "best_budget": report.best_budget,
        "walker": report.walker,
        "why": report.why,
    }
