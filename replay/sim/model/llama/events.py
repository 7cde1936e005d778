"""What the llama model reports: one typed event per line llama-server would log (and per thing a
client sees), each at the modelled time `t` it happened, with the numbers its line prints.

The simulator's log (sim/server) formats them in llama.cpp's own printf formats, so the project's
llama-server log parser and correlator read the simulator's log as they read the real one; a twin
comparison lines the events up against the real server's lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from replay.sim.model.llama.checkpoints import Checkpoint


@dataclass(frozen=True, slots=True)
class LlamaResult:
    """One finished task, in the numbers llama-server returns (`timings`, `usage`) and the modelled
    seconds of each phase."""

    job_id: int
    task: int
    slot: int
    prompt_tokens: int
    cache_n: int  # timings.cache_n, usage.prompt_tokens_details.cached_tokens
    prompt_n: int  # timings.prompt_n: tokens re-processed
    predicted_n: int
    finish: str
    error: str | None
    queue_s: float
    prompt_s: float
    predicted_s: float
    total_s: float

    @property
    def reprocessed_tokens(self) -> int:
        return self.prompt_n

    def timings(self) -> dict[str, Any]:
        prompt_ms = self.prompt_s * 1000.0
        predicted_ms = self.predicted_s * 1000.0
        return {
            "cache_n": self.cache_n,
            "prompt_n": self.prompt_n,
            "prompt_ms": round(prompt_ms, 3),
            "prompt_per_token_ms": prompt_ms / self.prompt_n if self.prompt_n else 0.0,
            "prompt_per_second": 1e3 / prompt_ms * self.prompt_n if prompt_ms > 0 else 0.0,
            "predicted_n": self.predicted_n,
            "predicted_ms": round(predicted_ms, 3),
            "predicted_per_token_ms": predicted_ms / self.predicted_n if self.predicted_n else 0.0,
            "predicted_per_second": 1e3 / predicted_ms * self.predicted_n if predicted_ms > 0 else 0.0,
        }

    def x_sim(self) -> dict[str, Any]:
        return {
            "queue_s": round(self.queue_s, 6),
            "prefill_s": round(self.prompt_s, 6),
            "decode_s": round(self.predicted_s, 6),
            "total_s": round(self.total_s, 6),
            "restore_s": 0.0,
            "slot": self.slot,
        }


@dataclass(frozen=True, slots=True)
class Event:
    t: float


# --- slot selection (`get_available_slot`) ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlotSkipped(Event):
    """` - skipping, slot is empty` / ` - skipping, is_processing = 1`."""

    slot: int
    empty: bool


@dataclass(frozen=True, slots=True)
class SlotSimilarity(Event):
    """` - checking sim = S (lcp/n) > thold`."""

    slot: int
    sim: float
    lcp: int
    n_tokens: int
    threshold: float


@dataclass(frozen=True, slots=True)
class SlotSelected(Event):
    job_id: int
    slot: int
    by: str  # "id" | "lcp" | "lru"
    sim: float
    threshold: float
    f_keep: float
    t_last: int  # microseconds of the slot's last release, -1 if never used


# --- host prompt cache (`server_prompt_cache`) --------------------------------------------------


@dataclass(frozen=True, slots=True)
class CacheUpdating(Event):
    """`updating prompt cache`: the selected slot changes hands."""


@dataclass(frozen=True, slots=True)
class PromptSaved(Event):
    tokens: int
    bytes: int


@dataclass(frozen=True, slots=True)
class PromptSaveSkipped(Event):
    reason: str  # "contained" | "too-large"
    bytes: int
    limit: int


@dataclass(frozen=True, slots=True)
class PromptDropped(Event):
    """A stored prompt leaves the cache: `obsolete` (a prefix of the new one), `room` (to fit the
    new one), `size` or `tokens` (over a limit after an update)."""

    cause: str
    tokens: int
    bytes: int
    limit_tokens: int
    est_tokens: int


@dataclass(frozen=True, slots=True)
class PromptLookup(Event):
    base_keep: float
    base_sim: float
    candidates: tuple[tuple[int, int, float, float], ...]  # (tokens, lcp, f_keep, f_sim)


@dataclass(frozen=True, slots=True)
class PromptLoaded(Event):
    job_id: int
    slot: int
    tokens: int
    f_keep: float
    f_sim: float


@dataclass(frozen=True, slots=True)
class CacheState(Event):
    entries: tuple[tuple[int, int, int], ...]  # (tokens, checkpoints, bytes), oldest first
    bytes: int
    limit_bytes: int
    limit_tokens: int
    est_tokens: int


@dataclass(frozen=True, slots=True)
class CacheUpdated(Event):
    seconds: float


@dataclass(frozen=True, slots=True)
class IdleSlotSaved(Event):
    slot: int
    cleared: bool


# --- a task's prompt (`launch_slot_with_task`, `pre_decode`) ------------------------------------


@dataclass(frozen=True, slots=True)
class Launched(Event):
    job_id: int
    slot: int
    task: int


@dataclass(frozen=True, slots=True)
class NewPrompt(Event):
    job_id: int
    slot: int
    task: int
    n_ctx_slot: int
    n_tokens: int


@dataclass(frozen=True, slots=True)
class CacheReuseIgnored(Event):
    job_id: int
    slot: int
    task: int
    n_cache_reuse: int


@dataclass(frozen=True, slots=True)
class CacheReuseChunk(Event):
    job_id: int
    slot: int
    task: int
    size: int
    src: int  # cache position the chunk is moved from
    dst: int  # prompt position it is moved to


@dataclass(frozen=True, slots=True)
class CheckpointChecked(Event):
    job_id: int
    slot: int
    task: int
    checkpoint: Checkpoint
    threshold: int


@dataclass(frozen=True, slots=True)
class CheckpointRestored(Event):
    job_id: int
    slot: int
    task: int
    checkpoint: Checkpoint
    n_past: int


@dataclass(frozen=True, slots=True)
class FullReprocess(Event):
    """`forcing full prompt re-processing due to lack of cache data`."""

    job_id: int
    slot: int
    task: int


@dataclass(frozen=True, slots=True)
class CheckpointErased(Event):
    """`erased invalidated context checkpoint`: it ends past where the prompt resumes."""

    job_id: int
    slot: int
    task: int
    checkpoint: Checkpoint
    n_swa: int
    pos_next: int


@dataclass(frozen=True, slots=True)
class LastTokenReevaluated(Event):
    job_id: int
    slot: int
    task: int
    n_past: int
    n_tokens: int


@dataclass(frozen=True, slots=True)
class SeqRemove(Event):
    """`cached n_tokens = N, memory_seq_rm [N, end)`: each batch a slot adds prompt tokens to."""

    job_id: int
    slot: int
    task: int
    n_tokens: int


@dataclass(frozen=True, slots=True)
class CheckpointDropped(Event):
    """`create_checkpoint` dropped one: `too-close`, `oldest` or `superseded`."""

    job_id: int
    slot: int
    task: int
    checkpoint: Checkpoint
    cause: str


@dataclass(frozen=True, slots=True)
class CheckpointCreated(Event):
    job_id: int
    slot: int
    task: int
    checkpoint: Checkpoint
    index: int
    limit: int


@dataclass(frozen=True, slots=True)
class PromptProgress(Event):
    """`prompt processing, n_tokens = ..., progress = ...`: printed once the prompt has taken 3 s."""

    job_id: int
    slot: int
    task: int
    processed: int
    progress: float
    elapsed: float


@dataclass(frozen=True, slots=True)
class PromptDone(Event):
    """The prompt's last batch is decoded: the first token is sampled (`init sampler` before it)."""

    job_id: int
    slot: int
    task: int
    n_tokens: int


@dataclass(frozen=True, slots=True)
class Decoded(Event):
    """Streaming progress: `gen` tokens of the job's reply exist now (no log line)."""

    job_id: int
    gen: int


@dataclass(frozen=True, slots=True)
class Finished(Event):
    """`print_timing` and `release`: the slot holds `n_tokens` tokens now."""

    job_id: int
    result: LlamaResult
    n_tokens: int


@dataclass(frozen=True, slots=True)
class SlotPurged(Event):
    """`purging slot N with M tokens`: a unified KV cache ran out of room."""

    slot: int
    tokens: int


# --- slot files (`/slots/N?action=...`) ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlotAction(Event):
    """A slot save, restore or erase, with what it answers (`n_saved`/`n_restored`, bytes, ms)."""

    action_id: int
    slot: int
    action: str  # "save" | "restore" | "erase"
    filename: str
    tokens: int
    bytes: int
    seconds: float
    checkpoints: int
    checkpoint_bytes: int
    error: str | None
