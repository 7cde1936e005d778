"""The benchmark's arithmetic and its markdown verdict: error matching, target checks, parsers."""

from __future__ import annotations

from pathlib import Path

import orjson

from bench import main as bench_main
from bench.peers import TreeCpu, points_from
from bench.report import checks, markdown
from bench.stats import percentile, ttft_errors
from bench.wrk import parse_wrk

MS = 1_000_000


def _row(sid, rid, arrival, first, done=None):
    return [sid, rid, arrival, first, done if done is not None else first + MS, 64, 100]


def test_errors_are_matched_by_key_not_by_order():
    truth = {"a": _row(1, "a", 0, 20 * MS), "b": _row(2, "b", 0, 500 * MS)}
    # Listed in the opposite order to the truth rows; one key the server never saw.
    stats = ttft_errors({"b": 501.0, "a": 20.5, "zz": 3.0}, truth)
    assert stats.n == 2 and stats.unmatched == 1
    assert (stats.p50_ms, stats.max_ms) == (0.5, 1.0)
    assert stats.truth_p99_ms == 500.0


def test_percentile_is_nearest_rank():
    values = list(range(1, 101))
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_peer_points_use_server_stamps_for_rate_and_cpu():
    truth = {
        f"#{i}": _row(i, None, i * 10 * MS, i * 10 * MS + 20 * MS, i * 10 * MS + 25 * MS)
        for i in range(1, 11)
    }
    truth["#99"] = _row(99, None, 0, 20 * MS)
    records = [(4, f"#{i}", 21.0) for i in range(1, 11)] + [(1, "#99", 20.5)]
    cpu = TreeCpu(pid=0)
    cpu.samples = [(0, 0.0), (200 * MS, 0.2)]  # 1 CPU-second per second
    points = points_from(records, truth, cpu)
    assert [p.concurrency for p in points] == [1, 4]
    p4 = points[1]
    assert p4.requests == 10
    # 10 requests between the first arrival (10 ms) and the last done (125 ms).
    assert p4.rate == round(10 / 0.115, 1)
    assert p4.cpu_ms_per_request == round(0.115 / 10 * 1e3, 3)
    assert p4.error.p50_ms == 1.0


def test_parse_wrk_output():
    text = """Running 5s test @ http://127.0.0.1:1/v1/models
  Latency Distribution
     50%    1.62ms
     75%    2.00ms
     90%    3.00ms
     99%  850.00us
  91000 requests in 5.00s, 10.00MB read
Requests/sec:  18318.42
"""
    assert parse_wrk(text) == {"rate": 18318.42, "latency_p50_ms": 1.62, "latency_p99_ms": 0.85}


def _results(p99_500: float, ours_rate: float, peer_rate: float, sessions: int = 1000) -> dict:
    err = {"p50_ms": 0.2, "p99_ms": p99_500, "max_ms": 3.0, "truth_p50_ms": 500.0, "truth_p99_ms": 501.0}
    acc = {
        "label": "acc-500",
        "concurrency": 500,
        "first_token_ms": 500.0,
        "requests": 10,
        "in_flight_mean": 400.0,
        "rate": 100.0,
        "ttft_error": err,
    }
    point = {
        "workers": 1,
        "concurrency": 64,
        "rate": ours_rate,
        "ttft_error": err,
        "cpu_ms_per_request": 2.0,
        "server_cpu": 0.1,
    }
    rate = {
        "workers": 1,
        "points": [point],
        "max_rate": ours_rate,
        "max_rate_point": "c64",
        "error_p99_at_max_ms": 3.0,
        "max_rate_within_budget": ours_rate,
        "cpu_ms_per_request": 2.0,
    }
    peer = {
        "name": "inference-perf",
        "version": "0.7.0",
        "status": "ok",
        "reason": "",
        "max_rate": peer_rate,
        "max_rate_concurrency": 200,
        "error_p50_at_max_ms": 5.0,
        "error_p99_at_max_ms": 50.0,
        "error_1_stream": err,
        "venv_mib": 800.0,
        "cpu_ms_per_request_at_max": 2.1,
        "points": [],
    }
    missing = {
        "name": "guidellm",
        "version": "0.8.1",
        "status": "not-installed",
        "reason": "torch pulls CUDA",
        "max_rate": None,
    }
    return {
        "meta": {"started": "t", "host": "h", "cpus": 2, "python": "3.11", "quick": False},
        "accuracy": {"points": [acc]},
        "rate": {"w1": rate},
        "peers": {
            "peers": [peer, missing],
            "vllm": {"status": "not-installed", "reason": "CUDA", "version": "0.33.0"},
        },
        "memory": {
            "sessions": sessions,
            "history_tokens": 130000,
            "peak_rss_mib": 700.0,
            "concurrency": 16,
            "requests": 2 * sessions,
            "request_bytes_sent": 10**9,
            "trace_bytes": 10**5,
            "rss_loaded_mib": 40.0,
            "wall_s": 30.0,
            "cpu_s": 20.0,
        },
        "trace": {
            "bytes": 1_000_000_000,
            "validate_mb_s": 250.0,
            "load_mb_s": 150.0,
            "load_peak_rss_mib": 1100.0,
        },
    }


