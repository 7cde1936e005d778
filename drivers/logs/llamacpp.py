"""llama-server log lines -> typed numeric events.

Formats are llama.cpp's own printf strings (tools/server/server-context.cpp, server-task.cpp,
common/log.cpp), e.g. `slot %12.*s: id %2d | task %d | selected slot by LCP similarity,
sim_best = %.3f (> %.3f thold), f_keep = %.3f`. A line may carry a `M.SS.mmm.uuu` timestamp
(time since the process started) and a level letter when the server runs with
`--log-prefix --log-timestamps`, colour codes when stderr is a TTY, and whatever prefix a service
manager adds. Older builds printed the three timing lines under one `print_timing` header, so a
bare `prompt eval time = ...` line belongs to the slot and task of the previous header.

Only numbers and closed-vocabulary names leave this module: model paths, hosts, prompts never do.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Annotated, Any, ClassVar, get_args, get_origin, get_type_hints

from drivers.logs.base import ParseStats, SubstringCounter, Vocab, strip_ansi

REUSE_DISABLED_BY = Vocab("multimodal", "context", "mtp", "speculative")
SELECTED_BY = Vocab("lcp", "lru", "id")
# Why a prompt was not saved to the host cache (server-task.cpp `server_prompt_cache::alloc`).
SAVE_SKIPPED_BY = Vocab("present", "too_big", "no_memory")
# What went wrong with the context checkpoints appended to a slot file (server-context.cpp).
SLOT_FILE_FAULTS = Vocab("failed", "incomplete", "invalid", "truncated", "draft_mismatch")

# ---------------------------------------------------------------------------------------------
# Events


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Base of every llama.cpp event: `t` is seconds since the first process in the log started."""

    kind: ClassVar[str] = "event"
    t: float | None
    line: int

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, **asdict(self)}


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotEvent(Event):
    slot: int | None
    task: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotSelected(SlotEvent):
    kind: ClassVar[str] = "slot_selected"
    by: Annotated[str | None, SELECTED_BY]
    sim: float | None
    threshold: float | None
    f_keep: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class NewPrompt(SlotEvent):
    kind: ClassVar[str] = "new_prompt"
    n_ctx_slot: int | None
    n_keep: int | None
    n_tokens: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class SeqRemove(SlotEvent):
    """`n_tokens = N, memory_seq_rm [N, end)`: the first one of a task is the prefix it kept."""

    kind: ClassVar[str] = "seq_rm"
    n_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptProgress(SlotEvent):
    kind: ClassVar[str] = "prompt_progress"
    n_tokens: int | None
    batch_tokens: int | None
    progress: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptDone(SlotEvent):
    kind: ClassVar[str] = "prompt_done"
    n_tokens: int | None
    batch_tokens: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointCreated(SlotEvent):
    kind: ClassVar[str] = "checkpoint_created"
    index: int | None
    max: int | None
    pos_min: int | None
    pos_max: int | None
    n_tokens: int | None
    mib: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointRestored(SlotEvent):
    kind: ClassVar[str] = "checkpoint_restored"
    pos_min: int | None
    pos_max: int | None
    n_tokens: int | None
    n_past: int | None
    mib: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointErased(SlotEvent):
    kind: ClassVar[str] = "checkpoint_erased"
    pos_min: int | None
    pos_max: int | None
    n_tokens: int | None
    mib: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class FullReprocess(SlotEvent):
    """`forcing full prompt re-processing due to lack of cache data` (SWA / hybrid memory)."""

    kind: ClassVar[str] = "full_reprocess"


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotSimilarity(SlotEvent):
    """` - checking sim = S (lcp/n) > thold` (-lv 4): one occupied slot's score while a slot is chosen."""

    kind: ClassVar[str] = "slot_similarity"
    sim: float
    lcp: int
    n_tokens: int
    threshold: float


