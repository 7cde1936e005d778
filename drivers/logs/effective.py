"""The cache settings a server actually runs with, read from its own startup lines.

A requested setting is not evidence: llama-server silently drops `--cache-reuse` on multimodal
or non-shiftable contexts, and a ds4 flag may be missing from an older build. The `run` header
should carry what the server printed, and a run should warn when a requested cache setting is
not in effect.

Setting names (the keys `warn_missing` compares):
- ds4: `kv_disk` (bool), `kv_disk_budget_mib`, `kv_cache_min_tokens`, `kv_cache_cold_max_tokens`,
  `kv_cache_continued_interval_tokens`, `kv_cache_boundary_trim_tokens`,
  `kv_cache_boundary_align_tokens`, `kv_cache_cross_quant` (`accept`|`reject`), `ctx`,
  `prefill_chunk`, `backend`, `batched_sessions`.
- llama.cpp: `n_parallel`, `n_ctx_slot`, `kv_unified`, `cache_reuse` (0 when the server disabled
  it), `cache_reuse_disabled_by`, `cache_ram_mib` (-1 = no limit, 0 = off), `ctx_checkpoints`,
  `checkpoint_min_step`, `cache_idle_slots` (bool; dropped without `--cache-ram`), `n_threads`,
  `n_threads_batch`, `swa_cache_cells` (sliding-window models), `swa_full`, `log_verbosity`,
  `build` (the llama.cpp build number the server printed; 0 when it does not know it).
  Below verbosity 4 llama-server prints neither the prompt-cache nor the checkpoint line, so those
  settings are then "not shown", which is not the same as "not in effect".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from drivers.logs import ds4, llamacpp

Settings = dict[str, object]


def ds4_settings(events: Iterable[ds4.Event]) -> Settings:
    """Settings from ds4 startup events; later lines (a restart) override earlier ones."""
    out: Settings = {}
    saw_start = False
    batched: int | None = None
    for ev in events:
        if isinstance(ev, ds4.DiskCacheConfig):
            out.update(
                kv_disk=True,
                kv_disk_budget_mib=ev.budget_mib,
                kv_cache_min_tokens=ev.min_tokens,
                kv_cache_cold_max_tokens=ev.cold_max,
                kv_cache_continued_interval_tokens=ev.continued,
                kv_cache_boundary_trim_tokens=ev.trim,
                kv_cache_boundary_align_tokens=ev.align,
                kv_cache_cross_quant=ev.cross_quant,
            )
        elif isinstance(ev, ds4.ContextBuffers):
            saw_start = True
            out.update(ctx=ev.ctx, prefill_chunk=ev.prefill_chunk, backend=ev.backend)
        elif isinstance(ev, ds4.BatchedMode):
            batched = ev.resident_sessions
        elif isinstance(ev, ds4.Listening):
            saw_start = True
    if saw_start:
        out.setdefault("kv_disk", False)  # the KV disk line is printed whenever a disk dir is given
        out["batched_sessions"] = batched if batched is not None else 1
    elif batched is not None:
        out["batched_sessions"] = batched
    return {k: v for k, v in out.items() if v is not None}


def llamacpp_settings(events: Iterable[llamacpp.Event]) -> Settings:
    """Settings from llama-server startup events; `cache_reuse` is 0 when the server disabled it."""
    out: Settings = {}
    for ev in events:
        if isinstance(ev, llamacpp.SlotsInit):
            out.update(n_parallel=ev.n_slots, n_ctx_slot=ev.n_ctx_slot, kv_unified=ev.kv_unified)
        elif isinstance(ev, llamacpp.AutoParallel):
            out.update(n_parallel=ev.n_parallel, kv_unified=ev.kv_unified)
        elif isinstance(ev, llamacpp.CacheReuseDisabled):
            out.update(cache_reuse=0, cache_reuse_disabled_by=ev.by)
        elif isinstance(ev, llamacpp.PromptCacheConfig):
            out["cache_ram_mib"] = ev.limit_mib
        elif isinstance(ev, llamacpp.CheckpointConfig):
            out["ctx_checkpoints"] = ev.max
            if ev.min_spacing is not None:
                out["checkpoint_min_step"] = ev.min_spacing
        elif isinstance(ev, llamacpp.CacheIdleSlots):
            out["cache_idle_slots"] = ev.enabled
        elif isinstance(ev, llamacpp.Threads):
            out["n_threads"] = ev.n_threads
            if ev.n_threads_batch is not None:
                out["n_threads_batch"] = ev.n_threads_batch
        elif isinstance(ev, llamacpp.SwaCache):
            if ev.cells is not None:
                out["swa_cache_cells"] = ev.cells
            if ev.full is not None:
                out["swa_full"] = ev.full
        elif isinstance(ev, llamacpp.LogVerbosity):
            out["log_verbosity"] = ev.level
        elif isinstance(ev, llamacpp.BuildInfo):
            out["build"] = ev.build
    if "swa_cache_cells" in out:
        out.setdefault("swa_full", False)  # the full-size line is printed only when it is on
    return {k: v for k, v in out.items() if v is not None}


def _same(a: object, b: object) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a) == bool(b)
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)
    return str(a).lower() == str(b).lower()


_SHOWN_ONLY_WHEN_DROPPED = frozenset({"cache_reuse"})
"""llama-server prints nothing about `--cache-reuse` when it keeps it: absence is not a warning."""

_LLAMA_VERBOSE_ONLY = frozenset(
    {"cache_ram_mib", "ctx_checkpoints", "checkpoint_min_step", "cache_idle_slots"}
)
"""Printed by llama-server only at log verbosity 4 or more (`-lv 4`)."""


def warn_missing(requested: Mapping[str, object], effective: Mapping[str, object]) -> list[str]:
    """One line per requested setting that the server's startup log does not show in effect."""
    warnings: list[str] = []
    for key, want in requested.items():
        if key not in effective:
            if key in _SHOWN_ONLY_WHEN_DROPPED:
                continue
            level = effective.get("log_verbosity")
            if key in _LLAMA_VERBOSE_ONLY and isinstance(level, int) and level < 4:
                warnings.append(
                    f"{key}={want} was requested; the server logs it only at -lv 4 (it ran at {level})"
                )
                continue
            warnings.append(f"{key}={want} was requested but the server's startup log does not show it")
            continue
        got = effective[key]
        if _same(want, got):
            continue
        why = ""
        if key == "cache_reuse" and "cache_reuse_disabled_by" in effective:
            why = f" (disabled: not supported by {effective['cache_reuse_disabled_by']})"
        warnings.append(f"{key}={want} was requested but the server runs with {key}={got}{why}")
    return warnings
