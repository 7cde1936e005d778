"""Context checkpoints: the saved part of a slot's memory that cannot be rolled back (a recurrent
state, a sliding window), so a later prompt that shares only part of the prefix can resume there.

Rules from tools/server/server-context.cpp at b11549: where checkpoints are created (`pre_decode`:
`plan_batch`), which one a prompt resumes from (`pre_decode`: `find`), which ones a prompt
invalidates (`erase_after`), and what `create_checkpoint` evicts to make room (`create`).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from replay.sim.model.llama.build import Rules
from replay.sim.model.llama.prompt import LlamaPrompt


@dataclass(init=False, slots=True)
class Checkpoint:
    """`common_prompt_checkpoint`: the memory as it was before the batch that starts at `n_tokens`,
    its positions (`pos_min` is the memory's minimum, the SWA cells saved are `swa`), its size in
    bytes and the task that made it (-1: read back from a slot file)."""

    n_tokens: int
    pos_min: int
    pos_max: int
    size: int
    task: int
    swa: tuple[int, ...]

    def __init__(
        self, n_tokens: int, pos_min: int, pos_max: int, size: int, task: int, swa: tuple[int, ...]
    ) -> None:
        self.n_tokens = n_tokens
        self.pos_min = pos_min
        self.pos_max = pos_max
        self.size = size
        self.task = task
        self.swa = swa

    def from_file(self) -> Checkpoint:
        return Checkpoint(self.n_tokens, self.pos_min, self.pos_max, self.size, -1, self.swa)


@dataclass(init=False, slots=True)
class Created:
    """What `create_checkpoint` did: the checkpoints it dropped (too close to an earlier one, the
    oldest when full, one at the same place) and the new one's index (1-based) in the list."""

    too_close: list[Checkpoint]
    oldest: list[Checkpoint]
    superseded: list[Checkpoint]
    index: int

    def __init__(
        self, too_close: list[Checkpoint], oldest: list[Checkpoint], superseded: list[Checkpoint], index: int
    ) -> None:
        self.too_close = too_close
        self.oldest = oldest
        self.superseded = superseded
        self.index = index


def create(ckpts: list[Checkpoint], new: Checkpoint, limit: int, min_step: int, rules: Rules) -> Created:
    """`create_checkpoint`. When the list is about to be full, checkpoints of earlier tasks that lie
    within `--checkpoint-min-step` of the one before them go first (b10068 on); then the oldest,
    until there is room for `--ctx-checkpoints`; a checkpoint at the same n_tokens is replaced, not
    duplicated (b11063 on)."""
    too_close: list[Checkpoint] = []
    superseded: list[Checkpoint] = []
    if rules.user_message_checkpoints:
        last = -1
        i = 0
        while len(ckpts) + 1 >= limit and i < len(ckpts):
            cur = ckpts[i]
            if cur.task != new.task and last >= 0 and cur.n_tokens <= last + min_step:
                too_close.append(ckpts.pop(i))
                continue
            last = cur.n_tokens
            i += 1
    oldest: list[Checkpoint] = []
    while len(ckpts) >= limit and ckpts:
        oldest.append(ckpts.pop(0))
    if rules.supersede_checkpoints:
        kept = [c for c in ckpts if c.n_tokens != new.n_tokens]
        superseded = [c for c in ckpts if c.n_tokens == new.n_tokens]
        ckpts[:] = kept
    ckpts.append(new)
    return Created(too_close, oldest, superseded, len(ckpts))


def find(
    ckpts: list[Checkpoint], pos_next: int, thold: int, rules: Rules
) -> tuple[list[Checkpoint], Checkpoint | None]:
    """`pre_decode`'s search, newest first: a checkpoint past `pos_next` is skipped
    ([TAG_CHECKPOINTS_FIX_POS_MIN], b10068 on); one whose memory starts before the threshold (or
    at 0) is taken. Returns the ones checked (each logs `checking checkpoint with`) and the one
    taken."""
    checked: list[Checkpoint] = []
    for cur in reversed(ckpts):
        checked.append(cur)
        if rules.resume_v2 and cur.pos_max > pos_next:
            continue
        if cur.pos_min < thold or cur.pos_min == 0:
            return checked, cur
    return checked, None


def erase_after(ckpts: list[Checkpoint], pos_next: int) -> list[Checkpoint]:
    """`pre_decode`: every checkpoint ending after where the prompt resumes is invalid now."""
    gone = [c for c in ckpts if c.pos_max > pos_next]
    if gone:
        ckpts[:] = [c for c in ckpts if c.pos_max <= pos_next]
    return gone


@dataclass(init=False, slots=True)
class BatchPlan:
    """One slot's share of one server batch: how many prompt tokens it adds and whether a
    checkpoint is taken before the batch is decoded."""

    n_tokens: int
    checkpoint: bool

    def __init__(self, n_tokens: int, checkpoint: bool) -> None:
        self.n_tokens = n_tokens
        self.checkpoint = checkpoint


def plan_batch(
    prompt: LlamaPrompt,
    start: int,
    room: int,
    batch_before: int,
    ckpts: list[Checkpoint],
    pos_min: int,
    do_checkpoint: bool,
    n_batch: int,
    n_ubatch: int,
    min_step: int,
    every_nt: int,
    rules: Rules,
) -> BatchPlan:
    """`pre_decode`, for a slot whose prompt is at `start` tokens with `room` left in a batch that
    already holds `batch_before` tokens. The slot adds tokens until the batch is full or the prompt
    ends; with checkpoints it stops early so the memory can be saved at the right places: at a user
    message's start (the last one, or one `--checkpoint-min-step` past the last checkpoint), and
    4 + n_ubatch and 4 tokens before the prompt's end (llama.cpp PR 20288). The checkpoint is taken
    before the batch is decoded, so it holds the memory up to the batch's first token."""
    total = len(prompt)
    last_user = prompt.last_user
    n = min(total, start + room)  # the batch is full or the prompt ends
    if do_checkpoint:
        # The loop adds one token at a time and stops after the first at which a rule holds: the
        # earliest such position in (start, n].
        for b in (total - min(n_batch, 4 + n_ubatch), total - min(n_batch, 4)):
            if start < b < n:
                n = b
        if rules.user_message_checkpoints:
            i = bisect_right(prompt.user_starts, start)
            while i < len(prompt.user_starts) and prompt.user_starts[i] < n:
                u = prompt.user_starts[i]
                if u == last_user or not ckpts or u > ckpts[-1].n_tokens + min_step:
                    n = u
                    break
                i += 1
    added = n - start
    take = do_checkpoint
    near_end = total < n + n_ubatch
    if rules.user_message_checkpoints:
        if n < total and not prompt.is_user_start(start) and not near_end:
            take = False
        if take and pos_min < 0:
            take = False
        take = take and (not ckpts or start == last_user or near_end or start > ckpts[-1].n_tokens + min_step)
    else:
        # b9294: near the end, or every `checkpoint_every_nt` tokens counted from the batch's
        # start; no checkpoint of a memory under 64 tokens, none within 64 of the last.
        if n < total and not near_end:
            last = ckpts[-1].n_tokens if ckpts else 0
            take = take and every_nt > 0 and n - (batch_before + added) - last >= every_nt
        take = take and pos_min >= 0 and n >= 64
        take = take and (not ckpts or n - added > ckpts[-1].n_tokens + 64)
    return BatchPlan(added, take)