@dataclass(frozen=True, slots=True, kw_only=True)
class LastTokenReevaluated(SlotEvent):
    """`need to evaluate at least 1 token ...`: the whole prompt was cached, its last token is re-run
    (why a full hit reports `prompt_n` 1)."""

    kind: ClassVar[str] = "last_token_reevaluated"
    n_past: int
    n_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointCheck(SlotEvent):
    """`checking checkpoint with [pos_min, pos_max] against N...`: a candidate to resume from."""

    kind: ClassVar[str] = "checkpoint_check"
    pos_min: int
    pos_max: int
    against: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointSuperseded(SlotEvent):
    """`superseding context checkpoint at n_tokens = N`: a new checkpoint replaces one at the same place."""

    kind: ClassVar[str] = "checkpoint_superseded"
    n_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointEvicted(SlotEvent):
    """`erasing old context checkpoint (...)`: the oldest one goes when `--ctx-checkpoints` is full."""

    kind: ClassVar[str] = "checkpoint_evicted"
    pos_min: int | None
    pos_max: int | None
    n_tokens: int | None
    mib: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointPruned(SlotEvent):
    """`erasing context checkpoint too close to an earlier one (...)`: with `--ctx-checkpoints`
    full, a checkpoint of an earlier task within `--checkpoint-min-step` tokens of the one before
    it goes before the oldest does (newer builds' `create_checkpoint`)."""

    kind: ClassVar[str] = "checkpoint_pruned"
    pos_min: int | None
    pos_max: int | None
    n_tokens: int | None
    mib: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointDecision(SlotEvent):
    """`main/do_checkpoint = yes|no, pos_min = A, pos_max = B` (-lv 5): whether this batch ends in a
    checkpoint."""

    kind: ClassVar[str] = "checkpoint_decision"
    create: bool
    pos_min: int
    pos_max: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeculativeCheckpoint(SlotEvent):
    """`created speculative checkpoint (...)` / `restoring speculative checkpoint (...)` (-lv 5): the
    state a draft is rolled back to; it lives for one step and serves no later request."""

    kind: ClassVar[str] = "speculative_checkpoint"
    action: str  # "save" | "restore"
    pos_min: int | None
    pos_max: int | None
    n_tokens: int | None = None
    mib: float | None = None
    draft_mib: float | None = None
    size_bytes: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheReuseStart(SlotEvent):
    """`trying to reuse chunks with size > N, n_past = M` (-lv 5): `--cache-reuse` looks past the
    common prefix for chunks it can shift into place."""

    kind: ClassVar[str] = "cache_reuse_start"
    min_chunk: int
    n_past: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheReuseChunk(SlotEvent):
    """`reusing chunk with size N, shifting KV cache [a, b) -> [c, d)`: N cached tokens moved, not
    re-processed."""

    kind: ClassVar[str] = "cache_reuse_chunk"
    n_tokens: int
    src_start: int
    src_end: int
    dst_start: int
    dst_end: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheReuseDone(SlotEvent):
    """`after context reuse, new n_past = N` (-lv 5): the prefix kept once the chunks are in place."""

    kind: ClassVar[str] = "cache_reuse_done"
    n_past: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextShift(SlotEvent):
    """`slot context shift, n_keep = K, n_left = L, n_discard = D`: the context was full, D tokens
    after the first K were dropped from the slot's KV."""

    kind: ClassVar[str] = "context_shift"
    n_keep: int
    n_left: int
    n_discard: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotCleared(SlotEvent):
    """`clearing prompt with N tokens` (the slot's KV emptied: after a failed host-cache load, or an
    idle slot of a unified KV), or `clearing cache for lora change` (`lora` true)."""

    kind: ClassVar[str] = "slot_cleared"
    n_tokens: int | None = None
    lora: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotMemoryError(SlotEvent):
    """`n_past = N, slot.prompt.tokens.size() = M, seq_id = S, pos_min = -1`: the slot's memory lost
    positions its prompt still claims; the server aborts right after."""

    kind: ClassVar[str] = "slot_memory_error"
    n_past: int
    n_tokens: int
    pos_min: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotFileCheckpointFault(SlotEvent):
    """The context checkpoints of a slot file were not written or read whole: `failed to append`,
    `the appendix is incomplete`, `invalid`/`truncated ... appendix - ignored`, draft data dropped."""

    kind: ClassVar[str] = "slot_file_checkpoint_fault"
    action: str  # "save" | "restore"
    fault: Annotated[str | None, SLOT_FILE_FAULTS]


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotFileCheckpoints(SlotEvent):
    """`appended|restored N context checkpoint(s)` on a slot save/restore: the slot file holds them."""

    kind: ClassVar[str] = "slot_file_checkpoints"
    action: str  # "save" | "restore"
    count: int
    mib: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheReuseIgnored(SlotEvent):
    kind: ClassVar[str] = "cache_reuse_ignored"
    n_cache_reuse: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptTiming(SlotEvent):
    kind: ClassVar[str] = "prompt_timing"
    ms: float
    tokens: int
    tps: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalTiming(SlotEvent):
    kind: ClassVar[str] = "eval_timing"
    ms: float
    tokens: int
    tps: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Release(SlotEvent):
    kind: ClassVar[str] = "release"
    n_tokens: int | None
    truncated: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestError(Event):
    """`send_error: task id = N, error: ...`; only a prompt over the context is told apart."""

    kind: ClassVar[str] = "request_error"
    task: int | None
    cause: str  # "context" | "other"
    n_prompt_tokens: int | None
    n_ctx: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptCacheSave(Event):
    kind: ClassVar[str] = "prompt_cache_save"
    tokens: int | None
    mib: float | None
    draft_mib: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptCacheLookup(Event):
    kind: ClassVar[str] = "prompt_cache_lookup"
    f_keep: float | None
    sim: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptCacheLoad(Event):
    """`found better prompt with f_keep = ..., f_sim = ...`: a prompt restored from host RAM."""

    kind: ClassVar[str] = "prompt_cache_load"
    f_keep: float | None
    sim: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptCacheCandidate(Event):
    """`   - prompt with length N, lcp = M, f_keep = X, f_sim = Y`: one cached prompt considered."""

    kind: ClassVar[str] = "prompt_cache_candidate"
    tokens: int
    lcp: int
    f_keep: float
    sim: float


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptCacheState(Event):
    kind: ClassVar[str] = "prompt_cache_state"
    prompts: int | None
    mib: float | None
    limit_mib: float | None
    limit_tokens: int | None
    est_tokens: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptCacheEvict(Event):
    kind: ClassVar[str] = "prompt_cache_evict"
    cause: str  # "size" | "tokens" | "room" (made room for a new entry)
    mib: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptCacheSkip(Event):
    """A save that did not happen: `prompt is already in the cache, skipping`, `prompt state size X
    MiB exceeds cache size limit Y MiB, skipping`, `failed to allocate memory for prompt cache
    state` (the limit then drops: `PromptCacheLimit`)."""

    kind: ClassVar[str] = "prompt_cache_skip"
    cause: Annotated[str | None, SAVE_SKIPPED_BY]
    mib: float | None = None
    limit_mib: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptCacheObsolete(Event):
    """`removing obsolete cached prompt with length N`: a cached prompt the one being saved contains
    goes (no size printed: the entry of that length)."""

    kind: ClassVar[str] = "prompt_cache_obsolete"
    tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptCacheEntry(Event):
    """`   - prompt 0x...: N tokens, checkpoints: C, X MiB`: one entry the cache holds, listed after
    each `cache state` (X counts its checkpoints; the pointer is never read)."""

    kind: ClassVar[str] = "prompt_cache_entry"
    tokens: int
    checkpoints: int
    mib: float


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptCacheLimit(Event):
    """`cache size limit reduced to X MiB`: an allocation failed, the limit drops to 40% of use."""

    kind: ClassVar[str] = "prompt_cache_limit"
    limit_mib: float


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptCacheLoadFailed(Event):
    """`failed to restore state with size N` / `failed to load prompt from cache`: the chosen entry
    could not be loaded (it stays in the cache; the slot is cleared)."""

    kind: ClassVar[str] = "prompt_cache_load_failed"
    size_bytes: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class IdleSlotSave(SlotEvent):
    """`saving idle slot to prompt cache` (`--cache-idle-slots`): the save lines that follow are this
    slot's, not the one just selected."""

    kind: ClassVar[str] = "idle_slot_save"


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotPurged(Event):
    """`purging slot S with N tokens`: a unified KV out of room empties an idle slot."""

    kind: ClassVar[str] = "slot_purged"
    purged_slot: int
    n_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class KvCacheFull(Event):
    """`failed to find free space in the KV cache, retrying with smaller batch size, ...`."""

    kind: ClassVar[str] = "kv_cache_full"
    n_batch: int
    ret: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptCacheUpdate(Event):
    kind: ClassVar[str] = "prompt_cache_update"
    ms: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheReuseDisabled(Event):
    """`cache_reuse is not supported by multimodal|this context, it will be disabled`."""

    kind: ClassVar[str] = "cache_reuse_disabled"
    by: Annotated[str | None, REUSE_DISABLED_BY]


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotsInit(Event):
    kind: ClassVar[str] = "slots_init"
    n_slots: int | None
    n_ctx_slot: int | None
    kv_unified: bool | None