def test_checks_say_met_missed_and_by_how_much():
    found = checks(_results(p99_500=2.5, ours_rate=900.0, peer_rate=800.0))
    by_name = {c.name.removesuffix(" on 1.00 GB"): c for c in found}
    acc = by_name["TTFT error p99 at 500 streams, 500 ms to first token"]
    assert acc.met is False and "missed by 1.50 ms" in acc.gap
    rate = by_name["max rate vs fastest Python peer"]
    assert rate.met is False and "1.12x" in rate.gap and "needs 3200 req/s" in rate.gap
    cpu = by_name["client CPU per request at max rate, 1 worker"]
    assert cpu.met is False and "2.00 ms" in cpu.measured
    assert (
        by_name["max rate, 1 worker"].met is False
        and "missed by 1600.0 req/s" in by_name["max rate, 1 worker"].gap
    )
    assert by_name["max rate, 2 workers"].met is None  # no 2-worker point in this run
    assert "floor" not in cpu.gap  # no floor point in this run to compare with
    with_floor = _results(p99_500=2.5, ours_rate=900.0, peer_rate=800.0)
    with_floor["rate"]["floor"] = [{"cpu_ms_per_request": 0.5}, {"cpu_ms_per_request": 0.44}]
    slow = {c.name: c for c in checks(with_floor)}
    assert slow["client CPU per request at max rate, 1 worker"].gap.endswith(
        "; the bare Python floor spent 0.44 ms a request in this run"
    )
    assert "floor" in slow["max rate, 1 worker"].gap
    assert by_name["RSS, 1,000 sessions x 130K tokens"].met is True
    assert by_name["trace validate"].met is True
    assert by_name["trace load (validate + build)"].met is False
    assert (
        by_name["trace load peak RSS"].met is False
        and "1100.00 MiB" in by_name["trace load peak RSS"].measured
    )
    assert by_name["slow-morning end to end on the simulator"].met is None

    ok = {c.name: c for c in checks(_results(p99_500=0.8, ours_rate=3300.0, peer_rate=800.0, sessions=100))}
    assert ok["TTFT error p99 at 500 streams, 500 ms to first token"].met is True
    assert ok["max rate vs fastest Python peer"].met is True
    slower = _results(p99_500=0.8, ours_rate=3300.0, peer_rate=800.0)
    slower["accuracy"]["points"][0]["first_token_ms"] = 5000.0  # easier than the target's setting
    acc5000 = {c.name: c for c in checks(slower)}["TTFT error p99 at 500 streams, 500 ms to first token"]
    assert acc5000.met is None
    assert ok["max rate, 1 worker"].met is True
    assert ok["RSS, 1,000 sessions x 130K tokens"].met is None  # a quick run's 100 sessions prove nothing


