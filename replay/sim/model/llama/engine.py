"""llama-server's loop in modelled time: tasks in at any moment, events out.

The server runs one loop (`server_queue::start_loop`): it takes the tasks that arrived
(`process_single_task`: a slot is chosen, the host prompt cache swapped, the task launched, or the
task deferred while no slot is free; slot saves and restores run here too), then builds one batch
(`update_slots` -> `pre_decode`: one token for every generating slot, then prompt tokens of the
slots still reading their prompt, in slot order, up to `-b` tokens), decodes it and samples
(`post_decode`). A task that arrives meanwhile waits for the next pass. The copies the loop does
itself (prompt-cache swaps, checkpoints, slot files) hold it up for their modelled time.

`sequential.walk` serves tasks one after another with the same rules (`context.ServerContext`) and
the same arithmetic; tests/sim/model/test_llama_sequential.py keeps the two equal.
"""

from __future__ import annotations

from collections import deque

from replay.sim.model.llama import events as ev
from replay.sim.model.llama.config import LlamaConfig
from replay.sim.model.llama.context import LlamaSlot, ServerContext, SlotFile, prefill_seconds
from replay.sim.model.llama.prompt import LlamaJob
from replay.sim.model.llama.task import Task, fail_event, finish_event, progress_event

EPS = 1e-9


class _Action:
    """A `/slots/N?action=...` task."""

    def __init__(self, action_id: int, slot: int, action: str, filename: str, file: SlotFile | None) -> None:
        self.action_id = action_id
        self.slot = slot
        self.action = action
        self.filename = filename
        self.file = file
        self.result: SlotFile | None = None


