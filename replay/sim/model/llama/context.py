"""llama-server's cache rules over its slots: what `server_context_impl` does to a task before its
first batch, in each batch, when it ends, and to a slot file (tools/server/server-context.cpp at
b11549; the build-dependent rules are in `build.py`).

Both walkers drive these same rules: `engine.LlamaModel` interleaves many tasks in the server's
loop, `sequential.walk` serves them one after another, and tests/sim/model/test_llama_sequential.py
keeps the two equal. Every method returns the events it caused, at the modelled time it is given.
"""

from __future__ import annotations

from dataclasses import dataclass

from replay.sim.model.llama import checkpoints as ck
from replay.sim.model.llama import events as ev
from replay.sim.model.llama.arch import checkpoint_bytes, slot_file_bytes, state_bytes
from replay.sim.model.llama.checkpoints import Checkpoint
from replay.sim.model.llama.config import LlamaConfig
from replay.sim.model.llama.memory import MemState, SlotMemory, SwaRing
from replay.sim.model.llama.prompt import LlamaJob
from replay.sim.model.llama.prompt_cache import PromptCache, Saved, f32
from replay.sim.model.seq import TokenSeq, common_prefix


@dataclass(init=False, slots=True)
class SlotFile:
    """What a slot file holds (`llama_state_seq_save_file` and the checkpoint appendix)."""

    tokens: TokenSeq
    state: MemState
    checkpoints: tuple[Checkpoint, ...]
    bytes: int
    state_end: int  # the offset where the llama state payload ends (the appendix follows)

    def __init__(
        self,
        tokens: TokenSeq,
        state: MemState,
        checkpoints: tuple[Checkpoint, ...],
        bytes: int,  # the field's name: `dataclasses.replace` passes it by name
        state_end: int,
    ) -> None:
        self.tokens = tokens
        self.state = state
        self.checkpoints = checkpoints
        self.bytes = bytes
        self.state_end = state_end


class LlamaSlot:
    """One slot: the tokens its memory holds, its checkpoints, its memory, when it was last used."""

    def __init__(self, index: int, memory: SlotMemory) -> None:
        self.index = index
        self.memory = memory
        self.tokens = TokenSeq()
        self.checkpoints: list[Checkpoint] = []
        self.t_last = -1  # microseconds of modelled time at the last release (`t_last_used`)
        self.busy = False
        self.task = -1  # the last task it ran
        self.n_prompt_cached = 0
        self.n_prompt_processed = 0

    def clear(self) -> None:
        """`prompt_clear`: the memory and the prompt go."""
        self.memory.clear()
        self.tokens = TokenSeq()
        self.checkpoints = []


@dataclass(init=False, slots=True)
class Selection:
    """What `get_available_slot` chose: the slot (None: the task waits), whether the host prompt
    cache is updated for it, and the lines it logged."""

    slot: LlamaSlot | None
    update_cache: bool
    events: list[ev.Event]

    def __init__(self, slot: LlamaSlot | None, update_cache: bool, events: list[ev.Event]) -> None:
        self.slot = slot
        self.update_cache = update_cache
        self.events = events


def prefill_seconds(cfg: LlamaConfig, start: int, n: int) -> float:
    """Modelled seconds for `n` prompt tokens at positions start..start+n-1."""
    s = cfg.speeds
    return n * s.prefill_s + s.prefill_depth_s * (n * start + n * (n - 1) / 2)


def micros(t: float) -> int:
    return int(t * 1e6)


