"""One request at a time: the cache model's arithmetic without its event loop, for sizing sweeps.

When each request is sent only after the previous one has finished (`replay size sweep`'s default
plan), nothing overlaps: no queue, no second job on the GPU, no bulk decode cut short. A job's
life is then a straight line (live check, evict save, restore, prefill quanta with their saves,
decode steps with theirs), and `CacheModel` spends most of its time on the machinery for overlap.
This module walks that line with the same rules (`policy.py`), the same disk store and the same
floating-point steps, so its results equal `CacheModel`'s to the last bit; the tests check it on
generated traces. It splits the walk in two, so a sweep does the budget-independent half once:

* `LiveSlots`: what the live slots hold. Served one at a time, every request ends with its slot
  holding the whole reply, whatever the disk did, so routing and live hits and misses are the same
  at every budget;
* `DiskLane`: one budget's disk, clock and last-save positions, the part a budget changes. Its
  `begin` is the job's disk step (evict save, restore), its `run` the prompt and reply after it;
  a run that saves nothing is a `Walk` that other budgets starting from the same place replay.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import reduce
from operator import add

from replay.sim.model import events as ev
from replay.sim.model import policy
from replay.sim.model.config import SimConfig
from replay.sim.model.disk import Checkpoint, DiskStore
from replay.sim.model.job import Job
from replay.sim.model.seq import TokenSeq, is_prefix


@dataclass(init=False, slots=True)
class Walk:
    """The clock steps of a job's prompt and reply when they asked for no save: its prefill quanta,
    then its decode runs. Another budget that starts the prompt from the same cached position,
    with its slot's last save at the same position, walks the very same steps, so a sweep replays
    them instead of walking again."""

    prefill: tuple[float, ...]
    decode: tuple[float, ...]

    def __init__(self, prefill: tuple[float, ...], decode: tuple[float, ...]) -> None:
        self.prefill = prefill
        self.decode = decode

    def replay(self, t0: float) -> tuple[float, float]:
        """(decode start, end) from `t0`, adding step by step as the walk did (same rounding)."""
        t_decode = reduce(add, self.prefill, t0)
        return t_decode, reduce(add, self.decode, t_decode)


@dataclass(init=False, slots=True)
class Start:
    """Where one budget begins a job's prompt: after its evict save and restore, if any."""

    t0: float  # dispatch
    t: float  # prompt processing starts
    cached: int
    source: str
    evict_s: float
    restore_s: float

    def __init__(
        self, t0: float, t: float, cached: int, source: str, evict_s: float = 0.0, restore_s: float = 0.0
    ) -> None:
        self.t0 = t0
        self.t = t
        self.cached = cached
        self.source = source
        self.evict_s = evict_s
        self.restore_s = restore_s


@dataclass(slots=True)
class _Slot:
    index: int
    seq: TokenSeq
    visible: TokenSeq | None = None


@dataclass(init=False, slots=True)
class Live:
    """What the live slots make of one job (the same at every budget).

    `source` is the live reuse (`memory-token`, `thinking-visible`) or None when the job goes to
    the disk: after a live `miss` (with the live state to save first, `evict`), or on an empty slot.
    """

    slot: int
    cached: int
    source: str | None
    miss: bool
    evict: tuple[TokenSeq, str] | None

    def __init__(
        self,
        slot: int,
        cached: int,
        source: str | None,
        miss: bool = False,
        evict: tuple[TokenSeq, str] | None = None,
    ) -> None:
        self.slot = slot
        self.cached = cached
        self.source = source
        self.miss = miss
        self.evict = evict


