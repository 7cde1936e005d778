"""Disk-KV sizing: what a budget must hold, from ds4's rules, and what a workload does at each budget.

`chain` is the arithmetic of one cold read (the files a prefill of N tokens leaves, from the same
policy functions the simulator uses); `sweep` runs the simulator's own cache model (`CacheModel`)
offline over a trace in virtual time, once per budget, so the what-if answer offline and the
behaviour of `replay sim serve` online can never disagree.
"""

from __future__ import annotations

import gc
import statistics
from array import array
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, NamedTuple

from rich.table import Table

from replay.errors import UsageError
from replay.sim.model import events as ev
from replay.sim.model import policy
from replay.sim.model.config import DEFAULT_PRESET, PRESETS, MiB, SimConfig, config_for
from replay.sim.model.disk import Checkpoint
from replay.sim.model.engine import CacheModel
from replay.sim.model.job import ContextTooLong, Job, build_job, plan_job
from replay.sim.model.render import Rendered
from replay.sim.model.seq import TokenSeq
from replay.sim.model.sequential import DiskLane, Live, LiveSlots, Walk, save_room
from replay.sim.server.api import thinking_requested
from replay.sim.server.options import parse_bytes, parse_tokens
from replay.trace.model import Request

PLANS: tuple[str, ...] = ("sequential", "timed")
HISTORIES: tuple[str, ...] = ("live", "recorded")
Plan = Literal["sequential", "timed"]
History = Literal["live", "recorded"]
Message = dict[str, Any]

# --- chain ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChainFile:
    tokens: int
    bytes: int
    reason: str