@dataclass(frozen=True, slots=True, kw_only=True)
class NewSlot(Event):
    kind: ClassVar[str] = "new_slot"
    slot: int | None
    n_ctx: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class AutoParallel(Event):
    kind: ClassVar[str] = "auto_parallel"
    n_parallel: int | None
    kv_unified: bool | None


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptCacheConfig(Event):
    """Host-RAM prompt cache limit: MiB, -1 for no limit, 0 when disabled (`--cache-ram 0`)."""

    kind: ClassVar[str] = "prompt_cache_config"
    limit_mib: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointConfig(Event):
    kind: ClassVar[str] = "checkpoint_config"
    max: int
    min_spacing: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheIdleSlots(Event):
    """`idle slots will be saved to prompt cache ...`, or `--cache-idle-slots requires --cache-ram,
    disabling`."""

    kind: ClassVar[str] = "cache_idle_slots"
    enabled: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class SwaCache(Event):
    """`creating SWA KV cache, size = N cells`, `using full-size SWA cache` (`--swa-full`): how much
    of a sliding-window model's past the slot keeps, hence how far back a prompt can branch."""

    kind: ClassVar[str] = "swa_cache"
    cells: int | None
    full: bool | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Threads(Event):
    """`system_info: n_threads = N (n_threads_batch = M)` or `llama threadpool init, n_threads = N`."""

    kind: ClassVar[str] = "threads"
    n_threads: int
    n_threads_batch: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class LogVerbosity(Event):
    """`verbosity = N`: below 4 the prompt-cache and checkpoint settings lines are not printed."""

    kind: ClassVar[str] = "log_verbosity"
    level: int


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildInfo(Event):
    """`build_info: b11549-abc1234` (or `build: 11549 (abc1234) ...`): the llama.cpp build whose
    cache rules the server runs; 0 when the build does not know its number (xllamacpp: `b0-unknown`)."""

    kind: ClassVar[str] = "build_info"
    build: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Listening(Event):
    kind: ClassVar[str] = "listening"
    port: int | None


