"""The cache model as a discrete-event simulation: jobs in at virtual times, events out.

Nothing here is scripted per scenario. Queueing, two requests in flight, N slots, FIFO dispatch,
prefill quanta, the 128-token mixed quantum while another slot decodes (decode starvation), and
every disk save, restore and eviction follow from three resources and ds4's rules (`policy.py`):

* a FIFO queue of jobs; the head job goes to the free slot `policy.route` picks;
* one worker per slot, which does the slot's disk I/O (evict save, restore, cold/continued saves)
  on its own, without the GPU;
* one GPU that runs one step at a time: a prefill quantum for one slot (round-robin), or one
  batched decode step for every decoding slot; while any slot decodes, prefill and decode steps
  alternate and prefill quanta shrink to the mixed quantum.

Decode steps are run in bulk between points where something can happen (a reply ends, a log line
every 50 tokens, a continued-save position), and a bulk run is cut short at the next step boundary
when a job arrives or a slot becomes ready, so bulk and step-by-step runs give identical results.

Requests served one at a time (offline sizing) take a shorter road: `sequential.py` walks the
same steps without this loop, and tests/sim/model/test_sequential.py keeps the two equal to the last bit.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial

from replay.sim.model import events as ev
from replay.sim.model import policy
from replay.sim.model.config import SimConfig
from replay.sim.model.disk import Checkpoint, DiskStore
from replay.sim.model.job import ContextTooLong, Job
from replay.sim.model.seq import TokenSeq, common_prefix, is_prefix

EPS = 1e-9


@dataclass(eq=False, slots=True)
class _Run:
    job: Job
    t_submit: float
    slot: int = -1
    t_dispatch: float = 0.0
    cached: int = 0
    source: str = "none"
    pos: int = 0
    gen: int = 0
    cold_cut: int | None = None
    evict_s: float = 0.0
    restore_s: float = 0.0
    t_prompt_start: float = 0.0
    t_decode_start: float = 0.0
    progress: bool = False
    last_chunk_t: float = 0.0
    last_chunk_pos: int = 0
    last_dec_t: float = 0.0
    last_dec_gen: int = 0
    abort: bool = False
    resumed: bool = False  # the first quantum after a restore has paid `resume_prefill_s`

    @property
    def n(self) -> int:
        return self.job.reply.tokens

    @property
    def P(self) -> int:  # noqa: N802 - ds4's name for the prompt length
        return len(self.job.prompt.seq)


@dataclass(eq=False, slots=True)
class Slot:
    index: int
    seq: TokenSeq = field(default_factory=TokenSeq)
    visible: TokenSeq | None = None
    last_store: int = 0
    run: _Run | None = None
    phase: str = "idle"  # idle | io | prefill | decode | busy
    io_until: float = 0.0
    io_then: Callable[[], None] | None = None


@dataclass(eq=False, slots=True)
class _Op:
    kind: str  # prefill | decode
    start: float
    dt: float  # seconds per step
    k: int  # steps (prefill ops are one step of `tokens`)
    slots: tuple[Slot, ...]
    tokens: int = 0

    @property
    def end(self) -> float:
        return self.start + self.k * self.dt


class CacheModel:
    """ds4-server's cache and scheduling in virtual time.

    `submit(job, at)` hands in a job; `advance(until)` runs the model to `until` and returns the
    events that happened, in time order. `progress=False` drops the streaming and log-only progress
    events (prefill chunk and decoding lines), which is what offline sizing wants.
    """

    def __init__(
        self,
        cfg: SimConfig,
        checkpoints: Iterable[Checkpoint] = (),
        *,
        now: float = 0.0,
        progress: bool = True,
    ) -> None:
        self.cfg = cfg
        self.now = now
        self.progress = progress
        self.disk = DiskStore(cfg, list(checkpoints)) if cfg.disk else None
        self.slots = [Slot(i) for i in range(cfg.slots)]
        self.queue: deque[_Run] = deque()
        self.gpu: _Op | None = None
        self.stopping = False
        self._out: list[ev.Event] = []
        self._rr = -1
        self._last_op_decode = False
        self._persist_started = False
        self.done = False

    # --- public API ---------------------------------------------------------------------------

    def startup(self) -> list[ev.Event]:
        """ds4's startup eviction pass over the files found on disk."""
        if self.disk is not None:
            for cp in self.disk.trim(self.now):
                self._emit(ev.Evicted(self.now, cp))
        return self.drain()

    def submit(self, job: Job, at: float | None = None) -> None:
        if job.prompt_tokens >= self.cfg.ctx:
            raise ContextTooLong(job.prompt_tokens, self.cfg.ctx)
        if at is not None:
            self._run_until(at)
        run = _Run(job, self.now)
        if self.stopping:
            self._finish_unstarted(run)
            return
        self._truncate_gpu(self.now)
        self.queue.append(run)
        self._kick()

    def advance(self, until: float) -> list[ev.Event]:
        self._run_until(until)
        return self.drain()

    def drain(self) -> list[ev.Event]:
        out, self._out = self._out, []
        return out

    def next_time(self) -> float | None:
        times = [s.io_until for s in self.slots if s.phase == "io"]
        if self.gpu is not None:
            times.append(self.gpu.end)
        return min(times) if times else None

    def run_until_idle(self) -> list[ev.Event]:
        while (t := self.next_time()) is not None:
            self._run_until(t)
        return self.drain()

    def shutdown(self, at: float | None = None) -> None:
        """First SIGTERM: drop queued jobs, stop decodes, let prefills finish, then persist slots."""
        if at is not None:
            self._run_until(at)
        self.stopping = True
        while self.queue:
            self._finish_unstarted(self.queue.popleft())
        for slot in self.slots:
            if slot.run is not None:
                slot.run.abort = True
        self._truncate_gpu(self.now)
        self._kick()

    @property
    def busy(self) -> bool:
        return bool(self.queue) or any(s.run is not None for s in self.slots)

    # --- the event loop -----------------------------------------------------------------------

    def _emit(self, event: ev.Event) -> None:
        self._out.append(event)

    def _run_until(self, until: float) -> None:
        while True:
            t = self.next_time()
            if t is None or t > until + EPS:
                break
            self.now = max(self.now, t)
            self._fire_due()
            self._kick()
        if until > self.now:
            self._split_gpu(until)
            self.now = until

    def _fire_due(self) -> None:
        op = self.gpu
        if op is not None and op.end <= self.now + EPS:
            self.gpu = None
            self._complete_op(op)
        for slot in self.slots:
            if slot.phase == "io" and slot.io_until <= self.now + EPS:
                then, slot.io_then = slot.io_then, None
                slot.phase = "busy"
                assert then is not None
                then()

    def _kick(self) -> None:
        self._dispatch()
        self._start_gpu()
        if self.stopping and not self._persist_started and not any(s.run for s in self.slots):
            self._persist_started = True
            self._persist(0)

    def _dispatch(self) -> None:
        while self.queue and not self.stopping:
            free = [s for s in self.slots if s.run is None and s.phase == "idle"]
            if not free:
                return
            run = self.queue.popleft()
            slot = policy.route(self.cfg, free, run.job.prompt.seq)
            assert isinstance(slot, Slot)
            self._begin(run, slot)

    def _io(self, slot: Slot, seconds: float, then: Callable[[], None]) -> None:
        if seconds <= 0:
            slot.phase = "busy"
            then()
            return
        slot.phase = "io"
        slot.io_until = self.now + seconds
        slot.io_then = then

    def _ready(self, slot: Slot, phase: str) -> None:
        slot.phase = phase
        self._truncate_gpu(self.now)

    # --- GPU ----------------------------------------------------------------------------------

    def _start_gpu(self) -> None:
        if self.gpu is not None:
            return
        prefillers = [s for s in self.slots if s.phase == "prefill"]
        decoders = [s for s in self.slots if s.phase == "decode"]
        if prefillers and (not decoders or self._last_op_decode):
            slot = self._next_prefiller(prefillers)
            run = slot.run
            assert run is not None
            step = self.cfg.mixed_prefill_quantum if decoders else self.cfg.prefill_step
            stop = run.cold_cut if run.cold_cut is not None and run.pos < run.cold_cut else run.P
            q = max(1, min(step, stop - run.pos))
            dt = q / self.cfg.prefill_tps
            if run.pos == run.cached and run.source == "disk-text" and not run.resumed:
                run.resumed = True  # the resumed prefill's fixed cost, once
                dt = dt + self.cfg.resume_prefill_s
            self.gpu = _Op("prefill", self.now, dt, 1, (slot,), q)
        elif decoders:
            k = 1 if prefillers else min(self._decode_stop(s) for s in decoders)
            self.gpu = _Op("decode", self.now, 1.0 / self.cfg.decode_tps, max(1, k), tuple(decoders))

    def _next_prefiller(self, prefillers: list[Slot]) -> Slot:
        later = [s for s in prefillers if s.index > self._rr]
        slot = later[0] if later else prefillers[0]
        self._rr = slot.index
        return slot

    def _decode_stop(self, slot: Slot) -> int:
        """Steps until something can happen to this decoding slot."""
        run = slot.run
        assert run is not None
        steps = run.n - run.gen
        if self.progress:
            every = self.cfg.decode_log_every
            steps = min(steps, every - run.gen % every)
        cstep = self.cfg.continued_step
        if self.cfg.disk and cstep > 0 and self._decode_may_save(run):
            live = run.P + run.gen
            steps = min(steps, (live // cstep + 1) * cstep - live)
        return max(1, steps)

    def _decode_may_save(self, run: _Run) -> bool:
        """Before every decode step, except once a tool call has started in the reply."""
        tool_start = run.job.reply.tool_start
        return not (run.job.prompt.has_tools and tool_start is not None and run.gen > tool_start)

    def _truncate_gpu(self, t: float) -> None:
        """Cut a bulk decode run at the first step boundary at or after `t`."""
        op = self.gpu
        if op is None or op.kind != "decode" or op.k <= 1:
            return
        k = max(1, math.ceil((t - op.start) / op.dt - EPS))
        op.k = min(op.k, k)

    def _split_gpu(self, until: float) -> None:
        """Commit the decode steps of a bulk run finished by `until` (streaming progress)."""
        op = self.gpu
        if op is None or op.kind != "decode" or op.k <= 1 or not self.progress:
            return
        done = min(op.k - 1, int((until - op.start) / op.dt + EPS))
        if done <= 0:
            return
        t = op.start + done * op.dt
        for slot in op.slots:
            run = slot.run
            assert run is not None
            run.gen += done
            self._emit(ev.Decoded(t, run.job.id, run.gen))
        op.start = t
        op.k -= done

    def _complete_op(self, op: _Op) -> None:
        if op.kind == "prefill":
            self._last_op_decode = False
            slot = op.slots[0]
            run = slot.run
            assert run is not None
            run.pos += op.tokens
            self._after_prefill_step(slot)
            return
        self._last_op_decode = True
        for slot in op.slots:
            run = slot.run
            assert run is not None
            run.gen += op.k
            if self.progress:
                self._emit(ev.Decoded(self.now, run.job.id, run.gen))
                if run.gen % self.cfg.decode_log_every == 0 or run.gen == run.n:
                    self._decode_line(run)
            if run.gen >= run.n or run.abort:
                self._finish(slot)
            elif self._decode_may_save(run) and policy.continued_due(
                run.P + run.gen, slot.last_store, self.cfg
            ):
                seq = run.job.full.prefix(run.P + run.gen)
                slot.phase = "busy"
                self._save(slot, seq, "continued", "token-text", 0, partial(self._ready, slot, "decode"))

    # --- one job's life -----------------------------------------------------------------------

    def _begin(self, run: _Run, slot: Slot) -> None:
        run.slot = slot.index
        run.t_dispatch = self.now
        slot.run = run
        slot.phase = "busy"
        self._emit(ev.Dispatched(self.now, run.job.id, slot.index))
        prompt = run.job.prompt.seq
        if slot.seq and is_prefix(slot.seq, prompt):
            self._prompt_start(slot, len(slot.seq), "memory-token")
            return
        if slot.visible is not None and is_prefix(slot.visible, prompt):
            slot.seq, slot.visible = slot.visible, None
            self._emit(ev.LiveContinuation(self.now, run.job.id, len(slot.seq), len(prompt)))
            self._prompt_start(slot, len(slot.seq), "thinking-visible")
            return
        if not slot.seq:
            self._lookup(slot)
            return
        live = len(slot.seq)
        common = common_prefix(slot.seq, prompt)
        reason = policy.miss_reason(live, len(prompt), common)
        self._emit(ev.LiveMiss(self.now, run.job.id, slot.index, live, len(prompt), common, reason))
        slot.last_store = 0
        if policy.evict_save_applies(live, self.cfg):
            seq, key = (
                (slot.visible, "thinking-visible") if slot.visible is not None else (slot.seq, "token-text")
            )
            t0 = self.now

            def after_evict(slot: Slot = slot, t0: float = t0) -> None:
                run.evict_s = self.now - t0
                self._lookup(slot)

            self._save(slot, seq, "evict", key, 0, after_evict)
        else:
            self._lookup(slot)

    def _lookup(self, slot: Slot) -> None:
        run = slot.run
        assert run is not None
        slot.seq, slot.visible = TokenSeq(), None
        wanted = policy.lookup_reply_key(run.job.prompt.has_tools, self.cfg)
        cp = self.disk.lookup(run.job.prompt.seq, wanted) if self.disk is not None else None
        if cp is None:
            self._prompt_start(slot, 0, "none")
            return
        load_s = cp.size / (self.cfg.disk_read_gbps * 1e9)

        def loaded() -> None:
            assert self.disk is not None
            self.disk.hit(cp, self.now)
            consumed = policy.consumed_on_restore(cp.tokens, self.cfg) and cp in self.disk.files
            self._emit(ev.DiskHit(self.now, run.job.id, cp, load_s, consumed))
            if consumed:
                self.disk.remove(cp)
                self._emit(ev.Removed(self.now, cp))
            run.restore_s = load_s
            slot.seq = cp.seq
            slot.last_store = cp.tokens
            self._prompt_start(slot, cp.tokens, "disk-text")

        self._io(slot, load_s, loaded)

    def _flags(self, run: _Run, *, dsml_start: bool = False, dsml_end: bool = False) -> str:
        flags = ["TOOLS"] if run.job.prompt.has_tools else []
        if dsml_start:
            flags.append("DSML_START")
        if dsml_end:
            flags.append("DSML_END")
        return " ".join(flags)

    def _prompt_start(self, slot: Slot, cached: int, source: str) -> None:
        run = slot.run
        assert run is not None
        run.cached, run.source, run.pos = cached, source, cached
        run.t_prompt_start = run.last_chunk_t = self.now
        run.last_chunk_pos = cached
        self._emit(ev.PromptStart(self.now, run.job.id, slot.index, cached, run.P, self._flags(run)))
        run.progress = policy.shows_progress(cached, run.P, self.cfg)
        if policy.cold_save_applies(cached, run.P, self.cfg):
            run.cold_cut = policy.cold_cut(run.P, policy.anchor_of(run.job.prompt.anchor, self.cfg), self.cfg)
        if run.progress:
            if self.progress:
                self._emit(self._chunk_event(run))
            if policy.continued_due(run.pos, slot.last_store, self.cfg):
                self._save_prefix(slot, run.pos, "continued", 0, lambda: self._prefill_next(slot))
                return
        self._prefill_next(slot)

    def _chunk_event(self, run: _Run) -> ev.PrefillChunk:
        elapsed = self.now - run.t_prompt_start
        dt = self.now - run.last_chunk_t
        chunk_tps = (run.pos - run.last_chunk_pos) / dt if dt > 0 else 0.0
        avg_tps = (run.pos - run.cached) / elapsed if elapsed > 0 else 0.0
        run.last_chunk_t, run.last_chunk_pos = self.now, run.pos
        return ev.PrefillChunk(
            self.now,
            run.job.id,
            run.cached,
            run.P,
            run.pos - run.cached,
            chunk_tps,
            avg_tps,
            elapsed,
            self._flags(run),
        )

    def _after_prefill_step(self, slot: Slot) -> None:
        run = slot.run
        assert run is not None
        if run.progress and self.progress:
            self._emit(self._chunk_event(run))
        if run.cold_cut is not None and run.pos == run.cold_cut and run.pos < run.P:
            run.cold_cut = None
            self._save_prefix(slot, run.pos, "cold", run.P - run.pos, lambda: self._progress_checks(slot))
            return
        self._progress_checks(slot)

    def _progress_checks(self, slot: Slot) -> None:
        run = slot.run
        assert run is not None
        if run.progress and policy.continued_due(run.pos, slot.last_store, self.cfg):
            self._save_prefix(slot, run.pos, "continued", 0, lambda: self._prefill_next(slot))
            return
        self._prefill_next(slot)

    def _prefill_next(self, slot: Slot) -> None:
        run = slot.run
        assert run is not None
        if run.pos < run.P:
            self._ready(slot, "prefill")
            return
        self._emit(
            ev.PromptDone(
                self.now, run.job.id, run.cached, run.P, self.now - run.t_prompt_start, self._flags(run)
            )
        )
        slot.seq = run.job.prompt.seq

        def after_continued() -> None:
            if run.cold_cut == run.P:
                run.cold_cut = None
                self._save_prefix(slot, run.P, "cold", 0, lambda: self._start_decode(slot))
                return
            self._start_decode(slot)

        if policy.continued_due(run.P, slot.last_store, self.cfg):
            self._save_prefix(slot, run.P, "continued", 0, after_continued)
            return
        after_continued()

    def _start_decode(self, slot: Slot) -> None:
        run = slot.run
        assert run is not None
        run.t_decode_start = run.last_dec_t = self.now
        if run.n == 0 or run.abort:
            self._finish(slot)
            return
        self._ready(slot, "decode")

    def _decode_line(self, run: _Run) -> None:
        elapsed = self.now - run.t_decode_start
        dt = self.now - run.last_dec_t
        chunk = (run.gen - run.last_dec_gen) / dt if dt > 0 else 0.0
        avg = run.gen / elapsed if elapsed > 0 else 0.0
        run.last_dec_t, run.last_dec_gen = self.now, run.gen
        started = run.job.reply.tool_start is not None and run.gen > (run.job.reply.tool_start or 0)
        self._emit(
            ev.DecodeProgress(
                self.now,
                run.job.id,
                run.P,
                run.gen,
                chunk,
                avg,
                elapsed,
                self._flags(run, dsml_start=started),
            )
        )

    def _finish(self, slot: Slot) -> None:
        run = slot.run
        assert run is not None
        job, reply = run.job, run.job.reply
        complete = run.gen >= run.n
        slot.seq = job.full if complete else job.full.prefix(run.P + run.gen)
        slot.visible = None
        tool_call = bool(reply.tool_calls) and complete
        if tool_call:
            self._emit(
                ev.ToolCallsEmitted(
                    self.now,
                    job.id,
                    run.cached,
                    run.P,
                    tuple(c["id"] for c in reply.tool_calls),
                    tuple(c["name"] for c in reply.tool_calls),
                )
            )
        if (
            complete
            and reply.hidden_tokens
            and policy.visible_key_applies(self.cfg, job.prompt.has_tools, tool_call)
        ):
            slot.visible = job.visible
            self._emit(
                ev.ThinkingRemembered(self.now, job.id, run.cached, run.P, len(slot.seq), slot.visible)
            )
        error = None if complete else "shutdown requested"
        finish = reply.finish if complete else "error"
        result = self._result(run, finish, error)
        self._emit(
            ev.Finished(self.now, job.id, result, self._flags(run, dsml_start=tool_call, dsml_end=tool_call))
        )
        slot.run = None
        slot.phase = "idle"

    def _finish_unstarted(self, run: _Run) -> None:
        run.t_dispatch = run.t_prompt_start = run.t_decode_start = self.now
        result = self._result(run, "error", "shutdown requested")
        self._emit(ev.Finished(self.now, run.job.id, result, ""))

    def _result(self, run: _Run, finish: str, error: str | None) -> ev.Result:
        return ev.Result(
            job_id=run.job.id,
            slot=run.slot,
            prompt_tokens=run.P,
            cached_tokens=run.cached,
            completion_tokens=run.gen,
            finish=finish,
            error=error,
            cache_source=run.source,
            queue_s=run.t_dispatch - run.t_submit,
            evict_save_s=run.evict_s,
            restore_s=run.restore_s,
            prefill_s=max(0.0, run.t_decode_start - run.t_prompt_start),
            decode_s=max(0.0, self.now - run.t_decode_start),
            total_s=self.now - run.t_submit,
        )

    # --- saves --------------------------------------------------------------------------------

    def _save_prefix(self, slot: Slot, n: int, reason: str, trimmed: int, then: Callable[[], None]) -> None:
        run = slot.run
        assert run is not None
        if reason in ("cold", "continued"):
            slot.last_store = n
        self._save(slot, run.job.prompt.seq.prefix(n), reason, "token-text", trimmed, then)

    def _save(
        self, slot: Slot, seq: TokenSeq, reason: str, key: str, trimmed: int, then: Callable[[], None]
    ) -> None:
        """Write one checkpoint on the slot's worker, then continue with `then`."""
        if reason == "continued":
            slot.last_store = len(seq)
        disk = self.disk
        if disk is None:
            then()
            return
        size = self.cfg.file_bytes(len(seq))
        if disk.need(size) > disk.budget:
            outcome = disk.store(seq, reason, key, self.now, trimmed)
            self._emit(ev.Skipped(self.now, len(seq), reason, outcome.skipped or ""))
            then()
            return
        if disk.find_same(seq) is not None:
            then()
            return
        save_s = size / (self.cfg.disk_write_gbps * 1e9)
        job_id = slot.run.job.id if slot.run is not None else None

        def written() -> None:
            outcome = disk.store(seq, reason, key, self.now, trimmed)
            for cp in outcome.evicted_before:
                self._emit(ev.Evicted(self.now, cp, job_id))
            if outcome.stored is not None:
                self._emit(ev.Stored(self.now, job_id, slot.index, outcome.stored, reason, save_s))
            for cp in outcome.evicted_after:
                self._emit(ev.Evicted(self.now, cp, job_id))
            then()

        self._io(slot, save_s, written)

    def _persist(self, index: int) -> None:
        """Shutdown: every slot holding >= min tokens is written, one after another."""
        while index < len(self.slots):
            slot = self.slots[index]
            index += 1
            if policy.shutdown_save_applies(len(slot.seq), self.cfg):
                self._emit(ev.Persisting(self.now, slot.index, len(slot.seq)))
                seq, key = (
                    (slot.visible, "thinking-visible")
                    if slot.visible is not None
                    else (slot.seq, "token-text")
                )
                nxt = index
                self._save(slot, seq, "shutdown", key, 0, partial(self._persist, nxt))
                return
        self._emit(ev.ShutdownComplete(self.now))
        self.done = True
