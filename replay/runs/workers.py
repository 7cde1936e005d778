"""Spread one run over several processes (`--workers N`) or hosts (`--shard i/N`), merge it exactly.

One Python process saturates one core; a run that needs more is split by session
(`replay.trace.select`: a stable hash of the session id, so a session's turns, history and live
replies never leave the process that owns them). The parent hands each worker its own sessions,
already selected (shard, probe skipping): a worker never reads the trace file itself. Each worker
writes an ordinary results file; merging adds their encoded HDR histograms, which gives the same
percentiles as one process that saw every request.

Exit paths: SIGINT, SIGTERM or SIGHUP to the parent while workers run is passed on to each
worker by its PID (each runs in a process group of its own, so a terminal's Ctrl-C or a signal to
the parent's group reaches the parent alone, and each worker gets it exactly once); each worker
ends its run as a single-process run does (cancelled lines, its summary), and the parent merges
what was measured into `--out` with the signal as the outcome. A worker still running 10 s later
is killed by its PID. A parent killed outright (SIGKILL) is noticed by its workers: on Linux the
kernel's parent-death signal (SIGTERM), elsewhere a thread watching the parent's PID.

Across hosts: host k runs `replay run TRACE --shard k/N --out part-k.jsonl` (shards are numbered
1..N) and `replay report --merge part-*.jsonl` pools the files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import multiprocessing as mp
import os
import pickle
import queue as queue_mod
import resource
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from replay.engine.plans import Plan
from replay.engine.run import EngineConfig
from replay.errors import ReplayError, UsageError
from replay.metrics.hist import Summary
from replay.metrics.results import FORMAT, read_results
from replay.outputs import replacing
from replay.runs.recording import EXIT_FAILED, EXIT_SIGNAL, Recording, close_all, percentile, run_trace
from replay.trace.model import Request, Session, Trace, TraceHeader
from replay.trace.select import split_workers

_BARRIER_TIMEOUT_S = 600.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_STOP_GRACE_S = 10.0  # after a signal, how long a worker has to write its summary before SIGKILL
WORKERS_PER_CORE = 4  # `--workers` above this many per core only adds start-up time and contention


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cap_workers(asked: int, sessions: int, cores: int | None = None) -> tuple[int, str | None]:
    """`--workers` capped at the sessions there are (a worker owns whole sessions) and at
    `WORKERS_PER_CORE` per core; the note says so in one line when it applies."""
    cores = cores or usable_cores()
    by_cores = WORKERS_PER_CORE * cores
    cap = max(1, min(sessions, by_cores))
    if asked <= cap:
        return asked, None
    why = (
        f"the trace has {sessions:,} session{'s' if sessions != 1 else ''} and a worker owns whole sessions"
        if sessions <= by_cores
        else f"{WORKERS_PER_CORE} per core on {cores} core{'s' if cores != 1 else ''}"
    )
    return cap, f"note: --workers {asked:,} capped at {cap:,} ({why})"


def split_concurrency(plan: Plan, workers: int) -> list[Plan]:
    """Each worker's plan: `--concurrency` is the run's total, shared out (the first workers take
    the remainder). A plan without a concurrency (alternate, an uncapped timed plan) is unchanged."""
    total = getattr(plan, "concurrency", None)
    if total is None or not dataclasses.is_dataclass(plan):
        return [plan] * workers
    if total < workers:
        raise UsageError(
            f"--concurrency {total} is the total over all workers: it cannot be split across "
            f"{workers} workers (use at most {total} workers)"
        )
    return [
        dataclasses.replace(plan, concurrency=total // workers + (1 if i < total % workers else 0))
        for i in range(workers)
    ]


def part_path(out: Path, index: int, count: int) -> Path:
    return out.with_name(f"{out.stem}.part{index}of{count}{out.suffix or '.jsonl'}")


Packed = tuple[str, tuple[Any, ...], list[tuple[Any, ...]], list[tuple[Any, ...]]]


def pack(trace: Trace) -> Packed:
    """A trace as flat rows for another process: parents by id, so a 10,000-turn session is not a
    10,000-deep chain for pickle to recurse through. A parent that is not among the requests (a
    probe left out) travels too, marked, because its children rebuild their history from it.
    Requests come after their parents, as the reader reads them."""
    rows: list[tuple[Any, ...]] = []
    seen: set[int] = set()
    for req in trace.requests:
        parent = req.parent
        if parent is not None and parent.id not in seen:  # a parent left out of the list
            _pack_unlisted(parent, seen, rows)
        seen.add(req.id)
        rows.append(_row(req, True))
    sessions = [_values(s) for s in trace.sessions.values()]
    return trace.path, _values(trace.header), sessions, rows


def _values(obj: Any) -> tuple[Any, ...]:
    """A dataclass's fields in order: what its constructor takes back."""
    return tuple(getattr(obj, f.name) for f in dataclasses.fields(obj))