class ServerContext:
    """The rule state both walkers share: the slots, the KV rings, the host prompt cache."""

    def __init__(self, cfg: LlamaConfig) -> None:
        self.cfg = cfg
        self.rules = cfg.rules
        kind = cfg.arch.kind
        rings: list[SwaRing | None] = [
            SwaRing(cfg.swa_cells, cfg.arch.n_swa) if kind == "iswa" else None for _ in range(cfg.streams)
        ]
        self.rings = rings
        self.slots = [
            LlamaSlot(i, SlotMemory(i, kind, rings[0 if cfg.unified else i], cfg.n_ubatch))
            for i in range(cfg.n_slots)
        ]
        self.cache = PromptCache(cfg.cache_ram_mib, cfg.ctx_total) if cfg.prompt_cache_on else None
        self.tasks = 0

    # --- sizes -----------------------------------------------------------------------------------

    def state_of(self, slot: LlamaSlot, in_memory: bool = True) -> tuple[MemState, int]:
        state = slot.memory.snapshot()
        return state, state_bytes(self.cfg.arch, state.n, len(state.swa), self.cfg.streams, in_memory)

    # --- a task arrives: `get_available_slot`, the prompt cache, `launch_slot_with_task` ---------

    def select(self, job: LlamaJob, t: float) -> Selection:
        """`get_available_slot`: the slot named by `id_slot`, else the idle slot whose tokens cover
        the largest share of the prompt above `--slot-prompt-similarity`, else the least recently
        used idle slot (ties: the last one). A slot chosen by LRU, or by similarity while it would
        keep less than half of its tokens, changes hands: its state goes to the prompt cache."""
        cfg = self.cfg
        events: list[ev.Event] = []
        ret: LlamaSlot | None = None
        update = False
        n = len(job.prompt.seq)
        if job.id_slot != -1:
            ret = self.slots[job.id_slot % len(self.slots)]
            events.append(ev.SlotSelected(t, job.id, ret.index, "id", 0.0, 0.0, 0.0, ret.t_last))
        thold = f32(cfg.slot_prompt_similarity)
        if thold != 0.0:
            best = 0.0
            found: LlamaSlot | None = None
            for slot in self.slots:
                if job.id_slot != -1 and slot.index != job.id_slot:
                    continue
                if slot.busy:
                    events.append(ev.SlotSkipped(t, slot.index, False))
                    continue
                if not slot.tokens:
                    events.append(ev.SlotSkipped(t, slot.index, True))
                    continue
                lcp = common_prefix(slot.tokens, job.prompt.seq)
                sim = f32(lcp / n)
                events.append(ev.SlotSimilarity(t, slot.index, sim, lcp, n, thold))
                if sim > best and sim > thold:
                    best, found = sim, slot
            if found is not None:
                ret = found
            if ret is not None:
                held = len(ret.tokens)
                f_keep = f32(best * n / held) if held else float("nan")
                if job.id_slot == -1:
                    events.append(
                        ev.SlotSelected(t, job.id, ret.index, "lcp", best, thold, f_keep, ret.t_last)
                    )
                if f_keep < 0.5:
                    update = True
        if ret is None:
            for slot in self.slots:
                if slot.busy:
                    continue
                if ret is None or slot.t_last <= ret.t_last:
                    ret = slot
            if ret is not None:
                events.append(ev.SlotSelected(t, job.id, ret.index, "lru", 0.0, 0.0, 0.0, ret.t_last))
                update = True
        return Selection(ret, update and self.cache is not None, events)

    def update_cache(self, slot: LlamaSlot, job: LlamaJob, t: float) -> tuple[float, list[ev.Event]]:
        """`prompt_save` of the slot, `prompt_load` of the best stored prompt, `update`: the events
        and the modelled seconds the copies take (the server's loop waits for them)."""
        cache = self.cache
        assert cache is not None
        events: list[ev.Event] = [ev.CacheUpdating(t)]
        copied = self._save_to_cache(slot, t, events)
        look = cache.load(slot.tokens, job.prompt.seq)
        events.append(
            ev.PromptLookup(
                t,
                look.base_keep,
                look.base_sim,
                tuple((c.tokens, c.lcp, c.f_keep, c.f_sim) for c in look.candidates),
            )
        )
        found = look.found
        if found is not None:
            slot.tokens = found.tokens
            slot.checkpoints = list(found.checkpoints)
            slot.memory.load(found.state)
            copied += found.state_bytes
            events.append(ev.PromptLoaded(t, job.id, slot.index, len(found.tokens), look.f_keep, look.f_sim))
        self._update(t, events)
        seconds = copied / self.cfg.speeds.host_bps
        events.append(ev.CacheUpdated(t, seconds))
        return seconds, events

    def _save_to_cache(self, slot: LlamaSlot, t: float, events: list[ev.Event]) -> int:
        """`server_slot::prompt_save`: bytes copied (0 when nothing was stored)."""
        cache = self.cache
        if cache is None or not slot.tokens:
            return 0
        state, size = self.state_of(slot)
        events.append(ev.PromptSaved(t, len(slot.tokens), size))
        saved = cache.alloc(slot.tokens, slot.checkpoints, state, size)
        total = size + sum(c.size for c in slot.checkpoints)
        self._saved_events(saved, total, t, events)
        return saved.entry.size if saved.entry is not None else 0

    def _saved_events(self, saved: Saved, size: int, t: float, events: list[ev.Event]) -> None:
        cache = self.cache
        assert cache is not None
        if saved.skipped is not None:
            events.append(ev.PromptSaveSkipped(t, saved.skipped, size, cache.limit_bytes))
        for e in saved.obsolete:
            events.append(ev.PromptDropped(t, "obsolete", len(e.tokens), e.size, 0, 0))
        for e in saved.evicted:
            events.append(ev.PromptDropped(t, "room", len(e.tokens), e.size, 0, 0))

    def _update(self, t: float, events: list[ev.Event]) -> None:
        cache = self.cache
        assert cache is not None
        by_size, by_tokens = cache.update()
        est = cache.token_limit_estimate()
        for e in by_size:
            events.append(ev.PromptDropped(t, "size", len(e.tokens), e.size, cache.limit_tokens, est))
        for e in by_tokens:
            events.append(ev.PromptDropped(t, "tokens", len(e.tokens), e.size, cache.limit_tokens, est))
        events.append(
            ev.CacheState(
                t,
                tuple((len(e.tokens), len(e.checkpoints), e.size) for e in cache.entries),
                cache.size,
                cache.limit_bytes,
                cache.limit_tokens,
                cache.token_limit_estimate(),
            )
        )

    def launch(self, slot: LlamaSlot, job: LlamaJob, t: float) -> tuple[int, float, list[ev.Event]]:
        """`launch_slot_with_task`, then the idle-slot pass of `process_single_task`
        (`--cache-idle-slots`): every idle slot's state is stored in the prompt cache, and cleared
        when the KV cache is unified (its cells are then free for the others). Returns the task id
        and the seconds the copies take."""
        task = self.tasks
        self.tasks += 1
        slot.busy = True
        slot.task = task
        events: list[ev.Event] = [ev.Launched(t, job.id, slot.index, task)]
        copied = 0
        cfg = self.cfg
        if cfg.idle_slots_cached and (self.rules.resume_v2 or cfg.unified):
            for other in self.slots:
                if other.busy:
                    continue
                events.append(ev.IdleSlotSaved(t, other.index, cfg.unified))
                stored = self._save_to_cache(other, t, events)
                if stored > 0:
                    copied += stored
                    self._update(t, events)
                if cfg.unified:
                    other.clear()
        return task, copied / cfg.speeds.host_bps, events

    # --- the task's prompt: `pre_decode` in state STARTED ---------------------------------------

    def start_prompt(self, slot: LlamaSlot, job: LlamaJob, task: int, t: float) -> tuple[int, list[ev.Event]]:
        """How much of the prompt the slot reuses (`n_past`, reported as `cache_n`): the common
        prefix with its tokens (`cache_prompt`), plus chunks moved by `--cache-reuse` where the
        memory can shift; where the memory cannot roll back (recurrent, sliding window) only to a
        checkpoint at or before that point, else nothing. At least one token is always processed.
        -1: the prompt does not fit the slot's context (the task fails; its slot was chosen and the
        prompt cache updated all the same)."""
        cfg, rules = self.cfg, self.rules
        prompt = job.prompt
        n = len(prompt.seq)
        events: list[ev.Event] = [ev.NewPrompt(t, job.id, slot.index, task, cfg.n_ctx_slot, n)]
        if n >= cfg.n_ctx_slot:
            return -1, events  # "request (N tokens) exceeds the available context size"
        n_past = 0
        if job.cache_prompt:
            n_past = common_prefix(slot.tokens, prompt.seq)
            reuse = job.n_cache_reuse
            if reuse > 0 and not cfg.arch.can_shift:
                events.append(ev.CacheReuseIgnored(t, job.id, slot.index, task, reuse))
            elif reuse > 0:
                n_past = self._reuse_chunks(slot, job, task, n_past, reuse, t, events)
        pos_next = n_past
        has_new = n_past < n
        back = 0 if (rules.resume_v2 and has_new) else 1
        thold = max(0, pos_next - cfg.n_swa - back)
        if 0 < n_past <= len(slot.tokens):
            pos_min = slot.memory.pos_min()
            if pos_min >= thold:
                checked, found = ck.find(slot.checkpoints, pos_next, thold, rules)
                for c in checked:
                    events.append(ev.CheckpointChecked(t, job.id, slot.index, task, c, thold))
                if found is not None:
                    pos_next = min(pos_next, max(found.pos_min + 1, found.pos_max))
                    n_past = min(pos_next, found.n_tokens)
                    slot.memory.load_partial(found.swa, found.pos_max)
                    events.append(ev.CheckpointRestored(t, job.id, slot.index, task, found, n_past))
                else:
                    events.append(ev.FullReprocess(t, job.id, slot.index, task))
                    pos_next = 0
                    n_past = 0
        for c in ck.erase_after(slot.checkpoints, pos_next):
            events.append(ev.CheckpointErased(t, job.id, slot.index, task, c, cfg.n_swa, pos_next))
        if n_past == n and n_past > 0:
            events.append(ev.LastTokenReevaluated(t, job.id, slot.index, task, n_past, n))
            n_past -= 1
        slot.tokens = prompt.seq.prefix(n_past)
        slot.memory.truncate(n_past)
        slot.n_prompt_cached = n_past
        slot.n_prompt_processed = 0
        return n_past, events

    def _reuse_chunks(
        self,
        slot: LlamaSlot,
        job: LlamaJob,
        task: int,
        n_past: int,
        min_chunk: int,
        t: float,
        events: list[ev.Event],
    ) -> int:
        """`--cache-reuse N`: after the common prefix, chunks of at least N tokens that the slot
        holds further on are moved (KV shifted) to where the prompt has them."""
        cache = slot.tokens.tokens()
        new = job.prompt.seq.tokens()
        head_c = head_p = n_past
        while head_c < len(cache) and head_p < len(new):
            m = 0
            while head_c + m < len(cache) and head_p + m < len(new) and cache[head_c + m] == new[head_p + m]:
                m += 1
            if m >= min_chunk:
                events.append(ev.CacheReuseChunk(t, job.id, slot.index, task, m, head_c, head_p))
                n_past += m
                head_c += m
                head_p += m
            else:
                head_c += 1
        return n_past

    # --- one batch: `pre_decode`'s prompt tokens and checkpoints --------------------------------

    def prompt_batch(
        self, slot: LlamaSlot, job: LlamaJob, task: int, room: int, batch_before: int, t: float
    ) -> tuple[int, int, list[ev.Event]]:
        """The prompt tokens this slot adds to the batch (and the checkpoint taken before it is
        decoded): (tokens added, checkpoint bytes copied, events)."""
        cfg = self.cfg
        start = len(slot.tokens)
        events: list[ev.Event] = [ev.SeqRemove(t, job.id, slot.index, task, start)]
        memory = slot.memory
        plan = ck.plan_batch(
            job.prompt,
            start,
            room,
            batch_before,
            slot.checkpoints,
            memory.pos_min(),
            cfg.checkpoints_on,
            cfg.n_batch,
            cfg.n_ubatch,
            cfg.checkpoint_min_step,
            cfg.checkpoint_every_nt,
            self.rules,
        )
        copied = 0
        if plan.checkpoint:
            swa = tuple(memory.ring.unmasked(memory.seq)) if memory.ring is not None else ()
            size = checkpoint_bytes(cfg.arch, start, len(swa), cfg.streams)
            cp = Checkpoint(start, memory.pos_min(), memory.pos_max(), size, task, swa)
            made = ck.create(slot.checkpoints, cp, cfg.ctx_checkpoints, cfg.checkpoint_min_step, self.rules)
            for gone in made.too_close:
                events.append(ev.CheckpointDropped(t, job.id, slot.index, task, gone, "too-close"))
            for gone in made.oldest:
                events.append(ev.CheckpointDropped(t, job.id, slot.index, task, gone, "oldest"))
            for gone in made.superseded:
                events.append(ev.CheckpointDropped(t, job.id, slot.index, task, gone, "superseded"))
            events.append(
                ev.CheckpointCreated(t, job.id, slot.index, task, cp, made.index, cfg.ctx_checkpoints)
            )
            copied = size
        slot.tokens = job.prompt.seq.prefix(start + plan.n_tokens)
        slot.n_prompt_processed += plan.n_tokens
        return plan.n_tokens, copied, events

    def purge_for(self, need: int, t: float) -> list[ev.Event]:
        """`try_clear_idle_slots`: a unified KV cache short of `need` cells clears idle slots, one at
        a time in slot order, until they fit (a per-slot cache never runs short: its prompts fit)."""
        events: list[ev.Event] = []
        if not self.cfg.unified:
            return events
        while sum(s.memory.n for s in self.slots) + need > self.cfg.ctx_total:
            victim = next((s for s in self.slots if not s.busy and s.memory.n > 0), None)
            if victim is None:
                break
            events.append(ev.SlotPurged(t, victim.index, len(victim.tokens)))
            victim.clear()
        return events

    def release(self, slot: LlamaSlot, job: LlamaJob | None, t: float) -> None:
        """`server_slot::release`: the slot keeps the prompt and the reply but its last token
        (`job` None: a task that failed before its prompt, the slot keeps what it held)."""
        if job is not None:
            slot.tokens = job.full
        slot.busy = False
        slot.t_last = micros(t)

    # --- slot files: `SERVER_TASK_TYPE_SLOT_SAVE`, `_RESTORE`, `_ERASE` -------------------------

    def save_slot(self, slot: LlamaSlot) -> tuple[SlotFile, float]:
        """The tokens and the state (no in-memory header), plus the checkpoints when the build
        appends them (`save_slot_checkpoints`): the file and the seconds it takes to write."""
        cfg = self.cfg
        state, size = self.state_of(slot, in_memory=False)
        ckpts = tuple(slot.checkpoints) if self.rules.slot_file_checkpoints else ()
        state_end = slot_file_bytes(size, len(slot.tokens), [])
        nbytes = slot_file_bytes(size, len(slot.tokens), [c.size for c in ckpts])
        return SlotFile(slot.tokens, state, ckpts, nbytes, state_end), nbytes / cfg.speeds.file_write_bps

    def restore_slot(self, slot: LlamaSlot, file: SlotFile) -> tuple[int, int, float]:
        """The slot's prompt becomes the file's tokens and state, without checkpoints unless the
        build reads the appendix (`load_slot_checkpoints`, marked as restored: task -1). Returns
        (checkpoints restored, bytes read, seconds)."""
        cfg = self.cfg
        if len(file.tokens) > cfg.n_ctx_slot:
            raise ValueError("Restored prompt does not fit in the slot context")
        slot.clear()
        slot.tokens = file.tokens
        slot.memory.load(file.state)
        read = file.state_end
        restored = 0
        if self.rules.slot_file_checkpoints and file.checkpoints:
            kept = [c.from_file() for c in file.checkpoints][-cfg.ctx_checkpoints :]
            slot.checkpoints = kept
            restored = len(kept)
            read = file.bytes
        return restored, read, read / cfg.speeds.file_read_bps

    def erase_slot(self, slot: LlamaSlot) -> int:
        n = len(slot.tokens)
        slot.clear()
        return n