STARTUP_KINDS = (
    BuildInfo,
    AutoParallel,
    SlotsInit,
    NewSlot,
    PromptCacheConfig,
    CheckpointConfig,
    CacheReuseDisabled,
    CacheIdleSlots,
    SwaCache,
    Threads,
    LogVerbosity,
    Listening,
)

# ---------------------------------------------------------------------------------------------
# Grammar: one row per message shape, tried in order, the first match wins. A row's named groups
# are the event's fields (converted by the field's annotation: `int`, `float`, `bool`, or `str`
# checked against the `Vocab` it is annotated with); `fixed` sets the fields a message implies;
# slot, task, t and line come from the line's prefix. A `listed` row also reads a parenthesised
# `key = value, ...` list by key, so a field inserted by a newer build moves nothing.

_TS = re.compile(r"(?:^|\s)(\d+)\.(\d\d)\.(\d{3})\.(\d{3}) (?:[IWEDT] )?")
# The function name is `__func__` cut to 12 characters: a lambda's is `operator()`, not a word.
_SLOT = re.compile(r"(?:^|\s)slot\s+[^\s:]+: id\s+(-?\d+) \| task (-?\d+) \| ?(.*)$")
_SRV = re.compile(r"(?:^|\s)srv\s+[^\s:]+: ?(.*)$")
_NUM = r"-?\d+(?:\.\d+)?"
_KV = re.compile(rf"(\w+) = ({_NUM})")
_SIZE_MIB = re.compile(rf"size = ({_NUM}) MiB")


def _num(name: str) -> str:
    return rf"(?P<{name}>{_NUM})"


_TIMING = rf"{_num('ms')} ms /\s*(?P<tokens>\d+) (?:tokens|runs)\s*\(\s*{_NUM} ms per token,\s*{_num('tps')} tokens per second\)"


@dataclass(frozen=True, slots=True)
class Row:
    pattern: re.Pattern[str]
    event: type[Event]
    fixed: Mapping[str, object] = field(default_factory=dict)
    listed: bool = False  # the group named `listed` holds `key = value, ...` pairs


def _row(pattern: str, event: type[Event], listed: bool = False, **fixed: object) -> Row:
    return Row(re.compile(pattern), event, fixed, listed)


