"""Spread one run over several processes (`--workers N`) or hosts (`--shard i/N`), merge it exactly.

One Python process saturates one core; a run that needs more is split by session. Each session
belongs to one shard, chosen by a stable hash of its id (the same on every host and Python
version), so a session's turns, history and live replies never leave the process that owns them.
Each shard writes an ordinary results file; merging adds their encoded HDR histograms, which
gives the same percentiles as one process that saw every request.

Across hosts: host k runs `replay run TRACE --shard k/N --out part-k.jsonl` (shards are numbered
1..N) and `replay report part-*.jsonl` merges the files.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import queue as queue_mod
import resource
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from replay.engine.plans import Plan
from replay.engine.run import EngineConfig
from replay.errors import ReplayError, UsageError
from replay.metrics.hist import Summary
from replay.metrics.results import FORMAT, read_results
from replay.trace.model import Trace

_BARRIER_TIMEOUT_S = 600.0


def parse_shard(spec: str) -> tuple[int, int]:
    """`"2/4"` -> (2, 4); shards are numbered from 1."""
    index, slash, count = spec.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i = n = 0
    if not slash or n < 1 or not 1 <= i <= n:
        raise UsageError(f"--shard must be i/N with 1 <= i <= N (e.g. 1/2), not {spec!r}")
    return i, n


def shard_of(session_id: str, count: int) -> int:
    """The shard (1..count) that owns a session: a hash that no process or host can disagree on."""
    digest = hashlib.blake2b(session_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count + 1


def select_shard(trace: Trace, index: int, count: int) -> Trace:
    """The part of `trace` that shard `index` of `count` replays.

    A request that waited (`after.request`) for a request of another shard would wait forever
    in this process, so that one dependency is dropped; its own session's replies stay.
    """
    if not 1 <= index <= count:
        raise UsageError(f"shard {index} is not between 1 and {count}")
    sessions = {sid: s for sid, s in trace.sessions.items() if shard_of(sid, count) == index}
    mine = {r.id for r in trace.requests if r.session in sessions}
    requests = []
    for req in trace.requests:
        if req.session not in sessions:
            continue
        after = req.after
        if after and after.get("request") is not None and after["request"] not in mine:
            after = {k: v for k, v in after.items() if k != "request"}
            req = replace(req, after=after)
        requests.append(req)
    return Trace(path=trace.path, header=trace.header, sessions=sessions, requests=requests)


def part_path(out: Path, index: int, count: int) -> Path:
    return out.with_name(f"{out.stem}.part{index}of{count}{out.suffix or '.jsonl'}")


@dataclass(slots=True)
class WorkerReport:
    """What one worker process did, measured by itself."""

    shard: int
    count: int
    out: str
    outcome: str = ""
    requests: int = 0
    errors: int = 0
    cancelled: int = 0
    exit_code: int = 0
    wall_s: float = 0.0  # run only, after the trace was loaded
    cpu_s: float = 0.0  # user + system CPU of the run only
    rss_loaded_mib: float = 0.0  # resident memory with the trace loaded, before the run
    peak_rss_mib: float = 0.0  # the process's high-water mark
    error: str | None = None


@dataclass(slots=True)
class WorkersOutcome:
    out: str
    parts: list[WorkerReport] = field(default_factory=list)
    summary: Summary = field(default_factory=Summary)

    @property
    def requests(self) -> int:
        return sum(p.requests for p in self.parts)

    @property
    def errors(self) -> int:
        return sum(p.errors for p in self.parts)

    @property
    def exit_code(self) -> int:
        return max((p.exit_code for p in self.parts), default=0)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def run_shard(
    trace_path: str,
    index: int,
    count: int,
    plan: Plan,
    config: EngineConfig,
    out: str,
    target: dict[str, Any],
    max_duration_s: float | None = None,
    barrier: Any = None,
) -> WorkerReport:
    """Load the trace, keep shard `index`, replay it; `barrier` lines the shards' starts up."""
    from replay.runs.pipeline import run_trace
    from replay.trace.reader import read_trace

    report = WorkerReport(shard=index, count=count, out=out)
    trace = select_shard(read_trace(trace_path), index, count)
    report.rss_loaded_mib = round(_rss_mib(), 1)
    if barrier is not None:
        barrier.wait(_BARRIER_TIMEOUT_S)
    cpu0, t0 = _cpu_s(), time.perf_counter_ns()
    outcome = run_trace(trace, plan, config, out, {**target, "shard": f"{index}/{count}"}, max_duration_s)
    report.wall_s = round((time.perf_counter_ns() - t0) / 1e9, 4)
    report.cpu_s = round(_cpu_s() - cpu0, 4)
    report.peak_rss_mib = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    report.outcome, report.requests, report.errors = outcome.outcome, outcome.requests, outcome.errors
    report.cancelled, report.exit_code = outcome.cancelled, outcome.exit_code
    return report


