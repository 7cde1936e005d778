"""The sequential sweep: one request at a time, every budget at once (compiled: the per-request path).

What the live slots do is worked out once per slot layout (slot count and routing); each budget only
runs its own disk lane (`replay.sim.model.sequential`), and budgets share one lane for as long as
their disks cannot tell them apart.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import NamedTuple

from replay.metrics.switch import SWITCH, SwitchTracker
from replay.sim.model.checkpoint import Checkpoint
from replay.sim.model.config import SimConfig
from replay.sim.model.job import Job
from replay.sim.model.sequential import DiskLane, Live, LiveSlots, Walk, save_room
from replay.sizing.rows import StaleFile, SweepRow, stale_checkpoints, switch_figures

# Files on disk before the first request, for a config (a scenario's earlier day, say).
OnDisk = Callable[[SimConfig], list[Checkpoint]]


class _Member(NamedTuple):
    """One budget of a sequential sweep: where its row goes, the budget asked for, its config."""

    position: int
    budget: int
    cfg: SimConfig


class _LaneTally:
    """A disk lane and the switch figures it reports, for one budget or for several (`members`,
    smallest first) as long as their disks cannot tell them apart (`replay.sim.model.sequential.save_room`):
    the lane runs under the smallest budget, and budgets that could start evicting part with a
    copy of it."""

    def __init__(self, members: list[_Member], lane: DiskLane) -> None:
        self.members = members
        self.lane = lane
        self.reprocessed = 0
        self.rereads = array("q")
        self.waits = array("d")

    def add(self, reread: int, wait: float, switch: bool) -> None:
        """One request this lane served its own way (a live reuse's re-read is counted once for
        all lanes, by the caller)."""
        self.reprocessed += reread
        if switch:
            self.switched(reread, wait)

    def switched(self, reread: int, wait: float) -> None:
        self.rereads.append(reread)
        self.waits.append(wait)

    def free(self) -> int:
        """Bytes the lane's disk has free under the smallest budget it serves."""
        return self.members[0].cfg.budget_bytes - self._used()

    def part(self, room: int) -> list[_LaneTally]:
        """Budgets with less than `room` bytes free go on their own, each with its copy of the lane."""
        used = self._used()
        staying = [m for m in self.members if used + room <= m.cfg.budget_bytes]
        leaving = self.members[: len(self.members) - len(staying)]
        if not leaving:
            return []
        # The lane runs under the smallest budget's config: that budget keeps it.
        lanes = [self.lane] + [self.lane.copy(m.cfg) for m in leaving[1:]]
        if staying:
            self.lane = self.lane.copy(staying[0].cfg)
        self.members = staying
        parted = []
        for member, lane in zip(leaving, lanes, strict=True):
            tally = _LaneTally([member], lane)
            tally.reprocessed, tally.rereads, tally.waits = self.reprocessed, self.rereads[:], self.waits[:]
            parted.append(tally)
        return parted

    def _used(self) -> int:
        disk = self.lane.disk
        assert disk is not None  # a sweep always has one
        return disk.total

    def close(
        self, requests: int, switches: int, live_misses: int, live_rereads: int
    ) -> list[tuple[int, SweepRow]]:
        """A row per budget, with the index of its variant."""
        lane, first = self.lane, self.members[0].cfg
        row = SweepRow(0, first.slots, first.routing, requests, switches, lane.restores, live_misses)
        row.evictions, row.evictions_zero_hits = lane.evictions, lane.evictions_zero_hits
        row.reprocessed_tokens = self.reprocessed + live_rereads
        row.peak_disk_bytes, row.modelled_s = lane.peak_disk_bytes, lane.now
        switch_figures(row, self.rereads, self.waits)
        return [
            (m.position, replace(row, budget_bytes=m.budget, stores=dict(lane.stores))) for m in self.members
        ]


def sweep_sequential(
    jobs: Iterable[tuple[float, Job]],
    variants: list[tuple[int, SimConfig]],
    stale: Sequence[StaleFile],
    on_disk: OnDisk | None = None,
) -> list[SweepRow]:
    """The rows of a sequential sweep over `variants` (budget, config), in their order; `on_disk`
    gives, for a config, more files on disk before the first request (fresh ones each call)."""
    members: dict[tuple[int, str], list[_Member]] = {}
    for index, (budget, vcfg) in enumerate(variants):
        members.setdefault((vcfg.slots, vcfg.routing), []).append(_Member(index, budget, vcfg))
    layouts = [_Layout(group, stale, on_disk) for group in members.values()]
    requests = switches = 0
    order = SwitchTracker()  # one request at a time: each is done before the next is sent
    for _, job in jobs:
        requests += 1
        switch = SWITCH in order.on_send(job.session, False).flags
        order.on_done()
        switches += switch
        for layout in layouts:
            layout.serve(job, switch)
    rows = [
        row
        for layout in layouts
        for tally in layout.lanes
        for row in tally.close(requests, switches, layout.misses, layout.live_rereads)
    ]
    return [row for _, row in sorted(rows, key=lambda ir: ir[0])]