class LlamaModel:
    """`submit(job, at)` hands in a task, `slot_action(...)` a slot file task; `advance(until)`
    runs the loop to `until` and returns the events in time order. `progress=False` drops the
    streaming events (`Decoded`), which offline sizing does not need."""

    def __init__(self, cfg: LlamaConfig, *, now: float = 0.0, progress: bool = True) -> None:
        self.cfg = cfg
        self.ctx = ServerContext(cfg)
        self.now = now
        self.progress = progress
        self.queue: deque[Task | _Action] = deque()
        self.tasks: list[Task] = []  # launched, not finished
        self.iter_end: float | None = None
        self._parts: list[tuple[Task, int]] = []
        self._gen: list[Task] = []
        self._out: list[ev.Event] = []
        self.actions: dict[int, _Action] = {}

    # --- public API -------------------------------------------------------------------------------

    def submit(self, job: LlamaJob, at: float | None = None) -> None:
        if at is not None:
            self._run_until(at)
        self.queue.append(Task(job, self.now))
        self._kick()

    def slot_action(
        self,
        action_id: int,
        slot: int,
        action: str,
        filename: str,
        file: SlotFile | None = None,
        at: float | None = None,
    ) -> None:
        """Queue a save, restore or erase of slot `slot`; its `SlotAction` event answers it (a
        restore needs the `file` a save returned, read back by the caller)."""
        if at is not None:
            self._run_until(at)
        act = _Action(action_id, slot, action, filename, file)
        self.actions[action_id] = act
        self.queue.append(act)
        self._kick()

    def saved_file(self, action_id: int) -> SlotFile | None:
        act = self.actions.pop(action_id, None)
        return act.result if act is not None else None

    def advance(self, until: float) -> list[ev.Event]:
        self._run_until(until)
        return self.drain()

    def drain(self) -> list[ev.Event]:
        out, self._out = self._out, []
        return out

    def next_time(self) -> float | None:
        return self.iter_end

    def run_until_idle(self) -> list[ev.Event]:
        while (t := self.next_time()) is not None:
            self._run_until(t)
        return self.drain()

    @property
    def busy(self) -> bool:
        return bool(self.queue) or bool(self.tasks) or self.iter_end is not None

    @property
    def slots(self) -> list[LlamaSlot]:
        return self.ctx.slots

    def task_of(self, slot: LlamaSlot) -> Task | None:
        return next((k for k in self.tasks if k.slot is slot), None)

    # --- the loop ---------------------------------------------------------------------------------

    def _run_until(self, until: float) -> None:
        while self.iter_end is not None and self.iter_end <= until + EPS:
            self.now = max(self.now, self.iter_end)
            self._end_iteration()
            self._kick()
        if until > self.now:
            self.now = until

    def _kick(self) -> None:
        if self.iter_end is None:
            self._begin_iteration()

    def _begin_iteration(self) -> None:
        """One pass of the loop at `now`: the queue, then one batch."""
        ctx, t = self.ctx, self.now
        io = 0.0
        waiting: deque[Task | _Action] = deque()
        while self.queue:
            item = self.queue.popleft()
            if isinstance(item, _Action):
                done, seconds = self._action(item, t + io)
                io += seconds
                if not done:
                    waiting.append(item)
                continue
            sel = ctx.select(item.job, t + io)
            slot = sel.slot
            if slot is None or slot.busy:
                waiting.append(item)  # deferred until a slot is free
                continue
            self._out.extend(sel.events)
            if sel.update_cache:
                seconds, events = ctx.update_cache(slot, item.job, t + io)
                self._out.extend(events)
                io += seconds
            task_id, seconds, events = ctx.launch(slot, item.job, t + io)
            self._out.extend(events)
            io += seconds
            item.slot, item.task, item.state, item.t_launch = slot, task_id, "started", t + io
            self.tasks.append(item)
        self.queue = waiting
        cost = self._build_batch(t + io)
        if cost is None:
            self.iter_end = t + io if io > 0 else None
            return
        self.iter_end = t + io + cost

    def _action(self, act: _Action, t: float) -> tuple[bool, float]:
        ctx = self.ctx
        slot = ctx.slots[act.slot % len(ctx.slots)]
        if slot.busy:
            return False, 0.0
        seconds = 0.0
        error: str | None = None
        tokens = nbytes = ckpts = ckpt_bytes = 0
        if act.action == "save":
            file, seconds = ctx.save_slot(slot)
            act.result = file
            tokens, nbytes = len(file.tokens), file.bytes
            ckpts, ckpt_bytes = len(file.checkpoints), file.bytes - file.state_end
        elif act.action == "restore":
            assert act.file is not None
            try:
                ckpts, nbytes, seconds = ctx.restore_slot(slot, act.file)
                tokens = len(act.file.tokens)
                ckpt_bytes = nbytes - act.file.state_end
            except ValueError as exc:
                error = str(exc)
                slot.clear()
        else:
            tokens = ctx.erase_slot(slot)
        self._out.append(
            ev.SlotAction(
                t + seconds,
                act.action_id,
                slot.index,
                act.action,
                act.filename,
                tokens,
                nbytes,
                seconds,
                ckpts,
                ckpt_bytes,
                error,
            )
        )
        return True, seconds

    def _build_batch(self, t: float) -> float | None:
        """`pre_decode`: the batch and its modelled seconds (None when every slot is idle)."""
        if not self.tasks:
            return None
        ctx, cfg = self.ctx, self.cfg
        ordered = sorted(self.tasks, key=lambda k: k.slot.index if k.slot is not None else -1)
        gen = [k for k in ordered if k.state == "generating"]
        size = len(gen)
        parts: list[tuple[Task, int]] = []
        seconds = 0.0
        copied = 0
        for k in ordered:
            if k.state not in ("started", "prompt") or size >= cfg.n_batch:
                continue
            slot = k.slot
            assert slot is not None
            if k.state == "started":
                k.n_past, events = ctx.start_prompt(slot, k.job, k.task, t)
                self._out.extend(events)
                if k.n_past < 0:
                    self.tasks.remove(k)
                    self._out.append(fail_event(ctx, k, t))
                    continue
                k.state, k.t_prompt_start = "prompt", t
            p = progress_event(k, t)
            if p is not None:
                self._out.append(p)
            start = len(slot.tokens)
            added, ckpt, events = ctx.prompt_batch(slot, k.job, k.task, cfg.n_batch - size, size, t)
            self._out.extend(events)
            size += added
            copied += ckpt
            parts.append((k, added))
            seconds += prefill_seconds(cfg, start, added)
        if not gen and not parts:
            return None  # every task that was to start failed
        if gen:
            seconds += 1.0 / cfg.speeds.decode_tps
        seconds += copied / cfg.speeds.host_bps
        self._out.extend(ctx.purge_for(size, t))
        self._parts, self._gen = parts, gen
        return seconds

    def _end_iteration(self) -> None:
        """`post_decode`: the batch is in the memory; prompts that ended sample their first
        token, generating slots their next; tasks with all their tokens finish."""
        ctx, t = self.ctx, self.now
        self.iter_end = None
        parts, gen = self._parts, self._gen
        self._parts, self._gen = [], []
        for k in gen:
            assert k.slot is not None
            k.slot.memory.append(1)
        for k, added in parts:
            assert k.slot is not None
            k.slot.memory.append(added)
        for k in gen:
            k.gen += 1
            if self.progress:
                self._out.append(ev.Decoded(t, k.job.id, k.gen))
        for k, _ in parts:
            slot = k.slot
            assert slot is not None
            if len(slot.tokens) == k.job.n_tokens:
                k.state, k.t_prompt_done = "generating", t
                self._out.append(ev.PromptDone(t, k.job.id, slot.index, k.task, k.job.n_tokens))
                if len(k.job.reply) > 0:
                    k.gen = 1
                    if self.progress:
                        self._out.append(ev.Decoded(t, k.job.id, k.gen))
        for k in [k for k in self.tasks if k.state == "generating" and k.gen >= len(k.job.reply)]:
            self.tasks.remove(k)
            self._out.append(finish_event(ctx, k, t))
