"""ds4-server's cache rules, one function each, so a reader who knows ds4 finds every rule here.

References are to `shared/reference/ds4-server.md`: 4.1 and 4.7 (the key a file is stored and
looked up under), 4.2 (when each save fires), 4.4 (eviction score), 4.5 (restore), 5 (slot
routing), 3.1 (when progress lines appear).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from replay.sim.model.checkpoint import NO_REPLY_KEY, TEXT_KEY, TOOL_KEY, Checkpoint
from replay.sim.model.config import SimConfig
from replay.sim.model.seq import TokenSeq, common_prefix, is_prefix

ANCHOR_REASONS = ("cold", "evict", "shutdown")


class SlotView(Protocol):
    index: int
    seq: TokenSeq
    visible: TokenSeq | None


# --- saves (4.2) -------------------------------------------------------------------------------


def fallback_cut(prompt_tokens: int, cfg: SimConfig) -> int:
    """ds4's `store_len(P)`: (P - trim) rounded down to the alignment, when that is >= min; else P."""
    p, trim, align = prompt_tokens, cfg.kv_cache_boundary_trim_tokens, cfg.kv_cache_boundary_align_tokens
    if p > cfg.kv_cache_min_tokens + trim:
        cut = (p - trim) // align * align if align > 0 else p - trim
        if cut >= cfg.kv_cache_min_tokens:
            return cut
    return p


def cold_save_applies(cached: int, prompt_tokens: int, cfg: SimConfig) -> bool:
    """A cold save happens only for a request with no reuse at all whose prompt is in [min, cold_max]."""
    return (
        cfg.disk
        and cached == 0
        and cfg.kv_cache_cold_max_tokens > 0
        and cfg.kv_cache_min_tokens <= prompt_tokens <= cfg.kv_cache_cold_max_tokens
    )


def anchor_of(anchor: int | None, cfg: SimConfig) -> int | None:
    """The prompt's chat anchor as ds4 finds it: only a model with dedicated user/assistant
    tokens has one (`ds4_kvstore_chat_anchor_pos` needs their ids; Qwen's ChatML has none)."""
    return anchor if cfg.chat_anchor else None


def cold_cut(prompt_tokens: int, anchor: int | None, cfg: SimConfig) -> int:
    """Where the cold save cuts: the chat anchor when it is >= min, else the fallback cut."""
    if anchor is not None and cfg.kv_cache_min_tokens <= anchor < prompt_tokens:
        return anchor
    return fallback_cut(prompt_tokens, cfg)


def continued_due(live_tokens: int, last_store: int, cfg: SimConfig) -> bool:
    """Checked at every prefill progress event, after prefill and before every decode step."""
    step = cfg.continued_step
    if not cfg.disk or step <= 0 or live_tokens <= last_store or live_tokens < cfg.kv_cache_min_tokens:
        return False
    if cfg.continued_trigger == "crossed":
        return live_tokens // step > last_store // step
    return live_tokens % step == 0


def evict_save_applies(live_tokens: int, cfg: SimConfig) -> bool:
    """On a live miss the whole live state is saved before the disk lookup, if it is >= min."""
    return cfg.disk and live_tokens >= cfg.kv_cache_min_tokens


def shutdown_save_applies(live_tokens: int, cfg: SimConfig) -> bool:
    return cfg.disk and live_tokens >= cfg.kv_cache_min_tokens


def restorable(cp: Checkpoint, prompt_tokens: int, cfg: SimConfig, wanted: str | None = None) -> bool:
    """Restore candidates: at least min tokens, no longer than the prompt (4.5), under the key
    the request looks up (4.1, 4.7)."""
    return cfg.kv_cache_min_tokens <= cp.tokens <= prompt_tokens and (
        wanted is None or reply_key_matches(cp.reply_key, wanted)
    )


def consumed_on_restore(tokens: int, cfg: SimConfig) -> bool:
    """May build only: a restored checkpoint deeper than cold_max is deleted ("consumed")."""
    return (
        cfg.consume_deep_hits and cfg.kv_cache_cold_max_tokens > 0 and tokens > cfg.kv_cache_cold_max_tokens
    )


def visible_key_applies(cfg: SimConfig, has_tools: bool, tool_call: bool) -> bool:
    """Whether a reply with hidden reasoning is remembered under its client-visible transcript."""
    match cfg.visible_key:
        case "no-tools":
            return not has_tools
        case "tool-calls":
            return tool_call
        case "all":
            return True
        case _:
            return False


