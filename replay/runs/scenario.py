"""Run a scenario's arms on the embedded simulator: one trace, one simulator process, one results
file (and its server log) per arm.

The plan comes from the spec; `timed` and `closed-loop` plans run at the simulator's time scale so
the trace's seconds and the modelled seconds stay the same seconds.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from replay.engine.plans import make_plan
from replay.engine.run import EngineConfig
from replay.metrics.results import append_records
from replay.runs.pipeline import RunOutcome, TraceRun, check_reachable, run_trace, run_traces
from replay.runs.serverlog import effective_settings, server_records
from replay.runs.targets import Target, open_target, resolve_target
from replay.scenario.build import GenerateResult, generate
from replay.scenario.spec import Arm, Scenario
from replay.trace.reader import read_trace

if TYPE_CHECKING:
    from drivers.launch import Served


@dataclass(slots=True)
class ArmRun:
    arm: str
    trace: Path
    results: Path
    log: Path
    outcome: RunOutcome
    generated: GenerateResult


def sim_flags(arm: Arm, time_scale: float) -> list[str]:
    """The arm's simulator flags with the time scale (an arm's own `--time-scale` wins)."""
    flags = list(arm.sim)
    if "--time-scale" not in flags:
        flags += ["--time-scale", f"{time_scale:g}"]
    return flags


def run_command(spec: Scenario, arm: Arm, trace: str = "TRACE.jsonl") -> str:
    """The `replay run` command line that replays one arm by hand (shown by `scenario show`)."""
    flags = sim_flags(arm, spec.run.time_scale)
    parts = ["replay run", trace, "--target sim", f"--plan {spec.run.plan}"]
    if spec.run.concurrency:
        parts.append(f"--concurrency {spec.run.concurrency}")
    if spec.run.round_robin:
        parts.append("--round-robin")
    if spec.run.think != "off":
        parts.append(f"--think {spec.run.think}")
    if spec.run.plan in ("timed", "closed-loop"):
        parts.append(f"--speed {spec.run.time_scale:g}")
    parts.append(f"--sim-args '{' '.join(flags)}'")
    return " ".join(parts)


def _prepare(spec: Scenario, arm: Arm, out: Path) -> tuple[Scenario, Path, GenerateResult]:
    out.mkdir(parents=True, exist_ok=True)
    armed = spec.with_params(arm.params)
    trace_path = out / f"{spec.name}-{arm.name}.trace.jsonl"
    return armed, trace_path, generate(armed, trace_path)


def _trace_run(
    spec: Scenario,
    arm: Arm,
    out: Path,
    served: Served,
    kind: str,
    scale: float,
    trace_path: Path,
    timeout_s: float,
) -> TraceRun:
    """What replaying one arm against a server that is already up takes."""
    results = out / f"{spec.name}-{arm.name}.results.jsonl"
    speed = scale if spec.run.plan in ("timed", "closed-loop") else 1.0
    plan = make_plan(
        spec.run.plan, concurrency=spec.run.concurrency, speed=speed, round_robin=spec.run.round_robin
    )
    config = EngineConfig(
        base_url=served.url, think=spec.run.think, timeout_s=timeout_s, run_id=uuid.uuid4().hex[:8]
    )
    header: dict[str, Any] = {
        "kind": kind,
        "url": served.url,
        "build": served.build,
        "effective": effective_settings(kind, served.log_path),
        "scenario": spec.name,
        "arm": arm.name,
        "time_scale": scale,
    }
    return TraceRun(read_trace(trace_path), plan, config, results, header)


def _log_size(served: Served) -> int:
    path = served.log_path
    return Path(path).stat().st_size if path and Path(path).exists() else 0


def _arm_run(arm: Arm, trace_path: Path, generated: GenerateResult, outcome: RunOutcome) -> ArmRun:
    results = Path(outcome.out)
    return ArmRun(
        arm=arm.name,
        trace=trace_path,
        results=results,
        log=results.with_suffix(".server.log"),
        outcome=outcome,
        generated=generated,
    )


def _settled_size(path: Path, quiet_s: float = 0.05, limit_s: float = 2.0) -> int:
    """The log's size once it stops growing: ds4 prints a request's last line after replying."""
    size, deadline = path.stat().st_size, time.monotonic() + limit_s
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = path.stat().st_size
        if now == size:
            break
        size = now
    return size


def _finish(run: ArmRun, served: Served, kind: str, log_start: int) -> None:
    """Copy this run's part of the server log next to its results and append its `server` records."""
    if served.log_path is None or not Path(served.log_path).exists():
        return
    _settled_size(Path(served.log_path))
    with open(served.log_path, "rb") as src:
        src.seek(log_start)
        run.log.write_bytes(src.read())
    append_records(run.results, server_records(kind, run.log, run.outcome.results))


