"""Simulator settings: ds4-server's cache flags with ds4's defaults, plus the model's figures.

Field names follow ds4's flags (`--kv-cache-cold-max-tokens` -> `kv_cache_cold_max_tokens`).
Model presets carry what the seed figures measured; every figure can be overridden.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

KiB = 1024
MiB = 1024 * 1024
GiB = 1024 * MiB

Routing = Literal["upstream", "reuse-aware"]
Eviction = Literal["base", "aug"]
ContinuedTrigger = Literal["exact", "crossed"]
VisibleKey = Literal["no-tools", "tool-calls", "all", "none"]

ROUTINGS: tuple[str, ...] = ("upstream", "reuse-aware")
EVICTIONS: tuple[str, ...] = ("base", "aug")
CONTINUED_TRIGGERS: tuple[str, ...] = ("exact", "crossed")
VISIBLE_KEYS: tuple[str, ...] = ("no-tools", "tool-calls", "all", "none")


@dataclass(frozen=True, slots=True)
class Preset:
    """What a model costs: KV bytes per token (and per file), speeds, and the build's defaults."""

    model_id: str
    bytes_per_token: int
    fixed_bytes: int
    prefill_tps: float
    decode_tps: float
    ctx: int
    prefill_chunk: int
    visible_key: VisibleKey
    note: str


PRESETS: dict[str, Preset] = {
    # Seed figures section 1: 34.5 KiB per token, 486-522 tok/s prefill, 38-44 tok/s decode on a
    # 64 GB Mac; users run it with 2048/1024-token prefill chunks. In that field build tool-call
    # replies continued while plain-text replies missed their checkpoint (ds4 issue 1053 report).
    # Every file also holds a part that does not grow with its tokens (ds4 4.1: header, text
    # length, next-token logits, 151,936 x 4 bytes for this vocabulary). Small as it is, it is
    # what ranks never-restored files in ds4's score, tokens / file size: without it every such
    # file scores the same and the tie-break (least recently used first) would decide instead.
    "qwen38-q2": Preset(
        model_id="qwen3.8-flash-next",
        bytes_per_token=int(34.5 * KiB),
        fixed_bytes=151936 * 4,
        prefill_tps=510.0,
        decode_tps=40.0,
        ctx=262144,
        prefill_chunk=2048,
        visible_key="tool-calls",
        note="Qwen3.8-Flash-Next q2 on ds4 (seed figures, Apple silicon)",
    ),
    # ds4-server reference 4.3: 13.45 KiB/token + 22.9 MiB per file; README q2 prefill 250-470 t/s,
    # decode 21-37 t/s; ds4 defaults: ctx 32768, prefill chunk 4096 (August build). The A/B source
    # remembers a client-visible key only for requests without tools.
    "deepseek-v4-flash": Preset(
        model_id="deepseek-v4-flash",
        bytes_per_token=13768,
        fixed_bytes=int(22.9 * MiB),
        prefill_tps=400.0,
        decode_tps=30.0,
        ctx=32768,
        prefill_chunk=4096,
        visible_key="no-tools",
        note="DeepSeek V4 Flash q2 on ds4 (source-derived sizes)",
    ),
}