# --- checkpoint keys (4.1, 4.7) ----------------------------------------------------------------


def lookup_reply_key(has_tools: bool, cfg: SimConfig) -> str | None:
    """The key a request looks its prefix up under; None = any key (the A/B source, where the
    rendered text alone is the identity). In the field build a request with tools looks up under
    the tool key: a conversation whose replies were plain text never finds its own files
    (seed figures 1, overnight: "stored under the plain-text key, looked up under the tool key";
    ds4 issue 1053, PR 1058)."""
    if not cfg.tool_replay_key:
        return None
    return TOOL_KEY if has_tools else TEXT_KEY


def reply_key_matches(stored: str, wanted: str | None) -> bool:
    """A file is a candidate when no key is asked for, it holds no reply yet, or its key is the one asked for."""
    return wanted is None or stored in (NO_REPLY_KEY, wanted)


# --- live cache (4.5) --------------------------------------------------------------------------


def miss_reason(live_tokens: int, prompt_tokens: int, common: int) -> str:
    if common == prompt_tokens and prompt_tokens < live_tokens:
        return "incoming-prompt-shorter-than-live-checkpoint"
    return "token-mismatch"


def shows_progress(cached: int, prompt_tokens: int, cfg: SimConfig) -> bool:
    """Progress lines are absent for a cold prompt that fits one chunk and for a < 4 token suffix."""
    if cached == 0:
        return prompt_tokens > cfg.prefill_chunk
    return prompt_tokens - cached >= 4


# --- eviction (4.4) ----------------------------------------------------------------------------


def decayed_hits(cp: Checkpoint, now: float, cfg: SimConfig) -> float:
    age = max(0.0, now - cp.last_used)
    h = cp.hits * 2.0 ** (-age / cfg.hit_half_life_s)
    return 0.0 if h < 0.01 else h


def eviction_score(cp: Checkpoint, now: float, cfg: SimConfig, incoming: TokenSeq | None = None) -> float:
    """Lowest goes first: (h + 1) * tokens / size; from the August build on, anchors (cold,
    evict, shutdown) x2 and a continued file that is a strict prefix of the incoming one
    x(0.05 + 0.45 * h / (h + 1)) (`ds4_kvstore_entry_eviction_score`, KV_CACHE_ANCHOR_REASON_
    SCORE_FACTOR and KV_CACHE_CONTINUED_PREFIX_MIN/HIT_FACTOR)."""
    h = decayed_hits(cp, now, cfg)
    score = (h + 1.0) * cp.tokens / max(1, cp.size)
    if cfg.eviction == "aug":
        if cp.reason in ANCHOR_REASONS:
            score *= 2.0
        elif (
            cp.reason == "continued"
            and incoming is not None
            and len(cp.seq) < len(incoming)
            and is_prefix(cp.seq, incoming)
        ):
            score *= 0.05 + 0.45 * (h / (h + 1.0))
    return score


# --- routing (5) -------------------------------------------------------------------------------


def route(cfg: SimConfig, free: Sequence[SlotView], prompt: TokenSeq) -> SlotView:
    """Pick the free slot for a job.

    upstream: the longest token common prefix wins, an empty slot scores 0, ties go to the lower
    index (ds4 issue 1069). reuse-aware (PR 765): a slot whose live state is an exact prefix of the
    prompt first, then an empty slot, then the longest common prefix.
    """
    if len(free) == 1:
        return free[0]
    if cfg.routing == "reuse-aware":
        reusable = [(_reusable(s, prompt), s) for s in free if s.seq]
        reusable = [(n, s) for n, s in reusable if n > 0]
        if reusable:
            return max(reusable, key=lambda ns: (ns[0], -ns[1].index))[1]
        empty = [s for s in free if not s.seq]
        if empty:
            return min(empty, key=lambda s: s.index)
    return max(free, key=lambda s: (common_prefix(s.seq, prompt) if s.seq else 0, -s.index))


def _reusable(slot: SlotView, prompt: TokenSeq) -> int:
    if is_prefix(slot.seq, prompt):
        return len(slot.seq)
    if slot.visible is not None and is_prefix(slot.visible, prompt):
        return len(slot.visible)
    return 0