def _row(r: Request, listed: bool) -> tuple[Any, ...]:
    parent = None if r.parent is None else r.parent.id
    return (
        parent,
        listed,
        r.id,
        r.session,
        r.t,
        r.keep,
        r.append,
        r.params,
        r.reply,
        r.usage,
        r.after,
        r.tag,
        r.line,
    )


def _pack_unlisted(node: Request, seen: set[int], rows: list[tuple[Any, ...]]) -> None:
    """A parent chain not yet sent, oldest first, marked as not among the trace's requests."""
    chain = []
    cur: Request | None = node
    while cur is not None and cur.id not in seen:
        chain.append(cur)
        seen.add(cur.id)
        cur = cur.parent
    rows.extend(_row(r, False) for r in reversed(chain))


def unpack(packed: Packed, freeze: bool = False) -> Trace:
    """The trace `pack` flattened, with the same requests in the same order.

    `freeze`: for a worker that keeps the trace until it exits, as `read_trace(freeze=True)` does
    for `replay run`: built with the collector off, then moved to its permanent generation, so the
    full collection before the run does not scan every trace object (~0.15 s for 20,000 requests)."""
    if freeze:
        enabled = gc.isenabled()
        gc.disable()
        try:
            trace = unpack(packed)
            gc.freeze()
            return trace
        finally:
            if enabled:
                gc.enable()
    path, header, sessions, rows = packed
    made: dict[int, Request] = {}
    requests = []
    for parent, is_listed, rid, session, t, keep, *rest in rows:
        req = Request(rid, session, t, None if parent is None else made[parent], keep, *rest)
        made[rid] = req
        if is_listed:
            requests.append(req)
    return Trace(
        path=path,
        header=TraceHeader(*header),
        sessions={s[0]: Session(*s) for s in sessions},
        requests=requests,
    )


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
    interrupted: str | None = None  # the signal that stopped the run ("SIGTERM"), if one did

    @property
    def requests(self) -> int:
        return sum(p.requests for p in self.parts)

    @property
    def errors(self) -> int:
        return sum(p.errors for p in self.parts)

    @property
    def exit_code(self) -> int:
        if self.interrupted is not None:
            return EXIT_SIGNAL.get(self.interrupted, EXIT_FAILED)
        return max((p.exit_code for p in self.parts), default=0)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def peak_rss_mib() -> float:
    """This process's peak RSS since it started: its own memory map's high-water mark (VmHWM).

    Not `ru_maxrss` alone: on Linux, exec records the old memory map's peak in it, so a child
    started by a big parent reports at least the parent's size (the bench's 1 GB trace load, in
    a child, read the bench process's 408 MiB).
    """
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except (OSError, ValueError, IndexError):
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def run_shard(
    packed: Packed,
    index: int,
    count: int,
    plan: Plan,
    config: EngineConfig,
    out: str,
    target: dict[str, Any],
    max_duration_s: float | None = None,
    start_at: float | None = None,
    barrier: Any = None,
) -> WorkerReport:
    """Replay worker `index`'s part of the run; `barrier` lines the workers' starts up, and
    `start_at` (epoch seconds, a sharded run's instant) holds them until then."""
    report = WorkerReport(shard=index, count=count, out=out)
    trace = unpack(packed, freeze=True)
    report.rss_loaded_mib = round(_rss_mib(), 1)
    if barrier is not None:
        barrier.wait(_BARRIER_TIMEOUT_S)
    cpu0, t0 = _cpu_s(), time.perf_counter_ns()
    outcome = run_trace(
        trace, plan, config, out, {**target, "worker": f"{index}/{count}"}, max_duration_s, start_at=start_at
    )
    report.wall_s = round((time.perf_counter_ns() - t0) / 1e9, 4)
    report.cpu_s = round(_cpu_s() - cpu0, 4)
    report.peak_rss_mib = peak_rss_mib()
    report.outcome, report.requests, report.errors = outcome.outcome, outcome.requests, outcome.errors
    report.cancelled, report.exit_code = outcome.cancelled, outcome.exit_code
    return report


