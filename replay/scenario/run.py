"""Run a scenario's arms on the embedded simulator: one trace, one simulator process, one results
file (and its server log) per arm.

The plan comes from the spec; `timed` and `closed-loop` plans run at the simulator's time scale so
the trace's seconds and the modelled seconds stay the same seconds.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from replay.engine.plans import make_plan
from replay.engine.run import EngineConfig
from replay.runner import RunOutcome, check_reachable, run_trace
from replay.scenario.build import GenerateResult, generate
from replay.scenario.spec import Arm, Scenario
from replay.targets import open_target
from replay.trace.reader import read_trace


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
    if spec.run.plan in ("timed", "closed-loop"):
        parts.append(f"--speed {spec.run.time_scale:g}")
    parts.append(f"--sim-args '{' '.join(flags)}'")
    return " ".join(parts)


def run_arm(
    spec: Scenario,
    arm: Arm,
    out_dir: str | Path,
    time_scale: float | None = None,
    extra_sim: list[str] | None = None,
    console: Console | None = None,
    timeout_s: float = 600.0,
) -> ArmRun:
    """Generate the arm's trace, start a simulator with the arm's flags, replay, stop it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    scale = time_scale or spec.run.time_scale
    armed = spec.with_params(arm.params)
    trace_path = out / f"{spec.name}-{arm.name}.trace.jsonl"
    generated = generate(armed, trace_path)
    if generated.notice and console is not None:
        console.print(f"[yellow]note:[/yellow] {generated.notice}", highlight=False)
    results = out / f"{spec.name}-{arm.name}.results.jsonl"
    log = results.with_suffix(".server.log")
    trace = read_trace(trace_path)
    speed = scale if spec.run.plan in ("timed", "closed-loop") else 1.0
    plan = make_plan(spec.run.plan, concurrency=spec.run.concurrency, speed=speed, round_robin=spec.run.round_robin)
    flags = sim_flags(arm, scale) + list(extra_sim or [])
    with open_target("sim", flags, log_path=log) as target:
        check_reachable(target.url)
        config = EngineConfig(base_url=target.url, timeout_s=timeout_s, run_id=uuid.uuid4().hex[:8])
        described: dict[str, Any] = {**target.describe(), "scenario": spec.name, "arm": arm.name}
        outcome = run_trace(trace, plan, config, results, described)
    return ArmRun(arm=arm.name, trace=trace_path, results=results, log=log, outcome=outcome, generated=generated)


def run_arms(
    spec: Scenario,
    out_dir: str | Path,
    arms: list[str] | None = None,
    time_scale: float | None = None,
    console: Console | None = None,
) -> list[ArmRun]:
    """Every arm (or the named ones) in spec order."""
    chosen = [spec.arm(name) for name in arms] if arms else list(spec.arms)
    return [run_arm(spec, arm, out_dir, time_scale=time_scale, console=console) for arm in chosen]
