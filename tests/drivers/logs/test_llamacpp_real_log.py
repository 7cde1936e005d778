"""The llama-server log parser on the real server's own logs (tests/data/llama), checked against what
the server answered at each step (the `.steps.json` captured with each log).

Each chat request is one server task: the parser's per-task numbers (prompt size, cached prefix,
tokens evaluated, tokens generated) must be the response's `usage`/`timings`, and the cache events
(host prompt cache, context checkpoints, slot files) must land on the steps that caused them.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from drivers.logs import llamacpp as L
from drivers.logs.effective import llamacpp_settings, warn_missing

DATA = Path(__file__).resolve().parents[2] / "data" / "llama"
NAMES = sorted(p.stem for p in DATA.glob("*.log"))

# Strings an event may carry: its kind and closed vocabularies, never text from the log.
VOCAB = {
    "lcp",
    "lru",
    "id",
    "other",
    "save",
    "restore",
    "context",
    "multimodal",
    "mtp",
    "speculative",
    "size",
    "tokens",
    *L.SAVE_SKIPPED_BY.names,
    *L.SLOT_FILE_FAULTS.names,
    "room",
}


@dataclass
class Task:
    """What the log says about one request (one server task)."""

    task: int
    slot: int | None
    n_tokens: int | None = None  # new prompt, task.n_tokens
    cache_n: int | None = None  # first `cached n_tokens = N` of the task
    prompt_n: int | None = None  # prompt eval time ... / N tokens
    predicted_n: int | None = None
    kinds: Counter[str] = field(default_factory=Counter)  # events of the task and the srv events before it


def parse(name: str) -> L.LlamaLog:
    return L.parse_files([DATA / f"{name}.log"])


def steps(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"{name}.steps.json").read_text())


def tasks(log: L.LlamaLog) -> list[Task]:
    """Tasks in the order their prompts arrived; srv-level events go to the next task."""
    out: dict[int, Task] = {}
    pending: Counter[str] = Counter()
    for ev in log.events:
        task = getattr(ev, "task", None)
        if not isinstance(ev, L.SlotEvent) or task is None or task < 0:
            if not isinstance(ev, L.STARTUP_KINDS) and not isinstance(ev, L.SlotSimilarity | L.SlotSelected):
                pending[ev.kind] += 1
            continue
        t = out.get(task)
        if t is None:  # the task's first line (`new prompt` at -lv 4, else its timing)
            t = out[task] = Task(task=task, slot=ev.slot, kinds=pending)
            pending = Counter()
        t.kinds[ev.kind] += 1
        if isinstance(ev, L.NewPrompt):
            t.n_tokens = ev.n_tokens
        elif isinstance(ev, L.SeqRemove) and t.cache_n is None:
            t.cache_n = ev.n_tokens
        elif isinstance(ev, L.PromptTiming):
            t.prompt_n = ev.tokens
        elif isinstance(ev, L.EvalTiming):
            t.predicted_n = ev.tokens
    return list(out.values())


def chat_steps(name: str) -> list[list[dict[str, Any]]]:
    """Chat requests in the order sent; requests sent together form one group."""
    groups = []
    for s in steps(name)["steps"]:
        if "concurrent" in s:
            groups.append(s["concurrent"])
        elif "words" in s["request"]:
            groups.append([s])
    return groups


def by_step(name: str) -> dict[str, Task]:
    """Step name -> its task, for the steps sent one at a time."""
    found = tasks(parse(name))
    out: dict[str, Task] = {}
    i = 0
    for group in chat_steps(name):
        if len(group) == 1:
            out[group[0]["step"]] = found[i]
        i += len(group)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_every_line_is_understood_and_the_counts_agree(name: str) -> None:
    log = parse(name)
    st = log.stats
    assert st.unrecognised == 0, name
    assert st.warnings == [], st.warnings
    assert st.recognised + st.known_ignored + st.blank == st.lines
    assert all(c.ok for c in st.checks)


@pytest.mark.parametrize("name", NAMES)
def test_each_request_is_one_task_with_the_servers_numbers(name: str) -> None:
    found = tasks(parse(name))
    groups = chat_steps(name)
    assert len(found) == sum(len(g) for g in groups)
    verbose = steps(name)["flags"][-2:] == ["-lv", "4"]
    i = 0
    for group in groups:
        got = found[i : i + len(group)]
        i += len(group)
        want = []
        for s in group:
            if s["status"] != 200:
                want.append((s["error"]["n_prompt_tokens"], None, None, None))
                continue
            t = s["timings"]
            cache_n = t["cache_n"] if verbose else None  # `cached n_tokens` is a -lv 4 line
            want.append((s["usage"]["prompt_tokens"], cache_n, t["prompt_n"], t["predicted_n"]))
        have = [(x.n_tokens, x.cache_n, x.prompt_n, x.predicted_n) for x in got]
        if not verbose:  # at the default verbosity the prompt size is not printed either
            have = [(w[0], None, p, d) for w, (_, _, p, d) in zip(want, have, strict=True)]
        assert sorted(have, key=str) == sorted(want, key=str), [s["step"] for s in group]


def test_host_prompt_cache_events_land_on_their_steps() -> None:
    t = by_step("llama_server_basic")
    back = t["A back (host cache load)"].kinds
    assert back["prompt_cache_load"] == 1 and back["prompt_cache_save"] == 1
    assert back["prompt_cache_candidate"] == 2  # the two prompts it held, each scored by LCP
    miss = t["B (cache miss, A saved to host cache)"].kinds
    assert miss["prompt_cache_save"] == 1 and miss["prompt_cache_load"] == 0
    assert t["A again (cache hit)"].kinds["prompt_cache_lookup"] == 0  # same slot, no cache update
    assert t["A again (cache hit)"].kinds["last_token_reevaluated"] == 1
    log = parse("llama_server_basic")
    loads = [e for e in log.events if isinstance(e, L.PromptCacheLoad)]
    assert [(e.f_keep, e.sim) for e in loads] == [(0.996, 1.0)]
    lookups = [e for e in log.events if isinstance(e, L.PromptCacheLookup)]
    assert len(lookups) == log.stats.by_kind["prompt_cache_update"] == 7
    assert lookups[0].f_keep == -1.0  # the empty slot's first update


def test_slot_similarity_lines_score_each_occupied_slot() -> None:
    log = parse("llama_server_basic")
    sims = [e for e in log.events if isinstance(e, L.SlotSimilarity)]
    first = sims[0]
    assert (first.sim, first.lcp, first.n_tokens, first.threshold) == (1.0, 1514, 1514, 0.1)
    assert all(abs(e.sim - e.lcp / e.n_tokens) < 0.001 for e in sims)
    # every LCP selection follows a score above the threshold; every LRU one follows none
    for sel in (e for e in log.events if isinstance(e, L.SlotSelected) and e.by == "lcp"):
        assert any(s.line == sel.line - 1 and s.sim == sel.sim for s in sims)


def test_two_slots_lcp_lru_and_pinned() -> None:
    t = by_step("llama_server_np2")
    log = parse("llama_server_np2")
    selected = {e.line: e for e in log.events if isinstance(e, L.SlotSelected)}
    order = sorted(selected.values(), key=lambda e: e.line)
    by = [e.by for e in order]
    assert by[:2] == ["lru", "lru"]  # both slots empty: least recently used
    assert by[2:4] == ["lcp", "lcp"]  # A and B go back to the slot holding them
    assert by[4:6] == ["lru", "lru"]  # C matches neither; A's slot was taken by C
    assert (by[6], order[6].slot) == ("id", 1)
    assert t["A again (back to its slot)"].prompt_n == 1
    assert t["C (new: LRU slot)"].cache_n == 5  # only the template's opening tokens
    settings = llamacpp_settings(log.events)
    assert (settings["n_parallel"], settings["n_ctx_slot"], settings["cache_ram_mib"]) == (2, 8192, 0)
    assert settings["cache_idle_slots"] is False  # `--cache-idle-slots requires --cache-ram, disabling`


def test_context_checkpoints_on_a_sliding_window_model() -> None:
    t = by_step("llama_server_swa")
    branch = t["branch at 500 words"]
    assert branch.kinds["checkpoint_check"] == 4 and branch.kinds["checkpoint_restored"] == 1
    assert branch.cache_n == 1  # the only usable checkpoint was the one at the start
    assert t["A back"].kinds["checkpoint_restored"] == 1 and t["A back"].prompt_n == 5
    assert t["A after restore"].kinds["checkpoint_restored"] == 1
    log = parse("llama_server_swa")
    files = [e for e in log.events if isinstance(e, L.SlotFileCheckpoints)]
    assert [(e.action, e.count) for e in files] == [("save", 5), ("restore", 5)]
    assert files[0].mib == pytest.approx(0.262)
    checks = [e for e in log.events if isinstance(e, L.CheckpointCheck) and e.task == branch.task]
    assert [(c.pos_min, c.pos_max, c.against) for c in checks][-1] == (0, 0, 249)
    assert log.stats.by_kind["checkpoint_superseded"] == 5


def test_forcing_full_reprocessing_and_evicted_checkpoints() -> None:
    t = by_step("llama_server_swa_forcing")
    branch = t["branch at 500 words"]
    assert branch.kinds["full_reprocess"] == 1 and branch.cache_n == 0 and branch.prompt_n == 1514
    assert branch.kinds["checkpoint_check"] == 2  # with -ctxcp 2 only two were kept
    log = parse("llama_server_swa_forcing")
    evicted = [e for e in log.events if isinstance(e, L.CheckpointEvicted)]
    assert len(evicted) == 2 and all(e.pos_min == 0 and e.n_tokens == 1 for e in evicted)
    assert llamacpp_settings(log.events)["ctx_checkpoints"] == 2


def test_swa_full_keeps_the_branch_prefix() -> None:
    t = by_step("llama_server_swa_full")
    branch = t["branch at 500 words"]
    assert branch.cache_n == 505 and branch.kinds["full_reprocess"] == 0
    settings = llamacpp_settings(parse("llama_server_swa_full").events)
    assert settings["swa_full"] is True and settings["swa_cache_cells"] == 16384


def test_prompt_over_the_context_is_a_request_error() -> None:
    log = parse("llama_server_basic")
    errors = [e for e in log.events if isinstance(e, L.RequestError)]
    assert [(e.cause, e.n_prompt_tokens, e.n_ctx) for e in errors] == [("context", 17014, 16384)]


@pytest.mark.parametrize("name", NAMES)
def test_effective_settings_follow_the_flags(name: str) -> None:
    flags = steps(name)["flags"]
    settings = llamacpp_settings(parse(name).events)

    def flag(f: str) -> str | None:
        return flags[flags.index(f) + 1] if f in flags else None

    assert settings["n_threads"] == int(flag("-t") or 0)
    assert settings["n_parallel"] == int(flag("-np") or 1)
    assert settings["log_verbosity"] == int(flag("-lv") or 3)
    requested: dict[str, object] = {"n_parallel": settings["n_parallel"]}
    if flag("-lv") == "4":
        assert settings["cache_ram_mib"] == int(flag("--cache-ram") or 8192)
        assert settings["ctx_checkpoints"] == int(flag("-ctxcp") or 32)
        requested["cache_ram_mib"] = int(flag("--cache-ram") or 8192)
    else:
        assert "cache_ram_mib" not in settings  # not printed below -lv 4
        msg = warn_missing({"cache_ram_mib": 8192}, settings)
        assert msg == ["cache_ram_mib=8192 was requested; the server logs it only at -lv 4 (it ran at 3)"]
    if flag("--cache-reuse"):
        requested["cache_reuse"] = int(flag("--cache-reuse") or 0)
        assert warn_missing(requested, settings) == [
            "cache_reuse=256 was requested but the server runs with cache_reuse=0 "
            "(disabled: not supported by context)"
        ]
    else:
        assert warn_missing(requested, settings) == []


@pytest.mark.parametrize("name", NAMES)
def test_events_carry_numbers_only(name: str) -> None:
    for ev in parse(name).events:
        for key, value in ev.to_dict().items():
            if isinstance(value, str):
                assert key == "kind" or value in VOCAB, (ev.kind, key, value)
            else:
                assert value is None or isinstance(value, int | float | bool), (ev.kind, key)
