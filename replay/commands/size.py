"""`replay size chain` and `replay size sweep`: how big the disk KV budget must be."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from replay.commands import print_json
from replay.errors import UsageError
from replay.sim.model.config import SimConfig


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
    plan: str = "auto"  # a scenario's trace: its plan; else alternate, as `replay run`
    speed: float = 1.0
    concurrency: int | None = None
    round_robin: bool = False
    think: str = "auto"
    sim_args: str = ""  # simulator flags (`replay sim serve`'s), e.g. '--build sept'
    history: str = "live"
    slots: str = "1"
    routing: str = "upstream"
    target: str | None = None  # goal: no switch re-reads more than this
    stale: str | None = None  # earlier days' checkpoints already on disk
    hidden_reasoning: bool = False
    ctx: str | None = None  # context tokens (default: the preset's)
    workers: int | None = None  # default: one per core for big traces
    as_json: bool = False
    server: str = "ds4"  # ds4 | llama: which server's cache model the sweep walks
    cache_ram: str = "0,2G,8G,16G"  # llama: host prompt cache sizes (--cache-ram)
    n_parallel: str = "1"  # llama: slot counts (-np)


def sweep(args: SweepArgs, console: Console) -> int:
    if args.server == "llama":
        return sweep_llama_cmd(args, console)
    if args.server != "ds4":
        raise UsageError(f"--server must be ds4 or llama, not {args.server!r}")
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from replay import sizing as size
    from replay.sim.model.config import parse_bytes, parse_tokens
    from replay.sizing.parallel import auto_workers

    ctx = parse_tokens(args.ctx) if args.ctx is not None else None
    if ctx is not None and ctx < 1:
        raise UsageError("--ctx must be at least 1 token")
    if not args.trace.is_file():
        raise UsageError(f"{args.trace}: no such trace file")
    plan, think, sim_args, on_disk, origin = args.plan, args.think, args.sim_args, None, None
    if plan == "auto":
        plan, think, sim_args, on_disk, origin = _as_its_scenario(args)
    cfg = size.size_config(args.preset, hidden_reasoning=args.hidden_reasoning or None, ctx=ctx)
    if sim_args.strip():
        ctx_flag = f" --ctx {ctx}" if ctx is not None else ""
        cfg = _sim_config(args.preset, sim_args + ctx_flag, args.hidden_reasoning)
    sizes = size.parse_budgets(args.budgets)
    if args.workers is not None and args.workers < 1:
        raise UsageError("--workers must be at least 1")
    _check_context(args.trace, cfg.ctx, ctx is not None, args.preset)
    if origin is not None and not args.as_json:
        console.print(origin, highlight=False)  # said once the sweep can go ahead
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
            think=think,
            plan=plan,
            speed=args.speed,
            concurrency=args.concurrency,
            round_robin=args.round_robin,
            slots=size.parse_slots(args.slots),
            routings=[r.strip() for r in args.routing.split(",") if r.strip()],
            target_reread=parse_tokens(args.target) if args.target else None,
            stale=size.stale_files(parse_bytes(args.stale), cfg) if args.stale else (),
            on_disk=on_disk,
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


def _sim_config(preset: str, sim_args: str, hidden_reasoning: bool) -> SimConfig:
    """The cache model as `replay sim serve` would run with these flags (the budget aside: each
    budget of the sweep replaces `--kv-disk-space-mb`)."""
    import shlex

    from replay.sim.server.options import flag_problem, parse

    argv = ["--preset", preset, *shlex.split(sim_args), "--kv-disk-dir", "unused"]
    if hidden_reasoning:
        argv.append("--hidden-reasoning")
    problem = flag_problem(argv)
    if problem is not None:
        raise UsageError(f"--sim-args: {problem}")
    cfg, _ = parse(argv)
    return cfg


def _as_its_scenario(args: SweepArgs) -> tuple[str, str, str, Any, str | None]:
    """`--plan auto`: a trace a built-in scenario generated is swept as `scenario run` replays it
    (its plan and `--think`, its arms' server flags but the budget, the files its earlier day left
    on disk); any other trace with `replay run`'s default plan, alternate. Returns (plan, think,
    simulator flags, files on disk, a line saying so or None)."""
    import shlex

    from replay.errors import ReplayError
    from replay.runs.leftovers import leftover_checkpoints
    from replay.scenario.catalog import SCENARIOS_DIR, find_scenario
    from replay.trace.reader import iter_records

    records = iter_records(args.trace)
    first = next(records, None)  # the header line, read alone
    records.close()
    source = (
        str(first[1].get("source") or "") if first is not None and first[1].get("kind") == "trace" else ""
    )
    name = source.removeprefix("scenario:") if source.startswith("scenario:") else None
    if name is None or not (SCENARIOS_DIR / f"{name}.toml").exists():
        return "alternate", args.think, args.sim_args, None, None
    try:
        spec = find_scenario(name)
    except ReplayError:
        return "alternate", args.think, args.sim_args, None, None
    flags = _without_budget(spec.arms[0].sim)
    sim_args = args.sim_args or shlex.join(flags)
    think = args.think if args.think != "auto" else spec.run.think
    trace = args.trace

    def on_disk(cfg: SimConfig) -> list[Any]:
        return leftover_checkpoints(spec, trace, cfg)

    said = (
        f"{trace}: generated by scenario {name}, swept as `replay scenario run` replays it: plan "
        f"{spec.run.plan}, --think {think}, server flags {sim_args or '(defaults)'} (its arm "
        f"{spec.arms[0].name}'s but the budget)"
        + (f", {len(spec.leftovers)} kind(s) of files on disk from an earlier day" if spec.leftovers else "")
        + " (--plan NAME sweeps it otherwise)"
    )
    return spec.run.plan, think, sim_args, on_disk if spec.leftovers else None, said


def _without_budget(flags: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    skip = False
    for flag in flags:
        if skip:
            skip = False
            continue
        if flag in ("--kv-disk-space-mb", "--time-scale", "--clock"):
            skip = True
            continue
        out.append(flag)
    return out


def sweep_llama_cmd(args: SweepArgs, console: Console) -> int:
    """`replay size sweep TRACE --server llama --cache-ram 0,2G,8G,16G --np 1,2`."""
    from replay.sim.model.config import parse_tokens
    from replay.sim.model.llama.config import PRESETS as LLAMA_PRESETS
    from replay.sizing.llama import smallest, sweep_llama
    from replay.trace.reader import read_trace

    if not args.trace.is_file():
        raise UsageError(f"{args.trace}: no such trace file")
    if args.history not in ("live", "recorded"):
        raise UsageError(f"--history must be live or recorded, not {args.history!r}")
    rams = parse_cache_ram(args.cache_ram)
    slots = []
    for part in args.n_parallel.split(","):
        if part.strip():
            if not part.strip().isdigit() or int(part) < 1:
                raise UsageError(f"--np takes slot counts of 1 or more, e.g. 1,2 (not {part.strip()!r})")
            slots.append(int(part))
    preset = args.preset if args.preset in LLAMA_PRESETS else "report002-hybrid"
    ctx = parse_tokens(args.ctx) if args.ctx is not None else None
    loaded = read_trace(args.trace, freeze=True)
    rows = sweep_llama(loaded.requests, rams, slots, preset=preset, history=args.history, n_ctx=ctx)
    target = parse_tokens(args.target) if args.target else None
    best = smallest(rows, target)
    if args.as_json:
        print_json(
            {
                "server": "llama",
                "preset": preset,
                "rows": [r.to_dict() for r in rows],
                "smallest": {str(k): (None if v is None else v.cache_ram_mib) for k, v in best.items()},
            }
        )
        return 0
    console.print(
        f"llama-server model, preset {preset}, requests one at a time ({args.history} history)",
        highlight=False,
    )
    console.print(
        f"{'-np':>3} {'--cache-ram':>11} {'re-processed':>12} {'on switches':>11} {'worst switch':>12} "
        f"{'restores':>8} {'evictions':>9} {'prefill s':>9}",
        highlight=False,
    )
    for r in rows:
        console.print(
            f"{r.n_parallel:>3} {r.cache_ram_mib:>11} {r.reprocessed:>12,} {r.switch_reprocessed:>11,} "
            f"{r.worst_switch:>12,} {r.host_restores:>8} {r.host_evictions:>9} {r.prompt_s:>9.1f}",
            highlight=False,
        )
    goal = (
        f"no switch re-processes more than {target:,} tokens"
        if target is not None
        else ("the worst switch as cheap as with the largest cache")
    )
    for np_, r in best.items():
        said = "none of these sizes" if r is None else f"--cache-ram {r.cache_ram_mib}"
        console.print(f"-np {np_}: smallest host cache with {goal}: {said}", highlight=False)
    return 0


def parse_cache_ram(text: str) -> list[int]:
    """`0,2G,8G,16G` -> MiB, as `--cache-ram` takes them (a bare number is MiB, as the flag's)."""
    from replay.sim.model.config import parse_bytes

    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        mib = int(part) if part.isdigit() else parse_bytes(part) // (1 << 20)
        out.add(mib)
    if not out:
        raise UsageError("--cache-ram needs at least one size, e.g. 0,2G,8G,16G")
    return sorted(out)
