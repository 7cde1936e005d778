"""llama-server log parser, on lines printed with llama.cpp's own printf formats (llama_logtext).

A real server log will be added under tests/data/llama/ by the llama.cpp work.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drivers.logs import llamacpp as L
from drivers.logs.base import ParseStats
from replay.report.logs import summarize_llamacpp
from tests.support.llama_logtext import (
    APPEND_FAILED,
    APPEND_INCOMPLETE,
    APPENDIX_INVALID,
    APPENDIX_TRUNCATED,
    CACHE_ENTRY,
    CACHE_LIMIT,
    CACHE_NO_MEMORY,
    CACHE_OBSOLETE,
    CACHE_PRESENT,
    CACHE_ROOM,
    CACHE_TOO_BIG,
    CKPT_DECISION,
    CKPT_ERASED,
    CKPT_NEW,
    CKPT_RESTORED,
    CKPT_TOO_CLOSE,
    CLEAR_LORA,
    CLEAR_PROMPT,
    CONTEXT_SHIFT,
    DONE,
    DRAFT_DROPPED,
    EVAL_OLD,
    FULL,
    KV_FULL,
    LOAD_FAILED,
    NEW_PROMPT,
    POS_ERROR,
    PR_LINK,
    PROGRESS,
    PROGRESS_PP,
    PROMPT_EVAL,
    PURGE,
    RELEASE,
    RESTORE_FAILED,
    REUSE_CHUNK,
    REUSE_DONE,
    REUSE_START,
    SEL_LCP,
    SEL_LCP_OLD,
    SEQ_RM,
    SPEC_CKPT_NEW,
    SPEC_CKPT_RESTORE,
    TOTAL,
    c_format,
    prefixed,
    request,
    slot,
    srv,
    startup,
    timing,
)


def events(lines: list[str]) -> L.LlamaLog:
    return L.parse_lines(lines)


def one(line: str) -> L.Event:
    log = events([line])
    assert len(log.events) == 1, (line, log.stats.to_dict())
    return log.events[0]


def test_slot_selection_lines() -> None:
    for fmt in (SEL_LCP, SEL_LCP_OLD):
        ev = one(slot("get_availabl", 1, -1, fmt, 0.994, 0.1, 1.0))
        assert isinstance(ev, L.SlotSelected)
        assert (ev.slot, ev.task, ev.by, ev.sim, ev.threshold, ev.f_keep) == (1, -1, "lcp", 0.994, 0.1, 1.0)
    lru = one(slot("get_availabl", 2, -1, "selected slot by LRU, t_last = %d", 1101356388876))
    assert isinstance(lru, L.SlotSelected) and (lru.by, lru.sim) == ("lru", None)


def test_prompt_lines() -> None:
    np_ = one(slot("update_slots", 0, 7, NEW_PROMPT, 65536, 0, 2948))
    assert isinstance(np_, L.NewPrompt) and (np_.task, np_.n_ctx_slot, np_.n_tokens) == (7, 65536, 2948)
    rm = one(slot("update_slots", 0, 7, SEQ_RM, 2900, 2900))
    assert isinstance(rm, L.SeqRemove) and rm.n_tokens == 2900
    pr = one(slot("update_slots", 0, 7, PROGRESS, 1024, 512, 1024 / 2948))
    assert isinstance(pr, L.PromptProgress) and (pr.n_tokens, pr.batch_tokens) == (1024, 512)
    assert pr.progress == pytest.approx(0.347354, abs=1e-6)
    pp = one(slot("print_timing", 0, 7, PROGRESS_PP, 3584, 0.06, 3.41, 1052.29))
    assert isinstance(pp, L.PromptProgress) and (pp.n_tokens, pp.batch_tokens, pp.progress) == (
        3584,
        None,
        0.06,
    )
    dn = one(slot("update_slots", 0, 7, DONE, 2948, 20))
    assert isinstance(dn, L.PromptDone) and (dn.n_tokens, dn.batch_tokens) == (2948, 20)
    rel = one(slot("release", 0, 7, RELEASE, 3000, 1))
    assert isinstance(rel, L.Release) and (rel.n_tokens, rel.truncated) == (3000, 1)


def test_checkpoint_and_reprocess_lines() -> None:
    c = one(slot("update_slots", 0, 3, CKPT_NEW, 1, 32, 8000, 8000, 8001, 62.813))
    assert isinstance(c, L.CheckpointCreated)
    assert (c.index, c.max, c.pos_min, c.pos_max, c.n_tokens, c.mib) == (1, 32, 8000, 8000, 8001, 62.813)
    r = one(slot("update_slots", 0, 3, CKPT_RESTORED, 50665, 50665, 50666, 50666, 149.626))
    assert isinstance(r, L.CheckpointRestored) and (r.n_past, r.mib) == (50666, 149.626)
    e = one(slot("update_slots", 1, 3416, CKPT_ERASED, 3169, 3169, 3170, 0, 0, 149.626))
    assert isinstance(e, L.CheckpointErased) and (e.slot, e.task, e.n_tokens) == (1, 3416, 3170)
    f = one(slot("update_slots", 0, 2, FULL, PR_LINK))
    assert isinstance(f, L.FullReprocess) and (f.slot, f.task) == (0, 2)
    ig = one(slot("update_slots", 1, 3416, "cache reuse is not supported - ignoring n_cache_reuse = %d", 256))
    assert isinstance(ig, L.CacheReuseIgnored) and ig.n_cache_reuse == 256


def test_timing_lines_new_and_old_layout() -> None:
    p, e, _ = timing(0, 16, 6246.51, 630, 742.23, 37)
    pt, et = one(p), one(e)
    assert isinstance(pt, L.PromptTiming) and (pt.task, pt.ms, pt.tokens) == (16, 6246.51, 630)
    assert pt.tps == pytest.approx(100.86, abs=0.01)
    assert isinstance(et, L.EvalTiming) and (et.ms, et.tokens) == (742.23, 37)
    # older builds: one header, then bare lines (and `runs` instead of `tokens`)
    old = [
        slot("print_timing", 2, 9, "\n").rstrip("\n"),
        PROMPT_EVAL % (105.14, 44, 2.39, 418.51),
        EVAL_OLD % ("print_timings", 50.0, 5, 10.0, 100.0),
        TOTAL % (155.14, 49),
    ]
    log = events(old)
    kinds = [(type(ev).__name__, ev.slot, ev.task) for ev in log.events]  # type: ignore[attr-defined]
    assert kinds == [("PromptTiming", 2, 9), ("EvalTiming", 2, 9)]
    assert log.stats.unrecognised == 0


def test_prompt_cache_lines() -> None:
    lines = [
        srv("get_availabl", "%s", "updating prompt cache"),
        srv(
            "prompt_save",
            " - saving prompt with length %d, total state size = %.3f MiB (draft: %.3f MiB)",
            42057,
            1546.853,
            0.0,
        ),
        srv("prompt_save", " - saving prompt with length %d, total state size = %.3f MiB", 1378, 235.778),
        srv("load", " - looking for better prompt, base f_keep = %.3f, sim = %.3f", 0.001, 0.069),
        srv("load", " - found better prompt with f_keep = %.3f, sim = %.3f", 1.0, 0.98),
        srv("update", " - cache size limit reached, removing oldest entry (size = %.3f MiB)", 358.458),
        srv(
            "update",
            " - cache token limit (%d, est: %d) reached, removing oldest entry (size = %.3f MiB)",
            4096,
            8000,
            12.5,
        ),
        srv(
            "update",
            " - cache state: %d prompts, %.3f MiB (limits: %.3f MiB, %d tokens, %d est)",
            4,
            7492.431,
            8192.0,
            75008,
            167792,
        ),
        srv(
            "update",
            "   - prompt %s: %7d tokens, checkpoints: %2d, %9.3f MiB",
            "0x55d4c8a0b2c0",
            1378,
            2,
            535.03,
        ),
        srv("get_availabl", "prompt cache update took %.2f ms", 15.21),
    ]
    log = events(lines)
    ev = log.events
    assert [e.kind for e in ev] == [
        "prompt_cache_save",
        "prompt_cache_save",
        "prompt_cache_lookup",
        "prompt_cache_load",
        "prompt_cache_evict",
        "prompt_cache_evict",
        "prompt_cache_state",
        "prompt_cache_entry",
        "prompt_cache_update",
    ]
    assert (ev[0].tokens, ev[0].mib, ev[0].draft_mib) == (42057, 1546.853, 0.0)  # type: ignore[attr-defined]
    assert ev[1].draft_mib is None  # type: ignore[attr-defined]
    assert (ev[4].cause, ev[5].cause) == ("size", "tokens")  # type: ignore[attr-defined]
    assert (ev[6].prompts, ev[6].limit_mib, ev[6].est_tokens) == (4, 8192.0, 167792)  # type: ignore[attr-defined]
    assert (ev[7].tokens, ev[7].checkpoints, ev[7].mib) == (1378, 2, 535.03)  # type: ignore[attr-defined]
    assert log.stats.unrecognised == 0 and log.stats.known_ignored == 1


def test_startup_lines() -> None:
    log = events(
        startup(n_slots=2, n_ctx=8192, reuse_disabled="multimodal")
        + [
            "main: n_parallel is set to auto, using n_parallel = 4 and kv_unified = true",
            srv("llama_server", "listening on http://0.0.0.0:%d", 8081),
            srv("init", "%s", "context checkpoints disabled"),
            srv("load_model", "%s", "cache_reuse is not supported by this context, it will be disabled"),
            srv("load_model", "%s", "cache_reuse is not supported with MTP, it will be disabled"),
        ]
    )
    build, *rest = log.events
    assert build.kind == "build_info" and build.build == 6970  # type: ignore[attr-defined]
    log.events[:] = rest
    kinds = [e.kind for e in log.events]
    assert kinds == [
        "cache_reuse_disabled",
        "slots_init",
        "new_slot",
        "new_slot",
        "prompt_cache_config",
        "checkpoint_config",
        "listening",
        "auto_parallel",
        "listening",
        "checkpoint_config",
        "cache_reuse_disabled",
        "cache_reuse_disabled",
    ]
    ev = log.events
    assert ev[0].by == "multimodal"  # type: ignore[attr-defined]
    assert (ev[1].n_slots, ev[1].n_ctx_slot, ev[1].kv_unified) == (2, 8192, False)  # type: ignore[attr-defined]
    assert (ev[3].slot, ev[3].n_ctx) == (1, 8192)  # type: ignore[attr-defined]
    assert ev[4].limit_mib == 8192 and ev[5].max == 32 and ev[5].min_spacing == 8192  # type: ignore[attr-defined]
    assert ev[6].port == 8080 and ev[8].port == 8081  # type: ignore[attr-defined]
    assert (ev[7].n_parallel, ev[7].kv_unified) == (4, True)  # type: ignore[attr-defined]
    assert ev[9].max == 0 and ev[10].by == "context" and ev[11].by == "mtp"  # type: ignore[attr-defined]
    assert all(c.ok for c in log.stats.checks)
    off = events(
        [
            srv("init", "%s", "prompt cache is disabled - use `--cache-ram N` to enable it"),
            srv("init", "prompt cache is enabled, size limit: %s", "no limit"),
        ]
    )
    assert [e.limit_mib for e in off.events] == [0, -1]  # type: ignore[attr-defined]


@pytest.mark.parametrize("style", ["plain", "prefixed", "colour", "journald"])
def test_prefix_styles_give_the_same_events(style: str) -> None:
    base = startup() + request(0, 1, 3964, 2, 37, 742.23)
    if style == "plain":
        lines = base
    elif style == "journald":
        lines = [f"May 21 07:23:00 host llama-server[59332]: {x}" for x in base]
    else:
        lines = [prefixed(x, 1_000_000 + i * 250_000, colour=style == "colour") for i, x in enumerate(base)]
    log = events(lines)
    plain = events(base)
    strip = lambda evs: [{k: v for k, v in e.to_dict().items() if k not in ("t",)} for e in evs]  # noqa: E731
    assert strip(log.events) == strip(plain.events)
    assert log.stats.warnings == []
    if style in ("prefixed", "colour"):
        assert log.events[0].kind == "build_info" and log.events[0].t == pytest.approx(1.0, abs=1e-6)
        assert log.events[1].t == pytest.approx(1.0 + 0.25 * 2, abs=1e-6)
        assert log.events[-1].t is not None and log.events[-1].t > log.events[0].t


def test_timestamps_continue_across_a_restart() -> None:
    lines = [
        prefixed(x, 5_000_000 + i * 1000) for i, x in enumerate(startup() + request(0, 1, 100, 0, 5, 10.0))
    ]
    lines += [
        prefixed(x, 1_000_000 + i * 1000) for i, x in enumerate(startup() + request(0, 1, 100, 0, 5, 10.0))
    ]
    log = events(lines)
    ts = [e.t for e in log.events]
    assert all(t is not None for t in ts)
    assert all(b >= a for a, b in zip(ts, ts[1:], strict=False))  # type: ignore[operator]


def test_unknown_lines_and_cross_check() -> None:
    lines = startup() + [
        "llama_model_loader: - kv   0: general.architecture str = llama",
        slot("get_availabl", 0, -1, "selected slot by a brand new rule"),
        slot("update_slots", 0, 3, "created context checkpoint one of many"),
        slot("update_slots", 0, 3, "prompt processing progress, n_tokens = many, progress = all"),
    ]
    log = events(lines)
    # the two variants no pattern knows (build and loader lines are known startup output)
    assert (log.stats.unrecognised, log.stats.unknown_values) == (2, 1)
    sel = next(e for e in log.events if isinstance(e, L.SlotSelected))
    assert sel.by == "other"
    warnings = log.stats.warnings
    assert any(w.startswith("checkpoint_created: 1 line(s)") for w in warnings)
    assert any(w.startswith("prompt_progress: 1 line(s)") for w in warnings)
    assert not any(w.startswith("slot_selected") for w in warnings)


def test_no_text_leaves_the_parser() -> None:
    secret = "Quixoticpangolin"
    lines = (
        startup()
        + [
            srv("load_model", "loading model '%s'", f"/home/{secret}/m.gguf"),
            srv("llama_server", "listening on http://%s:%d", secret, 8080),
            slot("update_slots", 0, 1, "%s", f"{secret} prompt eval time"),
            srv("load_model", "%s", f"cache_reuse is not supported by {secret}, it will be disabled"),
        ]
        + request(0, 1, 3964, 2, 37, 742.23)
    )
    log = events(lines)
    out = json.dumps([e.to_dict() for e in log.events]) + json.dumps(log.stats.to_dict())
    windows, total = summarize_llamacpp(log.events)
    out += json.dumps([w.to_dict() for w in windows]) + json.dumps(total.to_dict())
    assert secret.lower() not in out.lower()
    assert any(e.kind == "cache_reuse_disabled" and e.by == "other" for e in log.events)  # type: ignore[attr-defined]


def test_llama_summary_windows_and_figures() -> None:
    lines = startup() + request(0, 1, 4000, 0, 50, 1000.0) + request(0, 2, 4100, 3990, 50, 1250.0)
    lines += [slot("update_slots", 0, 3, FULL, PR_LINK)] + request(0, 3, 60000, 0, 100, 4000.0)
    lines += startup() + request(0, 1, 3000, 2900, 10, 250.0)  # restart, same settings
    lines += startup(reuse_disabled="this context") + request(0, 1, 3000, 0, 10, 500.0)
    windows, total = summarize_llamacpp(events(lines).events)
    assert [w.runs for w in windows] == [2, 1]
    w1, w2 = windows
    assert w1.requests == 4 and w1.full_prefills == 2 and w1.forced_full_reprocess == 1
    assert w1.continuation_rate == pytest.approx(2 / 4)
    bands = {b["band"]: b["median_tps"] for b in w1.decode_bands}
    assert bands["0-50K"] == pytest.approx(40.0) and bands["50-100K"] == pytest.approx(25.0)
    assert w1.decode_tps_time_weighted == pytest.approx(1000 * 210 / 6500.0)
    assert w1.slot_selected == {"lcp": 4}
    assert w2.settings["cache_reuse"] == 0 and "cache_reuse" not in w1.settings
    assert total.requests == 5


# The grammar is a table: every row feeds only numbers and closed vocabularies into its event.

VOCAB_WORDS = (
    L.SELECTED_BY.names
    | L.REUSE_DISABLED_BY.names
    | L.SAVE_SKIPPED_BY.names
    | L.SLOT_FILE_FAULTS.names
    | {"other", "save", "restore", "size", "tokens", "context", "room"}
)


def _only_numbers(ev: L.Event) -> None:
    for name, value in ev.to_dict().items():
        if name == "kind" or value is None or isinstance(value, bool | int | float):
            continue
        assert value in VOCAB_WORDS, (ev.kind, name, value)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_line_a_row_matches_gives_numbers_only(data: st.DataObject) -> None:
    row = data.draw(st.sampled_from(L.ROWS))
    msg = data.draw(st.from_regex(row.pattern, fullmatch=True).filter(lambda s: "\n" not in s))
    ev = L.message_event(msg, {"t": None, "line": 1, "slot": 0, "task": 1}, ParseStats())
    assert ev is not None and type(ev) in {r.event for r in L.ROWS}
    _only_numbers(ev)


def test_a_row_cannot_feed_log_text_to_a_free_text_field() -> None:
    with pytest.raises(TypeError, match="cannot take text"):
        L.check_row(L.Row(re.compile(r"error: (?P<cause>\w+)"), L.RequestError))
    with pytest.raises(TypeError, match="no field"):
        L.check_row(L.Row(re.compile(r"x"), L.Release, {"bogus": 1}))
    for row in L.ROWS:
        L.check_row(row)


# The cache lines of newer builds: each format as the server prints it, any numbers it may print.

POS = st.integers(0, 10**7)
MIB = st.floats(0, 10**5, allow_nan=False).map(lambda x: round(x, 3))
FILE = st.text(st.characters(codec="ascii", exclude_characters="\n\r'"), max_size=20)


def _slot(fmt: str, *args: object) -> str:
    return slot("update_slots", 0, 7, "%s", c_format(fmt, *args)) if args else slot("update_slots", 0, 7, fmt)


def _srv(fmt: str, *args: object) -> str:
    return srv("update", "%s", c_format(fmt, *args)) if args else srv("update", "%s", fmt)


# (line maker, argument strategies, event kind, fields the arguments land in, fixed fields)
NEWER_LINES: list[tuple[Any, str, tuple[Any, ...], str, tuple[str | None, ...], dict[str, object]]] = [
    (
        _slot,
        CKPT_TOO_CLOSE,
        (POS, POS, POS, MIB),
        "checkpoint_pruned",
        ("pos_min", "pos_max", "n_tokens", "mib"),
        {},
    ),
    (
        _slot,
        CKPT_DECISION,
        (st.sampled_from(["yes", "no"]), POS, POS),
        "checkpoint_decision",
        (None, "pos_min", "pos_max"),
        {},
    ),
    (
        _slot,
        SPEC_CKPT_NEW,
        (POS, POS, POS, MIB, MIB),
        "speculative_checkpoint",
        ("pos_min", "pos_max", "n_tokens", "mib", "draft_mib"),
        {"action": "save"},
    ),
    (
        _slot,
        SPEC_CKPT_RESTORE,
        (POS, POS, POS),
        "speculative_checkpoint",
        ("pos_min", "pos_max", "size_bytes"),
        {"action": "restore"},
    ),
    (_slot, REUSE_START, (POS, POS), "cache_reuse_start", ("min_chunk", "n_past"), {}),
    (
        _slot,
        REUSE_CHUNK,
        (POS, POS, POS, POS, POS),
        "cache_reuse_chunk",
        ("n_tokens", "src_start", "src_end", "dst_start", "dst_end"),
        {},
    ),
    (_slot, REUSE_DONE, (POS,), "cache_reuse_done", ("n_past",), {}),
    (_slot, CONTEXT_SHIFT, (POS, POS, POS), "context_shift", ("n_keep", "n_left", "n_discard"), {}),
    (_slot, CLEAR_PROMPT, (POS,), "slot_cleared", ("n_tokens",), {"lora": False}),
    (_slot, CLEAR_LORA, (POS, POS), "slot_cleared", (None, None), {"lora": True}),
    (
        _slot,
        POS_ERROR,
        (POS, POS, st.integers(0, 64), st.just(-1)),
        "slot_memory_error",
        ("n_past", "n_tokens", None, "pos_min"),
        {},
    ),
    (
        _slot,
        APPEND_FAILED,
        (FILE,),
        "slot_file_checkpoint_fault",
        (None,),
        {"action": "save", "fault": "failed"},
    ),
    (
        _slot,
        APPEND_INCOMPLETE,
        (FILE,),
        "slot_file_checkpoint_fault",
        (None,),
        {"action": "save", "fault": "incomplete"},
    ),
    (
        _slot,
        APPENDIX_INVALID,
        (FILE,),
        "slot_file_checkpoint_fault",
        (None,),
        {"action": "restore", "fault": "invalid"},
    ),
    (
        _slot,
        APPENDIX_TRUNCATED,
        (FILE,),
        "slot_file_checkpoint_fault",
        (None,),
        {"action": "restore", "fault": "truncated"},
    ),
    (
        _slot,
        DRAFT_DROPPED,
        (FILE,),
        "slot_file_checkpoint_fault",
        (None,),
        {"action": "restore", "fault": "draft_mismatch"},
    ),
    (_slot, LOAD_FAILED, (), "prompt_cache_load_failed", (), {"size_bytes": None}),
    (_slot, "saving idle slot to prompt cache", (), "idle_slot_save", (), {}),
    (_srv, CACHE_PRESENT, (), "prompt_cache_skip", (), {"cause": "present"}),
    (_srv, CACHE_TOO_BIG, (MIB, MIB), "prompt_cache_skip", ("mib", "limit_mib"), {"cause": "too_big"}),
    (_srv, CACHE_NO_MEMORY, (FILE,), "prompt_cache_skip", (None,), {"cause": "no_memory"}),
    (_srv, CACHE_ROOM, (MIB,), "prompt_cache_evict", ("mib",), {"cause": "room"}),
    (_srv, CACHE_LIMIT, (MIB,), "prompt_cache_limit", ("limit_mib",), {}),
    (_srv, CACHE_OBSOLETE, (POS,), "prompt_cache_obsolete", ("tokens",), {}),
    (
        _srv,
        CACHE_ENTRY,
        (st.integers(1, 2**47), POS, st.integers(0, 99), MIB),
        "prompt_cache_entry",
        (None, "tokens", "checkpoints", "mib"),
        {},
    ),
    (_srv, RESTORE_FAILED, (POS,), "prompt_cache_load_failed", ("size_bytes",), {}),
    (_srv, PURGE, (st.integers(0, 64), POS), "slot_purged", ("purged_slot", "n_tokens"), {}),
    (_srv, KV_FULL, (POS, POS, st.integers(-2, 1)), "kv_cache_full", (None, "n_batch", "ret"), {}),
]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_newer_cache_lines_give_their_numbers(data: st.DataObject) -> None:
    maker, fmt, strategies, kind, names, fixed = data.draw(st.sampled_from(NEWER_LINES))
    args = tuple(data.draw(s) for s in strategies)
    us = data.draw(st.integers(0, 10**9))
    log = events([prefixed(maker(fmt, *args), us, data.draw(st.sampled_from("IWED")))])
    assert log.stats.unrecognised == 0 and len(log.events) == 1, (fmt, args)
    ev = log.events[0]
    assert ev.kind == kind
    got = ev.to_dict()
    for name, value in zip(names, args, strict=True):
        if name is not None:
            assert got[name] == value, (name, got)
    for name, value in fixed.items():
        assert got[name] == value, (name, got)
    if kind == "checkpoint_decision":
        assert got["create"] is (args[0] == "yes")
    _only_numbers(ev)


def test_an_unknown_line_about_a_cache_is_counted_and_said() -> None:
    lines = [
        *startup(),
        slot("update_slots", 0, 3, "moving context checkpoint to the host pool (n_tokens = %d)", 4096),
        slot("update_slots", 0, 3, "some brand new message about sampling"),
        srv("update", "%s", " - cache state: 2 prompts, 1.5 MiB, a layout no build printed"),
    ]
    st_ = events(lines).stats
    assert (st_.unrecognised, st_.unrecognised_cache) == (3, 2)
    assert any("2 line(s) about the server's caches were not recognised" in w for w in st_.warnings)
    assert st_.to_dict()["unrecognised_cache"] == 2