DEFAULT_PRESET = "qwen38-q2"


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Everything the cache model needs; defaults are ds4's unless a comment says otherwise."""

    preset: str = DEFAULT_PRESET
    model_id: str = PRESETS[DEFAULT_PRESET].model_id
    ctx: int = PRESETS[DEFAULT_PRESET].ctx
    bytes_per_token: int = PRESETS[DEFAULT_PRESET].bytes_per_token
    fixed_bytes: int = PRESETS[DEFAULT_PRESET].fixed_bytes
    prefill_tps: float = PRESETS[DEFAULT_PRESET].prefill_tps
    decode_tps: float = PRESETS[DEFAULT_PRESET].decode_tps
    prefill_chunk: int = PRESETS[DEFAULT_PRESET].prefill_chunk
    # None = ds4's single-session path; N = `--batched-session N` (N=1 takes the batched path).
    batched_sessions: int | None = None
    prefill_quantum: int = 2048
    mixed_prefill_quantum: int = 128
    routing: Routing = "upstream"
    # Disk KV is on when the server has `--kv-disk-dir`; size sweeps always turn it on.
    disk: bool = True
    kv_disk_space_mb: int = 4096
    kv_cache_min_tokens: int = 512
    kv_cache_cold_max_tokens: int = 30000
    kv_cache_continued_interval_tokens: int = 10000
    kv_cache_boundary_trim_tokens: int = 32
    kv_cache_boundary_align_tokens: int = 2048
    hit_half_life_s: float = 6 * 3600.0
    # The May build's eviction ("base": score only, after the store, new file protected) or the
    # August build's ("aug": before the store, x2 for anchor reasons, cheap superseded continued).
    eviction: Eviction = "base"
    # The May build deletes a restored checkpoint deeper than cold_max ("consumed", ds4 issue 673).
    consume_deep_hits: bool = False
    # "exact": continued saves only when a progress event lands on a multiple (A/B builds);
    # "crossed": when an event has crossed one since the last save (later builds, PR 903).
    continued_trigger: ContinuedTrigger = "exact"
    disk_read_gbps: float = 3.0
    disk_write_gbps: float = 1.5
    # The generated text holds reasoning the client never sends back (ds4 issue 1053).
    hidden_reasoning: bool = False
    reasoning_tokens: int = 64
    # Which replies the server remembers under a client-visible key (only matters with hidden
    # reasoning): "no-tools" = requests without tools (ds4 A/B), "tool-calls" = tool-call replies
    # (the field build in seed figures), "all" = PR 1058, "none".
    visible_key: VisibleKey = PRESETS[DEFAULT_PRESET].visible_key
    # ds4's `-n` default is 393216; a simulator reply that long is never what a replay wants.
    default_max_tokens: int = 256
    decode_log_every: int = 50
    quant_bits: int = 2

    @property
    def slots(self) -> int:
        return self.batched_sessions or 1

    @property
    def batched(self) -> bool:
        return self.batched_sessions is not None

    @property
    def budget_bytes(self) -> int:
        return self.kv_disk_space_mb * MiB

    @property
    def continued_step(self) -> int:
        """The continued-save interval rounded up to the alignment (10000 -> 10240); 0 = off."""
        interval, align = self.kv_cache_continued_interval_tokens, self.kv_cache_boundary_align_tokens
        if interval <= 0:
            return 0
        return math.ceil(interval / align) * align if align > 0 else interval

    @property
    def prefill_step(self) -> int:
        """Tokens per prefill step when no other slot is decoding."""
        if self.batched:
            return max(1, min(self.prefill_quantum, self.prefill_chunk))
        return max(1, self.prefill_chunk)

    def file_bytes(self, tokens: int) -> int:
        """Modelled size of one checkpoint file holding `tokens` tokens."""
        return self.bytes_per_token * tokens + self.fixed_bytes

    def with_(self, **changes: object) -> SimConfig:
        return replace(self, **changes)  # type: ignore[arg-type]


def config_for(preset: str = DEFAULT_PRESET, **overrides: object) -> SimConfig:
    """A config with a preset's figures, then `overrides` (None values are ignored)."""
    if preset not in PRESETS:
        raise KeyError(preset)
    p = PRESETS[preset]
    base = SimConfig(
        preset=preset,
        model_id=p.model_id,
        ctx=p.ctx,
        bytes_per_token=p.bytes_per_token,
        fixed_bytes=p.fixed_bytes,
        prefill_tps=p.prefill_tps,
        decode_tps=p.decode_tps,
        prefill_chunk=p.prefill_chunk,
        visible_key=p.visible_key,
    )
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]
