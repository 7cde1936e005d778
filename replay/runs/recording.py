"""One trace replayed into one results file: the run header, the sink, the summary, the exit paths.

Owns the exit paths: whatever ends the run (last reply, a failed request, `--max-duration`,
Ctrl-C, SIGTERM, SIGHUP) every measured request is already on disk and a `summary` line is still written.
The run header is built here and nowhere else, for every kind of replay (run, ab, scenario arms,
probe, each worker of a spread run).
"""

from __future__ import annotations

import datetime as _dt
import gc
import hashlib
import platform
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import orjson
from rich.console import Console

from replay import __version__, clock
from replay.engine.plans import Plan
from replay.engine.run import Engine, EngineConfig, loop_options
from replay.errors import Interrupted
from replay.metrics.held import TIMED_PLANS, LagTrend, LoadFacts
from replay.metrics.hist import new_histogram
from replay.metrics.record import RequestRecord
from replay.metrics.results import ResultsWriter
from replay.runs.barrier import wait_until
from replay.trace.model import Trace

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_SIGNAL = {"SIGINT": 130, "SIGTERM": 143, "SIGHUP": 129}


@dataclass(slots=True)
class RunOutcome:
    out: str
    outcome: str
    requests: int
    errors: int
    cancelled: int
    duration_s: float
    lag_p50_s: float | None
    lag_p99_s: float | None
    exit_code: int
    results: Sequence[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # the load fell short of what was asked


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def percentile(values: list[float], pct: float) -> float | None:
    """Nearest-rank percentile of the schedule lags (seconds, to the microsecond)."""
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return round(ordered[index], 6)


def hist_percentile(hist: Any, pct: float) -> float | None:
    """A lag histogram's percentile in seconds (3 significant figures, to the microsecond)."""
    if not hist.get_total_count():
        return None
    return round(hist.get_value_at_percentile(pct) / 1e6, 6)


_LAG_MAX_US = 10_800_000_000  # the histogram's range (3 h)
_GC_YOUNG = 10_000  # allocations between young-generation passes during a run (the default is 700)

# What the readers of a run's records use (the usage check and the server-log correlation).
KEPT_FIELDS = ("kind", "id", "seq", "status", "prompt_tokens", "cached_tokens", "output_tokens", "backend")
_REQUEST_START = b'{"kind":"request"'


class ResultsRecords(Sequence[dict[str, Any]]):
    """A finished run's request lines, read back from its results file each time they are
    iterated: `KEPT_FIELDS` of each, a cancelled one whole (its `id` is read). Nothing is held per
    request while the run goes (a replay against the simulator reads them for the log correlation
    once its server has stopped; kept in memory, even as 19-byte columns, they grew a run of a
    million one-request sessions by 19 MB), and reading them back holds one line at a time."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._len: int | None = None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        with open(self.path, "rb") as handle:
            for raw in handle:
                if not raw.startswith(_REQUEST_START):
                    continue
                line = orjson.loads(raw)
                if line.get("status") == "cancelled":
                    yield line
                else:
                    yield {k: line[k] for k in KEPT_FIELDS if k in line}

    def __len__(self) -> int:
        if self._len is None:
            with open(self.path, "rb") as handle:
                self._len = sum(raw.startswith(_REQUEST_START) for raw in handle)
        return self._len

    def __getitem__(self, i: Any) -> Any:
        rows = list(self)  # by position: for a caller that wants a list (not the run's own readers)
        return rows[i]


def run_header(
    trace: Trace,
    plan: dict[str, Any],
    config: EngineConfig,
    target: dict[str, Any],
    start: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `run` line of every results file (`kind` and `format` are added by the writer);
    `start` is the barrier's record (planned and actual start) when the run waited for one."""
    return {
        "tool": {"name": "agent-replay", "version": __version__},
        "trace": {
            "path": trace.path,
            "sha256": file_sha256(trace.path),
            "source": trace.header.source,
            **({"start": trace.header.start} if trace.header.start else {}),
        },
        "target": target,
        "plan": plan,
        "history": config.history,
        "think": config.think,
        "seed": 0,
        "started": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        **({"start": start} if start else {}),
    }


class Recording:
    """One trace being replayed into one results file: the engine, its sink and the file.

    `annotate` adds to each record before its line is written (a probe's step label), `observe`
    sees every line written (cancelled ones too). The engine it runs is one over the whole trace,
    unless it was given one (`take`): a run that restarts its server gives one per server process
    (the sink and the file stay).

    Its memory does not grow with the run: lines go to the file as they come, the schedule lags
    into a histogram; with `keep_records` the outcome's `results` are the lines for the readers
    that need them: read back from the file with `keep_fields=KEPT_FIELDS`, else kept in a list
    (`keep_fields` of each, or whole lines with None).
    """

    def __init__(
        self,
        trace: Trace,
        plan: Plan,
        config: EngineConfig,
        out: str | Path,
        target: dict[str, Any],
        keep_records: bool,
        plan_header: dict[str, Any] | None = None,
        annotate: Callable[[RequestRecord], None] | None = None,
        observe: Callable[[dict[str, Any]], None] | None = None,
        keep_fields: tuple[str, ...] | None = None,
        start: dict[str, Any] | None = None,
    ) -> None:
        header = run_header(trace, {**plan.describe(), **(plan_header or {})}, config, target, start)
        self.out = str(out)
        self.writer = ResultsWriter(out, header)
        self.keep_records = keep_records
        self.annotate = annotate
        self.observe = observe
        self.keep_fields = keep_fields
        self.lags = new_histogram("latency_us")  # schedule lag, microseconds
        self.lag_trend = LagTrend(len(trace.requests))  # does the lag grow over the run?
        # With `KEPT_FIELDS` nothing is kept: the readers read the file back (`ResultsRecords`).
        self.from_file = keep_records and keep_fields == KEPT_FIELDS
        self.kept: list[dict[str, Any]] = []
        self.counts = {"requests": 0, "errors": 0, "cancelled": 0}
        self._trace, self._plan, self._config = trace, plan, config
        self._engine: Engine | None = None  # made when first asked for, unless one was given
        self.started: float | None = None  # monotonic, set when the first engine starts
        self.cpu_started: float | None = None  # this process's CPU time then

    @property
    def engine(self) -> Engine:
        """The engine that runs next: the one given to `take`, else one over the whole trace."""
        if self._engine is None:
            self._engine = Engine(self._trace, self._plan, self._config, self.sink)
        return self._engine

    def take(self, engine: Engine) -> None:
        """Run `engine` next; its records must come to this recording's `sink`."""
        if engine.sink != self.sink:
            raise ValueError("the engine's records must go to this recording's sink")
        self._engine = engine

    def sink(self, rec: RequestRecord) -> None:
        if self.annotate is not None:
            self.annotate(rec)
        if rec.status == "cancelled":
            self.counts["cancelled"] += 1
            line = self.writer.request(rec, summarise=False)
            if (
                self.keep_records and not self.from_file
            ):  # the server saw it: its counters and log still hold it
                self.kept.append(line)
        else:
            self.counts["requests"] += 1
            if rec.status != "ok":
                self.counts["errors"] += 1
            line = self.writer.request(rec)
            if line["lag_s"] is not None:
                self.lags.record_value(min(max(0, round(line["lag_s"] * 1e6)), _LAG_MAX_US))
                self.lag_trend.add(line["lag_s"])
            if self.keep_records and not self.from_file:
                fields = self.keep_fields
                self.kept.append(line if fields is None else {k: line[k] for k in fields if k in line})
        if self.observe is not None:
            self.observe(line)

    def close(self, outcome: str, duration: float, extra: dict[str, Any] | None = None) -> RunOutcome:
        """Write the `summary` line and say how the run ended."""
        counts = self.counts
        lag_p50, lag_p99 = hist_percentile(self.lags, 50), hist_percentile(self.lags, 99)
        load = self.load_facts(duration)
        warnings = load.warnings()
        self.writer.close(
            {
                "outcome": outcome,
                "duration_s": duration,
                **counts,
                "lag_p50_s": lag_p50,
                "lag_p99_s": lag_p99,
                **load.fields(),
                **({"warnings": warnings} if warnings else {}),
                **(extra or {}),
            }
        )
        if outcome in EXIT_SIGNAL:
            code = EXIT_SIGNAL[outcome]
        else:
            code = EXIT_FAILED if counts["errors"] else EXIT_OK
        return RunOutcome(
            out=self.out,
            outcome=outcome,
            requests=counts["requests"],
            errors=counts["errors"],
            cancelled=counts["cancelled"],
            duration_s=duration,
            lag_p50_s=lag_p50,
            lag_p99_s=lag_p99,
            exit_code=code,
            results=ResultsRecords(self.out) if self.from_file else self.kept,
            warnings=warnings,
        )

    def load_facts(self, duration: float) -> LoadFacts:
        """The load the run held against what its plan asked (of the current engine's requests)."""
        plan = self.engine.plan
        cpu = None
        if self.cpu_started is not None and duration > 0:
            cpu = (time.process_time() - self.cpu_started) / duration
        held = self.engine.held
        growth = self.lag_trend.growth() if plan.name in TIMED_PLANS else None
        return LoadFacts(
            plan=plan.name,
            asked=plan.capacity if plan.name == "overlap" else None,
            cap=plan.capacity,
            held_mean=held.mean(),
            held_max=held.max(),
            loop_delay_ms=self.engine.loop_delay.mean_ms(),
            client_cpu=cpu,
            lag_start_s=growth[0] if growth else None,
            lag_end_s=growth[1] if growth else None,
            waiting_max=self.engine.progress.waiting_max,
            client_queue_p50_ms=self.engine.client_queue.percentile_ms(50),
            client_queue_p99_ms=self.engine.client_queue.percentile_ms(99),
        )


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP raise `Interrupted` while the block runs (main thread only), so a run
    signalled outside its replay loop (loading the trace, starting its servers, reading their
    logs afterwards) unwinds its `with` blocks: the servers it started are stopped by PID and its
    scratch folder removed, where the default action would end the process and leave them. SIGINT
    raises KeyboardInterrupt already. The replay loop, and the relay of a run over workers, put
    their own handlers in for their time and give these back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise Interrupted(signum, signal.Signals(signum).name)

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def run_trace(
    trace: Trace,
    plan: Plan,
    config: EngineConfig,
    out: str | Path,
    target: dict[str, Any],
    max_duration_s: float | None = None,
    console: Console | None = None,
    keep_records: bool = False,
    start_at: float | None = None,
) -> RunOutcome:
    """Replay `trace` and write `out`; returns what happened (never raises for request failures).
    With `start_at` (epoch seconds) the schedule begins at that instant (`runs.barrier`)."""
    start = wait_until(start_at) if start_at is not None else None
    recording = Recording(trace, plan, config, out, target, keep_records, start=start)
    return run_recordings([recording], max_duration_s, console)[0]


def run_recordings(
    recordings: list[Recording], max_duration_s: float | None, console: Console | None = None
) -> list[RunOutcome]:
    """Run the recordings' engines together on one event loop, then close every file (on every
    exit path: an exception still leaves each file with its `summary` line)."""
    outcome = "done"
    try:
        outcome = run_engines(recordings, max_duration_s, console)
    finally:
        outcomes = close_all(recordings, outcome)
    return outcomes


def close_all(
    recordings: list[Recording], outcome: str, extra: dict[str, Any] | None = None
) -> list[RunOutcome]:
    """Write every file's `summary` line; the duration runs from the first engine's start."""
    now = clock.monotonic()
    return [r.close(outcome, round(now - (r.started or now), 3), extra) for r in recordings]


def run_engines(
    recordings: list[Recording], max_duration_s: float | None, console: Console | None = None
) -> str:
    """Run the recordings' current engines under the run's limits; returns why they ended. Files
    are left open: the caller closes them, on every exit path."""
    live: Any = nullcontext()
    if console is not None and len(recordings) == 1:
        from replay.report.live import progress_view

        live = progress_view(recordings[0].engine.progress, console)
    # The loaded traces live for the whole run: keep the collector from re-scanning them (its
    # full passes pause the event loop for tens of ms with hundreds of streams in flight), and
    # the engines' per-request tables with them.
    for r in recordings:
        r.engine.prepare()
    gc.collect()
    gc.freeze()
    # A streamed request makes thousands of short-lived objects; at the default 700 allocations
    # the young generation is scanned several times per request along with the thousands of
    # waiting requests' tasks (6-8 us of client CPU per request). 10,000 keeps each
    # pass short (about a millisecond) and cycles are still freed within a few requests.
    thresholds = gc.get_threshold()
    gc.set_threshold(_GC_YOUNG, *thresholds[1:])
    started = clock.monotonic()
    for r in recordings:
        if r.started is None:
            r.started, r.cpu_started = started, time.process_time()
    try:
        with live:
            return anyio.run(
                _supervise,
                [r.engine for r in recordings],
                max_duration_s,
                backend_options=loop_options(recordings[0].engine.config.loop),
            )
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


async def _supervise(engines: list[Engine], max_duration_s: float | None) -> str:
    """Run the engines under the run's limits; returns why they ended."""
    outcome = "done"
    async with anyio.create_task_group() as tg:

        async def watch_signals() -> None:
            nonlocal outcome
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
                async for sig in signals:
                    outcome = signal.Signals(sig).name
                    tg.cancel_scope.cancel()
                    return

        tg.start_soon(watch_signals)
        with anyio.move_on_after(max_duration_s) as scope:
            async with anyio.create_task_group() as runs:
                for engine in engines:
                    runs.start_soon(engine.run)
        if scope.cancelled_caught:
            outcome = "max-duration"
        tg.cancel_scope.cancel()
    return outcome
