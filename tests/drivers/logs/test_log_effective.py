"""Effective cache settings from startup lines, and warnings when a requested one is not in force."""

from __future__ import annotations

from drivers.logs import ds4, llamacpp
from drivers.logs.effective import ds4_settings, llamacpp_settings, warn_missing
from tests.support.ds4_logtext import Ds4LogWriter
from tests.support.llama_logtext import srv, startup


def test_ds4_settings_single_and_batched() -> None:
    w = Ds4LogWriter()
    w.startup(ctx=163840, prefill_chunk=1024, budget=131072, cold_max=0, continued=0)
    s = ds4_settings(ds4.parse_lines(w.lines).events)
    assert s == {
        "ctx": 163840,
        "prefill_chunk": 1024,
        "backend": "metal",
        "kv_disk": True,
        "kv_disk_budget_mib": 131072,
        "kv_cache_min_tokens": 512,
        "kv_cache_cold_max_tokens": 0,
        "kv_cache_continued_interval_tokens": 0,
        "kv_cache_boundary_trim_tokens": 32,
        "kv_cache_boundary_align_tokens": 2048,
        "kv_cache_cross_quant": "accept",
        "batched_sessions": 1,
    }
    w2 = Ds4LogWriter()
    w2.startup(disk_dir=None, sessions=2)
    s2 = ds4_settings(ds4.parse_lines(w2.lines).events)
    assert s2["batched_sessions"] == 2 and s2["kv_disk"] is False


def test_ds4_warns_about_settings_not_in_force() -> None:
    w = Ds4LogWriter()
    w.startup(disk_dir=None)
    eff = ds4_settings(ds4.parse_lines(w.lines).events)
    req = {"kv_disk": True, "kv_disk_budget_mib": 65536, "ctx": 262144, "batched_sessions": 2}
    warnings = warn_missing(req, eff)
    assert warnings == [
        "kv_disk=True was requested but the server runs with kv_disk=False",
        "kv_disk_budget_mib=65536 was requested but the server's startup log does not show it",
        "batched_sessions=2 was requested but the server runs with batched_sessions=1",
    ]
    assert warn_missing({"ctx": 262144, "prefill_chunk": 4096.0}, eff) == []


def test_llamacpp_cache_reuse_disabled_is_a_warning() -> None:
    lines = startup(n_slots=2, n_ctx=8192, reuse_disabled="multimodal", cache_ram=0)
    eff = llamacpp_settings(llamacpp.parse_lines(lines).events)
    assert eff == {
        "build": 6970,  # `build: 6970 (abcdef12) with ...`: the rules a cache model applies
        "cache_reuse": 0,
        "cache_reuse_disabled_by": "multimodal",
        "n_parallel": 2,
        "n_ctx_slot": 8192,
        "kv_unified": False,
        "cache_ram_mib": 0,
        "ctx_checkpoints": 32,
        "checkpoint_min_step": 8192,
    }
    warnings = warn_missing({"cache_reuse": 256, "n_parallel": 2, "cache_ram_mib": 8192}, eff)
    assert warnings == [
        "cache_reuse=256 was requested but the server runs with cache_reuse=0 (disabled: not supported by multimodal)",
        "cache_ram_mib=8192 was requested but the server runs with cache_ram_mib=0",
    ]


def test_llamacpp_cache_reuse_kept_is_silent() -> None:
    lines = startup() + [srv("init", "%s", "context checkpoints disabled")]
    eff = llamacpp_settings(llamacpp.parse_lines(lines).events)
    assert "cache_reuse" not in eff and eff["ctx_checkpoints"] == 0
    assert warn_missing({"cache_reuse": 256, "kv_unified": False}, eff) == []
    assert warn_missing({"ctx_checkpoints": 32}, eff) == [
        "ctx_checkpoints=32 was requested but the server runs with ctx_checkpoints=0"
    ]