ROWS: tuple[Row, ...] = (
    _row(
        rf"selected slot by LCP similarity, (?:f_)?sim_best = {_num('sim')} \(> {_num('threshold')} thold\), f_keep = {_num('f_keep')}",
        SlotSelected,
        by="lcp",
    ),
    _row(r"selected slot by LRU\b", SlotSelected, by="lru"),
    _row(r"selected slot by (?P<by>\w+)", SlotSelected),
    _row(
        r"new prompt, n_ctx_slot = (?P<n_ctx_slot>\d+), n_keep = (?P<n_keep>-?\d+), (?:task\.n_tokens|n_prompt_tokens) = (?P<n_tokens>\d+)",
        NewPrompt,
    ),
    _row(r"n_tokens = (?P<n_tokens>\d+), memory_seq_rm \[\d+, end\)", SeqRemove),
    _row(
        rf"prompt processing progress, n_tokens = (?P<n_tokens>\d+), batch\.n_tokens = (?P<batch_tokens>\d+), progress = {_num('progress')}",
        PromptProgress,
    ),
    _row(
        rf"prompt processing, n_tokens =\s*(?P<n_tokens>\d+), progress = {_num('progress')}", PromptProgress
    ),
    _row(
        r"prompt processing done, n_tokens = (?P<n_tokens>\d+), batch\.n_tokens = (?P<batch_tokens>\d+)",
        PromptDone,
    ),
    _row(
        r"created context checkpoint (?P<index>\d+) of (?P<max>\d+) \((?P<listed>[^()]*)\)",
        CheckpointCreated,
        listed=True,
    ),
    _row(r"restored context checkpoint \((?P<listed>[^()]*)\)", CheckpointRestored, listed=True),
    _row(r"erased invalidated context checkpoint \((?P<listed>[^()]*)\)", CheckpointErased, listed=True),
    _row(r"forcing full prompt re-processing", FullReprocess),
    _row(
        rf"- checking sim = {_num('sim')} \((?P<lcp>\d+)/(?P<n_tokens>\d+)\) > {_num('threshold')}",
        SlotSimilarity,
    ),
    _row(
        r"need to evaluate at least 1 token .*\(n_past = (?P<n_past>\d+), task\.n_tokens\(\) = (?P<n_tokens>\d+)\)",
        LastTokenReevaluated,
    ),
    _row(
        r"checking checkpoint with \[(?P<pos_min>-?\d+), (?P<pos_max>-?\d+)\] against (?P<against>-?\d+)",
        CheckpointCheck,
    ),
    _row(r"superseding context checkpoint at n_tokens = (?P<n_tokens>\d+)", CheckpointSuperseded),
    _row(r"erasing old context checkpoint \((?P<listed>[^()]*)\)", CheckpointEvicted, listed=True),
    _row(
        r"erasing context checkpoint too close to an earlier one \((?P<listed>[^()]*)\)",
        CheckpointPruned,
        listed=True,
    ),
    _row(
        r"main/do_checkpoint = (?P<create>yes|no), pos_min = (?P<pos_min>-?\d+), pos_max = (?P<pos_max>-?\d+)",
        CheckpointDecision,
    ),
    _row(
        rf"created speculative checkpoint \(pos_min = (?P<pos_min>-?\d+), pos_max = (?P<pos_max>-?\d+), "
        rf"n_tokens = (?P<n_tokens>\d+), size = {_num('mib')} MiB, draft = {_num('draft_mib')} MiB\)",
        SpeculativeCheckpoint,
        action="save",
    ),
    _row(
        r"restoring speculative checkpoint \(pos_min = (?P<pos_min>-?\d+), pos_max = (?P<pos_max>-?\d+), "
        r"size = (?P<size_bytes>\d+)\)",
        SpeculativeCheckpoint,
        action="restore",
    ),
    _row(r"trying to reuse chunks with size > (?P<min_chunk>\d+), n_past = (?P<n_past>\d+)", CacheReuseStart),
    _row(
        r"reusing chunk with size (?P<n_tokens>\d+), shifting KV cache \[(?P<src_start>\d+), "
        r"(?P<src_end>\d+)\) -> \[(?P<dst_start>\d+), (?P<dst_end>\d+)\)",
        CacheReuseChunk,
    ),
    _row(r"after context reuse, new n_past = (?P<n_past>\d+)", CacheReuseDone),
    _row(
        r"slot context shift, n_keep = (?P<n_keep>-?\d+), n_left = (?P<n_left>-?\d+), n_discard = (?P<n_discard>-?\d+)",
        ContextShift,
    ),
    _row(r"clearing prompt with (?P<n_tokens>\d+) tokens", SlotCleared, lora=False),
    _row(r"clearing cache for lora change", SlotCleared, lora=True),
    _row(
        r"^n_past = (?P<n_past>-?\d+), slot\.prompt\.tokens\.size\(\) = (?P<n_tokens>\d+), "
        r"seq_id = -?\d+, pos_min = (?P<pos_min>-?\d+)",
        SlotMemoryError,
    ),
    # The slot file's name that these lines quote is never read.
    _row(
        r"failed to append context checkpoints to .* - the appendix is incomplete",
        SlotFileCheckpointFault,
        action="save",
        fault="incomplete",
    ),
    _row(r"failed to append context checkpoints to ", SlotFileCheckpointFault, action="save", fault="failed"),
    _row(
        r"invalid context checkpoint appendix in .* - ignored",
        SlotFileCheckpointFault,
        action="restore",
        fault="invalid",
    ),
    _row(
        r"truncated context checkpoint appendix in .* - ignored",
        SlotFileCheckpointFault,
        action="restore",
        fault="truncated",
    ),
    _row(
        r"draft context checkpoint data in .* does not match the draft context - dropped",
        SlotFileCheckpointFault,
        action="restore",
        fault="draft_mismatch",
    ),
    # The file name that follows is never read.
    _row(
        rf"appended (?P<count>\d+) context checkpoint\(s\)(?: \({_num('mib')} MiB\))?",
        SlotFileCheckpoints,
        action="save",
    ),
    _row(
        rf"restored (?P<count>\d+) context checkpoint\(s\)(?: \({_num('mib')} MiB\))?",
        SlotFileCheckpoints,
        action="restore",
    ),
    _row(
        r"cache reuse is not supported - ignoring n_cache_reuse = (?P<n_cache_reuse>\d+)", CacheReuseIgnored
    ),
    _row(
        r"cache_reuse is not supported (?:by|with) (?:this )?(?P<by>.+?), it will be disabled",
        CacheReuseDisabled,
    ),
    _row(rf"prompt eval time =\s*{_TIMING}", PromptTiming),
    _row(rf"(?<!prompt )eval time =\s*{_TIMING}", EvalTiming),
    _row(r"stop processing: n_tokens = (?P<n_tokens>\d+), truncated = (?P<truncated>\d+)", Release),
    _row(
        rf"saving prompt with length (?P<tokens>\d+), total state size = {_num('mib')} MiB(?: \(draft: {_num('draft_mib')} MiB\))?",
        PromptCacheSave,
    ),
    # Newer builds print `f_sim`, older ones `sim`.
    _row(
        rf"looking for better prompt, base f_keep = {_num('f_keep')}, (?:f_)?sim = {_num('sim')}",
        PromptCacheLookup,
    ),
    _row(rf"found better prompt with f_keep = {_num('f_keep')}, (?:f_)?sim = {_num('sim')}", PromptCacheLoad),
    _row(
        rf"- prompt with length\s+(?P<tokens>\d+), lcp =\s+(?P<lcp>\d+), f_keep = {_num('f_keep')}, (?:f_)?sim = {_num('sim')}",
        PromptCacheCandidate,
    ),
    _row(
        rf"cache state: (?P<prompts>\d+) prompts, {_num('mib')} MiB \(limits: {_num('limit_mib')} MiB, (?P<limit_tokens>\d+) tokens, (?P<est_tokens>\d+) est\)",
        PromptCacheState,
    ),
    _row(
        rf"cache token limit \(\d+, est: \d+\) reached, removing oldest entry \(size = {_num('mib')} MiB\)",
        PromptCacheEvict,
        cause="tokens",
    ),
    _row(
        rf"cache size limit reached, removing oldest entry \(size = {_num('mib')} MiB\)",
        PromptCacheEvict,
        cause="size",
    ),
    _row(
        rf"making room for prompt cache entry, removing oldest entry \(size = {_num('mib')} MiB\)",
        PromptCacheEvict,
        cause="room",
    ),
    _row(r"- prompt is already in the cache, skipping", PromptCacheSkip, cause="present"),
    _row(
        rf"- prompt state size {_num('mib')} MiB exceeds cache size limit {_num('limit_mib')} MiB, skipping",
        PromptCacheSkip,
        cause="too_big",
    ),
    # The allocator's message that follows is never read.
    _row(r"failed to allocate memory for prompt cache state", PromptCacheSkip, cause="no_memory"),
    _row(rf"- cache size limit reduced to {_num('limit_mib')} MiB", PromptCacheLimit),
    _row(r"- removing obsolete cached prompt with length (?P<tokens>\d+)", PromptCacheObsolete),
    _row(
        rf"- prompt (?:0x)?[0-9A-Fa-f]+: +(?P<tokens>\d+) tokens, checkpoints: +(?P<checkpoints>\d+), +{_num('mib')} MiB",
        PromptCacheEntry,
    ),
    _row(r"failed to restore state with size (?P<size_bytes>\d+)", PromptCacheLoadFailed),
    _row(r"failed to load prompt from cache", PromptCacheLoadFailed),
    _row(r"purging slot (?P<purged_slot>\d+) with (?P<n_tokens>\d+) tokens", SlotPurged),
    _row(r"saving idle slot to prompt cache", IdleSlotSave),
    _row(
        r"failed to find free space in the KV cache, retrying with smaller batch size, off = -?\d+, "
        r"n_batch = (?P<n_batch>-?\d+), ret = (?P<ret>-?\d+)",
        KvCacheFull,
    ),
    _row(rf"prompt cache update took {_num('ms')} ms", PromptCacheUpdate),
    _row(
        r"initializing, n_slots = (?P<n_slots>\d+), n_ctx_slot = (?P<n_ctx_slot>\d+)(?:, kv_unified = '(?P<kv_unified>\w+)')?",
        SlotsInit,
    ),
    _row(r"new slot,? n_ctx(?:_slot)? = (?P<n_ctx>\d+)", NewSlot),
    _row(
        r"n_parallel is set to auto, using n_parallel = (?P<n_parallel>\d+) and kv_unified = (?P<kv_unified>\w+)",
        AutoParallel,
    ),
    _row(
        r"prompt cache is enabled, size limit: (?:(?P<limit_mib>\d+) MiB|no limit)",
        PromptCacheConfig,
        limit_mib=-1,
    ),
    _row(r"prompt cache is disabled", PromptCacheConfig, limit_mib=0),
    _row(
        r"context checkpoints enabled, max = (?P<max>\d+), min spacing = (?P<min_spacing>\d+)",
        CheckpointConfig,
    ),
    _row(r"context checkpoints disabled", CheckpointConfig, max=0),
    _row(r"idle slots will be saved to prompt cache", CacheIdleSlots, enabled=True),
    _row(r"--cache-idle-slots requires --cache-ram, disabling", CacheIdleSlots, enabled=False),
    _row(r"creating\s+SWA KV cache, size = (?P<cells>\d+) cells", SwaCache),
    _row(r"using full-size SWA cache", SwaCache, full=True),
    # srv send_error, the function name stripped; only a prompt over the context is told apart.
    _row(
        r"^task id = (?P<task>-?\d+), error: .*?request \((?P<n_prompt_tokens>\d+) tokens\) exceeds the available context size \((?P<n_ctx>\d+) tokens\)",
        RequestError,
        cause="context",
    ),
    _row(r"^task id = (?P<task>-?\d+), error: ", RequestError, cause="other"),
    _row(
        r"system_info: n_threads = (?P<n_threads>\d+) \(n_threads_batch = (?P<n_threads_batch>\d+)\)", Threads
    ),
    _row(r"llama threadpool init, n_threads = (?P<n_threads>\d+)", Threads),
    _row(r"common_params_print_info: verbosity = (?P<level>\d+)", LogVerbosity),
    _row(r"(?:server is )?listening on \S*?:(?P<port>\d+)\b", Listening),
    _row(r"^build_info: b(?P<build>\d+)-", BuildInfo),
    _row(r"(?:^|\s)build: (?P<build>\d+) \(", BuildInfo),
)

