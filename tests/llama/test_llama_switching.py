"""The `switching` scenario, scaled down, replayed against the real llama.cpp server.

Two tool-using sessions share a system prompt and tool definitions and take turns. What each switch
re-processes (our records' `reprocessed_tokens`, from the server's `timings.prompt_n`) is checked
against what llama-server's policy implies:

- it picks a slot by the longest common prefix, when the share of the prompt it covers is above
  `--slot-prompt-similarity` (0.1), and only otherwise the least recently used slot;
- when the chosen slot is about to lose most of its content it saves it to the host-RAM prompt cache
  (`--cache-ram`, 8 GiB by default) and loads the best-matching cached prompt instead.

So with the host cache every switch resumes its own conversation; without it, on one slot, every
switch keeps only the shared prefix. With two slots the shared prefix (about 18% of the prompt)
is above the threshold, so the second session is sent to the slot holding the first and the other
slot is never used: `-np 2` behaves like `-np 1`. Raising the threshold (`-sps 0.5`) lets each
session keep a slot of its own.

The run glue is the one `replay run --server` uses: drivers start the server by PID, the engine
replays, and `/metrics` counters are compared with the records' usage (`replay.serverside.metrics`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from drivers.launch import start_target
from drivers.logs import llamacpp as L
from drivers.target import Target
from replay.metrics.results import read_results
from replay.runs import pipeline
from replay.runs.options import ReplayOptions
from replay.runs.pipeline import ReplayJob
from replay.scenario import find_scenario, generate
from replay.serverside.logs import effective_settings
from replay.trace.reader import read_trace
from tests.support.llamakit import require_xllamacpp

pytestmark = pytest.mark.llama

PARAMS = {"scale": 0.02, "turns": 2, "defaults.reply_tokens": 32}  # ~1.5K, ~1.7K tokens; four switches


@dataclass
class Run:
    records: list[dict[str, Any]]
    metrics: dict[str, Any]
    settings: dict[str, Any]
    events: list[L.Event]


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("switching") / "switching.trace.jsonl"
    generate(find_scenario("switching", PARAMS), path)
    return path


def replay(model: Path, trace: Path, work: Path, *flags: str) -> Run:
    """What `replay run --server` does: start the target, replay, check its counters, stop it."""
    require_xllamacpp()
    target = Target(
        kind="llamacpp",
        name="switching",
        binary="xllamacpp",
        model=str(model),
        flags=("-c", "16384", "-t", "1", "-lv", "4", *flags),
        ready_timeout=60,
        stop_timeout=10,
    )
    loaded = read_trace(trace)
    options = ReplayOptions(timeout=120.0)
    with start_target(target, work) as served:
        job = ReplayJob(
            served=served, trace=loaded, options=options, out=work / "results.jsonl", workdir=work
        )
        (done,) = pipeline.replay([job], say=lambda _line: None)
    assert done.exit_code == 0 and done.requests == 6
    (metrics,) = done.metrics
    assert metrics["scrapes"] >= 2  # before and after, and every few seconds between
    assert served.log_path is not None
    return Run(
        records=read_results(work / "results.jsonl").requests,  # the file: the run keeps few fields in memory
        metrics=metrics,
        settings=effective_settings("llamacpp", served.log_path),
        events=L.parse_files([served.log_path]).events,
    )


def check_records(run: Run) -> tuple[int, list[dict[str, Any]]]:
    """The shared prefix (what the second cold read found cached) and the four switches."""
    recs = run.records
    assert [r["session"] for r in recs] == ["a", "b"] * 3
    assert [r["switch"] for r in recs] == [["cold"], ["cold"]] + [["switch"]] * 4
    for r in recs:
        assert r["status"] == "ok" and r["reprocessed_source"] == "server"
        assert r["reprocessed_tokens"] == r["prompt_tokens"] - r["cached_tokens"]
    assert recs[0]["cached_tokens"] == 0
    assert run.metrics["ok"] is True, run.metrics["disagreements"]
    return recs[1]["cached_tokens"], recs[2:]


def assert_second_cold_read_shares_the_slot(run: Run) -> None:
    """b's first request went to the slot holding a: it found the shared prefix there."""
    b = run.records[1]
    assert 0.1 * b["prompt_tokens"] < b["cached_tokens"] < 0.3 * b["prompt_tokens"]


