"""Run a trace against a target and write the results: the glue between trace, plan, engine and file.

Owns the exit paths: whatever ends the run (last reply, a failed request, `--max-duration`,
Ctrl-C, SIGTERM) every measured request is already on disk and a `summary` line is still written.
"""

from __future__ import annotations

import datetime as _dt
import gc
import hashlib
import platform
import signal
import time
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import httpx
from rich.console import Console

from replay import __version__
from replay.engine.plans import Plan
from replay.engine.run import Engine, EngineConfig, check_options
from replay.errors import TargetError
from replay.metrics.record import RequestRecord
from replay.metrics.results import ResultsWriter, read_results
from replay.runs.serverlog import effective_settings, setting_warnings
from replay.runs.servermetrics import watch_counters
from replay.runs.workers import run_workers
from replay.trace.model import Trace

if TYPE_CHECKING:
    from drivers.launch import Served

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_SIGNAL = {"SIGINT": 130, "SIGTERM": 143}


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
    results: list[dict[str, Any]] = field(default_factory=list)


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_reachable(base_url: str, timeout_s: float = 5.0) -> None:
    """Fail before the run starts if nothing answers at the target URL (any HTTP answer will do)."""
    try:
        httpx.get(base_url.rstrip("/") + "/v1/models", timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise TargetError(f"target {base_url} is unreachable: {type(exc).__name__}: {exc}") from None


def _percentile(values: list[float], pct: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return round(ordered[index], 6)


class _Recording:
    """One trace being replayed into one results file: the engine, its sink and the file."""

    def __init__(
        self,
        trace: Trace,
        plan: Plan,
        config: EngineConfig,
        out: str | Path,
        target: dict[str, Any],
        keep_records: bool,
    ) -> None:
        header = {
            "tool": {"name": "agent-replay", "version": __version__},
            "trace": {
                "path": trace.path,
                "sha256": file_sha256(trace.path),
                "source": trace.header.source,
                **({"start": trace.header.start} if trace.header.start else {}),
            },
            "target": target,
            "plan": plan.describe(),
            "history": config.history,
            "think": config.think,
            "seed": 0,
            "started": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "host": platform.node(),
        }
        self.out = str(out)
        self.writer = ResultsWriter(out, header)
        self.keep_records = keep_records
        self.lags: list[float] = []
        self.kept: list[dict[str, Any]] = []
        self.counts = {"requests": 0, "errors": 0, "cancelled": 0}
        self.engine = Engine(trace, plan, config, self.sink)

    def sink(self, rec: RequestRecord) -> None:
        if rec.status == "cancelled":
            self.counts["cancelled"] += 1
            self.writer.request(rec, summarise=False)
            return
        self.counts["requests"] += 1
        if rec.status != "ok":
            self.counts["errors"] += 1
        line = self.writer.request(rec)
        if line["lag_s"] is not None:
            self.lags.append(line["lag_s"])
        if self.keep_records:
            self.kept.append(line)

    def close(self, outcome: str, duration: float) -> RunOutcome:
        """Write the `summary` line and say how the run ended."""
        counts = self.counts
        lag_p50, lag_p99 = _percentile(self.lags, 50), _percentile(self.lags, 99)
        self.writer.close(
            {"outcome": outcome, "duration_s": duration, **counts, "lag_p50_s": lag_p50, "lag_p99_s": lag_p99}
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
        )


@dataclass(frozen=True, slots=True)
class TraceRun:
    """What `run_traces` needs for one of the traces it replays side by side."""

    trace: Trace
    plan: Plan
    config: EngineConfig
    out: str | Path
    target: dict[str, Any]


def run_trace(
    trace: Trace,
    plan: Plan,
    config: EngineConfig,
    out: str | Path,
    target: dict[str, Any],
    max_duration_s: float | None = None,
    console: Console | None = None,
    keep_records: bool = False,
) -> RunOutcome:
    """Replay `trace` and write `out`; returns what happened (never raises for request failures)."""
    recording = _Recording(trace, plan, config, out, target, keep_records)
    live = _live_display(recording.engine, console) if console is not None else nullcontext()
    return _run([recording], max_duration_s, live)[0]


def run_traces(runs: list[TraceRun], keep_records: bool = False) -> list[RunOutcome]:
    """Replay several traces at once, each against its own target into its own file, on one event
    loop: independent runs (a scenario's arms) take as long as the longest, not the sum."""
    recordings = [_Recording(r.trace, r.plan, r.config, r.out, r.target, keep_records) for r in runs]
    return _run(recordings, None, nullcontext())


def _run(recordings: list[_Recording], max_duration_s: float | None, live: Any) -> list[RunOutcome]:
    # The loaded traces live for the whole run: keep the collector from re-scanning them (its
    # full passes pause the event loop for tens of ms with hundreds of streams in flight).
    gc.collect()
    gc.freeze()
    started = time.monotonic()
    outcome = "done"
    try:
        with live:
            outcome = anyio.run(_supervise, [r.engine for r in recordings], max_duration_s)
    finally:
        gc.unfreeze()
        duration = round(time.monotonic() - started, 3)
        outcomes = [r.close(outcome, duration) for r in recordings]
    return outcomes


async def _supervise(engines: list[Engine], max_duration_s: float | None) -> str:
    """Run the engines under the run's limits; returns why they ended."""
    outcome = "done"
    async with anyio.create_task_group() as tg:

        async def watch_signals() -> None:
            nonlocal outcome
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
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


def _live_display(engine: Engine, console: Console):
    from replay.report.live import progress_view

    return progress_view(engine.progress, console)


@dataclass(slots=True)
class RunOptions:
    """What a run asks of the engine, whichever server it runs against."""

    plan: Plan
    api: str | None = None
    model: str | None = None
    history: str = "live"
    think: str = "off"
    timeout: float = 1800.0
    max_duration: float | None = None

    def __post_init__(self) -> None:
        check_options(self.history, self.think, self.api)

    def engine_config(self, base_url: str) -> EngineConfig:
        return EngineConfig(
            base_url=base_url,
            api=self.api,
            model=self.model,
            history=self.history,
            think=self.think,
            timeout_s=self.timeout,
            run_id=uuid.uuid4().hex[:8],
        )


@dataclass(slots=True)
class ServedRun:
    """One replay against a started server, and the lines to append once the server has stopped."""

    exit_code: int
    requests: int
    errors: int
    records: list[dict[str, Any]]
    metrics: dict[str, Any]


def replay_on(
    served: Served,
    kind: str,
    trace: Trace,
    options: RunOptions,
    out: Path,
    *,
    header: dict[str, Any] | None = None,
    say: Callable[[str], None] = print,
    console: Console | None = None,
    workers: int = 1,
    trace_path: Path | None = None,
) -> ServedRun:
    """Replay `trace` against a ready server: settings in force in the header, counters checked.

    The server's own log is read for `server` records only after it stops (its shutdown lines
    come last), so the caller appends `server_records(...)` once the server is gone.
    """
    check_reachable(served.url)
    settings = effective_settings(kind, served.log_path)
    warnings = setting_warnings(kind, served.build.get("argv") or [], settings)
    for line in warnings:
        say(f"[yellow]warning:[/yellow] {line}")
    target = {
        "kind": kind,
        "url": served.url,
        "build": served.build,
        "effective": settings,
        "warnings": warnings,
    }
    target.update(header or {})
    config = options.engine_config(served.url)
    with watch_counters(served) as counters:  # Prometheus counters, where the server has them
        code, requests, errors, records = _replay(
            trace, options, config, out, target, console, workers, trace_path
        )
    metrics = counters(records)
    for line in metrics.get("disagreements") or ():
        say(f"[yellow]warning:[/yellow] server counters disagree with usage: {line}")
    return ServedRun(code, requests, errors, records, metrics)


def _replay(
    trace: Trace,
    options: RunOptions,
    config: EngineConfig,
    out: Path,
    target: dict[str, Any],
    console: Console | None,
    workers: int,
    trace_path: Path | None,
) -> tuple[int, int, int, list[dict[str, Any]]]:
    """In this process, or spread over `workers` processes by session (their parts merge exactly)."""
    if workers > 1 and trace_path is not None:
        spread = run_workers(trace_path, options.plan, config, out, target, workers, options.max_duration)
        return spread.exit_code, spread.requests, spread.errors, read_results(out).requests
    outcome = run_trace(
        trace, options.plan, config, out, target, options.max_duration, console=console, keep_records=True
    )
    return outcome.exit_code, outcome.requests, outcome.errors, outcome.results
