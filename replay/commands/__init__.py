"""What each CLI command does, with plain arguments: the CLI parses, this module acts."""

from __future__ import annotations

import shlex
import sys
import tempfile
from pathlib import Path

import orjson
from rich.console import Console

from replay.engine.plans import make_plan
from replay.errors import UsageError
from replay.metrics.results import append_records, merged_summary, read_results, time_scale
from replay.report.table import class_table, summary_rows
from replay.runs.pipeline import RunOptions, replay_on
from replay.runs.probe import skip_probes
from replay.runs.serverlog import server_records
from replay.runs.servermetrics import server_memory
from replay.runs.targets import dry_run as dry_run_target
from replay.runs.targets import open_target, resolve_target
from replay.runs.workers import parse_shard, select_shard
from replay.trace.reader import read_trace
from replay.trace.reader import validate as validate_trace


def validate(path: Path) -> str:
    counts = validate_trace(path)
    return (
        f"{path}: ok ({counts['sessions']} sessions, {counts['requests']} requests, "
        f"{counts['blobs']} blobs, {counts['lines']} lines)"
    )


def run(
    trace: Path,
    target: str | None,
    out: Path,
    plan: str = "alternate",
    concurrency: int | None = None,
    speed: float = 1.0,
    round_robin: bool = False,
    api: str | None = None,
    model: str | None = None,
    history: str = "live",
    think: str = "off",
    timeout: float = 1800.0,
    max_duration: float | None = None,
    sim_args: str = "",
    server: Path | None = None,
    service: Path | None = None,
    workdir: Path | None = None,
    dry_run: bool = False,
    workers: int = 1,
    shard: str | None = None,
    console: Console | None = None,
) -> int:
    """Replay a trace; returns the exit code (0 ok, 1 requests failed, 130/143 interrupted)."""
    the_plan = make_plan(plan, concurrency=concurrency, speed=speed, round_robin=round_robin)
    options = RunOptions(the_plan, api, model, history, think, timeout, max_duration)
    if workers < 1:
        raise UsageError("--workers must be at least 1")
    loaded = read_trace(trace)  # validates fully before anything is sent
    if shard is not None:
        loaded = select_shard(loaded, *parse_shard(shard))
    say = (console or Console(stderr=True)).print
    with tempfile.TemporaryDirectory(prefix="replay-scratch-") as scratch:
        tgt = resolve_target(target, server, shlex.split(sim_args), Path(scratch))
        if dry_run:
            dry_run_target(tgt, workdir or Path(scratch), service, say)
            return 0
        loaded, notice = skip_probes(loaded)  # E5-style steps need `replay probe` to restart the server
        if notice:
            say(notice)
        # The server's log must outlive the server: its records are read after it stops.
        work = workdir or Path(scratch) / "work"
        with open_target(tgt, work, service, say=say) as served, server_memory(served, work) as memory:
            done = replay_on(
                served,
                tgt.kind,
                loaded,
                options,
                out,
                header={"shard": shard} if shard else None,
                say=say,
                console=console,
                workers=workers,
                trace_path=trace,
            )
        append_records(out, [done.metrics, *memory, *server_records(tgt.kind, served.log_path, done.records)])
    if console is not None:
        report([out], as_json=False, console=console)
        console.print(f"{done.requests} requests, {done.errors} failed; results in {out}", highlight=False)
        console.print(
            f"HTML report and summary: replay report {out} --html {Path(out).with_suffix('')}-report",
            highlight=False,
        )
    return done.exit_code


def report(paths: list[Path], as_json: bool, console: Console, html: Path | None = None) -> None:
    results = [read_results(p) for p in paths]
    if html is not None:
        from replay.report.html import write_report

        written = write_report(paths, html)
        console.print(f"report: {written.html}\nmarkdown summary: {written.markdown}", highlight=False)
    summary = merged_summary(results)
    if as_json:
        _print_json({"files": [str(p) for p in paths], "classes": summary_rows(summary)})
        return
    title = "Requests by switch class" + (f" ({len(paths)} files merged)" if len(paths) > 1 else "")
    scales = {time_scale(res.run) for res in results}
    console.print(class_table(summary, title=title, time_scale=scales.pop() if len(scales) == 1 else None))
    for res in results:
        line = next((r for r in [res.summary_line] if r), None)
        if line and line.get("lag_p99_s") is not None:
            console.print(
                f"{Path(res.path).name}: outcome {line.get('outcome')}, schedule lag p50 "
                f"{line.get('lag_p50_s'):.4f} s, p99 {line.get('lag_p99_s'):.4f} s",
                highlight=False,
            )


def logs_summary(paths: list[Path], kind: str, year: int | None, as_json: bool, console: Console) -> None:
    from replay.report.logs import print_summary, summarize

    summary = summarize(paths, kind=kind, year=year)
    if as_json:
        _print_json(summary.to_dict())
    else:
        print_summary(summary, console=console)


def restore(journal: Path | None, dry_run: bool, console: Console) -> int:
    from drivers.guard import restore_from_journal

    report = restore_from_journal(journal, dry_run=dry_run, say=console.print)
    return 0 if report.ok else 1


def _print_json(doc: object) -> None:
    sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")


def size_chain(
    tokens: str,
    start: str,
    per_token: str | None,
    fixed: str | None,
    interval: int | None,
    chunk: int | None,
    preset: str,
    others: str,
    anchor: int | None,
    as_json: bool,
    console: Console,
) -> None:
    from replay import sizing as size
    from replay.sim.model.config import parse_tokens

    cfg = size.size_config(preset, per_token=per_token, fixed=fixed, interval=interval, chunk=chunk)
    found = size.chain(parse_tokens(tokens), start=parse_tokens(start), cfg=cfg, anchor=anchor)
    other = size.parse_token_list(others)
    if as_json:
        _print_json(size.chain_json(found, others=other, cfg=cfg))
    else:
        console.print(size.chain_table(found, others=other, cfg=cfg))


def size_sweep(
    trace: Path,
    budgets: str,
    preset: str,
    plan: str,
    speed: float,
    history: str,
    slots: str,
    routing: str,
    target: str | None,
    stale: str | None,
    hidden_reasoning: bool,
    workers: int | None,
    as_json: bool,
    console: Console,
) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from replay import sizing as size
    from replay.sim.model.config import parse_bytes, parse_tokens
    from replay.sizing.parallel import auto_workers

    cfg = size.size_config(preset, hidden_reasoning=hidden_reasoning or None)
    sizes = size.parse_budgets(budgets)
    if not trace.is_file():
        raise UsageError(f"{trace}: no such trace file")
    if workers is not None and workers < 1:
        raise UsageError("--workers must be at least 1")
    processes = workers or auto_workers(trace, len(sizes))
    bar = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=as_json,
    )
    with bar:
        task = bar.add_task(
            f"sweeping {len(sizes)} budget(s) in {processes} process(es); trace lines read", total=None
        )
        found = size.sweep_trace(
            trace,
            sizes,
            cfg=cfg,
            history=history,
            plan=plan,
            speed=speed,
            slots=size.parse_slots(slots),
            routings=[r.strip() for r in routing.split(",") if r.strip()],
            target_reread=parse_tokens(target) if target else None,
            stale=size.stale_files(parse_bytes(stale), cfg) if stale else (),
            workers=processes,
            progress=None
            if as_json
            else lambda done, total: bar.update(task, completed=done, total=total or None),
        )
    if as_json:
        _print_json(size.sweep_json(found))
    else:
        console.print(size.sweep_table(found))