_IGNORED = re.compile(
    r"processing task, is_child|total time =|graphs reused =|draft acceptance|n_gen =|init sampler|"
    r"updating prompt cache|sampler chain|sampler params|release: id|"
    r"slot\s+\w+: id\s+-?\d+ \| task -?\d+ \|\s*$|"
    r"use `--cache-ram|for more info see|model loaded|loading model|all slots are idle|"
    r"clearing slot with|cancel task|stopped by|"
    r"- skipping, |n_past was set to|conv_id=|chat template|preserve_reasoning|"
    r"initializing \.\.\.|threads for HTTP server|security: |local path |"
    r"no implementations specified for speculative|cleaning up before exit|~Server: |"
    # Speculative decoding's accepted drafts, and adapter (alora) bookkeeping: no cache figure.
    r"accepted +\d+/ *\d+ draft tokens|keeping cache for alora|only caching to alora invocation start|"
    r"processing pre-alora tokens|stop prompt batch filling at|"
    # The KV pool sized per slot at start-up (--kv-unified-per-slot): the size is `initializing`'s.
    r"--kv-unified-per-slot|capping per-slot context|speculative decoding (?:will use checkpoints|"
    r"context initialized|not supported)|"
    # Router mode's model instances and the web UI's files: caches of models and pages, not of KV.
    r"name=|cached model presets|serve nocache|"
    # Newer builds' start-up: the chat format picked, the CORS warning box, how the port is bound.
    r"chat format: |CORS is set to allow|this can be a security risk|more info: https?://|"
    r"llama_server: -{5,}|binding port with"
)
# Words of a line about a cache: an unrecognised one means the server said something about its
# caches this parser does not know, and the run's cache figures may be incomplete.
_CACHE_WORDS = re.compile(
    r"(?i)cache|checkpoint|memory_seq|\bkv\b|prompt (?:state|save|load)|restor|evict|purg|erasing|"
    r"erased|discard|context shift|n_past"
)
# Model loading and backend set-up: whole families of lines that never say anything about caching
# (the tokenizer's `load:` lines are not the prompt cache's `srv  load:` ones).
_STARTUP_CHATTER = re.compile(
    r"(?:^|[IWEDT] |\s)(?:llama_model_loader|print_info|load_tensors|llama_context|llama_kv_cache\w*|"
    r"llama_memory\w*|sched_reserve|resolve_fused_ops|graph_reserve|common_\w+|llama_model_load\w*|"
    r"load_backend|ggml_\w+|build|system_info|main):|(?:^|[IWEDT] )load: |"
    r"cmn\s+common_\w+: |common_params_print_info: (?!verbosity)|device_info:|^\s+- CPU "
)
_CROSS_CHECKS = (
    ("prompt_timing", "prompt eval time ="),
    ("slot_similarity", "- checking sim ="),
    ("prompt_cache_lookup", "looking for better prompt"),
    ("prompt_cache_load", "found better prompt"),
    ("prompt_cache_candidate", "- prompt with length"),
    ("checkpoint_check", "checking checkpoint with"),
    ("checkpoint_erased", "erased invalidated context checkpoint"),
    ("checkpoint_evicted", "erasing old context checkpoint"),
    ("checkpoint_superseded", "superseding context checkpoint"),
    ("slot_selected", "selected slot by"),
    ("new_prompt", "new prompt, n_ctx_slot"),
    ("checkpoint_created", "created context checkpoint"),
    ("checkpoint_restored", "restored context checkpoint"),
    ("full_reprocess", "forcing full prompt re-processing"),
    ("cache_reuse_disabled", "cache_reuse is not supported"),
    ("prompt_cache_save", "saving prompt with length"),
    ("prompt_progress", "progress = "),  # `prompt processing progress, ...` and `prompt processing, ...`
)