class _Layout:
    """The budgets of one slot layout (slot count and routing): one set of live slots serves them
    all, and lanes whose clocks and last saves are equal form a cohort, whose first lane serves a
    job that touches no disk for all of them."""

    def __init__(self, members: list[_Member], stale: Sequence[StaleFile], on_disk: OnDisk | None) -> None:
        cfg = members[0].cfg
        self.cfg = cfg
        self.live_slots = LiveSlots(cfg)
        # Budgets the stale files fit share a lane; a smaller one trims them its own way.
        members = sorted(members, key=lambda m: m.cfg.budget_bytes)

        def files(c: SimConfig) -> list[Checkpoint]:
            return stale_checkpoints(stale, c) + (on_disk(c) if on_disk is not None else [])

        stale_bytes = sum(cp.size for cp in files(cfg))
        fits = [m for m in members if stale_bytes <= m.cfg.budget_bytes]
        groups = [[m] for m in members if stale_bytes > m.cfg.budget_bytes] + ([fits] if fits else [])
        self.lanes = [_LaneTally(g, DiskLane(g[0].cfg, files(g[0].cfg))) for g in groups]
        self.shared = [tally for tally in self.lanes if len(tally.members) > 1]
        self.cohorts: list[list[_LaneTally]] = []
        self._regroup()
        self.misses = 0
        self.live_rereads = 0  # tokens re-read after a live reuse, the same at every budget

    def serve(self, job: Job, switch: bool) -> None:
        live = self.live_slots.admit(job)
        self.misses += live.miss
        self._part(job, live)
        walks: dict[tuple[int, int, bool], Walk | None] = {}
        ends: dict[tuple[int, int, bool, float], tuple[float, float]] = {}
        if live.source is None:  # to the disk: every lane on its own
            for tally in self.lanes:
                _serve(job, live, tally, switch, walks, ends)
            self._regroup()
            return
        reread = len(job.prompt.seq) - live.cached
        self.live_rereads += reread
        split = False
        for head, *rest in self.cohorts:
            wait = _serve(job, live, head, switch, walks, ends)
            if wait is None:  # it saved: the others may not (budget too small, file already there)
                for tally in rest:
                    _serve(job, live, tally, switch, walks, ends)
                split = True
                continue
            now = head.lane.now
            for tally in rest:
                tally.lane.now = now
                if switch:
                    tally.switched(reread, wait)
        if split:
            self._regroup()

    def _part(self, job: Job, live: Live) -> None:
        """Before the job: budgets sharing a lane that it could make differ go their own ways."""
        if not self.shared:
            return
        room = save_room(job, live, self.cfg)
        parted = [new for tally in self.shared if tally.free() < room for new in tally.part(room)]
        if parted:
            self.lanes = [tally for tally in self.lanes if tally.members] + parted
            self.shared = [tally for tally in self.lanes if len(tally.members) > 1]
            self._regroup()

    def _regroup(self) -> None:
        cohorts: dict[tuple[float, tuple[int, ...]], list[_LaneTally]] = {}
        for tally in self.lanes:
            cohorts.setdefault((tally.lane.now, tuple(tally.lane.last_store)), []).append(tally)
        self.cohorts = list(cohorts.values())


def _serve(
    job: Job,
    live: Live,
    tally: _LaneTally,
    switch: bool,
    walks: dict[tuple[int, int, bool], Walk | None],
    ends: dict[tuple[int, int, bool, float], tuple[float, float]],
) -> float | None:
    """One job at one budget: its own disk step (evict save, restore), then the prompt and reply.
    Those take the same steps at every budget that starts them from the same cached position with
    its last save at the same position, as long as they save nothing: walked once (`walks`), then
    replayed on the other clocks, and added up once per start (`ends`); a start from a restore
    walks apart from a live one (its first quantum pays the resumed prefill's fixed cost). Returns
    the job's wait when it touched no disk, else None."""
    lane, slot = tally.lane, live.slot
    P = len(job.prompt.seq)  # noqa: N806 - ds4's name for the prompt length
    start = lane.begin(job, live)
    t0, t, cached = start.t0, start.t, start.cached
    saved_at = lane.last_store[slot]
    restored = start.source == "disk-text"
    walk = walks.get((cached, saved_at, restored), _UNWALKED)
    if walk is None or walk is _UNWALKED:
        t_decode, t_end = lane.run(job, slot, start)
        if walk is _UNWALKED:
            walks[cached, saved_at, restored] = walk = lane.walk
    else:
        end = ends.get((cached, saved_at, restored, t))
        if end is None:
            end = ends[cached, saved_at, restored, t] = walk.replay(t)
        t_decode, t_end = end
        lane.advance(t_end)
    wait = (t_end - t0) - max(0.0, t_end - t_decode)  # a `Result`'s total_s - decode_s
    if live.source is None:
        tally.add(P - cached, wait, switch)
        return None
    if switch:
        tally.switched(P - cached, wait)
    return wait if walk is not None else None


_UNWALKED = Walk((), ())
