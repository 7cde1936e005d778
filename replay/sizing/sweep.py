"""What a workload does at each disk budget, modelled offline over a trace with the simulator's own
rules (`replay.sim.model`), so the what-if answer offline and the behaviour of `replay sim serve`
online cannot disagree.

A sweep walks the trace as `replay run` would send it under the same plan. With the default plan,
`alternate` (`sequential`), each request goes when the previous one has finished, in trace order,
and every budget is walked at once: the live slots once per slot layout, and sequential disk lanes
shared by the budgets whose disks cannot differ yet (`replay.sizing.lanes`). Under `overlap`,
`timed` and `closed-loop` which request comes next depends on modelled time, so each budget runs
the event-driven `CacheModel` with the requests sent as the plan sends them
(`replay.sizing.timeline`).
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

from replay.errors import UsageError
from replay.metrics.switch import SWITCH
from replay.sim.model import events as ev
from replay.sim.model.config import MiB, SimConfig, config_for
from replay.sim.model.job import Job
from replay.sizing.jobs import History, jobs_from_trace, read_requests, scheduled_from_trace
from replay.sizing.lanes import OnDisk, sweep_sequential
from replay.sizing.parallel import sweep_in_workers
from replay.sizing.rows import (
    StaleFile,
    SweepReport,
    SweepRow,
    best_budget,
    stale_checkpoints,
    switch_figures,
)
from replay.sizing.timeline import PLANS as TIMELINE_PLANS
from replay.sizing.timeline import Schedule, Scheduled, Sent, Timeline

# `sequential` is the sweep's old name for `alternate`.
PLANS: tuple[str, ...] = ("sequential", *TIMELINE_PLANS)
SweepPlan = Literal["sequential", "alternate", "overlap", "timed", "closed-loop"]
Jobs = Iterable[tuple[float, Job]] | Iterable[Scheduled]


def schedule_for(
    plan: str, *, speed: float = 1.0, concurrency: int | None = None, round_robin: bool = False
) -> Schedule:
    """The replay plan a sweep walks, as `replay run` takes it (`sequential` = `alternate`)."""
    try:
        return Schedule(
            "alternate" if plan == "sequential" else plan,
            speed=speed,
            concurrency=concurrency,
            round_robin=round_robin,
        )
    except ValueError as exc:
        raise UsageError(f"--{exc}" if "speed" in str(exc) else f"--plan: {exc}") from None


def walker_for(schedule: Schedule) -> tuple[str, str]:
    """Which walk serves a plan, and why: the sweep says both in its output."""
    if schedule.one_at_a_time:
        return (
            "sequential",
            f"plan {schedule.plan}: one request at a time in trace order, so the order does not "
            "depend on modelled time and every budget walks the same requests one after another",
        )
    how = {
        "alternate": "one request at a time, sessions taking turns",
        "overlap": f"up to {schedule.capacity} requests in flight, each when the replies it carries are back",
        "timed": "each request at its trace time, or when the replies it carries are back",
        "closed-loop": "each request when its previous reply is done plus its tool time",
    }[schedule.plan]
    return (
        "event loop",
        f"plan {schedule.plan}: {how}; which request the server sees next depends on how long "
        "it took, so each budget walks the event-loop model in modelled time",
    )


def sweep(
    jobs: Jobs,
    budgets: Sequence[int],
    *,
    cfg: SimConfig | None = None,
    plan: str = "sequential",
    speed: float = 1.0,
    concurrency: int | None = None,
    round_robin: bool = False,
    slots: Sequence[int | None] | None = None,
    routings: Sequence[str] | None = None,
    target_reread: int | None = None,
    stale: Sequence[StaleFile] = (),
    on_disk: OnDisk | None = None,
) -> SweepReport:
    """A row per (budget, slot count, routing), all fed the same jobs.

    The plan is `replay run`'s (`sequential` = `alternate`). Sent one at a time in trace order,
    the budgets share live slots and disk lanes while they cannot differ (`replay.sizing.lanes`);
    any other plan runs one event-loop model per variant, each request sent when the plan sends
    it in modelled time (`replay.sizing.timeline`: `timed` at trace time / `speed`, closed-loop
    after its previous reply plus its tool time, overlapping up to the cap). `jobs` are
    `Scheduled` entries (from `scheduled_from_trace`), or (send time, job) pairs that wait for
    nothing. `stale` files are on disk before the first request (they can only take space), and
    so are `on_disk(config)`'s (real checkpoints: a scenario's earlier day, say).
    """
    base = cfg or config_for()
    schedule = schedule_for(plan, speed=speed, concurrency=concurrency, round_robin=round_robin)
    variants: list[tuple[int, SimConfig]] = []
    for budget in budgets:
        for n in slots if slots is not None else (base.batched_sessions,):
            for routing in routings if routings is not None else (base.routing,):
                mb = max(1, -(-budget // MiB))
                variants.append(
                    (budget, base.with_(disk=True, kv_disk_space_mb=mb, batched_sessions=n, routing=routing))
                )
    walker, why = walker_for(schedule)
    if walker == "sequential":
        rows = sweep_sequential(
            ((e.t, e.job) if isinstance(e, Scheduled) else e for e in jobs), variants, stale
        )
    else:
        entries = [e if isinstance(e, Scheduled) else Scheduled(e[0], e[1]) for e in jobs]
        rows = [_walk_row(entries, budget, vcfg, schedule, stale, on_disk) for budget, vcfg in variants]
    return SweepReport(rows, target_reread, best_budget(rows, target_reread), walker, why)


def _walk_row(
    entries: list[Scheduled],
    budget: int,
    cfg: SimConfig,
    schedule: Schedule,
    stale: Sequence[StaleFile],
    on_disk: OnDisk | None,
) -> SweepRow:
    """One variant's row: the event-loop model fed the requests as the plan sends them."""
    tally = _Tally(SweepRow(budget, cfg.slots, cfg.routing))
    files = stale_checkpoints(stale, cfg) + (on_disk(cfg) if on_disk is not None else [])
    timeline = Timeline(entries, cfg, schedule, files)
    for happened in timeline:
        tally.add(happened)
    disk = timeline.model.disk
    tally.row.peak_disk_bytes = disk.peak if disk is not None else 0
    return tally.close()


