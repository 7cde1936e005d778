"""Run a scenario's arms on the embedded simulator: one trace, one simulator process, one results
file (and its server log) per arm.

The plan comes from the spec; `timed` and `closed-loop` plans run at the simulator's time scale so
the trace's seconds and the modelled seconds stay the same seconds.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from drivers.target import load_target
from replay.engine.defaults import SCENARIO_TIMEOUT_S
from replay.errors import UsageError
from replay.runs.leftovers import disk_mib, write_leftovers
from replay.runs.options import ReplayOptions
from replay.runs.pipeline import Replayed, ReplayJob, RunOutcome, finish, replay
from replay.runs.probe import replay_restarting
from replay.runs.targets import Target, open_target, open_targets, resolve_target
from replay.scenario.build import GenerateResult, generate, plan_requests
from replay.scenario.show import arm_sim_flags
from replay.scenario.spec import Arm, Scenario
from replay.sim.server.flags import server_kind
from replay.trace.reader import read_trace
from replay.trace.select import PROBE_TAG

if TYPE_CHECKING:
    from drivers.launch import Served


@dataclass(slots=True)
class ArmResult:
    arm: str
    trace: Path
    results: Path
    log: Path
    outcome: RunOutcome
    generated: GenerateResult


def first_request_clock(spec: Scenario, trace_path: Path) -> str | None:
    """The report's clock at the trace's first request (`--clock`), for a spec that has one."""
    if spec.clock is None:
        return None
    first = next(iter(read_trace(trace_path).requests), None)
    when = datetime.fromisoformat(spec.clock) + timedelta(seconds=first.t if first is not None else 0.0)
    return when.isoformat()


def _prepare(spec: Scenario, arm: Arm, out: Path) -> tuple[Scenario, Path, GenerateResult]:
    out.mkdir(parents=True, exist_ok=True)
    armed = spec.with_params(arm.params)
    trace_path = out / f"{spec.name}-{arm.name}.trace.jsonl"
    return armed, trace_path, generate(armed, trace_path)


# What a scenario's arms ask of the engine unless told otherwise; each arm's spec gives the schedule.
ARM_OPTIONS = ReplayOptions(timeout=SCENARIO_TIMEOUT_S)


def _scheduled(spec: Scenario, options: ReplayOptions, scale: float) -> ReplayOptions:
    """`options` with the spec's schedule and thinking: timed and closed-loop run at the
    simulator's speed-up, and then a reply is done when its modelled seconds say (`modelled_done`:
    this host's delay per call, times the scale, would pile up along each session's chain)."""
    speed = scale if spec.run.plan in ("timed", "closed-loop") else 1.0
    return dataclasses.replace(
        options,
        plan=spec.run.plan,
        concurrency=spec.run.concurrency,
        speed=speed,
        round_robin=spec.run.round_robin,
        think=spec.run.think,
        modelled_done=speed == scale,
    )


def _job(
    spec: Scenario,
    arm: Arm,
    out: Path,
    served: Served,
    scale: float,
    trace_path: Path,
    options: ReplayOptions,
    workdir: Path,
    disk_at_start_mib: float = 0.0,
) -> ReplayJob:
    """What replaying one arm against a server that is already up takes; `disk_at_start_mib`:
    what an earlier day's files take of the disk budget (the report's disk strip starts there)."""
    return ReplayJob(
        served=served,
        trace=read_trace(trace_path),
        options=_scheduled(spec, options, scale),
        out=out / f"{spec.name}-{arm.name}.results.jsonl",
        workdir=workdir,
        header={
            "scenario": spec.name,
            "arm": arm.name,
            "time_scale": scale,
            **({"disk_at_start_mib": disk_at_start_mib} if disk_at_start_mib else {}),
        },
    )


def _log_size(served: Served) -> int:
    path = served.log_path
    return Path(path).stat().st_size if path and Path(path).exists() else 0


def _arm_result(arm: Arm, trace_path: Path, generated: GenerateResult, outcome: RunOutcome) -> ArmResult:
    results = Path(outcome.out)
    return ArmResult(
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


def _finish(run: ArmResult, done: Replayed, served: Served, log_start: int) -> None:
    """Copy this run's part of the server log next to its results and append the lines that
    follow its summary (counters, memory, the log's `server` records)."""
    log = None
    if served.log_path is not None and Path(served.log_path).exists():
        _settled_size(Path(served.log_path))
        with open(served.log_path, "rb") as src:
            src.seek(log_start)
            run.log.write_bytes(src.read())
        log = run.log
    finish(done, log)


def run_arm(
    spec: Scenario,
    arm: Arm,
    out_dir: str | Path,
    time_scale: float | None = None,
    console: Console | None = None,
    options: ReplayOptions = ARM_OPTIONS,
) -> ArmResult:
    """Generate the arm's trace, start a simulator with the arm's flags, replay, stop it."""
    return run_arms(spec, out_dir, [arm.name], time_scale=time_scale, console=console, options=options)[0]


def run_shared(
    runs: list[tuple[Scenario, Arm]],
    out_dir: str | Path,
    flags: list[str],
    time_scale: float,
    options: ReplayOptions = ARM_OPTIONS,
) -> list[ArmResult]:
    """Several (scenario, arm) runs, one after another, on ONE simulator started with `flags`.

    The server's state (live slot, disk checkpoints) carries over from run to run, so use it only
    for runs whose outcome cannot depend on what came before; it saves a process start per run.
    Each run's results get the server records of its own stretch of the log.
    """
    out = Path(out_dir)
    done: list[ArmResult] = []
    with tempfile.TemporaryDirectory(prefix="replay-scenario-") as scratch:
        scaled = flags if "--time-scale" in flags else [*flags, "--time-scale", f"{time_scale:g}"]
        if any(spec.leftovers for spec, _ in runs):
            raise UsageError("scenarios with [[leftovers]] need a simulator of their own (run_arms)")
        target = resolve_target("sim", None, scaled, Path(scratch))
        work = Path(scratch) / "work"
        with open_target(target, work) as served:
            for spec, arm in runs:
                armed, trace_path, generated = _prepare(spec, arm, out)
                log_start = _log_size(served)
                job = _job(armed, arm, out, served, time_scale, trace_path, options, work)
                (replayed,) = replay([job], say=_quiet)
                run = _arm_result(arm, trace_path, generated, replayed.outcome)
                _finish(run, replayed, served, log_start)
                done.append(run)
    return done


def run_arms(
    spec: Scenario,
    out_dir: str | Path,
    arms: list[str] | None = None,
    time_scale: float | None = None,
    console: Console | None = None,
    options: ReplayOptions = ARM_OPTIONS,
) -> list[ArmResult]:
    """Every arm (or the named ones), each on its own simulator, all at once.

    Arms share nothing but the client's event loop, so the scenario takes as long as its longest
    arm. Each arm's results get its server's whole log: startup lines and shutdown saves too.
    """
    out = Path(out_dir)
    scale = time_scale or spec.run.time_scale
    chosen = [spec.arm(name) for name in arms] if arms else list(spec.arms)
    prepared = []
    restarting: dict[str, ArmResult] = {}
    fleets = []
    for arm in chosen:
        armed, trace_path, generated = _prepare(spec, arm, out)
        if arm.fleet is not None:
            fleets.append((armed, arm, trace_path, generated))
            continue
        if server_kind(list(arm.sim)) == "llama" and _has_probes(trace_path):
            restarting[arm.name] = _run_restarting(armed, arm, trace_path, generated, out, scale, options)
            continue
        if generated.notice and console is not None:
            console.print(f"[yellow]note:[/yellow] {generated.notice}", highlight=False)
        prepared.append((armed, arm, trace_path, generated))
    if fleets:
        for run in _run_fleets(fleets, out, scale, options):
            restarting[run.arm] = run
    if not prepared:
        return [restarting[arm.name] for arm in chosen]
    with ExitStack() as scratches:
        scratch = [
            Path(scratches.enter_context(tempfile.TemporaryDirectory(prefix="replay-scenario-")))
            for _ in prepared
        ]
        targets = [
            resolve_target("sim", None, arm_sim_flags(arm, scale, first_request_clock(armed, trace_path)), d)
            for (armed, arm, trace_path, _), d in zip(prepared, scratch, strict=True)
        ]
        at_start = [
            disk_mib(
                write_leftovers(
                    armed, trace_path, d / "kv", list(arm.sim), first_request_clock(armed, trace_path)
                )
            )
            for (armed, arm, trace_path, _), d in zip(prepared, scratch, strict=True)
        ]
        with _serve_all(targets, scratch) as served:
            jobs = [
                _job(armed, arm, out, srv, scale, trace_path, options, d / "work", mib)
                for (armed, arm, trace_path, _), srv, d, mib in zip(
                    prepared, served, scratch, at_start, strict=True
                )
            ]
            say = _quiet if console is None else (lambda m: console.print(m, highlight=False))
            replayed = replay(jobs, say=say)
        runs = []
        for (_, arm, trace_path, generated), done, srv in zip(prepared, replayed, served, strict=True):
            run = _arm_result(arm, trace_path, generated, done.outcome)
            _finish(run, done, srv, 0)
            runs.append(run)
    side = {run.arm: run for run in runs}
    return [restarting.get(arm.name) or side[arm.name] for arm in chosen]


def _has_probes(trace_path: Path) -> bool:
    return any(r.tag == PROBE_TAG for r in read_trace(trace_path).requests)


def _run_restarting(
    spec: Scenario,
    arm: Arm,
    trace_path: Path,
    generated: GenerateResult,
    out: Path,
    scale: float,
    options: ReplayOptions,
) -> ArmResult:
    """An arm on the simulator playing llama-server whose trace has `probe` requests (E5: save the
    slot, restart, restore, resend): replayed through the probe's restarts, on its own."""
    results = out / f"{spec.name}-{arm.name}.results.jsonl"
    labels = {p.rid: p.label for p in plan_requests(spec)}
    with tempfile.TemporaryDirectory(prefix="replay-scenario-") as scratch:
        target = resolve_target("sim", None, arm_sim_flags(arm, scale), Path(scratch))
        done = replay_restarting(
            target,
            read_trace(trace_path),
            labels,
            results,
            results.with_suffix(".server.log"),
            Path(scratch) / "work",
            _scheduled(spec, options, scale),
            header={"scenario": spec.name, "arm": arm.name, "time_scale": scale},
        )
    return _arm_result(arm, trace_path, generated, done.outcome)


def fleet_targets(arm: Arm, scale: float, scratch: Path) -> Path:
    """The target files of a fleet arm, written into `scratch`: `replicas` simulators with the
    arm's flags (`sims.toml`), and SGLang's router in front of them (`router.toml`) when the arm
    names a router policy. Returns the file to start: the router's, or the simulators'."""
    fleet = arm.fleet
    assert fleet is not None
    flags = arm_sim_flags(arm, scale)
    sims = [
        'kind = "sim"',
        'name = "sims"',
        f"replicas = {fleet.replicas}",
        f"flags = {json.dumps(flags)}",
    ]
    if server_kind(flags) != "llama":
        sims.append('kv_disk_dir = "auto"')  # each replica its own directory
    (scratch / "sims.toml").write_text("\n".join(sims) + "\n")
    if fleet.router is None:
        return scratch / "sims.toml"
    router = ['kind = "sglang-router"', 'name = "router"', f'policy = "{fleet.router}"']
    router += ['backend = "sims.toml"', "ready_timeout = 120"]
    (scratch / "router.toml").write_text("\n".join(router) + "\n")
    return scratch / "router.toml"


def _run_fleets(
    fleets: list[tuple[Scenario, Arm, Path, GenerateResult]], out: Path, scale: float, options: ReplayOptions
) -> list[ArmResult]:
    """The arms over several simulators, side by side: each fleet started (its simulators, then
    its router in front of them, each by its PID), all replayed at once, and every process
    stopped whatever happens (`open_targets` stops what it started, the last started first, on
    every way out; `_serve_all` waits on each start and each stop)."""
    with ExitStack() as scratches:
        scratch = [
            Path(scratches.enter_context(tempfile.TemporaryDirectory(prefix="replay-fleet-"))) for _ in fleets
        ]
        targets = [
            load_target(fleet_targets(arm, scale, d))
            for (_, arm, _, _), d in zip(fleets, scratch, strict=True)
        ]
        with _serve_all(targets, scratch, fleet=True) as served:
            jobs = [_fleet_job(armed, arm, trace_path, out, srv, scale, options, d / "work")
                    for (armed, arm, trace_path, _), srv, d in zip(fleets, served, scratch, strict=True)]  # fmt: skip
            replayed = replay(jobs, say=_quiet)
        runs = []
        for (_, arm, trace_path, generated), done, srv in zip(fleets, replayed, served, strict=True):
            run = _arm_result(arm, trace_path, generated, done.outcome)
            _finish(run, done, srv[0], 0)
            runs.append(run)
    return runs


def _fleet_job(
    spec: Scenario,
    arm: Arm,
    trace_path: Path,
    out: Path,
    served: list[Served],
    scale: float,
    options: ReplayOptions,
    workdir: Path,
) -> ReplayJob:
    """What replaying one fleet arm takes: the router (or the client's routing) in front of the
    arm's simulators, `served[0]` the address the client sends to."""
    fleet = arm.fleet
    assert fleet is not None
    options = dataclasses.replace(_scheduled(spec, options, scale), routing=fleet.routing or "sticky")
    return ReplayJob(
        served=served[0],
        fleet=tuple(served) if fleet.routing is not None else (),
        trace=read_trace(trace_path),
        options=options,
        out=out / f"{spec.name}-{arm.name}.results.jsonl",
        workdir=workdir,
        header={
            "scenario": spec.name,
            "arm": arm.name,
            "time_scale": scale,
            "fleet": {"replicas": fleet.replicas, "router": fleet.router, "routing": fleet.routing},
        },
    )


def _quiet(_message: str) -> None:
    """Where a run without a console says things (nothing is shown)."""


@contextmanager
def _serve_all(targets: list[Target], scratch: list[Path], fleet: bool = False) -> Iterator[list[Any]]:
    """Start every arm's simulator at once and stop them all at once: each start and each stop
    waits on its own process (by its PID), so doing them side by side saves a second per arm.
    `fleet`: each target is a fleet (`open_targets`: its servers, and its router), served as the
    list of its processes."""
    contexts: list[Any] = [
        open_targets([t], d / "work") if fleet else open_target(t, d / "work")
        for t, d in zip(targets, scratch, strict=True)
    ]
    with ThreadPoolExecutor(max_workers=len(contexts)) as pool:
        starts = [pool.submit(cm.__enter__) for cm in contexts]
        wait(starts)
        started = [cm for cm, f in zip(contexts, starts, strict=True) if f.exception() is None]
        try:
            yield [f.result() for f in starts]  # the first failed start raises here
        finally:
            for stop in [pool.submit(cm.__exit__, None, None, None) for cm in started]:
                stop.result()