Converter = Callable[[str, ParseStats], object]
_CONTEXT = frozenset({"t", "line", "slot", "task"})  # from the line's prefix, never from its message


def _to_int(v: str) -> int:
    return int(float(v)) if "." in v else int(v)


def _to_bool(v: str) -> bool:
    return v.lower() in ("true", "1", "yes")


def _converter(hint: Any) -> Converter | None:
    """How a field's text becomes its value, from its annotation: a number, a flag, or a name of
    the `Vocab` it is annotated with. None for a plain `str`: only a row's `fixed` sets one."""
    extras: tuple[Any, ...] = ()
    if get_origin(hint) is Annotated:
        hint, *rest = get_args(hint)
        extras = tuple(rest)
    (kind,) = [a for a in get_args(hint) if a is not type(None)] or [hint]
    if kind is int:
        return lambda v, _: _to_int(v)
    if kind is float:
        return lambda v, _: float(v)
    if kind is bool:
        return lambda v, _: _to_bool(v)
    vocab = next((e for e in extras if isinstance(e, Vocab)), None)
    if vocab is not None:
        return lambda v, stats: vocab(v.strip().lower(), stats)
    return None


@cache
def _converters(event: type[Event]) -> dict[str, Converter | None]:
    """Each field's converter (the line-prefix fields are ints: slot, task, line; `t` is never matched)."""
    hints = get_type_hints(event, include_extras=True)
    return {f.name: _converter(hints[f.name]) for f in fields(event)}


