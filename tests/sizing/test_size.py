"""`replay size`: chain arithmetic and the offline sweep over traces (same model as the server)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from rich.console import Console

from replay.errors import ReplayError, UsageError
from replay.sim.model import events as ev
from replay.sim.model.config import GiB, MiB, config_for, parse_bytes, parse_tokens
from replay.sim.model.engine import CacheModel
from replay.sizing import (
    StaleFile,
    chain,
    chain_json,
    chain_table,
    jobs_from_requests,
    parse_budgets,
    parse_slots,
    parse_token_list,
    size_config,
    stale_files,
    sweep,
    sweep_json,
    sweep_table,
    sweep_trace,
)
from replay.sizing import parallel as size_parallel
from replay.sizing.parallel import PARALLEL_FROM_BYTES, auto_workers
from replay.trace import TraceWriter
from replay.trace.synth import synth_text
from tests.support.sim_workloads import Convo, run_turn, system_message

QWEN = config_for("qwen38-q2")


def test_chain_depends_on_the_prefill_chunk_and_the_interval() -> None:
    assert [f.tokens for f in chain(50_000, cfg=QWEN.with_(prefill_chunk=4_096)).files] == [
        20_480,
        40_960,
        50_000,
    ]
    doubled = chain(130_000, cfg=QWEN.with_(kv_cache_continued_interval_tokens=20_480))
    assert len(doubled.files) == 7 and doubled.total_bytes < 0.65 * chain(130_000, cfg=QWEN).total_bytes


def test_chain_of_a_short_read_has_its_cold_save() -> None:
    c = chain(11_732, cfg=QWEN)
    assert [(f.tokens, f.reason) for f in c.files] == [(10_240, "cold"), (11_732, "evict")]
    with_anchor = chain(20_000, cfg=QWEN, anchor=3_000)
    assert with_anchor.files[0].tokens == 3_000 and with_anchor.files[0].reason == "cold"


def test_chain_table_renders() -> None:
    console = Console(width=140, record=True)
    console.print(chain_table(chain(77_000, start=14_336, cfg=QWEN), others=[63_000], cfg=QWEN))
    text = console.export_text()
    assert "71,680" in text and "--kv-disk-space-mb" in text


def test_size_parsing() -> None:
    assert parse_bytes("34.5KiB") == 35_328
    assert (
        parse_bytes("24G") == 24 * GiB and parse_bytes("64GB") == 64 * 10**9 and parse_bytes("4096") == 4096
    )
    assert parse_tokens("77K") == 77_000 and parse_tokens("1.5M") == 1_500_000
    with pytest.raises(UsageError):
        parse_bytes("lots")


def _write_trace(path: Path) -> Path:
    """Two tool sessions sharing a system prompt, alternating, with recorded replies that differ
    from what any server would generate."""
    system = {"role": "system", "content": synth_text(3_000, 1)}
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    with TraceWriter(path, source="test") as w:
        w.session("a")
        w.session("b")
        hist = {"a": [system, {"role": "user", "content": synth_text(20_000, 2)}]}
        hist["b"] = [system, {"role": "user", "content": synth_text(15_000, 3)}]
        for turn in range(4):
            for name in ("a", "b"):
                msg = {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": f"{name}{turn}", "name": "bash", "arguments": "{}"}],
                }
                reply = {"message": msg, "finish": "tool_calls", "output_tokens": 40}
                w.request(
                    name,
                    10.0 * (2 * turn + (name == "b")),
                    hist[name],
                    {"max_tokens": 40, "tools": tools},
                    reply=reply,
                )
                hist[name] = [
                    *hist[name],
                    msg,
                    {
                        "role": "tool",
                        "tool_call_id": f"{name}{turn}",
                        "content": synth_text(2_000, 10 * turn + 7),
                    },
                ]
    return path


def test_sweep_over_a_trace_live_vs_recorded_history(tmp_path: Path) -> None:
    trace = _write_trace(tmp_path / "t.jsonl")
    budgets = [256 * MiB, 8 * GiB]
    live = sweep_trace(trace, budgets, cfg=QWEN, history="live", target_reread=3_000)
    recorded = sweep_trace(trace, budgets, cfg=QWEN, history="recorded")
    for rows in (live.rows, recorded.rows):
        assert [r.requests for r in rows] == [8, 8] and all(r.switches == 6 for r in rows)
    small, big = live.rows
    assert big.reread_max <= 3_000 < small.reread_max  # at 256 MiB nothing of a 20K session fits
    assert live.best_budget == 8 * GiB
    # recorded replies never match what the server generated: restores stop short of them
    assert recorded.rows[1].reprocessed_tokens > big.reprocessed_tokens
    console = Console(width=200, record=True)
    console.print(sweep_table(live))
    assert "smallest budget" in console.export_text()


def test_sweep_agrees_with_the_model_run_request_by_request() -> None:
    """The sweep's numbers are the cache model's: same requests, same cached tokens, same totals."""
    cfg = QWEN.with_(kv_disk_space_mb=4 * 1024)
    system = system_message(5_000)
    convos = [Convo("a", system, 30_000, 1), Convo("b", system, 40_000, 2)]
    model = CacheModel(cfg, progress=False)
    direct, requests = [], []
    for i, convo in enumerate(convos * 3, 1):
        requests.append(convo.request())
        result, _ = run_turn(model, convo, i, cfg, grow=3_000, gap_s=0.0)
        direct.append(result)
    row = sweep(jobs_from_requests(requests, cfg), [4 * GiB], cfg=cfg).rows[0]
    assert row.reprocessed_tokens == sum(r.reprocessed_tokens for r in direct)
    assert row.reread_max == max(r.reprocessed_tokens for r in direct[2:])
    swept = CacheModel(cfg, progress=False)
    cached = []
    for _, job in jobs_from_requests(requests, cfg):
        swept.run_until_idle()
        swept.submit(job, swept.now)
        cached += [e.result.cached_tokens for e in swept.run_until_idle() if isinstance(e, ev.Finished)]
    assert cached == [r.cached_tokens for r in direct]


def test_timed_plan_overlaps_requests_and_slots_fill() -> None:
    system = system_message(5_000)
    convos = [Convo("a", system, 30_000, 1), Convo("b", system, 30_000, 2)]
    requests = []
    for turn in range(3):
        for k, convo in enumerate(convos):
            req = convo.request()
            requests.append(
                type(req)(req.session, req.messages, req.max_tokens, 1000.0 * turn + k, req.tools, req.finish)
            )
            convo.answer(convo.job(0, QWEN).reply, 1_000)
    report = sweep(
        jobs_from_requests(requests, QWEN),
        [16 * GiB],
        cfg=QWEN,
        plan="timed",
        slots=[None, 2],
        routings=["reuse-aware"],
    )
    one, two = report.rows
    assert (one.slots, two.slots) == (1, 2)
    assert one.live_misses > 0 and two.live_misses == 0 and two.restores == 0
    assert two.wait_p50_s < one.wait_p50_s


def test_stale_files_take_space_and_never_match() -> None:
    system = system_message(5_000)
    a, b = Convo("a", system, 40_000, 1), Convo("b", system, 40_000, 2)
    requests = []
    for convo in (a, b, a, b):
        requests.append(convo.request())
        convo.answer(convo.job(0, QWEN).reply, 2_000)
    clean = sweep(jobs_from_requests(requests, QWEN), [8 * GiB], cfg=QWEN).rows[0]
    old = stale_files(6 * GiB, QWEN)
    assert len(old) == 2 and all(isinstance(f, StaleFile) for f in old)
    crowded = sweep(jobs_from_requests(requests, QWEN), [8 * GiB], cfg=QWEN, stale=old).rows[0]
    assert crowded.reprocessed_tokens > clean.reprocessed_tokens
    assert crowded.evictions_zero_hits == crowded.evictions > 0


def test_cli_helpers_build_configs_and_json() -> None:
    cfg = size_config("deepseek-v4-flash", per_token="13.45KiB", interval=20_480, chunk=2_048)
    assert cfg.bytes_per_token == 13_772 and cfg.continued_step == 20_480 and cfg.prefill_chunk == 2_048
    assert cfg.fixed_bytes == int(22.9 * MiB)  # the preset's, since --fixed was not given
    with pytest.raises(UsageError):
        size_config("no-such-model")
    assert parse_token_list("130K, 63K") == [130_000, 63_000] and parse_token_list("") == []
    assert parse_budgets("4G,64G") == [4 * GiB, 64 * GiB]
    assert parse_slots("1,2") == [None, 2]
    data = chain_json(chain(130_000, cfg=QWEN), others=[130_000] * 3, cfg=QWEN)
    assert data["total_bytes"] == sum(f["bytes"] for f in data["files"]) and data["budget_bytes"] < 50e9
    report = sweep(iter([]), [GiB], cfg=QWEN, target_reread=1)
    assert sweep_json(report)["rows"][0]["requests"] == 0


def test_sweep_in_worker_processes_gives_the_rows_of_one_process(tmp_path: Path) -> None:
    trace = _write_trace(tmp_path / "t.jsonl")
    budgets = [256 * MiB, 8 * GiB, 2 * GiB]  # not sorted: rows come back in the order asked
    seen: list[tuple[int, int]] = []
    one = sweep_trace(trace, budgets, cfg=QWEN, target_reread=3_000)
    two = sweep_trace(
        trace, budgets, cfg=QWEN, target_reread=3_000, workers=2, progress=lambda d, t: seen.append((d, t))
    )
    assert two.rows == one.rows and two.best_budget == one.best_budget is not None
    assert [r.budget_bytes for r in two.rows] == budgets
    lines = len(trace.read_text().splitlines())
    assert seen[0] == (0, lines) and seen[-1] == (lines, lines)  # progress through the trace's lines


@pytest.mark.parametrize(
    "options",
    [
        {"history": "recorded"},
        {"plan": "timed", "speed": 4.0},
        {"slots": [None, 2], "routings": ["upstream", "reuse-aware"]},
        {"stale": [StaleFile(81_920)] * 3, "cfg": QWEN.with_(hidden_reasoning=True)},
    ],
    ids=["recorded", "timed", "layouts", "stale-hidden"],
)
def test_every_sweep_option_crosses_to_the_workers(tmp_path: Path, options: dict[str, Any]) -> None:
    trace = _write_trace(tmp_path / "t.jsonl")
    options = {"cfg": QWEN, **options}
    budgets = [256 * MiB, 12 * GiB, 3 * GiB]
    one = sweep_trace(trace, budgets, **options)
    three = sweep_trace(trace, budgets, workers=3, **options)
    assert three.rows == one.rows


def test_a_bad_trace_line_stops_a_parallel_sweep_with_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "trace", "format": "agent-replay-trace/1"}\n{"kind": "request"\n')
    with pytest.raises(ReplayError, match=r"bad.jsonl:2"):
        sweep_trace(bad, [GiB, 2 * GiB], cfg=QWEN, workers=2)


def test_a_dead_sweep_worker_is_one_clear_error(tmp_path: Path) -> None:
    trace = _write_trace(tmp_path / "t.jsonl")

    def kill_the_worker(done: int, total: int) -> None:
        if done == 0:  # before the first batch is sent
            kids = psutil.Process().children()
            (worker,) = [k for k in kids if "spawn_main" in " ".join(k.cmdline())]  # not the resource tracker
            worker.kill()
            deadline = time.monotonic() + 10
            while worker.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
                time.sleep(0.01)  # dead, and left for the sweep to reap

    with pytest.raises(ReplayError, match=r"sweep worker 1 \(pid \d+\) exited with code -9"):
        sweep_trace(trace, [GiB, 2 * GiB], cfg=QWEN, workers=2, progress=kill_the_worker)


def test_auto_workers_one_per_core_for_big_traces(tmp_path: Path, monkeypatch) -> None:
    small, big = tmp_path / "small.jsonl", tmp_path / "big.jsonl"
    small.write_text("{}\n")
    with open(big, "wb") as f:
        f.truncate(PARALLEL_FROM_BYTES)  # sparse: only its size matters
    monkeypatch.setattr(size_parallel.os, "cpu_count", lambda: 8)
    assert auto_workers(small, 20) == 1  # not worth a second process
    assert auto_workers(big, 20) == 8  # a core each
    assert auto_workers(big, 3) == 4  # the reading process, and at most one more per budget
