"""Our own client under the benchmark: accuracy at K streams in flight, and its maximum rate.

Every point is a real `run_workers` replay (the same code path as `replay run --workers N`) of a
synthetic trace against the reference server; the server's truth log is read right after, and
each record is matched to its truth row by the X-Request-ID the engine sent.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.server import RunningServer
from bench.stats import ErrorStats, percentile, ttft_errors
from bench.workload import stream_trace
from replay.engine.plans import make_plan
from replay.engine.run import EngineConfig
from replay.metrics.results import read_results
from replay.runs.workers import run_workers
from replay.trace.reader import read_trace

ERROR_P99_BUDGET_MS = 5.0  # the rate target: the fastest rate whose TTFT error p99 stays within it
ACCURACY_FIRST_TOKEN_MS = 500.0  # the accuracy target: 500 streams in flight, 500 ms to first token


@dataclass(slots=True)
class Point:
    """One measured load point."""

    label: str
    concurrency: int
    workers: int
    first_token_ms: float
    tokens: int
    requests: int = 0  # completed ok
    errors: int = 0
    wall_s: float = 0.0
    rate: float = 0.0  # completed requests per second
    cpu_ms_per_request: float | None = None
    in_flight_mean: float = 0.0  # mean streams open, from the records (sum of latencies / wall)
    server_cpu: float = 0.0  # fraction of one core the server used
    host_load: float = 0.0  # 1-minute load average after the point (other work on the host)
    reused: float = 0.0  # share of requests sent on a kept connection
    client_queue_p99_ms: float | None = None  # first tokens' wait in the client after their stamp
    error: ErrorStats = field(default_factory=ErrorStats)

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__slots__ if k != "error"}
        out["ttft_error"] = self.error.to_json()
        return out


def drive(
    srv: RunningServer,
    work: Path,
    label: str,
    concurrency: int,
    requests: int,
    workers: int = 1,
    first_token_ms: float = 20.0,
    tokens: int = 64,
    max_duration_s: float | None = None,
) -> Point:
    """Keep `concurrency` streams in flight (closed loop) for `requests` or `max_duration_s`."""
    trace = stream_trace(
        work / f"{label}.trace.jsonl",
        requests,
        output_tokens=tokens,
        bench={"first_token_ms": first_token_ms},
    )
    config = EngineConfig(base_url=srv.url, run_id=label, timeout_s=120.0)
    srv.clear()
    cpu0 = srv.cpu_s()
    t0 = time.perf_counter()
    outcome = run_workers(
        read_trace(trace),
        make_plan("overlap", concurrency=concurrency),
        config,
        work / f"{label}.results.jsonl",
        {"kind": "refserver", "url": srv.url},
        workers,
        max_duration_s,
    )
    elapsed = time.perf_counter() - t0
    server_cpu = srv.cpu_s() - cpu0
    truth = srv.truth(clear=True)
    records = [
        r
        for r in read_results(outcome.out).requests
        if r.get("status") == "ok" and r.get("ttft_s") is not None
    ]
    point = Point(label, concurrency, workers, first_token_ms, tokens)
    point.errors = outcome.errors
    point.requests = len(records)
    point.host_load = round(os.getloadavg()[0], 2)
    if not records:
        return point
    # Rate over the server-stamped window, exactly as the peers' rates are taken.
    rows = [truth[f"{label}-{r['id']}"] for r in records if f"{label}-{r['id']}" in truth]
    rows = [row for row in rows if row[4] is not None]
    if rows:
        point.wall_s = round((max(row[4] for row in rows) - min(row[2] for row in rows)) / 1e9, 3)
    if point.wall_s > 0:
        point.rate = round(len(rows) / point.wall_s, 1)
        point.in_flight_mean = round(sum(r["latency_s"] for r in records) / point.wall_s, 1)
    cpu = sum(p.cpu_s for p in outcome.parts)
    point.cpu_ms_per_request = round(cpu / len(records) * 1e3, 3)
    point.server_cpu = round(server_cpu / max(elapsed, 1e-9), 3)
    point.reused = round(sum(1 for r in records if r.get("reused")) / len(records), 3)
    q99 = percentile(sorted(r["client_queue_s"] for r in records if r.get("client_queue_s") is not None), 99)
    if q99 is not None:
        point.client_queue_p99_ms = round(q99 * 1e3, 3)
    point.error = ttft_errors({f"{label}-{r['id']}": r["ttft_s"] * 1e3 for r in records}, truth)
    return point


def accuracy(srv: RunningServer, work: Path, quick: bool) -> list[Point]:
    """TTFT error at 1, 100 and 500 streams in flight.

    Many streams are held open by a long first-token delay rather than a high rate, so the point
    measures open streams, not throughput (500 streams at 20 ms would need 25,000 req/s). 500
    streams at the target's 500 ms to first token run at ~1,000 req/s, a quarter of one process's ceiling.
    """
    # Points of about 10 s (quick) or 20 s: one stream at ~21 ms, 100 at ~100 req/s, 500 at ~1,000.
    plan = [("acc-1", 1, 20.0, 500 if quick else 1000), ("acc-100", 100, 1000.0, 1000 if quick else 2000)]
    plan.append(("acc-500", 500, ACCURACY_FIRST_TOKEN_MS, 10_000 if quick else 20_000))
    return [drive(srv, work, label, c, n, first_token_ms=ftd) for label, c, ftd, n in plan]


def max_rate(srv: RunningServer, work: Path, workers: int, quick: bool, duration_s: float) -> dict[str, Any]:
    """Closed-loop sweep of concurrency; reports every point, the best, and the best within budget.

    Concurrency is the run's total (split between the workers), so the ladder scales with them;
    a quick run measures one point per worker count. The trace is sized for twice the rate
    expected, so a point ends at `duration_s`, not by running out of requests.
    """
    ladder = (128,) if quick else (4, 16, 32, 64, 128)
    points: list[Point] = []
    estimate = 2500.0 * workers
    for per_worker in ladder:
        c = per_worker * workers
        n = max(c * 4, 10_000, int(estimate * duration_s * 2))
        point = drive(srv, work, f"rate-w{workers}-c{c}", c, n, workers=workers, max_duration_s=duration_s)
        points.append(point)
        estimate = max(point.rate * 1.3, 200.0)
    best = max(points, key=lambda p: p.rate)
    within = [p for p in points if p.error.p99_ms is not None and p.error.p99_ms <= ERROR_P99_BUDGET_MS]
    best_within = max(within, key=lambda p: p.rate) if within else None
    return {
        "workers": workers,
        "points": [p.to_json() for p in points],
        "max_rate": best.rate,
        "max_rate_point": best.label,
        "max_rate_concurrency": best.concurrency,
        "error_p99_at_max_ms": best.error.p99_ms,
        "max_rate_within_budget": best_within.rate if best_within else None,
        "within_budget_point": best_within.label if best_within else None,
        "cpu_ms_per_request": (best_within or best).cpu_ms_per_request,
    }
