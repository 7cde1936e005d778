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
from array import array
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console

from replay import __version__
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

# What the readers of a run's kept records use (the usage check and the server-log correlation).
KEPT_FIELDS = ("kind", "seq", "status", "prompt_tokens", "cached_tokens", "output_tokens", "backend")
_NUMBERS = ("seq", "prompt_tokens", "cached_tokens", "output_tokens")
_NONE = -(2**31)  # a number column's None
_OWN = 255  # a status code: the line is kept whole, in `_whole`


class KeptRecords(Sequence[dict[str, Any]]):
    """`KEPT_FIELDS` of each request line, in columns: 4-byte numbers, a 1-byte status and backend,
    about 19 bytes a request where a dict a line kept ~220 (a replay against the simulator
    keeps these for the log correlation, and at a million one-request sessions the dicts alone
    grew it by 220 MB). Read back as dicts, one per line, in order. A line that does not fit (a
    number past 32 bits, another kind, a missing field) is kept whole."""

    def __init__(self) -> None:
        self._numbers = {name: array("i") for name in _NUMBERS}
        self._status = array("B")
        self._names: list[str] = []  # status code -> its text
        self._codes: dict[str, int] = {}
        self._backend = array("B")  # 0: no backend field; else 1 + its index in `_backends`
        self._backends: list[str | None] = []
        self._backend_codes: dict[str | None, int] = {}
        self._whole: dict[int, dict[str, Any]] = {}

    def append(self, line: dict[str, Any], whole: bool = False) -> None:
        """Keep `line`'s `KEPT_FIELDS`; `whole`: all of it (a cancelled line: its `id` is read)."""
        kept = line if whole else {k: line[k] for k in KEPT_FIELDS if k in line}
        status = kept.get("status")
        code = self._codes.get(status) if type(status) is str else None
        if code is None and type(status) is str and len(self._names) < _OWN:
            code = self._codes[status] = len(self._names)
            self._names.append(status)
        values = [kept.get(name, _NONE) for name in _NUMBERS]
        backend = self._backend_code(kept)
        fits = (
            code is not None
            and backend is not None
            and kept.get("kind") == "request"
            and not whole
            and len(kept) == len(KEPT_FIELDS) - (backend == 0)
            and all((v is None) or (type(v) is int and _NONE < v < 2**31) for v in values)
        )
        if not fits:
            self._whole[len(self._status)] = kept
            code, values, backend = _OWN, [0] * len(_NUMBERS), 0
        for name, value in zip(_NUMBERS, values, strict=True):
            self._numbers[name].append(_NONE if value is None else value)
        self._status.append(code)  # type: ignore[arg-type]
        self._backend.append(backend)  # type: ignore[arg-type]

    def _backend_code(self, kept: dict[str, Any]) -> int | None:
        """0 without a `backend` field, else its code; None if it cannot have one (not a name, or
        a 255th name)."""
        if "backend" not in kept:
            return 0
        name = kept["backend"]
        code = self._backend_codes.get(name)
        if code is None and (name is None or type(name) is str) and len(self._backends) < _OWN - 1:
            self._backends.append(name)
            code = self._backend_codes[name] = len(self._backends)
        return code

    def __len__(self) -> int:
        return len(self._status)

    def _row(self, i: int) -> dict[str, Any]:
        code = self._status[i]
        if code == _OWN:
            return dict(self._whole[i])
        row: dict[str, Any] = {"kind": "request"}
        for name, col in self._numbers.items():
            value = col[i]
            row[name] = None if value == _NONE else value
        row["status"] = self._names[code]
        backend = self._backend[i]
        if backend:
            row["backend"] = self._backends[backend - 1]
        return row

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._row(k) for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._row(i)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self._row(i) for i in range(len(self)))


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
    into a histogram; `keep_records` keeps the fields in `KEPT_FIELDS` of each line (for the
    readers that need them; `keep_fields=None` keeps whole lines).
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
        # The fields the readers use, in columns (`KeptRecords`); whole lines in a list.
        self.kept: list[dict[str, Any]] | KeptRecords = KeptRecords() if keep_fields == KEPT_FIELDS else []
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
            if self.keep_records:  # the server saw it: its counters and log still hold it
                if isinstance(self.kept, KeptRecords):
                    self.kept.append(line, whole=True)
                else:
                    self.kept.append(line)
        else:
            self.counts["requests"] += 1
            if rec.status != "ok":
                self.counts["errors"] += 1
            line = self.writer.request(rec)
            if line["lag_s"] is not None:
                self.lags.record_value(min(max(0, round(line["lag_s"] * 1e6)), _LAG_MAX_US))
                self.lag_trend.add(line["lag_s"])
            if self.keep_records:
                fields = self.keep_fields
                if fields is None or isinstance(self.kept, KeptRecords):
                    self.kept.append(line)
                else:
                    self.kept.append({k: line[k] for k in fields if k in line})
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
            results=self.kept,
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
    now = time.monotonic()
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
    started = time.monotonic()
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
