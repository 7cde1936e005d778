"""The llama-server logs written in the server's shape (tests/data/llama/written/write.py): cache
paths the captured logs do not reach in a short run, parsed whole and followed entry by entry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from drivers.logs import llamacpp as L
from replay.metrics.results import ResultsWriter, append_records
from replay.report.view import load_run
from replay.serverside.logs import server_records

WRITTEN = Path(__file__).resolve().parents[2] / "data" / "llama" / "written"
# (prompt tokens, cached tokens) of each request, in the order sent.
REQUESTS = {
    "idle_slots_obsolete": [(1000, 0), (1000, 0), (1200, 1009), (1500, 5), (2000, 5), (1300, 1209)],
    "reuse_and_shift": [(4000, 0), (3950, 3600), (4000, 0)],
}


def records(name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    reqs = [
        {"seq": i, "id": i, "session": "s", "status": "ok", "prompt_tokens": p, "cached_tokens": c}
        for i, (p, c) in enumerate(REQUESTS[name], 1)
    ]
    return reqs, server_records("llamacpp", WRITTEN / f"{name}.log", reqs)


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_every_line_is_known_and_every_request_finds_its_task(name: str) -> None:
    log = L.parse_files([WRITTEN / f"{name}.log"])
    st = log.stats
    assert (st.unrecognised, st.unrecognised_cache, st.warnings) == (0, 0, [])
    assert st.recognised + st.known_ignored == st.lines
    reqs, recs = records(name)
    tasks = [r for r in recs if r["event"] == "request"]
    assert [r["request_seq"] for r in tasks] == [r["seq"] for r in reqs]


def test_idle_saves_obsolete_prompts_room_and_a_load_follow_the_server() -> None:
    _, recs = records("idle_slots_obsolete")
    host = [r for r in recs if "host_cache" in (str(r.get("reason")), str(r.get("source")))]
    host += [r for r in recs if str(r.get("reason") or "").startswith("host_cache_")]
    host.sort(key=lambda r: r["line"])
    sizes = [r.get("entry_mib") or r.get("mib") for r in host]  # a save's entry, else the line's MiB
    assert [
        (r["event"], r.get("reason") or r.get("source"), m) for r, m in zip(host, sizes, strict=True)
    ] == [
        ("store", "host_cache", 0.605),  # A from idle slot 0, with its checkpoint
        ("store", "host_cache", 0.605),  # B from idle slot 1
        ("store_skipped", "host_cache", 0.505),  # B again: already cached
        ("store", "host_cache", 0.805),  # A + 200 from idle slot 0, two checkpoints
        ("evict", "host_cache_obsolete", 0.605),  # ... which contains A
        ("store_skipped", "host_cache", 0.605),
        ("store", "host_cache", 0.855),  # C from idle slot 1 (B's checkpoint invalidated)
        ("evict", "host_cache_room", 0.605),  # B, the oldest
        ("store_skipped", "host_cache", 0.755),
        ("restore", "host_cache", 0.805),  # A + 200 loaded: it leaves the cache
        ("store", "host_cache", 1.105),  # D from idle slot 0
    ]
    skipped = [r["cause"] for r in recs if r["event"] == "store_skipped"]
    assert skipped == ["present", "present", "present"]
    restore = next(r for r in host if r["event"] == "restore")
    assert (restore["entry_tokens"], restore["taken"], restore["request_seq"]) == (1209, True, 6)
    states = [r for r in recs if r["event"] == "host_cache_state"]
    assert [r["mib"] for r in states] == [0.0, 0.0, 0.605, 1.21, 1.21, 1.41, 1.41, 1.66, 0.855, 1.96]
    assert all(r["ledger_mib"] == r["mib"] for r in states)


def test_the_strip_of_the_written_log_is_where_the_server_says(tmp_path: Path) -> None:
    reqs, recs = records("idle_slots_obsolete")
    path = tmp_path / "r.jsonl"
    ResultsWriter(path, {"target": {"kind": "llamacpp"}}).close()
    append_records(path, [{"kind": "request", **r} for r in reqs] + recs)
    view = load_run(path)
    assert view.cache == "host"
    for st in (r for r in recs if r["event"] == "host_cache_state"):
        before = [p for p in view.disk if p.line is not None and p.line < st["line"]]
        assert (before[-1].used_mib if before else 0.0) == pytest.approx(st["mib"], abs=1e-9)


def test_reused_chunks_a_context_shift_and_a_lora_change_are_records_of_their_requests() -> None:
    _, recs = records("reuse_and_shift")
    by = [(r["request_seq"], r["event"], r.get("reason") or r.get("source"), r.get("tokens")) for r in recs]
    assert (2, "restore", "cache_reuse", 1500) in by and (2, "restore", "cache_reuse", 1700) in by
    assert (2, "evict", "context_shift", 4095) in by
    assert any(seq == 3 and ev == "live_miss" and why == "lora_change" for seq, ev, why, _ in by)
