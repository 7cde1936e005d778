"""`replay size` options from their command-line strings (`34.5KiB`, `4G,24G,64G`, `1,2`)."""

from __future__ import annotations

from replay.errors import UsageError
from replay.sim.model.config import DEFAULT_PRESET, PRESETS, SimConfig, config_for, parse_bytes, parse_tokens


def size_config(
    preset: str = DEFAULT_PRESET,
    *,
    per_token: str | None = None,
    fixed: str | None = None,
    interval: int | None = None,
    align: int | None = None,
    chunk: int | None = None,
    cold_max: int | None = None,
    ctx: int | None = None,
    eviction: str | None = None,
    hidden_reasoning: bool | None = None,
    visible_key: str | None = None,
) -> SimConfig:
    """A sizing config from CLI strings (`34.5KiB`, `22.9MiB`); None keeps the preset's value."""
    if preset not in PRESETS:
        raise UsageError(f"unknown preset {preset!r} (known: {', '.join(sorted(PRESETS))})")
    return config_for(
        preset,
        disk=True,
        bytes_per_token=parse_bytes(per_token) if per_token else None,
        fixed_bytes=parse_bytes(fixed) if fixed is not None else None,
        kv_cache_continued_interval_tokens=interval,
        kv_cache_boundary_align_tokens=align,
        kv_cache_cold_max_tokens=cold_max,
        prefill_chunk=chunk,
        ctx=ctx,
        eviction=eviction,
        hidden_reasoning=hidden_reasoning,
        visible_key=visible_key,
    )


def parse_token_list(text: str) -> list[int]:
    """`130K,130K,63K` -> token counts (empty text -> [])."""
    return [parse_tokens(part) for part in text.split(",") if part.strip()]


def parse_budgets(text: str) -> list[int]:
    """`4G,24G,64G` -> bytes (binary units: 24G = 24 GiB = --kv-disk-space-mb 24576)."""
    budgets = [parse_bytes(part) for part in text.split(",") if part.strip()]
    if not budgets:
        raise UsageError("--budgets needs at least one size, e.g. 4G,24G,64G")
    return budgets


def parse_slots(text: str) -> list[int | None]:
    """`1,2` -> slot counts; 1 is ds4's single-session path (no --batched-session)."""
    out: list[int | None] = []
    for part in text.split(","):
        if part.strip():
            n = int(part)
            if n < 1:
                raise UsageError("slot counts must be at least 1")
            out.append(None if n == 1 else n)
    return out