def assert_resumed(run: Run) -> None:
    """Every switch found its own conversation: its previous prompt, and part of the reply."""
    _, switches = check_records(run)
    prev = {r["session"]: r for r in run.records[:2]}
    for r in switches:
        p = prev[r["session"]]
        assert p["prompt_tokens"] <= r["cached_tokens"] <= p["prompt_tokens"] + p["output_tokens"]
        prev[r["session"]] = r


def assert_lost(run: Run) -> None:
    """Every switch kept only the prefix both sessions share."""
    shared, switches = check_records(run)
    assert [r["cached_tokens"] for r in switches] == [shared] * 4


def kinds(run: Run) -> dict[str, int]:
    out: dict[str, int] = {}
    for ev in run.events:
        out[ev.kind] = out.get(ev.kind, 0) + 1
    return out


def selected(run: Run) -> list[tuple[str | None, int | None]]:
    return [(e.by, e.slot) for e in run.events if isinstance(e, L.SlotSelected)]


def test_one_slot_host_cache_resumes_every_switch(tiny_llama: Path, trace: Path, tmp_path: Path) -> None:
    run = replay(tiny_llama, trace, tmp_path, "-np", "1")
    assert_second_cold_read_shares_the_slot(run)
    assert_resumed(run)
    assert kinds(run)["prompt_cache_load"] == 4  # one host-cache load per switch
    assert run.settings["cache_ram_mib"] == 8192


def test_one_slot_without_host_cache_loses_every_switch(
    tiny_llama: Path, trace: Path, tmp_path: Path
) -> None:
    run = replay(tiny_llama, trace, tmp_path, "-np", "1", "--cache-ram", "0")
    assert_second_cold_read_shares_the_slot(run)
    assert_lost(run)
    assert kinds(run).get("prompt_cache_load", 0) == 0
    assert selected(run) == [("lru", 0)] + [("lcp", 0)] * 5  # the shared prefix is above 0.1


def test_two_slots_one_used_without_host_cache(tiny_llama: Path, trace: Path, tmp_path: Path) -> None:
    run = replay(tiny_llama, trace, tmp_path, "-np", "2", "--cache-ram", "0")
    assert_second_cold_read_shares_the_slot(run)
    assert_lost(run)
    slots = {slot for _, slot in selected(run)}
    assert len(slots) == 1  # LCP similarity beats the empty slot every time
    assert [by for by, _ in selected(run)] == ["lru"] + ["lcp"] * 5
    assert run.settings["n_parallel"] == 2


def test_two_slots_with_host_cache(tiny_llama: Path, trace: Path, tmp_path: Path) -> None:
    run = replay(tiny_llama, trace, tmp_path, "-np", "2")
    assert_second_cold_read_shares_the_slot(run)
    assert_resumed(run)
    assert len({slot for _, slot in selected(run)}) == 1
    assert kinds(run)["prompt_cache_load"] == 4


def test_two_slots_each_session_keeps_its_own(tiny_llama: Path, trace: Path, tmp_path: Path) -> None:
    run = replay(tiny_llama, trace, tmp_path, "-np", "2", "--cache-ram", "0", "-sps", "0.5")
    assert run.records[1]["cached_tokens"] == 0  # b's first request took the empty slot
    assert_resumed(run)
    picks = selected(run)
    assert [by for by, _ in picks] == ["lru", "lru"] + ["lcp"] * 4
    a, b = picks[0][1], picks[1][1]
    assert a != b and [slot for _, slot in picks[2:]] == [a, b, a, b]
