"""`replay size chain` and `replay size sweep`: how big the disk KV budget must be."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from replay.commands import print_json
from replay.errors import UsageError


@dataclass(frozen=True, kw_only=True, slots=True)
class ChainArgs:
    tokens: str
    start: str = "0"
    per_token: str | None = None
    fixed: str | None = None
    interval: int | None = None
    chunk: int | None = None
    preset: str = "qwen38-q2"
    others: str = ""
    anchor: int | None = None
    as_json: bool = False


def chain(args: ChainArgs, console: Console) -> int:
    from replay import sizing as size
    from replay.sim.model.config import parse_tokens

    cfg = size.size_config(
        args.preset, per_token=args.per_token, fixed=args.fixed, interval=args.interval, chunk=args.chunk
    )
    found = size.chain(parse_tokens(args.tokens), start=parse_tokens(args.start), cfg=cfg, anchor=args.anchor)
    other = size.parse_token_list(args.others)
    if args.as_json:
        print_json(size.chain_json(found, others=other, cfg=cfg))
    else:
        console.print(size.chain_table(found, others=other, cfg=cfg))
    return 0


def _check_context(trace: Path, ctx: int, given: bool, preset: str) -> None:
    """Refuse a trace whose prompts do not fit the context before sweeping (the model would refuse
    the first such request minutes in), naming the flag that fixes it."""
    from replay.trace.prompts import trace_overflow

    found = trace_overflow(trace, ctx)
    if found is not None:
        context = f"--ctx {ctx}" if given else f"the {ctx:,}-token context of preset {preset}"
        raise UsageError(f"{trace}: {found.describe(context)}; give --ctx {found.suggested_ctx()}")


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepArgs:
    trace: Path
    budgets: str = "4G,8G,16G,24G,32G,48G,64G"
    preset: str = "qwen38-q2"
    plan: str = "sequential"
    speed: float = 1.0
    history: str = "live"
    slots: str = "1"
    routing: str = "upstream"
    target: str | None = None  # goal: no switch re-reads more than this
    stale: str | None = None  # earlier days' checkpoints already on disk
    hidden_reasoning: bool = False
    ctx: str | None = None  # context tokens (default: the preset's)
    workers: int | None = None  # default: one per core for big traces
    as_json: bool = False


def sweep(args: SweepArgs, console: Console) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from replay import sizing as size
    from replay.sim.model.config import parse_bytes, parse_tokens
    from replay.sizing.parallel import auto_workers

    ctx = parse_tokens(args.ctx) if args.ctx is not None else None
    if ctx is not None and ctx < 1:
        raise UsageError("--ctx must be at least 1 token")
    cfg = size.size_config(args.preset, hidden_reasoning=args.hidden_reasoning or None, ctx=ctx)
    sizes = size.parse_budgets(args.budgets)
    if not args.trace.is_file():
        raise UsageError(f"{args.trace}: no such trace file")
    if args.workers is not None and args.workers < 1:
        raise UsageError("--workers must be at least 1")
    _check_context(args.trace, cfg.ctx, ctx is not None, args.preset)
    processes = args.workers or auto_workers(args.trace, len(sizes))
    bar = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=args.as_json,
    )
    with bar:
        task = bar.add_task(
            f"sweeping {len(sizes)} budget(s) in {processes} process(es); trace lines read", total=None
        )
        found = size.sweep_trace(
            args.trace,
            sizes,
            cfg=cfg,
            history=args.history,
            plan=args.plan,
            speed=args.speed,
            slots=size.parse_slots(args.slots),
            routings=[r.strip() for r in args.routing.split(",") if r.strip()],
            target_reread=parse_tokens(args.target) if args.target else None,
            stale=size.stale_files(parse_bytes(args.stale), cfg) if args.stale else (),
            workers=processes,
            progress=None
            if args.as_json
            else lambda done, total: bar.update(task, completed=done, total=total or None),
        )
    if args.as_json:
        print_json(size.sweep_json(found))
    else:
        console.print(size.sweep_table(found))
    return 0