def _worker_main(args: tuple[Any, ...], barrier: Any, queue: Any) -> None:
    index, count = args[1], args[2]
    try:
        report = run_shard(*args, barrier=barrier)
    except BaseException as exc:  # reported to the parent, which decides; never a silent worker death
        if barrier is not None:
            barrier.abort()
        report = WorkerReport(shard=index, count=count, out=args[5], outcome="failed", exit_code=1)
        report.error = f"shard {index}/{count}: {type(exc).__name__}: {exc}"
    queue.put(asdict(report))


def run_workers(
    trace_path: str | Path,
    plan: Plan,
    config: EngineConfig,
    out: str | Path,
    target: dict[str, Any],
    workers: int,
    max_duration_s: float | None = None,
) -> WorkersOutcome:
    """Replay `trace_path` in `workers` processes, one shard each, then merge into `out`.

    Every worker loads the trace and waits at a barrier, so the shards start together (a timed
    plan's clock starts at the same moment in each). Part files stay next to `out`.
    """
    if workers < 1:
        raise UsageError("--workers must be at least 1")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")  # no fork: the parent may hold threads and an event loop
    barrier = ctx.Barrier(workers)
    queue = ctx.Queue()
    procs = []
    for index in range(1, workers + 1):
        part = str(part_path(out, index, workers))
        args = (str(trace_path), index, workers, plan, config, part, target, max_duration_s)
        proc = ctx.Process(target=_worker_main, args=(args, barrier, queue), name=f"replay-shard-{index}")
        proc.start()
        procs.append(proc)
    reports: list[WorkerReport] = []
    try:
        while len(reports) < workers:
            try:
                reports.append(WorkerReport(**queue.get(timeout=1.0)))
            except queue_mod.Empty:  # check that no worker died without reporting
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead and len(reports) + len(dead) >= workers:
                    for p in dead:
                        index = procs.index(p) + 1
                        msg = f"shard {index}/{workers}: worker exited with code {p.exitcode}"
                        reports.append(
                            WorkerReport(
                                shard=index, count=workers, out="", outcome="failed", exit_code=1, error=msg
                            )
                        )
    finally:
        for proc in procs:
            proc.join()
    reports.sort(key=lambda r: r.shard)
    parts = [Path(r.out) for r in reports if r.out and Path(r.out).exists()]
    if not parts:
        problems = "; ".join(r.error or f"shard {r.shard}: no results" for r in reports)
        raise ReplayError(f"no shard wrote a results file: {problems}")
    summary = merge_results(parts, out, workers=workers)
    return WorkersOutcome(out=str(out), parts=reports, summary=summary)


def merge_results(parts: list[Path], out: Path, workers: int | None = None) -> Summary:
    """Write one results file from several: the first header, every request, one merged summary."""
    summary = Summary()
    totals = {"requests": 0, "errors": 0, "cancelled": 0}
    outcomes: list[str] = []
    duration = 0.0
    lags: list[float] = []
    header: dict[str, Any] | None = None
    with open(out, "wb") as handle:
        for part in parts:
            res = read_results(part)
            if header is None:
                header = {**res.run, "format": FORMAT, "merged_from": [str(p) for p in parts]}
                if workers is not None:
                    header["workers"] = workers
                handle.write(orjson.dumps(header) + b"\n")
            for rec in res.requests:
                handle.write(orjson.dumps(rec) + b"\n")
                if rec.get("status") != "cancelled" and rec.get("lag_s") is not None:
                    lags.append(rec["lag_s"])
            summary.merge(res.summary)
            line = res.summary_line or {}
            for key in totals:
                totals[key] += int(line.get(key) or 0)
            outcomes.append(str(line.get("outcome", "cut-short")))
            duration = max(duration, float(line.get("duration_s") or 0.0))
        lags.sort()

        def pct(p: float) -> float | None:
            return lags[min(len(lags) - 1, max(0, round(p / 100 * (len(lags) - 1))))] if lags else None

        outcome = next((o for o in outcomes if o != "done"), "done")
        tail = {"kind": "summary", "classes": summary.encode(), "outcome": outcome, "duration_s": duration}
        tail.update(totals, lag_p50_s=pct(50), lag_p99_s=pct(99), parts=len(parts))
        handle.write(orjson.dumps(tail) + b"\n")
    return summary