def _write_input(path: Path, packed: Packed) -> None:
    """A worker's part goes through a file, not the spawn pipe: CPython's spawn writes the
    arguments into the pipe while it still holds the child's end open, so a child that dies
    before reading them (a script without a main guard, a failed import) leaves a part larger
    than the pipe's 64 KiB blocked there, and the run hangs instead of failing."""
    with open(path, "wb") as f:
        pickle.dump(packed, f, protocol=pickle.HIGHEST_PROTOCOL)


def _read_input(path: str) -> Packed:
    with open(path, "rb") as f:
        packed: Packed = pickle.load(f)
    Path(path).unlink(missing_ok=True)
    return packed


def _die_with_parent(parent: int, kernel: bool) -> None:
    """Stop (SIGTERM to this worker, which ends its run with its summary) when the parent dies,
    even by SIGKILL. `kernel`: Linux's parent-death signal, which fires when the thread that
    started this process ends, so only when that was the parent's main thread; otherwise, and
    off Linux, a thread that looks at the parent's PID every 0.2 s."""
    if kernel:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(1, int(signal.SIGTERM), 0, 0, 0) == 0:  # PR_SET_PDEATHSIG
                if os.getppid() != parent:  # it died before the request took effect
                    os.kill(os.getpid(), signal.SIGTERM)
                return
        except (OSError, AttributeError):
            pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="replay-parent-watch", daemon=True).start()


def _worker_main(
    args: tuple[Any, ...], barrier: Any, queue: Any, parent: tuple[int, bool] = (0, False)
) -> None:
    index, count = args[1], args[2]
    if parent[0]:
        with contextlib.suppress(OSError):
            os.setpgrp()  # signals reach this worker from the parent alone (see the module's notes)
        _die_with_parent(*parent)
    try:
        report = run_shard(_read_input(args[0]), *args[1:], barrier=barrier)
    except BaseException as exc:  # reported to the parent, which decides; never a silent worker death
        if barrier is not None:
            barrier.abort()
        report = WorkerReport(shard=index, count=count, out=args[5], outcome="failed", exit_code=1)
        report.error = f"shard {index}/{count}: {type(exc).__name__}: {exc}"
    queue.put(asdict(report))


