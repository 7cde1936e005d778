"""`replay ab`: two builds on the same trace, A B B A, then the report (or its JSON)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from replay.commands import print_json
from replay.engine.defaults import AB_HISTORY
from replay.report.ab import render
from replay.report.ab_stats import CONFIDENCE
from replay.runs.ab import run_ab
from replay.runs.options import ReplayOptions


@dataclass(frozen=True, kw_only=True, slots=True)
class AbArgs:
    trace: Path
    a: Path  # target TOML of build A
    b: Path
    options: ReplayOptions = ReplayOptions(history=AB_HISTORY)  # every arm run's
    repeat: int = 2
    out_dir: Path | None = None
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
    args.options.check()  # before any server starts
    progress = Console(stderr=True)
    outcome = run_ab(
        args.trace,
        args.a,
        args.b,
        repeat=args.repeat,
        out_dir=args.out_dir,
        options=args.options,
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