class _Tally:
    """Folds what one walk sent and what its model did into a `SweepRow`. A switch is a request
    sent right after one of another session (the engine's classes, `replay.metrics.switch`)."""

    def __init__(self, row: SweepRow) -> None:
        self.row = row
        self.switch: dict[int, bool] = {}
        self.rereads: list[int] = []
        self.waits: list[float] = []
        self.stores: Counter[str] = Counter()
        self.now = 0.0

    def add(self, e: Sent | ev.Event) -> None:
        row = self.row
        match e:
            case Sent():
                self.switch[e.entry.job.id] = SWITCH in e.switch.flags
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
        self.now = max(self.now, e.t)

    def close(self) -> SweepRow:
        row = self.row
        row.stores = dict(self.stores)
        row.modelled_s = self.now
        switch_figures(row, self.rereads, self.waits)
        return row


def sweep_trace(
    path: str | Path,
    budgets: Sequence[int],
    *,
    cfg: SimConfig | None = None,
    history: History = "live",
    think: str = "auto",
    workers: int = 1,
    progress: Callable[[int, int], None] | None = None,
    **kwargs: Any,
) -> SweepReport:
    """`sweep` over a trace file, read as it goes (`read_requests`); with `workers` > 1 and a
    plan the sequential lanes serve, this process reads and renders and the others split the
    budgets (`replay.sizing.parallel`); `progress(line, lines)` hears how far into the trace the
    sweep is (files `on_disk` keep it in one process). `think` is the run's `--think` (see
    `jobs_from_trace`)."""
    cfg = cfg or config_for()
    schedule = schedule_for(
        kwargs.get("plan", "sequential"),
        speed=kwargs.get("speed", 1.0),
        concurrency=kwargs.get("concurrency"),
        round_robin=kwargs.get("round_robin", False),
    )
    sequential = walker_for(schedule)[0] == "sequential"
    # The sweep makes no reference cycles, and with millions of objects alive (the trace, every
    # budget's checkpoints) the collector's passes over them would cost a quarter of the time.
    collecting = gc.isenabled()
    gc.disable()
    try:
        if workers > 1 and budgets and sequential and kwargs.get("on_disk") is None:
            options = dict(kwargs, cfg=cfg, history=history, think=think)
            found = sweep_in_workers(path, budgets, workers, options, _rows_of, progress)
            rows = [SweepRow(**row) for row in found]
            target = kwargs.get("target_reread")
            return SweepReport(rows, target, best_budget(rows, target), *walker_for(schedule))
        requests = read_requests(path, progress)
        if sequential:
            return sweep(jobs_from_trace(requests, cfg, history, think), budgets, cfg=cfg, **kwargs)
        return sweep(list(scheduled_from_trace(requests, cfg, history, think)), budgets, cfg=cfg, **kwargs)
    finally:
        if collecting:
            gc.enable()


def _rows_of(
    jobs: Iterable[tuple[float, Job]], budgets: Sequence[int], **kwargs: Any
) -> list[dict[str, Any]]:
    """A worker's part of a sweep, as plain rows (run in the worker process)."""
    return [asdict(row) for row in sweep(jobs, budgets, **kwargs).rows]
