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
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

from drivers.logs.base import ParseStats, SubstringCounter, Vocab, strip_ansi

REUSE_DISABLED_BY = Vocab("multimodal", "context", "mtp", "speculative")
SELECTED_BY = Vocab("lcp", "lru", "id")

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
    by: str | None
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
    cause: str  # "size" | "tokens"
    mib: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptCacheUpdate(Event):
    kind: ClassVar[str] = "prompt_cache_update"
    ms: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheReuseDisabled(Event):
    """`cache_reuse is not supported by multimodal|this context, it will be disabled`."""

    kind: ClassVar[str] = "cache_reuse_disabled"
    by: str | None


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
class Listening(Event):
    kind: ClassVar[str] = "listening"
    port: int | None


STARTUP_KINDS = (
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
# Grammar

_TS = re.compile(r"(?:^|\s)(\d+)\.(\d\d)\.(\d{3})\.(\d{3}) (?:[IWEDT] )?")
_SLOT = re.compile(r"(?:^|\s)slot\s+\w+: id\s+(-?\d+) \| task (-?\d+) \| ?(.*)$")
_SRV = re.compile(r"(?:^|\s)srv\s+\w+: ?(.*)$")
_NUM = r"(-?\d+(?:\.\d+)?)"
_SEL_LCP = re.compile(
    rf"selected slot by LCP similarity, (?:f_)?sim_best = {_NUM} \(> {_NUM} thold\), f_keep = {_NUM}"
)
_SEL_LRU = re.compile(r"selected slot by LRU\b")
_SEL_OTHER = re.compile(r"selected slot by (\w+)")
_NEW_PROMPT = re.compile(
    r"new prompt, n_ctx_slot = (\d+), n_keep = (-?\d+), (?:task\.n_tokens|n_prompt_tokens) = (\d+)"
)
_SEQ_RM = re.compile(r"n_tokens = (\d+), memory_seq_rm \[(\d+), end\)")
_PROGRESS = re.compile(
    rf"prompt processing progress, n_tokens = (\d+), batch\.n_tokens = (\d+), progress = {_NUM}"
)
_PROGRESS_PP = re.compile(rf"prompt processing, n_tokens =\s*(\d+), progress = {_NUM}")
_DONE = re.compile(r"prompt processing done, n_tokens = (\d+), batch\.n_tokens = (\d+)")
_CKPT_CREATED = re.compile(r"created context checkpoint (\d+) of (\d+) \(([^()]*)\)")
_CKPT_RESTORED = re.compile(r"restored context checkpoint \(([^()]*)\)")
_CKPT_ERASED = re.compile(r"erased invalidated context checkpoint \(([^()]*)\)")
_FULL = re.compile(r"forcing full prompt re-processing")
_SIM = re.compile(rf"- checking sim = {_NUM} \((\d+)/(\d+)\) > {_NUM}")
_REEVAL = re.compile(r"need to evaluate at least 1 token .*\(n_past = (\d+), task\.n_tokens\(\) = (\d+)\)")
_CKPT_CHECK = re.compile(r"checking checkpoint with \[(-?\d+), (-?\d+)\] against (-?\d+)")
_CKPT_SUPERSEDED = re.compile(r"superseding context checkpoint at n_tokens = (\d+)")
_CKPT_EVICTED = re.compile(r"erasing old context checkpoint \(([^()]*)\)")
# The file name that follows is never read.
_SLOT_FILE_CKPT = re.compile(rf"(appended|restored) (\d+) context checkpoint\(s\)(?: \({_NUM} MiB\))?")
_REUSE_IGNORED = re.compile(r"cache reuse is not supported - ignoring n_cache_reuse = (\d+)")
_REUSE_DISABLED = re.compile(r"cache_reuse is not supported (?:by|with) (.+?), it will be disabled")
_PROMPT_EVAL = re.compile(
    rf"prompt eval time =\s*{_NUM} ms /\s*(\d+) tokens \(\s*{_NUM} ms per token,\s*{_NUM} tokens per second\)"
)
_EVAL = re.compile(
    rf"(?<!prompt )eval time =\s*{_NUM} ms /\s*(\d+) (?:tokens|runs)\s*\(\s*{_NUM} ms per token,\s*{_NUM} tokens per second\)"
)
_RELEASE = re.compile(r"stop processing: n_tokens = (\d+), truncated = (\d+)")
_PC_SAVE = re.compile(
    rf"saving prompt with length (\d+), total state size = {_NUM} MiB(?: \(draft: {_NUM} MiB\))?"
)
# Newer builds print `f_sim`, older ones `sim`.
_PC_LOOKUP = re.compile(rf"looking for better prompt, base f_keep = {_NUM}, (?:f_)?sim = {_NUM}")
_PC_LOAD = re.compile(rf"found better prompt with f_keep = {_NUM}, (?:f_)?sim = {_NUM}")
_PC_CANDIDATE = re.compile(
    rf"- prompt with length\s+(\d+), lcp =\s+(\d+), f_keep = {_NUM}, (?:f_)?sim = {_NUM}"
)
_PC_STATE = re.compile(
    rf"cache state: (\d+) prompts, {_NUM} MiB \(limits: {_NUM} MiB, (\d+) tokens, (\d+) est\)"
)
_PC_EVICT_SIZE = re.compile(rf"cache size limit reached, removing oldest entry \(size = {_NUM} MiB\)")
_PC_EVICT_TOKENS = re.compile(
    rf"cache token limit \(\d+, est: \d+\) reached, removing oldest entry \(size = {_NUM} MiB\)"
)
_PC_UPDATE = re.compile(rf"prompt cache update took {_NUM} ms")
_SLOTS_INIT = re.compile(r"initializing, n_slots = (\d+), n_ctx_slot = (\d+)(?:, kv_unified = '(\w+)')?")
_NEW_SLOT = re.compile(r"new slot,? n_ctx(?:_slot)? = (\d+)")
_AUTO_PAR = re.compile(r"n_parallel is set to auto, using n_parallel = (\d+) and kv_unified = (\w+)")
_PC_ENABLED = re.compile(r"prompt cache is enabled, size limit: (?:(\d+) MiB|(no limit))")
_PC_DISABLED = re.compile(r"prompt cache is disabled")
_CKPT_ENABLED = re.compile(r"context checkpoints enabled, max = (\d+), min spacing = (\d+)")
_CKPT_DISABLED = re.compile(r"context checkpoints disabled")
_IDLE_SLOTS = re.compile(r"idle slots will be saved to prompt cache")
_IDLE_SLOTS_OFF = re.compile(r"--cache-idle-slots requires --cache-ram, disabling")
_SWA_CELLS = re.compile(r"creating\s+SWA KV cache, size = (\d+) cells")
_SWA_FULL = re.compile(r"using full-size SWA cache")
_SEND_ERROR = re.compile(r"^task id = (-?\d+), error: ")  # srv send_error, function name stripped
_CTX_EXCEEDED = re.compile(r"request \((\d+) tokens\) exceeds the available context size \((\d+) tokens\)")
_THREADS = re.compile(r"system_info: n_threads = (\d+) \(n_threads_batch = (\d+)\)")
_THREADPOOL = re.compile(r"llama threadpool init, n_threads = (\d+)")
_VERBOSITY = re.compile(r"common_params_print_info: verbosity = (\d+)")
_LISTEN = re.compile(r"(?:server is )?listening on \S*?:(\d+)\b")
_KV = re.compile(rf"(\w+) = {_NUM}")

_IGNORED = re.compile(
    r"processing task, is_child|total time =|graphs reused =|draft acceptance|n_gen =|init sampler|"
    r"prompt is already in the cache|removing obsolete cached prompt|updating prompt cache|"
    r"- prompt 0x|- prompt [0-9A-Fa-f]+:|sampler chain|sampler params|release: id|"
    r"slot\s+\w+: id\s+-?\d+ \| task -?\d+ \|\s*$|"
    r"use `--cache-ram|for more info see|model loaded|loading model|all slots are idle|"
    r"saving idle slot|clearing prompt with|clearing slot with|cancel task|stopped by|"
    r"- skipping, |n_past was set to|conv_id=|chat template|preserve_reasoning|"
    r"initializing \.\.\.|build_info:|threads for HTTP server|security: |local path |"
    r"no implementations specified for speculative|cleaning up before exit|~Server: "
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
    ("prompt_progress", "prompt processing progress"),
)


def _kv(inner: str) -> dict[str, float]:
    return {k: float(v) for k, v in _KV.findall(inner)}


def _int(d: dict[str, float], k: str) -> int | None:
    return int(d[k]) if k in d else None


def _size_mib(inner: str) -> float | None:
    m = re.search(rf"size = {_NUM} MiB", inner)
    return float(m.group(1)) if m else None


def _bool(v: str | None) -> bool | None:
    return None if v is None else v.lower() in ("true", "1", "yes")


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
        ev = self._message(msg, slot, task)
        if ev is None:
            # In a timestamped log a line without a stamp continues a multi-line entry (sampler
            # params, the chat template example); it was given its chance as a bare line above.
            continuation = ts is None and self._stamped
            if continuation or _IGNORED.search(line) or _STARTUP_CHATTER.search(line):
                st.known_ignored += 1
            else:
                st.unrecognised += 1
            return None
        st.recognised += 1
        st.by_kind[ev.kind] += 1
        return ev

    def finish(self) -> ParseStats:
        self.stats.checks = self._counter.checks(self.stats.by_kind)
        return self.stats

    def _message(self, msg: str, slot: int | None, task: int | None) -> Event | None:
        b = {"t": self._t, "line": self._n}
        s = {**b, "slot": slot, "task": task}
        if "selected slot by" in msg:
            if m := _SEL_LCP.search(msg):
                return SlotSelected(
                    **s,
                    by="lcp",
                    sim=float(m.group(1)),
                    threshold=float(m.group(2)),
                    f_keep=float(m.group(3)),
                )
            if _SEL_LRU.search(msg):
                return SlotSelected(**s, by="lru", sim=None, threshold=None, f_keep=None)
            if m := _SEL_OTHER.search(msg):
                return SlotSelected(
                    **s, by=SELECTED_BY(m.group(1).lower(), self.stats), sim=None, threshold=None, f_keep=None
                )
            return None
        if m := _NEW_PROMPT.search(msg):
            return NewPrompt(
                **s, n_ctx_slot=int(m.group(1)), n_keep=int(m.group(2)), n_tokens=int(m.group(3))
            )
        if m := _SEQ_RM.search(msg):
            return SeqRemove(**s, n_tokens=int(m.group(1)))
        if m := _PROGRESS.search(msg):
            return PromptProgress(
                **s, n_tokens=int(m.group(1)), batch_tokens=int(m.group(2)), progress=float(m.group(3))
            )
        if m := _PROGRESS_PP.search(msg):
            return PromptProgress(
                **s, n_tokens=int(m.group(1)), batch_tokens=None, progress=float(m.group(2))
            )
        if m := _DONE.search(msg):
            return PromptDone(**s, n_tokens=int(m.group(1)), batch_tokens=int(m.group(2)))
        if m := _CKPT_CREATED.search(msg):
            kv = _kv(m.group(3))
            return CheckpointCreated(
                **s,
                index=int(m.group(1)),
                max=int(m.group(2)),
                pos_min=_int(kv, "pos_min"),
                pos_max=_int(kv, "pos_max"),
                n_tokens=_int(kv, "n_tokens"),
                mib=_size_mib(m.group(3)),
            )
        if m := _CKPT_RESTORED.search(msg):
            kv = _kv(m.group(1))
            return CheckpointRestored(
                **s,
                pos_min=_int(kv, "pos_min"),
                pos_max=_int(kv, "pos_max"),
                n_tokens=_int(kv, "n_tokens"),
                n_past=_int(kv, "n_past"),
                mib=_size_mib(m.group(1)),
            )
        if m := _CKPT_ERASED.search(msg):
            kv = _kv(m.group(1))
            return CheckpointErased(
                **s,
                pos_min=_int(kv, "pos_min"),
                pos_max=_int(kv, "pos_max"),
                n_tokens=_int(kv, "n_tokens"),
                mib=_size_mib(m.group(1)),
            )
        if _FULL.search(msg):
            return FullReprocess(**s)
        if m := _SIM.search(msg):
            return SlotSimilarity(
                **s,
                sim=float(m.group(1)),
                lcp=int(m.group(2)),
                n_tokens=int(m.group(3)),
                threshold=float(m.group(4)),
            )
        if m := _REEVAL.search(msg):
            return LastTokenReevaluated(**s, n_past=int(m.group(1)), n_tokens=int(m.group(2)))
        if m := _CKPT_CHECK.search(msg):
            return CheckpointCheck(
                **s, pos_min=int(m.group(1)), pos_max=int(m.group(2)), against=int(m.group(3))
            )
        if m := _CKPT_SUPERSEDED.search(msg):
            return CheckpointSuperseded(**s, n_tokens=int(m.group(1)))
        if m := _CKPT_EVICTED.search(msg):
            kv = _kv(m.group(1))
            return CheckpointEvicted(
                **s,
                pos_min=_int(kv, "pos_min"),
                pos_max=_int(kv, "pos_max"),
                n_tokens=_int(kv, "n_tokens"),
                mib=_size_mib(m.group(1)),
            )
        if m := _SLOT_FILE_CKPT.search(msg):
            return SlotFileCheckpoints(
                **s,
                action="save" if m.group(1) == "appended" else "restore",
                count=int(m.group(2)),
                mib=float(m.group(3)) if m.group(3) else None,
            )
        if m := _REUSE_IGNORED.search(msg):
            return CacheReuseIgnored(**s, n_cache_reuse=int(m.group(1)))
        if m := _REUSE_DISABLED.search(msg):
            by = m.group(1).strip().lower()
            by = {"this context": "context"}.get(by, by)
            return CacheReuseDisabled(**b, by=REUSE_DISABLED_BY(by, self.stats))
        if m := _PROMPT_EVAL.search(msg):
            return PromptTiming(**s, ms=float(m.group(1)), tokens=int(m.group(2)), tps=float(m.group(4)))
        if m := _EVAL.search(msg):
            return EvalTiming(**s, ms=float(m.group(1)), tokens=int(m.group(2)), tps=float(m.group(4)))
        if m := _RELEASE.search(msg):
            return Release(**s, n_tokens=int(m.group(1)), truncated=int(m.group(2)))
        if m := _PC_SAVE.search(msg):
            return PromptCacheSave(
                **b,
                tokens=int(m.group(1)),
                mib=float(m.group(2)),
                draft_mib=float(m.group(3)) if m.group(3) else None,
            )
        if m := _PC_LOOKUP.search(msg):
            return PromptCacheLookup(**b, f_keep=float(m.group(1)), sim=float(m.group(2)))
        if m := _PC_LOAD.search(msg):
            return PromptCacheLoad(**b, f_keep=float(m.group(1)), sim=float(m.group(2)))
        if m := _PC_CANDIDATE.search(msg):
            return PromptCacheCandidate(
                **b,
                tokens=int(m.group(1)),
                lcp=int(m.group(2)),
                f_keep=float(m.group(3)),
                sim=float(m.group(4)),
            )
        if m := _PC_STATE.search(msg):
            return PromptCacheState(
                **b,
                prompts=int(m.group(1)),
                mib=float(m.group(2)),
                limit_mib=float(m.group(3)),
                limit_tokens=int(m.group(4)),
                est_tokens=int(m.group(5)),
            )
        if m := _PC_EVICT_SIZE.search(msg):
            return PromptCacheEvict(**b, cause="size", mib=float(m.group(1)))
        if m := _PC_EVICT_TOKENS.search(msg):
            return PromptCacheEvict(**b, cause="tokens", mib=float(m.group(1)))
        if m := _PC_UPDATE.search(msg):
            return PromptCacheUpdate(**b, ms=float(m.group(1)))
        if m := _SLOTS_INIT.search(msg):
            return SlotsInit(
                **b, n_slots=int(m.group(1)), n_ctx_slot=int(m.group(2)), kv_unified=_bool(m.group(3))
            )
        if m := _NEW_SLOT.search(msg):
            return NewSlot(**b, slot=slot, n_ctx=int(m.group(1)))
        if m := _AUTO_PAR.search(msg):
            return AutoParallel(**b, n_parallel=int(m.group(1)), kv_unified=_bool(m.group(2)))
        if m := _PC_ENABLED.search(msg):
            return PromptCacheConfig(**b, limit_mib=int(m.group(1)) if m.group(1) else -1)
        if _PC_DISABLED.search(msg):
            return PromptCacheConfig(**b, limit_mib=0)
        if m := _CKPT_ENABLED.search(msg):
            return CheckpointConfig(**b, max=int(m.group(1)), min_spacing=int(m.group(2)))
        if _CKPT_DISABLED.search(msg):
            return CheckpointConfig(**b, max=0, min_spacing=None)
        if _IDLE_SLOTS.search(msg):
            return CacheIdleSlots(**b, enabled=True)
        if _IDLE_SLOTS_OFF.search(msg):
            return CacheIdleSlots(**b, enabled=False)
        if m := _SWA_CELLS.search(msg):
            return SwaCache(**b, cells=int(m.group(1)), full=None)
        if _SWA_FULL.search(msg):
            return SwaCache(**b, cells=None, full=True)
        if m := _SEND_ERROR.search(msg):
            ctx = _CTX_EXCEEDED.search(msg)
            return RequestError(
                **b,
                task=int(m.group(1)),
                cause="context" if ctx else "other",
                n_prompt_tokens=int(ctx.group(1)) if ctx else None,
                n_ctx=int(ctx.group(2)) if ctx else None,
            )
        if m := _THREADS.search(msg):
            return Threads(**b, n_threads=int(m.group(1)), n_threads_batch=int(m.group(2)))
        if m := _THREADPOOL.search(msg):
            return Threads(**b, n_threads=int(m.group(1)), n_threads_batch=None)
        if m := _VERBOSITY.search(msg):
            return LogVerbosity(**b, level=int(m.group(1)))
        if m := _LISTEN.search(msg):
            return Listening(**b, port=int(m.group(1)))
        return None


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