@dataclass(frozen=True, slots=True)
class Chain:
    """The checkpoint files one read of `tokens` tokens leaves, restored from `start`."""

    tokens: int
    start: int
    files: tuple[ChainFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    @property
    def final_bytes(self) -> int:
        return self.files[-1].bytes if self.files else 0


def chain(
    tokens: int,
    *,
    start: int = 0,
    cfg: SimConfig | None = None,
    anchor: int | None = None,
    final: bool = True,
) -> Chain:
    """Files written reading `tokens` tokens after restoring `start` (0 = from scratch).

    The prefill is walked as the simulator walks it (`DiskLane._prefill`): prefill quanta from
    `start`, a continued save wherever a progress event lands on the interval, the cold save (from
    scratch only, prompt within [min, cold_max]) when the prefill reaches its cut (the anchor or the
    fallback cut), so a cold read also writes the continued saves it passes before the cut; then,
    with `final`, the copy of the whole conversation the next switch (evict) or a shutdown writes.
    """
    cfg = cfg or config_for()
    files: list[ChainFile] = []

    def save(n: int, reason: str) -> int:
        files.append(ChainFile(n, cfg.file_bytes(n), reason))
        return n

    last = start
    progress = policy.shows_progress(start, tokens, cfg)
    cut = None
    if policy.cold_save_applies(start, tokens, cfg):
        cut = policy.cold_cut(tokens, anchor, cfg)
    pos = start
    if progress and policy.continued_due(pos, last, cfg):
        last = save(pos, "continued")
    step = cfg.prefill_step
    while pos < tokens:
        stop = cut if cut is not None and pos < cut else tokens
        pos += max(1, min(step, stop - pos))
        if cut is not None and pos == cut and pos < tokens:
            cut = None
            last = save(pos, "cold")
        if progress and policy.continued_due(pos, last, cfg):
            last = save(pos, "continued")
    if policy.continued_due(tokens, last, cfg):
        last = save(tokens, "continued")
    if cut == tokens:
        last = save(tokens, "cold")
    if final and tokens >= cfg.kv_cache_min_tokens and tokens > last:
        save(tokens, "evict")
    files.sort(key=lambda f: f.tokens)
    return Chain(tokens, start, tuple(files))


def budget_rule(
    longest: int, others: Sequence[int] = (), *, start: int = 0, cfg: SimConfig | None = None
) -> int:
    """Bytes a budget needs: the chain of the longest conversation read from scratch plus the
    latest copy of every other conversation active the same day (seed figures, section 1), with
    ds4's 1% per-file slack."""
    cfg = cfg or config_for()
    total = chain(longest, start=start, cfg=cfg).total_bytes + sum(cfg.file_bytes(t) for t in others)
    return total + total // 100


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


def human_bytes(n: float) -> str:
    """Both units, because field reports mix them: `2.72 GB (2.53 GiB)`."""
    if n >= 1e9:
        return f"{n / 1e9:.2f} GB ({n / 2**30:.2f} GiB)"
    return f"{n / 1e6:.1f} MB ({n / 2**20:.1f} MiB)"


# --- sweep ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SweepRequest:
    """One request to replay offline: messages already materialised (recorded history)."""

    session: str
    messages: list[Message]
    max_tokens: int
    t: float = 0.0
    tools: list[dict[str, Any]] | None = None
    finish: str = "stop"
    tool_name: str | None = None


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


def _stale_checkpoints(stale: Sequence[StaleFile], cfg: SimConfig) -> list[Checkpoint]:
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


def jobs_from_requests(
    requests: Iterable[SweepRequest | tuple[str, list[Message], int]], cfg: SimConfig
) -> Iterator[tuple[float, Job]]:
    """(send time, job) for already-materialised requests; tuples are (session, messages, max_tokens)."""
    for i, req in enumerate(requests, 1):
        if not isinstance(req, SweepRequest):
            session, messages, max_tokens = req
            req = SweepRequest(session, messages, max_tokens)
        yield (
            req.t,
            build_job(
                i,
                req.messages,
                req.tools,
                req.max_tokens,
                cfg,
                finish=req.finish,
                tool_name=req.tool_name,
                session=req.session,
            ),
        )


def jobs_from_trace(
    requests: Iterable[Request], cfg: SimConfig, history: History = "live"
) -> Iterator[tuple[float, Job]]:
    """(send time, job) for each of a trace's requests (in trace order, as `replay.trace` reads
    them), replies spliced as the engine does: the simulator's own reply in `live` history, the
    recorded one in `recorded` history.

    A request that keeps all its parent's messages is rendered as the parent's rendering plus its
    new messages (what `render` would give for the whole list), so a turn costs what it adds.
    """
    from replay.trace import materialize
    from replay.trace.materialize import plain_message, recorded_message

    replies: dict[int, Message] = {}  # the reply each request got, for the requests that resend it
    reply_for = replies.__getitem__
    rendered: OrderedDict[int, Rendered] = OrderedDict()  # recent requests' renderings, by id

    for req in requests:
        if history == "recorded":
            replies[req.id] = recorded_message(req)
        tools = req.params.get("tools")
        parent = req.parent
        base = None
        if parent is not None and req.keep == parent.n_messages:
            base = rendered.get(parent.id)
        if base is not None and base.tools == tools:
            new = [
                plain_message(m if m.get("$reply") is None else reply_for(m["$reply"])) for m in req.append
            ]
            done = base.add(new)
        else:
            done = Rendered(tools).add(materialize(req, reply_for))
        rendered[req.id] = done
        if len(rendered) > _RENDERINGS_KEPT:
            rendered.popitem(last=False)
        reply = req.reply or {}
        finish = reply.get("finish") or "stop"
        calls = (reply.get("message") or {}).get("tool_calls") or []
        try:
            job = plan_job(
                req.id,
                done.prompt(),
                tools,
                req.max_tokens,
                cfg,
                finish=finish,
                tool_name=calls[0].get("name") if calls else None,
                session=req.session,
                thinking=thinking_requested(req.params),
            )
        except ContextTooLong as exc:
            raise UsageError(f"request {req.id}: {exc}; give a larger context") from None
        if history == "live":
            replies[req.id] = job.reply.message()
        yield req.t, job


# Renderings kept for requests still to come to extend: a trace's next turn usually follows its
# parent closely; one further away is rendered from its messages (same result, more work).
_RENDERINGS_KEPT = 4096


class _Tally:
    """Folds one model's events into a `SweepRow`."""

    def __init__(self, row: SweepRow, model: CacheModel) -> None:
        self.row = row
        self.model = model
        self.sessions: dict[int, str | None] = {}
        self.switch: dict[int, bool] = {}
        self.last: str | None = None
        self.seen: set[str | None] = set()
        self.rereads: list[int] = []
        self.waits: list[float] = []
        self.stores: Counter[str] = Counter()

    def add(self, events: list[ev.Event]) -> None:
        row = self.row
        for e in events:
            match e:
                case ev.Dispatched():
                    session = self.sessions.get(e.job_id)
                    first = session not in self.seen
                    self.seen.add(session)
                    self.switch[e.job_id] = not first and self.last is not None and session != self.last
                    self.last = session
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
        _switch_figures(row, self.rereads, self.waits)
        return row


def _switch_figures(row: SweepRow, rereads: Sequence[int], waits: Sequence[float]) -> None:
    """Re-read tokens and modelled waits per switch: median and worst."""
    if rereads:
        row.reread_p50 = statistics.median(rereads)
        row.reread_max = max(rereads)
        row.wait_p50_s = statistics.median(waits)
        row.wait_max_s = max(waits)


def sweep(
    jobs: Iterable[tuple[float, Job]],
    budgets: Sequence[int],
    *,
    cfg: SimConfig | None = None,
    plan: Plan = "sequential",
    speed: float = 1.0,
    slots: Sequence[int | None] | None = None,
    routings: Sequence[str] | None = None,
    target_reread: int | None = None,
    stale: Sequence[StaleFile] = (),
) -> SweepReport:
    """Run the cache model once per (budget, slot count, routing) over the same jobs, in lockstep.

    `sequential`: each request is sent when the previous one finished (trace order); `timed`: at
    its trace time divided by `speed` (requests overlap and queue as they would on the server).
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
        rows = _sweep_sequential(jobs, variants, stale)
    else:
        rows = _sweep_timed(jobs, variants, stale, speed)
    return SweepReport(rows, target_reread, _best_budget(rows, target_reread))


def _best_budget(rows: Sequence[SweepRow], target_reread: int | None) -> int | None:
    """The smallest budget at which no switch re-reads more than the target."""
    if target_reread is None:
        return None
    ok = sorted(r.budget_bytes for r in rows if r.reread_max <= target_reread)
    return ok[0] if ok else None


def _sweep_timed(
    jobs: Iterable[tuple[float, Job]],
    variants: list[tuple[int, SimConfig]],
    stale: Sequence[StaleFile],
    speed: float,
) -> list[SweepRow]:
    """Requests at their trace times: the event-driven model, one per variant."""
    tallies: list[_Tally] = []
    for budget, vcfg in variants:
        model = CacheModel(vcfg, _stale_checkpoints(stale, vcfg), progress=False)
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
        _switch_figures(row, self.rereads, self.waits)
        return [
            (m.position, replace(row, budget_bytes=m.budget, stores=dict(lane.stores))) for m in self.members
        ]


def _sweep_sequential(
    jobs: Iterable[tuple[float, Job]], variants: list[tuple[int, SimConfig]], stale: Sequence[StaleFile]
) -> list[SweepRow]:
    """One request at a time: what the live slots do is worked out once per slot layout, and each
    budget only runs its own disk (`replay.sim.model.sequential`), shared with other budgets while they
    cannot differ."""
    members: dict[tuple[int, str], list[_Member]] = {}
    for index, (budget, vcfg) in enumerate(variants):
        members.setdefault((vcfg.slots, vcfg.routing), []).append(_Member(index, budget, vcfg))
    layouts = [_Layout(group, stale) for group in members.values()]
    requests = switches = 0
    seen: set[str | None] = set()
    previous: str | None = None
    for _, job in jobs:
        requests += 1
        session = job.session
        switch = session in seen and previous is not None and session != previous
        seen.add(session)
        previous = session
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

    def __init__(self, members: list[_Member], stale: Sequence[StaleFile]) -> None:
        cfg = members[0].cfg
        self.cfg = cfg
        self.live_slots = LiveSlots(cfg)
        # Budgets the stale files fit share a lane; a smaller one trims them its own way.
        members = sorted(members, key=lambda m: m.cfg.budget_bytes)
        stale_bytes = sum(cfg.file_bytes(f.tokens) for f in stale)
        fits = [m for m in members if stale_bytes <= m.cfg.budget_bytes]
        groups = [[m] for m in members if stale_bytes > m.cfg.budget_bytes] + ([fits] if fits else [])
        self.lanes = [_LaneTally(g, DiskLane(g[0].cfg, _stale_checkpoints(stale, g[0].cfg))) for g in groups]
        self.shared = [tally for tally in self.lanes if len(tally.members) > 1]
        self.cohorts: list[list[_LaneTally]] = []
        self._regroup()
        self.misses = 0
        self.live_rereads = 0  # tokens re-read after a live reuse, the same at every budget

    def serve(self, job: Job, switch: bool) -> None:
        live = self.live_slots.admit(job)
        self.misses += live.miss
        self._part(job, live)
        walks: dict[tuple[int, int], Walk | None] = {}
        ends: dict[tuple[int, int, float], tuple[float, float]] = {}
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
    walks: dict[tuple[int, int], Walk | None],
    ends: dict[tuple[int, int, float], tuple[float, float]],
) -> float | None:
    """One job at one budget: its own disk step (evict save, restore), then the prompt and reply.
    Those take the same steps at every budget that starts them from the same cached position with
    its last save at the same position, as long as they save nothing: walked once (`walks`), then
    replayed on the other clocks, and added up once per start (`ends`). Returns the job's wait when
    it touched no disk, else None."""
    lane, slot = tally.lane, live.slot
    P = len(job.prompt.seq)  # noqa: N806 - ds4's name for the prompt length
    start = lane.begin(job, live)
    t0, t, cached = start.t0, start.t, start.cached
    saved_at = lane.last_store[slot]
    walk = walks.get((cached, saved_at), _UNWALKED)
    if walk is None or walk is _UNWALKED:
        t_decode, t_end = lane.run(job, slot, start)
        if walk is _UNWALKED:
            walks[cached, saved_at] = walk = lane.walk
    else:
        end = ends.get((cached, saved_at, t))
        if end is None:
            end = ends[cached, saved_at, t] = walk.replay(t)
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
    from replay.sizing.parallel import sweep_in_workers

    cfg = cfg or config_for()
    # The sweep makes no reference cycles, and with millions of objects alive (the trace, every
    # budget's checkpoints) the collector's passes over them would cost a quarter of the time.
    collecting = gc.isenabled()
    gc.disable()
    try:
        if workers > 1 and budgets:
            options = dict(kwargs, cfg=cfg, history=history)
            rows = sweep_in_workers(path, budgets, workers, options, progress)
            target = kwargs.get("target_reread")
            return SweepReport(rows, target, _best_budget(rows, target))
        return sweep(jobs_from_trace(read_requests(path, progress), cfg, history), budgets, cfg=cfg, **kwargs)
    finally:
        if collecting:
            gc.enable()


def read_requests(
    path: str | Path, progress: Callable[[int, int], None] | None = None, every: int = 20_000
) -> Iterator[Request]:
    """A trace's requests as they are read (a sweep starts long before the whole trace is in),
    each let go once no later line names it; `progress(line, lines)` hears how far into the
    file reading has got, every `every` lines."""
    from replay.trace import iter_requests, last_references

    found = last_references(path)
    requests = iter_requests(path, found.last)  # a window of the trace in memory
    if progress is None:
        yield from requests
        return
    total = found.lines
    progress(0, total)
    told = 0
    for req in requests:
        yield req
        if req.line - told >= every:
            told = req.line
            progress(told, total)
    progress(total, total)


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
    notes = [PEAK_NOTE]
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


# --- option helpers for the CLI ------------------------------------------------------------------


def size_config(
    preset: str = DEFAULT_PRESET,
    *,
    per_token: str | None = None,
    fixed: str | None = None,
    interval: int | None = None,
    align: int | None = None,
    chunk: int | None = None,
    cold_max: int | None = None,
    ctx: int | None = None,
    eviction: str | None = None,
    hidden_reasoning: bool | None = None,
    visible_key: str | None = None,
) -> SimConfig:
    """A sizing config from CLI strings (`34.5KiB`, `22.9MiB`); None keeps the preset's value."""
    if preset not in PRESETS:
        raise UsageError(f"unknown preset {preset!r} (known: {', '.join(sorted(PRESETS))})")
    return config_for(
        preset,
        disk=True,
        bytes_per_token=parse_bytes(per_token) if per_token else None,
        fixed_bytes=parse_bytes(fixed) if fixed is not None else None,
        kv_cache_continued_interval_tokens=interval,
        kv_cache_boundary_align_tokens=align,
        kv_cache_cold_max_tokens=cold_max,
        prefill_chunk=chunk,
        ctx=ctx,
        eviction=eviction,
        hidden_reasoning=hidden_reasoning,
        visible_key=visible_key,
    )


def parse_token_list(text: str) -> list[int]:
    """`130K,130K,63K` -> token counts (empty text -> [])."""
    return [parse_tokens(part) for part in text.split(",") if part.strip()]


def parse_budgets(text: str) -> list[int]:
    """`4G,24G,64G` -> bytes (binary units: 24G = 24 GiB = --kv-disk-space-mb 24576)."""
    budgets = [parse_bytes(part) for part in text.split(",") if part.strip()]
    if not budgets:
        raise UsageError("--budgets needs at least one size, e.g. 4G,24G,64G")
    return budgets


def parse_slots(text: str) -> list[int | None]:
    """`1,2` -> slot counts; 1 is ds4's single-session path (no --batched-session)."""
    out: list[int | None] = []
    for part in text.split(","):
        if part.strip():
            n = int(part)
            if n < 1:
                raise UsageError("slot counts must be at least 1")
            out.append(None if n == 1 else n)
    return out


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
    }