def test_markdown_has_the_targets_and_the_peer_table():
    text = markdown(_results(p99_500=2.5, ours_rate=900.0, peer_rate=800.0))
    assert (
        "| TTFT error p99 at 500 streams, 500 ms to first token | <= 1 ms | 2.50 ms | **missed** | missed by 1.50 ms"
        in text
    )
    assert "| inference-perf 0.7.0 | 800 req/s | 200 |" in text
    assert "1.12x" in text  # rate ratio ours / peer
    assert "guidellm 0.8.1 | – |" in text and "not-installed: torch pulls CUDA" in text
    assert "vllm bench serve 0.33.0" in text


def test_a_failed_section_is_reported_not_fatal():
    results = _results(p99_500=0.5, ours_rate=1.0, peer_rate=1.0)
    results["memory"] = {"status": "failed", "reason": "RuntimeError: boom"}
    results["trace"] = {"status": "failed", "reason": "OSError: disk"}
    text = markdown(results)
    assert "Section failed: RuntimeError: boom" in text
    assert "Trace read throughput: failed (OSError: disk)" in text


def test_partial_runs_keep_earlier_sections(tmp_path: Path):
    (tmp_path / "memory.json").write_bytes(
        orjson.dumps({"section": "memory", "measured": "yesterday", "data": {"sessions": 5}})
    )
    (tmp_path / "rate.json").write_bytes(
        orjson.dumps({"section": "rate", "measured": "yesterday", "data": {"w1": {}}})
    )
    results, when = bench_main.load_previous(tmp_path, skip=["rate"])
    assert results == {"memory": {"sessions": 5}} and when == {"memory": "yesterday"}
    args = bench_main.parse_args(["--quick", "--only", "rate,memory"])
    assert args.sections == ["rate", "memory"] and args.duration == 10.0  # quick points: >= 10 s
    quick = bench_main.parse_args(["--quick"]).sections
    assert "peers" not in quick and "server" not in quick
    assert "peers" in bench_main.parse_args([]).sections


def test_the_imports_section_has_a_row_and_an_rss_check_per_kind():
    results = _results(p99_500=0.5, ours_rate=1.0, peer_rate=1.0)
    weka = {
        "kind": "weka",
        "input_mb": 100.0,
        "output_mb": 730.0,
        "import_s": 20.0,
        "import_cpu_s": 16.0,
        "mb_per_s": 5.0,
        "mb_per_cpu_s": 6.2,
        "peak_rss_mib": 90.0,
        "result": "1,000 requests in 60 sessions from weka",
    }
    otel = {**weka, "kind": "otel", "peak_rss_mib": 600.0}
    failed = {"kind": "swe-agent", "status": "failed", "error": ["UsageError: boom"]}
    results["imports"] = {"mb": 100.0, "rss_target_mib": 512.0, "kinds": [weka, otel, failed]}
    by_name = {c.name: c for c in checks(results)}
    assert by_name["import weka peak RSS on 100 MB"].met is True
    assert by_name["import otel peak RSS on 100 MB"].met is False
    text = markdown(results)
    assert "## Importers of the public corpora (100 MB a kind)" in text
    assert (
        "| weka | 100.0 | 730.0 | 20.0 | 5.0 | 6.2 | 90 MiB | 1,000 requests in 60 sessions from weka |"
        in text
    )
    assert "| swe-agent | failed: UsageError: boom |" in text
    assert "--imports-mb 2048" in text
    assert "Measured " not in text  # a section run by `just bench` says nothing more
    results["imports"] |= {"measured": "2026-12-04", "host": "vm (2 cores)", "build": "pure Python"}
    assert "\nMeasured 2026-12-04 on vm (2 cores) (pure Python), one kind at a time\n" in markdown(results)


def test_imports_run_small_in_a_quick_run_and_at_any_size_when_asked():
    assert "imports" in bench_main.parse_args([]).sections
    assert bench_main.parse_args(["--quick"]).imports_mb == bench_main.IMPORTS_QUICK_MB
    assert bench_main.parse_args([]).imports_mb == bench_main.IMPORTS_MB
    assert bench_main.parse_args(["--only", "imports", "--imports-mb", "2048"]).imports_mb == 2048.0
