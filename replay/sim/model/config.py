"""Simulator settings: ds4-server's cache flags with ds4's defaults, plus the model's figures.

Field names follow ds4's flags (`--kv-cache-cold-max-tokens` -> `kv_cache_cold_max_tokens`).
Model presets carry what the seed figures measured; every figure can be overridden.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Literal

from replay.errors import UsageError

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
    # Whether the model's chat template has dedicated user/assistant tokens ds4's cold save can
    # cut at (the "chat anchor"); without them the cut is always the aligned fallback.
    chat_anchor: bool = True
    disk_read_gbps: float = 3.0
    disk_write_gbps: float = 1.5
    # Fixed seconds a prefill resumed from a restored checkpoint costs on top of its tokens.
    resume_prefill_s: float = 0.0


PRESETS: dict[str, Preset] = {
    # Seed figures section 1: 34.5 KiB per token, 486-522 tok/s prefill, 38-44 tok/s decode on a
    # 64 GB Mac; users run it with 2048/1024-token prefill chunks. In that field build tool-call
    # replies continued while plain-text replies missed their checkpoint (ds4 issue 1053 report).
    # A file costs what the report measured, 34.5 KiB per token and nothing per file ("the final
    # copy of a 77K-token conversation is 2.6 GB"; seven chain files 0.7-2.6 GB, 11.6 GB in all).
    # So every never-restored file has the same score, tokens / file size (ds4 4.4), and ds4's
    # tie-break, older last use first, picks the victim: the file that has waited longest, which
    # in a rotation of conversations is the one the next switch asks for ("the evictor kept
    # deleting the newest file, the one the next switch was about to ask for"). A per-file part
    # (DeepSeek's 22.9 MiB, ds4 4.3) would rank the shortest never-restored file lowest instead.
    "qwen38-q2": Preset(
        model_id="qwen3.8-flash-next",
        bytes_per_token=int(34.5 * KiB),
        fixed_bytes=0,
        prefill_tps=510.0,
        decode_tps=40.0,
        ctx=262144,
        prefill_chunk=2048,
        visible_key="tool-calls",
        note="Qwen3.8-Flash-Next q2 on ds4 (seed figures, Apple silicon)",
        # Report 000: qwen4exp has no dedicated separator token (ChatML spells <|im_start|>user as
        # text), so ds4's cold save "always falls back" to the aligned cut.
        chat_anchor=False,
        # Report 003's Mac: "a switch between two 100K-token conversations now restores in about
        # a second", 100K x 34.5 KiB = 3.5 GB in a second. It gives no write figure; report
        # 000's machine wrote both slots (the last two pre-warmed prompts, 6,655 and 5,822
        # tokens) at SIGTERM in 56-61 ms, 7.2-7.9 GB/s, the only one measured for these files.
        disk_read_gbps=3.5,
        disk_write_gbps=7.6,
    ),
    # Report 000's machine (M5 Max 128 GB, the q4k package): the A/B's logged round-2 request
    # (`ctx=6144..6657:513 ... 0.980s`) took ~0.25 s more than its 513 tokens at the run's own
    # round-1 rate (19,609 tokens in 27.87 s): a fixed cost of a resumed prefill. Its prefill
    # rate moved run to run as the page cache warmed (19,609 tokens in 38.27 -> 23.25 s), so an
    # arm sets the rate of the run it models.
    "qwen38-q4k": Preset(
        model_id="qwen3.8-flash-next",
        bytes_per_token=int(34.5 * KiB),
        fixed_bytes=0,
        prefill_tps=894.0,
        decode_tps=41.0,
        ctx=262144,
        prefill_chunk=2048,
        visible_key="tool-calls",
        note="Qwen3.8-Flash-Next q4k on ds4, report 000's M5 Max 128 GB",
        chat_anchor=False,
        # 000's restores: 6,144 tokens in 29.2 ms, 110,592 in 496.9 ms, 182,272 in 1,049.9 ms
        # (6.1-7.9 GB/s); its SIGTERM save, 7.2-7.9 GB/s (see qwen38-q2).
        disk_read_gbps=7.4,
        disk_write_gbps=7.6,
        resume_prefill_s=0.25,
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
    disk_read_gbps: float = PRESETS[DEFAULT_PRESET].disk_read_gbps
    disk_write_gbps: float = PRESETS[DEFAULT_PRESET].disk_write_gbps
    # The model has a chat anchor for the cold cut (see `Preset.chat_anchor`).
    chat_anchor: bool = PRESETS[DEFAULT_PRESET].chat_anchor
    # Fixed seconds of a prefill resumed after a disk restore (see `Preset.resume_prefill_s`).
    resume_prefill_s: float = PRESETS[DEFAULT_PRESET].resume_prefill_s
    # The server build whose rules these are, when `--build` named one (see `builds.py`).
    build: str = ""
    # The generated text holds reasoning the client never sends back (ds4 issue 1053).
    hidden_reasoning: bool = False
    reasoning_tokens: int = 64
    # Which replies the server remembers under a client-visible key (only matters with hidden
    # reasoning): "no-tools" = requests without tools (ds4 A/B), "tool-calls" = tool-call replies
    # (the field build in seed figures), "all" = PR 1058, "none".
    visible_key: VisibleKey = PRESETS[DEFAULT_PRESET].visible_key
    # The September field build (seed figures 1, overnight; ds4 issue 1053): a checkpoint is
    # stored under the kind of the last reply in its text (a tool call, replayed exactly through
    # the tool-id map, or plain text) and a request with tools looks up only tool-keyed files (and
    # files holding no reply yet). Off = the A/B source: the rendered text alone identifies a file.
    tool_replay_key: bool = False
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

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        """Pickled as its fields (sweep workers get it): compiled, a frozen dataclass cannot be
        rebuilt attribute by attribute."""
        return (SimConfig, tuple(getattr(self, name) for name in self.__dataclass_fields__))

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
        chat_anchor=p.chat_anchor,
        disk_read_gbps=p.disk_read_gbps,
        disk_write_gbps=p.disk_write_gbps,
        resume_prefill_s=p.resume_prefill_s,
    )
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]


# Sizes and token counts as ds4's flags and `replay size` take them.
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kib": 1024,
    "kb": 1000,
    "m": 1024**2,
    "mib": 1024**2,
    "mb": 1000**2,
    "g": 1024**3,
    "gib": 1024**3,
    "gb": 1000**3,
    "t": 1024**4,
    "tib": 1024**4,
    "tb": 1000**4,
}


def parse_bytes(text: str) -> int:
    """`34.5KiB`, `24G`, `64GB`, `4096`: K/M/G/T and KiB.. are binary, KB/MB/GB/TB decimal."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise UsageError(f"not a size: {text!r} (use e.g. 34.5KiB, 24G, 64GB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_tokens(text: str) -> int:
    """`77000`, `77K`, `1.5M` (decimal: token counts)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmM]?)\s*", text)
    if not m:
        raise UsageError(f"not a token count: {text!r}")
    return int(float(m.group(1)) * {"": 1, "k": 1000, "m": 1000_000}[m.group(2).lower()])
