"""A completion task as the loop tracks it, and the two events its life's end and its slow
prompts produce; shared by the loop (`engine.py`) and the sequential walker (`sequential.py`)."""

from __future__ import annotations

from replay.sim.model.llama import events as ev
from replay.sim.model.llama.context import LlamaSlot, ServerContext
from replay.sim.model.llama.prompt import LlamaJob

PROGRESS_AFTER_S = 3.0  # `print_timings_pp`: a prompt reports its progress once it has taken 3 s


class Task:
    """A completion task in the server."""

    def __init__(self, job: LlamaJob, t_submit: float) -> None:
        self.job = job
        self.t_submit = t_submit
        self.slot: LlamaSlot | None = None
        self.task = -1
        self.state = "waiting"  # waiting | started | prompt | generating
        self.n_past = 0
        self.gen = 0
        self.t_launch = 0.0
        self.t_prompt_start = 0.0
        self.t_prompt_done = 0.0


def finish_event(ctx: ServerContext, task: Task, t: float) -> ev.Finished:
    """`release` and the task's final numbers."""
    slot = task.slot
    assert slot is not None
    job = task.job
    ctx.release(slot, job, t)
    n = job.n_tokens
    result = ev.LlamaResult(
        job_id=job.id,
        task=task.task,
        slot=slot.index,
        prompt_tokens=n,
        cache_n=task.n_past,
        prompt_n=n - task.n_past,
        predicted_n=task.gen,
        finish=job.reply.finish,
        error=None,
        queue_s=task.t_launch - task.t_submit,
        prompt_s=task.t_prompt_done - task.t_prompt_start,
        predicted_s=t - task.t_prompt_done,
        total_s=t - task.t_submit,
    )
    return ev.Finished(t, job.id, result, len(slot.tokens))


def progress_event(task: Task, t: float) -> ev.PromptProgress | None:
    """`print_timings_pp`, before each prompt batch of a task that has taken 3 s so far."""
    elapsed = t - task.t_prompt_start
    slot = task.slot
    if elapsed < PROGRESS_AFTER_S or slot is None:
        return None
    n = task.job.n_tokens
    return ev.PromptProgress(
        t,
        task.job.id,
        slot.index,
        task.task,
        slot.n_prompt_processed,
        len(slot.tokens) / n if n else 0.0,
        elapsed,
    )


def fail_event(ctx: ServerContext, task: Task, t: float) -> ev.Finished:
    """`send_error` and `release` for a prompt longer than the slot's context."""
    slot = task.slot
    assert slot is not None
    job = task.job
    ctx.release(slot, None, t)
    n = job.n_tokens
    message = f"request ({n} tokens) exceeds the available context size ({ctx.cfg.n_ctx_slot} tokens), try increasing it"
    result = ev.LlamaResult(
        job_id=job.id,
        task=task.task,
        slot=slot.index,
        prompt_tokens=n,
        cache_n=0,
        prompt_n=0,
        predicted_n=0,
        finish="error",
        error=message,
        queue_s=task.t_launch - task.t_submit,
        prompt_s=0.0,
        predicted_s=0.0,
        total_s=t - task.t_submit,
    )
    return ev.Finished(t, job.id, result, len(slot.tokens))