class LiveSlots:
    """The live KV of every slot, for jobs served one at a time."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.slots = [_Slot(i, TokenSeq()) for i in range(cfg.slots)]

    def admit(self, job: Job) -> Live:
        """Route `job`, say what its slot reuses, and leave the slot as the finished job leaves it."""
        cfg, prompt = self.cfg, job.prompt.seq
        slot = policy.route(cfg, self.slots, prompt)
        assert isinstance(slot, _Slot)
        if slot.seq and is_prefix(slot.seq, prompt):
            live = Live(slot.index, len(slot.seq), "memory-token")
        elif slot.visible is not None and is_prefix(slot.visible, prompt):
            live = Live(slot.index, len(slot.visible), "thinking-visible")
        elif not slot.seq:
            live = Live(slot.index, 0, None)
        else:
            evict = None
            if policy.evict_save_applies(len(slot.seq), cfg):
                evict = (
                    (slot.visible, "thinking-visible")
                    if slot.visible is not None
                    else (slot.seq, "token-text")
                )
            live = Live(slot.index, 0, None, miss=True, evict=evict)
        reply = job.reply
        slot.seq = job.full
        remember = reply.hidden_tokens and policy.visible_key_applies(
            cfg, job.prompt.has_tools, bool(reply.tool_calls)
        )
        slot.visible = job.visible if remember else None
        return live


def save_room(job: Job, live: Live, cfg: SimConfig) -> int:
    """At most how many bytes, with ds4's slack, the job's saves can add to a disk at any budget:
    the evict save, a cold save and one continued save per interval it can reach, none longer
    than the longest state involved. A disk with that much room under its budget neither skips
    a save nor evicts during the job, so budgets that share it stay alike."""
    longest = job.full.n
    saves = 0
    if live.evict is not None:
        saves += 1
        longest = max(longest, len(live.evict[0]))
    if live.source is None:
        saves += 1
    step = cfg.continued_step
    if step > 0:
        saves += longest // step + 1
    return saves * DiskStore.need(cfg.file_bytes(longest))


class DiskLane:
    """One budget's side of sequential serving: its disk store, its clock, its slots' last saves,
    and the counts a sweep reports."""

    def __init__(self, cfg: SimConfig, checkpoints: Iterable[Checkpoint] = (), *, now: float = 0.0) -> None:
        self.cfg = cfg
        self.now = now
        self.disk = DiskStore(cfg, list(checkpoints)) if cfg.disk else None
        self.last_store = [0] * cfg.slots
        self.restores = 0
        self.stores: Counter[str] = Counter()
        self.evictions = 0
        self.evictions_zero_hits = 0
        self.peak_disk_bytes = 0
        self.saves = 0  # checkpoint writes asked for (written or not)
        self.walk: Walk | None = None
        self._prefill_s = cfg.prefill_step / cfg.prefill_tps
        self._dt = 1.0 / cfg.decode_tps
        if self.disk is not None:
            self._evicted(self.disk.trim(now))
            self.peak_disk_bytes = self.disk.peak

    def copy(self, cfg: SimConfig) -> DiskLane:
        """This lane as it stands, on its own from now on, under `cfg`'s budget."""
        out = DiskLane(cfg, now=self.now)
        out.disk = self.disk.copy(cfg) if self.disk is not None else None
        out.last_store, out.stores = self.last_store.copy(), self.stores.copy()
        out.restores, out.evictions, out.evictions_zero_hits = (
            self.restores,
            self.evictions,
            self.evictions_zero_hits,
        )
        out.peak_disk_bytes, out.saves = self.peak_disk_bytes, self.saves
        return out

    def serve(self, job: Job, live: Live) -> ev.Result:
        """Run `job` from dispatch to its last token; returns what `CacheModel` would report."""
        start = self.begin(job, live)
        t_decode, t = self.run(job, live.slot, start)
        return ev.Result(
            job_id=job.id,
            slot=live.slot,
            prompt_tokens=len(job.prompt.seq),
            cached_tokens=start.cached,
            completion_tokens=job.reply.tokens,
            finish=job.reply.finish,
            error=None,
            cache_source=start.source,
            queue_s=0.0,
            evict_save_s=start.evict_s,
            restore_s=start.restore_s,
            prefill_s=max(0.0, t_decode - start.t),
            decode_s=max(0.0, t - t_decode),
            total_s=t - start.t0,
        )

    def begin(self, job: Job, live: Live) -> Start:
        """The job's disk step, if the live slot left it one: the evict save of the slot's old
        state, then the restore of the prompt's longest stored prefix."""
        cfg, disk, slot = self.cfg, self.disk, live.slot
        t0 = t = self.now
        if live.source is not None:
            return Start(t0, t0, live.cached, live.source)
        evict_s = restore_s = 0.0
        cached, source = 0, "none"
        if live.miss:
            self.last_store[slot] = 0
            if live.evict is not None:
                t = self._save(t, slot, live.evict[0], "evict", live.evict[1], 0)
                evict_s = t - t0
        wanted = policy.lookup_reply_key(job.prompt.has_tools, cfg)
        cp = disk.lookup(job.prompt.seq, wanted) if disk is not None else None
        if cp is not None:
            assert disk is not None
            restore_s = cp.size / (cfg.disk_read_gbps * 1e9)
            t = t + restore_s
            disk.hit(cp, t)
            if policy.consumed_on_restore(cp.tokens, cfg) and cp in disk.files:
                disk.remove(cp)
            self.restores += 1
            self.last_store[slot] = cached = cp.tokens
            source = "disk-text"
        self.now = t
        return Start(t0, t, cached, source, evict_s, restore_s)

    def run(self, job: Job, slot: int, start: Start) -> tuple[float, float]:
        """Prefill from `start` and decode, with the saves they reach: (decode start, end). A run
        that asked for no save leaves its steps in `walk` (else `walk` is None)."""
        saves = self.saves
        prefill: list[float] = []
        resumed = start.source == "disk-text"
        t_decode = self._prefill(start.t, job, slot, start.cached, prefill, resumed)
        decode: list[float] = []
        t = self._decode(t_decode, job, slot, decode)
        self.walk = Walk(tuple(prefill), tuple(decode)) if self.saves == saves else None
        self.advance(t)
        return t_decode, t

    def advance(self, t: float) -> None:
        """The job is done at `t` (walked here, or replayed from another budget's walk)."""
        self.now = t
        disk = self.disk
        if disk is not None and disk.peak > self.peak_disk_bytes:
            self.peak_disk_bytes = disk.peak

    def _prefill(self, t: float, job: Job, slot: int, pos: int, steps: list[float], resumed: bool) -> float:
        """Prefill quanta from `pos`, with the cold save at its cut and continued saves at
        progress events on the interval (`CacheModel._prompt_start` to `_start_decode`); a
        prefill `resumed` after a restore pays `resume_prefill_s` with its first quantum."""
        cfg, P = self.cfg, len(job.prompt.seq)  # noqa: N806
        last = self.last_store
        progress = policy.shows_progress(pos, P, cfg)
        anchor = policy.anchor_of(job.prompt.anchor, cfg)
        cut = policy.cold_cut(P, anchor, cfg) if policy.cold_save_applies(pos, P, cfg) else None
        if progress and policy.continued_due(pos, last[slot], cfg):
            t = self._save_prefix(t, job, slot, pos, "continued", 0)
        step, tps = cfg.prefill_step, cfg.prefill_tps
        while pos < P:
            stop = cut if cut is not None and pos < cut else P
            q = max(1, min(step, stop - pos))
            dt = self._prefill_s if q == step else q / tps
            if resumed:
                resumed = False
                dt = dt + cfg.resume_prefill_s
            steps.append(dt)
            t = t + dt
            pos += q
            if cut is not None and pos == cut and pos < P:
                cut = None
                t = self._save_prefix(t, job, slot, pos, "cold", P - pos)
            if progress and policy.continued_due(pos, last[slot], cfg):
                t = self._save_prefix(t, job, slot, pos, "continued", 0)
        if policy.continued_due(P, last[slot], cfg):
            t = self._save_prefix(t, job, slot, P, "continued", 0)
        if cut == P:
            t = self._save_prefix(t, job, slot, P, "cold", 0)
        return t

    def _decode(self, t: float, job: Job, slot: int, steps: list[float]) -> float:
        """Decode in runs up to the next continued-save position (`CacheModel._decode_stop`)."""
        cfg, n = self.cfg, job.reply.tokens
        P = len(job.prompt.seq)  # noqa: N806
        cstep = cfg.continued_step if cfg.disk else 0
        tool_start = job.reply.tool_start if job.prompt.has_tools else None
        gen = 0
        while gen < n:
            may_save = tool_start is None or gen <= tool_start
            run = n - gen
            if cstep > 0 and may_save:
                live = P + gen
                run = min(run, (live // cstep + 1) * cstep - live)
            k = max(1, run)
            dt = k * self._dt
            steps.append(dt)
            t = t + dt
            gen += k
            if (
                gen < n
                and (tool_start is None or gen <= tool_start)
                and policy.continued_due(P + gen, self.last_store[slot], cfg)
            ):
                t = self._save(t, slot, job.full.prefix(P + gen), "continued", "token-text", 0)
        return t

    def _save_prefix(self, t: float, job: Job, slot: int, n: int, reason: str, trimmed: int) -> float:
        self.last_store[slot] = n
        return self._save(t, slot, job.prompt.seq.prefix(n), reason, "token-text", trimmed)

    def _save(self, t: float, slot: int, seq: TokenSeq, reason: str, key: str, trimmed: int) -> float:
        """Write one checkpoint (`CacheModel._save`): returns the time the write is done."""
        self.saves += 1
        if reason == "continued":
            self.last_store[slot] = len(seq)
        disk = self.disk
        if disk is None:
            return t
        size = self.cfg.file_bytes(len(seq))
        if disk.need(size) > disk.budget or disk.find_same(seq) is not None:
            return t  # too big for the budget (skipped) or already on disk: nothing written
        t = t + size / (self.cfg.disk_write_gbps * 1e9)
        outcome = disk.store(seq, reason, key, t, trimmed, checked=True)  # nothing ran meanwhile
        self._evicted(outcome.evicted_before)
        self._evicted(outcome.evicted_after)
        if outcome.stored is not None:
            self.stores[reason] += 1
        return t

    def _evicted(self, files: list[Checkpoint]) -> None:
        self.evictions += len(files)
        self.evictions_zero_hits += sum(1 for cp in files if cp.hits == 0)
