"""llama-server's captured logs -> `server` records: every request finds its task, with the
server's own prefill tokens and seconds, and the cache events each scenario is known to show."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drivers.logs import llamacpp
from replay.serverside.llamacpp import correlate
from replay.serverside.logs import server_records

DATA = Path(__file__).resolve().parents[1] / "data" / "llama"
NAMES = sorted(p.name.removesuffix(".steps.json") for p in DATA.glob("*.steps.json"))


def requests_of(name: str) -> list[dict[str, Any]]:
    """The steps that got usage back, as run records (seq in send order)."""
    steps = json.loads((DATA / f"{name}.steps.json").read_text())["steps"]
    flat = [c for s in steps for c in (s.get("concurrent") or [s])]
    out = []
    for s in flat:
        if s.get("usage"):
            u, t = s["usage"], s["timings"]
            out.append(
                {
                    "seq": len(out) + 1,
                    "step": s["step"],
                    "prompt_tokens": u["prompt_tokens"],
                    "cached_tokens": u["prompt_tokens_details"]["cached_tokens"],
                    "prompt_n": t["prompt_n"],
                    "prompt_ms": t["prompt_ms"],
                }
            )
    return out


def records(name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    reqs = requests_of(name)
    return reqs, server_records("llamacpp", DATA / f"{name}.log", reqs)


@pytest.mark.parametrize("name", NAMES)
def test_every_request_finds_its_task_with_the_servers_prefill(name: str) -> None:
    reqs, recs = records(name)
    tasks = {r["request_seq"]: r for r in recs if r["event"] == "request" and r["request_seq"] is not None}
    assert set(tasks) == {r["seq"] for r in reqs}
    for r in reqs:
        task = tasks[r["seq"]]
        assert task["prefill"] == r["prompt_n"] and task["cached"] == r["cached_tokens"]
        assert task["prompt_done_s"] == pytest.approx(r["prompt_ms"] / 1000, abs=1e-5)
    assert recs[-1]["event"] == "log_parse" and recs[-1]["unrecognised_cache"] == 0
    for rec in recs[:-1]:  # numbers and closed-vocabulary names only
        assert all(isinstance(v, int | float | str | type(None)) for v in rec.values())
        assert rec["event"] in (
            "request",
            "restore",
            "store",
            "store_skipped",
            "evict",
            "live_miss",
            "host_cache_state",
            "restore_failed",
        )


def by_step(name: str) -> dict[str, list[dict[str, Any]]]:
    reqs, recs = records(name)
    step = {r["seq"]: r["step"] for r in reqs}
    out: dict[str, list[dict[str, Any]]] = {}
    for rec in recs:
        if rec["event"] != "request":
            out.setdefault(step.get(rec["request_seq"], "none"), []).append(rec)
    return out


def test_host_cache_saves_on_a_miss_and_restores_on_the_way_back() -> None:
    got = by_step("llama_server_basic")
    miss = [r for r in got["B (cache miss, A saved to host cache)"] if r["event"] != "host_cache_state"]
    assert [(r["event"], r["reason"], r["tokens"]) for r in miss] == [("store", "host_cache", 1581)]
    back = got["A back (host cache load)"]
    restore = [r for r in back if r["event"] == "restore"]
    assert len(restore) == 1 and restore[0]["source"] == "host_cache" and restore[0]["tokens"] == 1573
    # The load takes A's entry (1,581 tokens, saved on the miss) out of the cache.
    assert (restore[0]["entry_tokens"], restore[0]["mib"], restore[0]["taken"]) == (1581, 0.79, True)


@pytest.mark.parametrize("name", NAMES)
def test_the_host_cache_ledger_holds_what_the_server_says_it_holds(name: str) -> None:
    """Saves add, loads and evictions take out: at every `cache state` line the ledger's MiB are the
    server's (each entry's size printed to 2-3 decimals)."""
    _, recs = records(name)
    states = [r for r in recs if r["event"] == "host_cache_state"]
    assert len(states) == (DATA / f"{name}.log").read_text().count(" - cache state: ")
    for r in states:  # every size the log prints is rounded to 2 or 3 decimals
        assert r["ledger_mib"] == pytest.approx(r["mib"], rel=0.01, abs=0.002), r


@pytest.mark.parametrize(
    "name", [n for n in NAMES if "cache state: 1 prompts" in (DATA / f"{n}.log").read_text()]
)
def test_the_report_strip_follows_the_host_cache_and_says_host_memory(name: str, tmp_path: Path) -> None:
    """The timeline's strip under a llama-server run is its host-RAM prompt cache: up on a save,
    down on a load or an eviction, where the server's `cache state` lines say it is."""
    from replay.metrics.results import ResultsWriter, append_records
    from replay.report.plots import timeline
    from replay.report.view import load_run

    reqs, recs = records(name)
    path = tmp_path / "r.jsonl"
    ResultsWriter(path, {"target": {"kind": "llamacpp"}}).close()
    lines = [{"kind": "request", "status": "ok", "id": r["seq"], "session": "s", **r} for r in reqs]
    append_records(path, [*lines, *recs])
    view = load_run(path)
    assert view.cache == "host" and view.disk
    for state in (r for r in recs if r["event"] == "host_cache_state"):
        before = [p for p in view.disk if p.line is not None and p.line < state["line"]]
        level = before[-1].used_mib if before else 0.0
        assert level == pytest.approx(state["mib"], rel=0.01, abs=0.002), (state, before[-1:])
    svg = timeline(view)
    assert "host-cache memory in use (--cache-ram) (MiB)" in svg and "disk KV" not in svg


def test_checkpoints_created_restored_invalidated_and_slot_files_belong_to_no_request() -> None:
    got = by_step("llama_server_swa")
    cold = [r for r in got["A cold"] if r["event"] != "host_cache_state"]
    assert {(r["event"], r["reason"]) for r in cold} == {("store", "checkpoint")}
    back = got["A back"]
    assert any(r["event"] == "restore" and r["source"] == "checkpoint" and r["tokens"] == 1569 for r in back)
    assert any(r["event"] == "evict" and r["reason"] == "checkpoint_invalidated" for r in got["A + 60 words"])
    slot_files = [r for r in got["none"] if r.get("source") == "slot_file" or r.get("reason") == "slot_file"]
    assert [r["event"] for r in slot_files] == ["store", "restore"]


def test_forced_full_reprocessing_is_a_live_miss_of_that_request() -> None:
    got = by_step("llama_server_swa_forcing")
    miss = [r for r in got["branch at 500 words"] if r["event"] == "live_miss"]
    assert miss == [miss[0]] and miss[0]["reason"] == "full_reprocess" and miss[0]["prompt"] == 1514


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_any_cut_of_a_log_correlates_without_error_and_matches_each_request_once(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(NAMES))
    lines = (DATA / f"{name}.log").read_text().splitlines(keepends=True)
    start = data.draw(st.integers(0, len(lines)))
    end = data.draw(st.integers(start, len(lines)))
    drop = data.draw(st.sets(st.integers(start, max(start, end - 1)), max_size=20))
    kept = [ln for i, ln in enumerate(lines[start:end], start) if i not in drop]
    reqs = requests_of(name)
    recs = correlate(reqs, llamacpp.parse_lines(kept).events)
    seqs = [r["request_seq"] for r in recs if r["event"] == "request" and r["request_seq"] is not None]
    assert len(seqs) == len(set(seqs)) and set(seqs) <= {r["seq"] for r in reqs}
