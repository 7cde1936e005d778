"""`replay ab`: two builds on the same trace, A B B A, then the report (or its JSON)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from replay.commands import print_json
from replay.engine.defaults import AB_HISTORY, PLAN, SPEED, THINK, TIMEOUT_S
from replay.report.ab import render
from replay.report.ab_stats import CONFIDENCE
from replay.runs.ab import run_ab
from replay.runs.options import ReplayOptions


@dataclass(frozen=True, kw_only=True, slots=True)
class AbArgs:
    trace: Path
    a: Path  # target TOML of build A
    b: Path
    repeat: int = 2
    out_dir: Path | None = None
    plan: str = PLAN
    concurrency: int | None = None
    speed: float = SPEED
    round_robin: bool = False
    api: str | None = None
    model: str | None = None
    history: str = AB_HISTORY
    think: str = THINK
    timeout: float = TIMEOUT_S
    max_duration: float | None = None
    reuse_cache: bool = False
    keep_cache: bool = False
    service: Path | None = None
    as_json: bool = False
    allow_identical: bool = False  # an A/A noise check instead of refusing arms that do not differ
    confidence: float = CONFIDENCE
    a_ref: str | None = None  # a git ref of A's checkout, built in its own worktree
    b_ref: str | None = None
    verbose: bool = False  # the method, the ratio tables and the per-class figures too


def ab(args: AbArgs, console: Console) -> int:
    """Run every arm run, then print the report; returns the exit code."""
    options = ReplayOptions(
        plan=args.plan,
        concurrency=args.concurrency,
        speed=args.speed,
        round_robin=args.round_robin,
        api=args.api,
        model=args.model,
        history=args.history,
        think=args.think,
        timeout=args.timeout,
        max_duration=args.max_duration,
    )
    options.check()
    progress = Console(stderr=True)
    outcome = run_ab(
        args.trace,
        args.a,
        args.b,
        repeat=args.repeat,
        out_dir=args.out_dir,
        options=options,
        reuse_cache=args.reuse_cache,
        keep_cache=args.keep_cache,
        service=args.service,
        say=lambda msg: progress.print(msg, highlight=False),
        allow_identical=args.allow_identical,
        confidence=args.confidence,
        refs={arm: ref for arm, ref in (("A", args.a_ref), ("B", args.b_ref)) if ref},
    )
    if args.as_json:
        print_json(outcome.doc)
    else:
        render(outcome.doc, console, verbose=args.verbose)
        page = outcome.summary_path.parent / "report" / "index.html"
        console.print(f"summary in {outcome.summary_path}; report in {page}", highlight=False)
    return outcome.exit_code