def run_arm(
    spec: Scenario,
    arm: Arm,
    out_dir: str | Path,
    time_scale: float | None = None,
    console: Console | None = None,
    timeout_s: float = 600.0,
) -> ArmRun:
    """Generate the arm's trace, start a simulator with the arm's flags, replay, stop it."""
    return run_arms(spec, out_dir, [arm.name], time_scale=time_scale, console=console, timeout_s=timeout_s)[0]


def run_shared(
    runs: list[tuple[Scenario, Arm]],
    out_dir: str | Path,
    flags: list[str],
    time_scale: float,
    timeout_s: float = 600.0,
) -> list[ArmRun]:
    """Several (scenario, arm) runs, one after another, on ONE simulator started with `flags`.

    The server's state (live slot, disk checkpoints) carries over from run to run, so use it only
    for runs whose outcome cannot depend on what came before; it saves a process start per run.
    Each run's results get the server records of its own stretch of the log.
    """
    out = Path(out_dir)
    done: list[ArmRun] = []
    with tempfile.TemporaryDirectory(prefix="replay-scenario-") as scratch:
        scaled = flags if "--time-scale" in flags else [*flags, "--time-scale", f"{time_scale:g}"]
        target = resolve_target("sim", None, scaled, Path(scratch))
        with open_target(target, Path(scratch) / "work") as served:
            check_reachable(served.url)
            for spec, arm in runs:
                armed, trace_path, generated = _prepare(spec, arm, out)
                log_start = _log_size(served)
                job = _trace_run(armed, arm, out, served, target.kind, time_scale, trace_path, timeout_s)
                outcome = run_trace(job.trace, job.plan, job.config, job.out, job.target, keep_records=True)
                run = _arm_run(arm, trace_path, generated, outcome)
                _finish(run, served, target.kind, log_start)
                done.append(run)
    return done


def run_arms(
    spec: Scenario,
    out_dir: str | Path,
    arms: list[str] | None = None,
    time_scale: float | None = None,
    console: Console | None = None,
    timeout_s: float = 600.0,
) -> list[ArmRun]:
    """Every arm (or the named ones), each on its own simulator, all at once.

    Arms share nothing but the client's event loop, so the scenario takes as long as its longest
    arm. Each arm's results get its server's whole log: startup lines and shutdown saves too.
    """
    out = Path(out_dir)
    scale = time_scale or spec.run.time_scale
    chosen = [spec.arm(name) for name in arms] if arms else list(spec.arms)
    prepared = []
    for arm in chosen:
        armed, trace_path, generated = _prepare(spec, arm, out)
        if generated.notice and console is not None:
            console.print(f"[yellow]note:[/yellow] {generated.notice}", highlight=False)
        prepared.append((armed, arm, trace_path, generated))
    with ExitStack() as scratches:
        scratch = [
            Path(scratches.enter_context(tempfile.TemporaryDirectory(prefix="replay-scenario-")))
            for _ in prepared
        ]
        targets = [
            resolve_target("sim", None, sim_flags(arm, scale), d)
            for (_, arm, _, _), d in zip(prepared, scratch, strict=True)
        ]
        with _serve_all(targets, scratch) as served:
            jobs = []
            for (armed, arm, trace_path, _), srv, target in zip(prepared, served, targets, strict=True):
                check_reachable(srv.url)
                jobs.append(_trace_run(armed, arm, out, srv, target.kind, scale, trace_path, timeout_s))
            outcomes = run_traces(jobs, keep_records=True)
        runs = []
        for (_, arm, trace_path, generated), outcome, srv, target in zip(
            prepared, outcomes, served, targets, strict=True
        ):
            run = _arm_run(arm, trace_path, generated, outcome)
            _finish(run, srv, target.kind, 0)
            runs.append(run)
    return runs


@contextmanager
def _serve_all(targets: list[Target], scratch: list[Path]) -> Iterator[list[Served]]:
    """Start every arm's simulator at once and stop them all at once: each start and each stop
    waits on its own process (by its PID), so doing them side by side saves a second per arm."""
    contexts = [open_target(t, d / "work") for t, d in zip(targets, scratch, strict=True)]
    with ThreadPoolExecutor(max_workers=len(contexts)) as pool:
        starts = [pool.submit(cm.__enter__) for cm in contexts]
        wait(starts)
        started = [cm for cm, f in zip(contexts, starts, strict=True) if f.exception() is None]
        try:
            yield [f.result() for f in starts]  # the first failed start raises here
        finally:
            for stop in [pool.submit(cm.__exit__, None, None, None) for cm in started]:
                stop.result()
