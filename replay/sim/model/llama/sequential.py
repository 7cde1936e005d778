"""One task at a time: llama-server's loop without its event machinery, for sweeps over settings.

When each request is sent only after the previous one has finished, nothing shares a batch: a
task's life is a straight line (slot choice, prompt-cache swap, launch, its prompt's batches with
their checkpoints, one decode step per generated token). `LlamaWalker` walks that line with the
same rules (`context.ServerContext`) and the same arithmetic as `engine.LlamaModel`, so its results
equal the loop's to the last bit; tests/sim/model/test_llama_sequential.py checks it.
"""

from __future__ import annotations

from replay.sim.model.llama import events as ev
from replay.sim.model.llama.config import LlamaConfig
from replay.sim.model.llama.context import ServerContext, SlotFile, prefill_seconds
from replay.sim.model.llama.prompt import LlamaJob
from replay.sim.model.llama.task import Task, fail_event, finish_event, progress_event


class LlamaWalker:
    """Serves tasks one after another; `now` is when the last one finished."""

    def __init__(self, cfg: LlamaConfig, *, now: float = 0.0, progress: bool = False) -> None:
        self.cfg = cfg
        self.ctx = ServerContext(cfg)
        self.now = now
        self.progress = progress
        self.events: list[ev.Event] = []

    def serve(self, job: LlamaJob, at: float | None = None) -> ev.LlamaResult:
        """Run `job` from its arrival (`at`, or when the last one finished) to its last token."""
        ctx, cfg, out = self.ctx, self.cfg, self.events
        t = self.now if at is None or at < self.now else at
        task = Task(job, t)
        io = 0.0
        sel = ctx.select(job, t + io)
        slot = sel.slot
        if slot is None or slot.busy:
            raise RuntimeError("a task served alone always finds an idle slot")
        out.extend(sel.events)
        if sel.update_cache:
            seconds, events = ctx.update_cache(slot, job, t + io)
            out.extend(events)
            io += seconds
        task_id, seconds, events = ctx.launch(slot, job, t + io)
        out.extend(events)
        io += seconds
        task.slot, task.task, task.t_launch = slot, task_id, t + io
        tb = t + io
        task.n_past, events = ctx.start_prompt(slot, job, task_id, tb)
        out.extend(events)
        if task.n_past < 0:
            failed = fail_event(ctx, task, tb)
            out.append(failed)
            self.now = tb
            return failed.result
        task.t_prompt_start = tb
        n = job.n_tokens
        while len(slot.tokens) < n:
            p = progress_event(task, tb)
            if p is not None:
                out.append(p)
            start = len(slot.tokens)
            added, copied, events = ctx.prompt_batch(slot, job, task_id, cfg.n_batch, 0, tb)
            out.extend(events)
            seconds = 0.0
            seconds += prefill_seconds(cfg, start, added)
            seconds += copied / cfg.speeds.host_bps
            out.extend(ctx.purge_for(added, tb))
            tb = tb + seconds
            slot.memory.append(added)
        task.t_prompt_done = tb
        out.append(ev.PromptDone(tb, job.id, slot.index, task_id, n))
        total = len(job.reply)
        if total > 0:
            task.gen = 1
            if self.progress:
                out.append(ev.Decoded(tb, job.id, 1))
        while task.gen < total:
            seconds = 0.0
            seconds += 1.0 / cfg.speeds.decode_tps
            seconds += 0 / cfg.speeds.host_bps
            out.extend(ctx.purge_for(1, tb))
            tb = tb + seconds
            slot.memory.append(1)
            task.gen += 1
            if self.progress:
                out.append(ev.Decoded(tb, job.id, task.gen))
        done = finish_event(ctx, task, tb)
        out.append(done)
        self.now = tb
        return done.result

    def save(self, slot: int) -> SlotFile:
        file, seconds = self.ctx.save_slot(self.ctx.slots[slot % len(self.ctx.slots)])
        self.now += seconds
        return file

    def restore(self, slot: int, file: SlotFile) -> None:
        _, _, seconds = self.ctx.restore_slot(self.ctx.slots[slot % len(self.ctx.slots)], file)
        self.now += seconds

    def drain(self) -> list[ev.Event]:
        out, self.events = self.events, []
        return out
