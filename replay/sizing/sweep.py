"""What a workload does at each disk budget, modelled offline over a trace with the simulator's own
rules (`replay.sim.model`), so the what-if answer offline and the behaviour of `replay sim serve`
online cannot disagree.

The default `sequential` plan sends each request when the previous one finished and walks every
budget at once: the live slots once per slot layout, and sequential disk lanes shared by the budgets
whose disks cannot differ yet (`replay.sizing.lanes`). The `timed` plan runs the event-driven
`CacheModel` once per budget, requests at their trace times (overlapping and queueing).
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

from replay.metrics.switch import SWITCH, SwitchTracker
from replay.sim.model import events as ev
from replay.sim.model.config import MiB, SimConfig, config_for
from replay.sim.model.engine import CacheModel
from replay.sim.model.job import Job
from replay.sizing.jobs import History, jobs_from_trace, read_requests
from replay.sizing.lanes import sweep_sequential
from replay.sizing.parallel import sweep_in_workers
from replay.sizing.rows import (
    StaleFile,
    SweepReport,
    SweepRow,
    best_budget,
    stale_checkpoints,
    switch_figures,
)

PLANS: tuple[str, ...] = ("sequential", "timed")
SweepPlan = Literal["sequential", "timed"]


def sweep(
    jobs: Iterable[tuple[float, Job]],
    budgets: Sequence[int],
    *,
    cfg: SimConfig | None = None,
    plan: SweepPlan = "sequential",
    speed: float = 1.0,
    slots: Sequence[int | None] | None = None,
    routings: Sequence[str] | None = None,
    target_reread: int | None = None,
    stale: Sequence[StaleFile] = (),
) -> SweepReport:
    """A row per (budget, slot count, routing), all fed the same jobs in one pass.

    `sequential`: each request is sent when the previous one finished (trace order), and the
    budgets share live slots and disk lanes while they cannot differ (`replay.sizing.lanes`);
    `timed`: one `CacheModel` per variant, each request at its trace time divided by `speed`
    (requests overlap and queue as they would on the server).
    `stale` files are on disk before the first request (they can only take space, never match).
    """
    base = cfg or config_for()
    variants: list[tuple[int, SimConfig]] = []
    for budget in budgets:
        for n in slots if slots is not None else (base.batched_sessions,):
            for routing in routings if routings is not None else (base.routing,):
                mb = max(1, -(-budget // MiB))
                variants.append(
                    (budget, base.with_(disk=True, kv_disk_space_mb=mb, batched_sessions=n, routing=routing))
                )
    if plan == "sequential":
        rows = sweep_sequential(jobs, variants, stale)
    else:
        rows = _sweep_timed(jobs, variants, stale, speed)
    return SweepReport(rows, target_reread, best_budget(rows, target_reread))


def _sweep_timed(
    jobs: Iterable[tuple[float, Job]],
    variants: list[tuple[int, SimConfig]],
    stale: Sequence[StaleFile],
    speed: float,
) -> list[SweepRow]:
    """Requests at their trace times: the event-driven model, one per variant."""
    tallies: list[_Tally] = []
    for budget, vcfg in variants:
        model = CacheModel(vcfg, stale_checkpoints(stale, vcfg), progress=False)
        tally = _Tally(SweepRow(budget, vcfg.slots, vcfg.routing), model)
        tally.add(model.startup())
        tallies.append(tally)
    for t, job in jobs:
        for tally in tallies:
            model = tally.model
            tally.sessions[job.id] = job.session
            model.submit(job, max(model.now, t / speed))
            tally.add(model.drain())
    rows = []
    for tally in tallies:
        tally.add(tally.model.run_until_idle())
        rows.append(tally.close())
    return rows


class _Tally:
    """Folds one model's events into a `SweepRow`."""

    def __init__(self, row: SweepRow, model: CacheModel) -> None:
        self.row = row
        self.model = model
        self.sessions: dict[int, str | None] = {}
        self.switch: dict[int, bool] = {}
        self.order = SwitchTracker()  # in dispatch order: the server's previous request
        self.rereads: list[int] = []
        self.waits: list[float] = []
        self.stores: Counter[str] = Counter()

    def add(self, events: list[ev.Event]) -> None:
        row = self.row
        for e in events:
            match e:
                case ev.Dispatched():
                    switch = self.order.on_send(self.sessions.get(e.job_id), False)
                    self.order.on_done()
                    self.switch[e.job_id] = SWITCH in switch.flags
                case ev.DiskHit():
                    row.restores += 1
                case ev.LiveMiss():
                    row.live_misses += 1
                case ev.Stored():
                    self.stores[e.reason] += 1
                case ev.Evicted():
                    row.evictions += 1
                    row.evictions_zero_hits += e.checkpoint.hits == 0
                case ev.Finished():
                    r = e.result
                    row.requests += 1
                    row.reprocessed_tokens += r.reprocessed_tokens
                    if self.switch.get(e.job_id):
                        row.switches += 1
                        self.rereads.append(r.reprocessed_tokens)
                        self.waits.append(r.total_s - r.decode_s)
        disk = self.model.disk
        if disk is not None:
            row.peak_disk_bytes = max(row.peak_disk_bytes, disk.peak)

    def close(self) -> SweepRow:
        row = self.row
        row.stores = dict(self.stores)
        row.modelled_s = self.model.now
        switch_figures(row, self.rereads, self.waits)
        return row


def sweep_trace(
    path: str | Path,
    budgets: Sequence[int],
    *,
    cfg: SimConfig | None = None,
    history: History = "live",
    workers: int = 1,
    progress: Callable[[int, int], None] | None = None,
    **kwargs: Any,
) -> SweepReport:
    """`sweep` over a trace file, read as it goes (`read_requests`); with `workers` > 1 this
    process reads and renders and the others split the budgets (`replay.sizing.parallel`);
    `progress(line, lines)` hears how far into the trace the sweep is."""
    cfg = cfg or config_for()
    # The sweep makes no reference cycles, and with millions of objects alive (the trace, every
    # budget's checkpoints) the collector's passes over them would cost a quarter of the time.
    collecting = gc.isenabled()
    gc.disable()
    try:
        if workers > 1 and budgets:
            options = dict(kwargs, cfg=cfg, history=history)
            found = sweep_in_workers(path, budgets, workers, options, _rows_of, progress)
            rows = [SweepRow(**row) for row in found]
            target = kwargs.get("target_reread")
            return SweepReport(rows, target, best_budget(rows, target))
        return sweep(jobs_from_trace(read_requests(path, progress), cfg, history), budgets, cfg=cfg, **kwargs)
    finally:
        if collecting:
            gc.enable()


def _rows_of(
    jobs: Iterable[tuple[float, Job]], budgets: Sequence[int], **kwargs: Any
) -> list[dict[str, Any]]:
    """A worker's part of a sweep, as plain rows (run in the worker process)."""
    return [asdict(row) for row in sweep(jobs, budgets, **kwargs).rows]