class _Relay:
    """While workers run: SIGINT, SIGTERM and SIGHUP to this process are noted, not fatal, and the
    first is passed on to every worker started (by PID). Main thread only (signals arrive there);
    elsewhere it does nothing. The handlers before it (a guard's) are put back on leaving."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.at = 0.0  # monotonic, when it came
        self.pids: list[int] = []
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _Relay:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._old[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)

    @property
    def outcome(self) -> str | None:
        return None if self.signum is None else signal.Signals(self.signum).name

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            return  # each worker has had its signal; the grace period ends in SIGKILL
        self.signum, self.at = signum, time.monotonic()
        for pid in self.pids:
            self.forward(pid)

    def forward(self, pid: int) -> None:
        if self.signum is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, self.signum)


def run_workers(
    trace: Trace,
    plan: Plan,
    config: EngineConfig,
    out: str | Path,
    target: dict[str, Any],
    workers: int,
    max_duration_s: float | None = None,
    shard: tuple[int, int] = (1, 1),
    start_at: float | None = None,
) -> WorkersOutcome:
    """Replay `trace` (shard `shard` of the whole, already selected) in `workers` processes, each
    handed its own sessions, then merge into `out`.

    Every worker unpacks its part and waits at a barrier, so the workers start together (a timed
    plan's clock starts at the same moment in each). Part files stay next to `out`. A signal to
    this process stops every worker (see the module's notes); what they measured is merged, with
    the signal as the outcome.
    """
    if workers < 1:
        raise UsageError("--workers must be at least 1")
    plans = split_concurrency(plan, workers)
    parts = split_workers(trace, workers)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")  # no fork: the parent may hold threads and an event loop
    barrier = ctx.Barrier(workers)
    queue = ctx.Queue()
    procs: list[Any] = []
    inputs = [part_path(out, index, workers).with_suffix(".input") for index in range(1, workers + 1)]
    reports: dict[int, WorkerReport] = {}
    parent = (os.getpid(), threading.current_thread() is threading.main_thread())
    with _Relay() as relay:
        try:
            for index in range(1, workers + 1):
                if relay.signum is not None:  # stopped while starting: start no more
                    break
                given, part = inputs[index - 1], str(part_path(out, index, workers))
                _write_input(given, pack(parts[index - 1]))
                args = (
                    str(given),
                    index,
                    workers,
                    plans[index - 1],
                    config,
                    part,
                    target,
                    max_duration_s,
                    start_at,
                )
                proc = ctx.Process(
                    target=_worker_main, args=(args, barrier, queue, parent), name=f"replay-shard-{index}"
                )
                proc.start()
                procs.append(proc)
                relay.pids.append(proc.pid)
                relay.forward(proc.pid)  # a signal that came while it was being started
            _collect(queue, procs, reports, relay, workers)
        finally:
            for proc in procs:
                if proc.is_alive() and relay.signum is not None:
                    proc.kill()  # this worker's PID only
                proc.join()
            for path in inputs:  # a worker that died before reading its part left it
                path.unlink(missing_ok=True)
    ordered = [reports[k] for k in sorted(reports)]
    written = [Path(r.out) for r in ordered if r.out and Path(r.out).exists()]
    if not written:
        if relay.outcome is None:
            problems = "; ".join(r.error or f"shard {r.shard}: no results" for r in ordered)
            raise ReplayError(f"no shard wrote a results file: {problems}")
        # Stopped before any worker began: still a results file, which says so.
        close_all([Recording(trace, plan, config, out, target, keep_records=False)], relay.outcome)
        return WorkersOutcome(out=str(out), parts=ordered, interrupted=relay.outcome)
    summary = merge_results(written, out, workers=workers, plan=plan.describe(), outcome=relay.outcome)
    return WorkersOutcome(out=str(out), parts=ordered, summary=summary, interrupted=relay.outcome)


def _collect(
    queue: Any, procs: list[Any], reports: dict[int, WorkerReport], relay: _Relay, count: int
) -> None:
    """Every started worker's report; one that died without reporting gets a failed one. After a
    signal, a worker that has not reported within `_STOP_GRACE_S` is killed (by its PID)."""
    while len(reports) < len(procs):
        try:
            report = WorkerReport(**queue.get(timeout=0.2))
            reports[report.shard] = report
            continue
        except queue_mod.Empty:
            pass
        if relay.signum is not None and time.monotonic() - relay.at > _STOP_GRACE_S:
            for proc in procs:
                if proc.is_alive():
                    proc.kill()
                    proc.join(5.0)
        # A worker's report is in the queue before it exits 0: one gone otherwise died unreported.
        for index, proc in enumerate(procs, 1):
            if index not in reports and proc.exitcode not in (None, 0):
                msg = f"shard {index}/{count}: worker exited with code {proc.exitcode}"
                reports[index] = WorkerReport(
                    shard=index, count=count, out="", outcome="failed", exit_code=1, error=msg
                )


def merge_results(
    parts: list[Path],
    out: Path,
    workers: int | None = None,
    plan: dict[str, Any] | None = None,
    outcome: str | None = None,
) -> Summary:
    """Write one results file from several: the first header, every request, one merged summary.
    Written whole into a temporary sibling and renamed, so a failed merge leaves `out` as it was.
    `outcome`: the whole run's (a signal that stopped it), else the first part's that was not done."""
    summary = Summary()
    backends: dict[str, Summary] = {}
    totals = {"requests": 0, "errors": 0, "cancelled": 0}
    outcomes: list[str] = []
    duration = 0.0
    lags: list[float] = []
    queues: list[float] = []  # first tokens' wait in the clients, seconds
    held = {"in_flight_asked": 0, "in_flight_mean": 0.0, "in_flight_max": 0}
    cpus: list[float | None] = []
    warnings: list[str] = []
    header: dict[str, Any] | None = None
    with replacing(Path(out)) as merged, open(merged, "wb") as handle:
        for part in parts:
            res = read_results(part)
            if header is None:
                header = {**res.run, "format": FORMAT, "merged_from": [str(p) for p in parts]}
                if isinstance(header.get("target"), dict):  # the whole run's target, not a worker's
                    header["target"] = {k: v for k, v in header["target"].items() if k != "worker"}
                if workers is not None:
                    header["workers"] = workers
                if plan is not None and isinstance(header.get("plan"), dict):  # the total, not a share
                    header["plan"] = {**header["plan"], **plan}
                handle.write(orjson.dumps(header) + b"\n")
            for rec in res.requests:
                handle.write(orjson.dumps(rec) + b"\n")
                if rec.get("status") != "cancelled" and rec.get("lag_s") is not None:
                    lags.append(rec["lag_s"])
                if rec.get("client_queue_s") is not None:
                    queues.append(rec["client_queue_s"])
            summary.merge(res.summary)
            for name, part_summary in res.backends.items():
                backends.setdefault(name, Summary()).merge(part_summary)
            line = res.summary_line or {}
            for key in totals:
                totals[key] += int(line.get(key) or 0)
            outcomes.append(str(line.get("outcome", "cut-short")))
            # The workers run side by side: their loads add (the maxima to an upper bound).
            for key in held:
                held[key] = held[key] + line[key] if line.get(key) is not None else held[key]
            cpus.append(line.get("client_cpu"))
            name = f"worker {len(outcomes)}/{len(parts)}"
            warnings.extend(f"{name}: {w}" for w in line.get("warnings") or ())
            duration = max(duration, float(line.get("duration_s") or 0.0))
        outcome = outcome or next((o for o in outcomes if o != "done"), "done")
        tail = {"kind": "summary", "classes": summary.encode(), "outcome": outcome, "duration_s": duration}
        if backends:
            tail["backends"] = {name: s.encode() for name, s in backends.items()}
        tail.update(totals, lag_p50_s=percentile(lags, 50), lag_p99_s=percentile(lags, 99), parts=len(parts))
        tail.update(
            in_flight_asked=held["in_flight_asked"] or None,
            in_flight_mean=round(held["in_flight_mean"], 2),
            in_flight_max=held["in_flight_max"],
            client_cpu=cpus,
        )
        q50, q99 = percentile(queues, 50), percentile(queues, 99)
        if q50 is not None and q99 is not None:
            tail.update(client_queue_p50_ms=round(q50 * 1e3, 3), client_queue_p99_ms=round(q99 * 1e3, 3))
        if warnings:
            tail["warnings"] = warnings
        handle.write(orjson.dumps(tail) + b"\n")
    return summary