def check_row(row: Row) -> None:
    """A row names only fields its event has, and feeds log text only to numbers and vocabularies."""
    conv = _converters(row.event)
    for name in row.fixed:
        if name not in conv:
            raise TypeError(f"{row.event.__name__} has no field {name!r}")
    for name in row.pattern.groupindex:
        if name != "listed" and conv.get(name) is None:
            raise TypeError(f"{row.event.__name__}.{name} cannot take text from a log line")


for _r in ROWS:
    check_row(_r)


def _event(row: Row, m: re.Match[str], context: dict[str, Any], stats: ParseStats) -> Event:
    conv = _converters(row.event)
    values: dict[str, object] = {name: context.get(name) for name in conv}
    values.update(row.fixed)
    if row.listed:
        listed = m["listed"]
        for key, text in _KV.findall(listed):
            convert = conv.get(key)
            if convert is not None and key not in _CONTEXT:
                values[key] = convert(text, stats)
        size = _SIZE_MIB.search(listed)
        values["mib"] = float(size.group(1)) if size else None
    for name, text in m.groupdict().items():
        if text is not None and name != "listed":
            convert = conv[name]
            assert convert is not None  # `check_row`
            values[name] = convert(text, stats)
    return row.event(**values)


def message_event(
    msg: str, context: dict[str, Any], stats: ParseStats, rows: Sequence[Row] = ROWS
) -> Event | None:
    """The event of the first row whose pattern is found in `msg`."""
    for row in rows:
        m = row.pattern.search(msg)
        if m is not None:
            return _event(row, m, context, stats)
    return None


class LlamaParser:
    """Feeds lines one at a time; `finish()` closes the statistics and the cross-check."""

    def __init__(self) -> None:
        self.stats = ParseStats()
        self._counter = SubstringCounter(_CROSS_CHECKS)
        self._n = 0
        self._t: float | None = None
        self._offset = 0.0
        self._last_raw: float | None = None
        self._slot_task: tuple[int | None, int | None] = (None, None)
        self._stamped = False

    def feed(self, raw_line: str) -> Event | None:
        self._n += 1
        st = self.stats
        st.lines += 1
        line = strip_ansi(raw_line)
        if not line.strip():
            st.blank += 1
            return None
        self._counter.observe(line)
        ts = _TS.search(line)
        if ts:
            raw = int(ts.group(1)) * 60 + int(ts.group(2)) + int(ts.group(3)) / 1e3 + int(ts.group(4)) / 1e6
            if self._last_raw is not None and raw < self._last_raw:
                self._offset += self._last_raw  # a restarted process counts from zero again
            self._last_raw = raw
            self._t = raw + self._offset
            self._stamped = True
        slot: int | None = None
        task: int | None = None
        m = _SLOT.search(line)
        if m:
            slot, task, msg = int(m.group(1)), int(m.group(2)), m.group(3)
            self._slot_task = (slot, task)
        else:
            s = _SRV.search(line)
            msg = s.group(1) if s else line
            slot, task = self._slot_task  # bare timing lines follow their slot header
        ev = message_event(msg, {"t": self._t, "line": self._n, "slot": slot, "task": task}, st)
        if ev is None:
            # In a timestamped log a line without a stamp continues a multi-line entry (sampler
            # params, the chat template example); it was given its chance as a bare line above.
            continuation = ts is None and self._stamped
            if continuation or _IGNORED.search(line) or _STARTUP_CHATTER.search(line):
                st.known_ignored += 1
            else:
                st.unrecognised += 1
                if _CACHE_WORDS.search(msg):
                    st.unrecognised_cache += 1
            return None
        st.recognised += 1
        st.by_kind[ev.kind] += 1
        return ev

    def finish(self) -> ParseStats:
        self.stats.checks = self._counter.checks(self.stats.by_kind)
        return self.stats


@dataclass
class LlamaLog:
    events: list[Event]
    stats: ParseStats


def parse_lines(lines: Iterable[str]) -> LlamaLog:
    parser = LlamaParser()
    events = [ev for ev in map(parser.feed, lines) if ev is not None]
    return LlamaLog(events=events, stats=parser.finish())


def _read_lines(paths: Iterable[str | Path]) -> Iterator[str]:
    for p in paths:
        with open(p, encoding="utf-8", errors="replace") as fh:
            yield from fh


def parse_files(paths: Iterable[str | Path]) -> LlamaLog:
    return parse_lines(_read_lines(paths))
