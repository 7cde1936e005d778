"""What the cache model reports: one typed event per thing ds4 would log or a client would see.

Each event carries the virtual time `t` it happened at and the numbers its log line needs, so
formatting (`log.py`) and the HTTP layer never look inside the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from replay.sim.model.disk import Checkpoint
from replay.sim.model.seq import TokenSeq

CACHE_SOURCE_CLASS = {"none": "none", "memory-token": "live", "thinking-visible": "live", "disk-text": "disk"}


@dataclass(frozen=True, slots=True)
class Result:
    """The outcome of one job: ds4's usage numbers and the modelled seconds of each phase."""

    job_id: int
    slot: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish: str
    error: str | None
    cache_source: str
    queue_s: float
    evict_save_s: float
    restore_s: float
    prefill_s: float
    decode_s: float
    total_s: float

    @property
    def reprocessed_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    def x_sim(self) -> dict[str, Any]:
        """The `x_sim` object the server adds to each final response (see the brief)."""
        return {
            "queue_s": round(self.queue_s, 6),
            "restore_s": round(self.restore_s, 6),
            "evict_save_s": round(self.evict_save_s, 6),
            "prefill_s": round(self.prefill_s, 6),
            "decode_s": round(self.decode_s, 6),
            "total_s": round(self.total_s, 6),
            "cache_source": CACHE_SOURCE_CLASS.get(self.cache_source, "none"),
            "slot": self.slot,
        }


@dataclass(frozen=True, slots=True)
class Event:
    t: float


@dataclass(frozen=True, slots=True)
class Dispatched(Event):
    job_id: int
    slot: int


@dataclass(frozen=True, slots=True)
class LiveMiss(Event):
    job_id: int
    slot: int
    live: int
    prompt: int
    common: int
    reason: str


@dataclass(frozen=True, slots=True)
class LiveContinuation(Event):
    """ds4's `thinking live continuation match=visible-prefix`: the remembered visible transcript matched."""

    job_id: int
    cached: int
    prompt: int


@dataclass(frozen=True, slots=True)
class Stored(Event):
    job_id: int | None
    slot: int
    checkpoint: Checkpoint
    reason: str
    save_s: float


@dataclass(frozen=True, slots=True)
class Skipped(Event):
    tokens: int
    reason: str
    because: str


@dataclass(frozen=True, slots=True)
class Evicted(Event):
    checkpoint: Checkpoint
    job_id: int | None = None  # the request whose save it made room for (None: the startup pass)


@dataclass(frozen=True, slots=True)
class DiskHit(Event):
    job_id: int
    checkpoint: Checkpoint
    load_s: float
    consumed: bool


@dataclass(frozen=True, slots=True)
class PromptStart(Event):
    job_id: int
    slot: int
    cached: int
    prompt: int
    flags: str


@dataclass(frozen=True, slots=True)
class PrefillChunk(Event):
    job_id: int
    cached: int
    prompt: int
    done: int
    chunk_tps: float
    avg_tps: float
    elapsed: float
    flags: str


@dataclass(frozen=True, slots=True)
class PromptDone(Event):
    job_id: int
    cached: int
    prompt: int
    elapsed: float
    flags: str


@dataclass(frozen=True, slots=True)
class Decoded(Event):
    """Streaming progress: `gen` tokens of the job's reply exist now (no log line)."""

    job_id: int
    gen: int


@dataclass(frozen=True, slots=True)
class DecodeProgress(Event):
    job_id: int
    start: int
    gen: int
    chunk_tps: float
    avg_tps: float
    elapsed: float
    flags: str


@dataclass(frozen=True, slots=True)
class ToolCallsEmitted(Event):
    job_id: int
    cached: int
    prompt: int
    ids: tuple[str, ...]
    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ThinkingRemembered(Event):
    job_id: int
    cached: int
    prompt: int
    live: int
    visible: TokenSeq


@dataclass(frozen=True, slots=True)
class Finished(Event):
    job_id: int
    result: Result
    flags: str


@dataclass(frozen=True, slots=True)
class Persisting(Event):
    slot: int
    tokens: int


@dataclass(frozen=True, slots=True)
class Removed(Event):
    """A file deleted outside eviction (consumed on restore): the file layer unlinks it."""

    checkpoint: Checkpoint


@dataclass(frozen=True, slots=True)
class ShutdownComplete(Event):
    pass
