"""`replay scenario list|show|generate|run|check`: the built-in scenarios, their traces, their arms
and their field figures."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from replay.errors import ReplayError
from replay.outputs import check_file, check_folder, output_folder, replacing
from replay.report.html import DIGEST_ROWS, Written, digest, write_report
from replay.runs.options import ReplayOptions
from replay.runs.scenario import ARM_OPTIONS, ArmResult, run_arms
from replay.scenario.build import generate as write_trace
from replay.scenario.build import plan_requests
from replay.scenario.catalog import find_scenario, list_scenarios
from replay.scenario.check import ArmView, Verdict, evaluate, routing_texts
from replay.scenario.expect import REQUEST_METRICS
from replay.scenario.show import describe, list_table
from replay.scenario.spec import Scenario, parse_params
from replay.serverside.logs import records_beside
from replay.sim.model.config import DEFAULT_PRESET, PRESETS


def list_(console: Console) -> int:
    """`replay scenario list`: one line per built-in scenario."""
    console.print(list_table(list_scenarios()))
    return 0


@dataclass(frozen=True, kw_only=True, slots=True)
class ShowArgs:
    name: str  # scenario name or spec file
    params: list[str] = field(default_factory=list)  # k=v overrides
    inputs: bool = False  # the inputs table, each with its measured sensitivity
    verbose: bool = False  # the modelling notes, every field figure with its gap, the per-arm commands


def show(args: ShowArgs, console: Console) -> int:
    spec = find_scenario(args.name, parse_params(args.params))
    if args.inputs:
        console.print(inputs_table(spec, console))
        return 0
    console.print(describe(spec, verbose=args.verbose))
    return 0


def inputs_table(spec: Scenario, console: Console) -> Table:
    """Every input of the spec: its value, the report's words or why it is assumed, and how far
    each row moves across its plausible range (walked in modelled time, a few seconds each)."""
    import tempfile

    from replay.runs.sensitivity import current_value, sensitivity, walk_rows

    table = Table(
        title=f"{spec.name}: inputs, their sources, and how far each row moves across an input's range",
        title_justify="left",
        show_lines=True,
    )
    for name in ("input", "value", "source or assumed", "range", "sensitivity (low | as written | high)"):
        table.add_column(name)
    for arm in spec.arms:
        table.add_row(f"arm {arm.name}", " ".join(arm.sim) or "defaults", arm.source or arm.about, "", "")
    with tempfile.TemporaryDirectory(prefix="replay-inputs-") as scratch:
        base = walk_rows(spec, Path(scratch)) if spec.expects else []
    with console.status("measuring each input's range on the model...") as status:
        for inp in spec.inputs:
            moves = sensitivity(spec, inp, base, say=lambda m: status.update(f"walking the rows at {m}"))
            if inp.range is None:
                moved = "-" if inp.name != "run.time_scale" else "no row: rows are judged in modelled time"
            elif not moves:
                moved = "no row moves"
            else:
                moved = "\n".join(f"{m.row}: {m.low} | {m.base} | {m.high}" for m in moves)
            span = "" if inp.range is None else f"{inp.range[0]:g}-{inp.range[1]:g}"
            source = inp.provenance + (f"\n[dim]{inp.note}[/dim]" if inp.note else "")
            table.add_row(inp.name, _value(current_value(spec, inp)), source, span, moved)
    return table


def _value(value: object) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


@dataclass(frozen=True, kw_only=True, slots=True)
class GenerateArgs:
    name: str
    out: Path | None = None  # default NAME.jsonl in the current directory
    params: list[str] = field(default_factory=list)
    force: bool = False  # replace an existing trace (once the new one is complete)


def generate(args: GenerateArgs, console: Console) -> int:
    """Write the trace (whole, then renamed into place) and say what is in it."""
    overrides = parse_params(args.params)
    spec = find_scenario(args.name, overrides)
    path = args.out or Path(f"{spec.name}.jsonl")
    check_file(path, option="--out", force=args.force)
    with replacing(path) as written:
        result = write_trace(spec, written)
    tags = ", ".join(f"{n} {tag}" for tag, n in sorted(result.tags.items()))
    console.print(
        f"{path}: {result.requests} requests ({tags}) in {result.sessions} sessions from scenario {spec.name}",
        highlight=False,
    )
    if result.notice:
        console.print(f"[yellow]note:[/yellow] {result.notice}", highlight=False)
    if (warning := context_warning(spec, path, overrides)) is not None:
        Console(stderr=True).print(f"[yellow]warning:[/yellow] {warning}", highlight=False, soft_wrap=True)
    return 0


def context_warning(spec: Scenario, trace: Path, overrides: dict[str, Any]) -> str | None:
    """What to say when the trace's prompts do not fit the context of the simulator the scenario's
    arms run (the smallest, where arms differ): `scenario run` would see them fail, `size sweep`
    refuse them. It names the parameters that made the trace long: the ones given with --param,
    else all of the spec's."""
    from replay.sim.server.options import parse as parse_sim_flags
    from replay.trace.prompts import trace_overflow

    contexts = {}
    for arm in spec.arms:
        try:
            cfg = parse_sim_flags(list(arm.sim))[0]
        except (ReplayError, SystemExit):  # flags `scenario run` itself would refuse
            continue
        contexts[cfg.ctx] = cfg.preset
    ctx, preset = min(contexts.items()) if contexts else (PRESETS[DEFAULT_PRESET].ctx, DEFAULT_PRESET)
    found = trace_overflow(trace, ctx)
    if found is None:
        return None
    named = overrides or spec.params
    params = ", ".join(f"{k}={v}" for k, v in named.items())
    why = (
        f"You set {params}: lower it" if overrides else f"Its parameters are {params}: lower one with --param"
    )
    return (
        f"{trace}: {found.describe(f'the {ctx:,}-token context of the scenario simulator ({preset})')}. "
        f"{why} (or give the server a larger context: `--ctx {found.suggested_ctx()}` in "
        "`replay size sweep`, in `--sim-args` of `replay run`)"
    )


def digest_table(written: Written, title: str) -> Table:
    """The arms side by side: what each switch cost (the report's first table, in the terminal)."""
    digests = [digest(view) for view in written.runs]
    table = Table(title=title, title_justify="left")
    table.add_column("")
    for d in digests:
        table.add_column(str(d["label"]), justify="right")
    for _, name, fmt in DIGEST_ROWS:
        table.add_row(name, *(fmt(d) for d in digests))
    return table


def run_and_report(
    spec: Scenario,
    out_dir: Path,
    console: Console,
    arms: list[str] | None = None,
    time_scale: float | None = None,
    options: ReplayOptions = ARM_OPTIONS,
) -> tuple[int, list[ArmResult], Written | None]:
    """Each arm on its own simulator (all at once), then the HTML report of all of them in
    `out_dir/report`."""
    chosen = arms or [a.name for a in spec.arms]
    console.print(f"running {len(chosen)} arm(s) side by side: {', '.join(chosen)}", highlight=False)
    runs = run_arms(spec, out_dir, chosen, time_scale=time_scale, console=console, options=options)
    for run in runs:
        console.print(
            f"  {run.arm:>8}: {run.outcome.requests} requests, {run.outcome.errors} failed "
            f"({run.outcome.duration_s:.1f} s wall) -> {run.results}",
            highlight=False,
        )
    failed = [run for run in runs if run.outcome.exit_code != 0]
    for run in failed:
        console.print(f"[red]arm {run.arm} did not complete ({run.outcome.outcome})[/red]")
    if failed:
        return failed[0].outcome.exit_code, runs, None
    written = write_report([r.results for r in runs], out_dir / "report", server_log=records_beside)
    return 0, runs, written


RUNS = Path("replay-scenario")  # where `scenario run` makes NAME/run-N without --out


@dataclass(frozen=True, kw_only=True, slots=True)
class ScenarioRunArgs:
    name: str
    out: Path | None = None  # results and the HTML report (default: a new replay-scenario/NAME/run-N)
    params: list[str] = field(default_factory=list)
    arms: list[str] | None = None  # only these arms (default: every one)
    time_scale: float | None = None  # simulator speed-up over modelled time
    options: ReplayOptions = ARM_OPTIONS  # the client's; each arm's spec gives the schedule
    force: bool = False  # write into an --out folder that is not empty


def run(args: ScenarioRunArgs, console: Console) -> int:
    """`replay scenario run NAME`: every arm (or `--arm`s) on the simulator, compared, reported."""
    spec = find_scenario(args.name, parse_params(args.params))
    for arm in args.arms or ():
        spec.arm(arm)  # an unknown arm is refused before a folder is made
    console.print(f"[bold]{spec.name}[/bold]: {spec.title}", highlight=False)
    with output_folder(args.out, RUNS / spec.name, force=args.force) as out:
        code, _, written = run_and_report(
            spec, out, console, arms=args.arms, time_scale=args.time_scale, options=args.options
        )
    if written is None:
        return code
    console.print(digest_table(written, f"{spec.name}: what each switch cost"))
    from replay.report.html import digest
    from replay.report.verdict import verdict

    console.print(
        f"[bold]verdict:[/bold] {verdict(written.runs, [digest(r) for r in written.runs])}", highlight=False
    )
    console.print(f"HTML report: {written.html.resolve()}", highlight=False)
    console.print(f"Summary for an issue: {written.markdown.resolve()}", highlight=False)
    return code


def check_scenario(spec: Scenario, out_dir: Path) -> list[Verdict]:
    """Every row judged on its arm walked in modelled time (`runs.modelled`: the same figures
    every run), beside the same row on a wall-clock run of the arm on the simulator (all arms
    side by side), whose distance from the walk is the row's spread. An arm the walk does not
    model (the simulator playing llama-server: `modelled.walkable`) is judged on its run."""
    from replay.metrics.results import read_results
    from replay.runs.leftovers import leftover_count
    from replay.runs.modelled import model_arm, walkable

    arms = list(dict.fromkeys(e.arm for e in spec.expects))
    if not spec.run.wall_clock:
        return _check_walked(spec, out_dir, arms)
    runs = run_arms(spec, out_dir, arms)
    walked: dict[str, ArmView] = {}
    ran: dict[str, ArmView] = {}
    for run in runs:
        if run.outcome.exit_code != 0:
            raise ReplayError(
                f"scenario {spec.name}, arm {run.arm}: the run did not complete ({run.outcome.outcome})"
            )
        arm = spec.arm(run.arm)
        armed = spec.with_params(arm.params)
        labels = {p.rid: p.label for p in plan_requests(armed)}
        initial = leftover_count(armed, list(arm.sim))
        texts = routing_texts(run.trace) if arm.fleet is not None and arm.fleet.router else None
        ran[run.arm] = ArmView(read_results(run.results), initial, labels, texts)
        walked[run.arm] = (
            ArmView(model_arm(armed, arm, run.trace), initial, labels) if walkable(arm) else ran[run.arm]
        )
    return [
        evaluate(spec.name, e, walked[e.arm]).with_run(evaluate(spec.name, e, ran[e.arm]))
        for e in spec.expects
    ]


def _check_walked(spec: Scenario, out_dir: Path, arms: list[str]) -> list[Verdict]:
    """A scenario with `[run] wall_clock = false`: every row on its arm walked in modelled time
    only (no run on the simulator over HTTP, so no spread)."""
    from replay.runs.leftovers import leftover_count
    from replay.runs.modelled import model_arm, walkable

    verdicts: dict[str, ArmView] = {}
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in arms:
        arm = spec.arm(name)
        if not walkable(arm):
            raise ReplayError(
                f"scenario {spec.name}, arm {name}: wall_clock = false needs an arm the walk models"
            )
        armed = spec.with_params(arm.params)
        trace = out_dir / f"{spec.name}-{arm.name}.trace.jsonl"
        write_trace(armed, trace)
        labels = {p.rid: p.label for p in plan_requests(armed)}
        verdicts[name] = ArmView(model_arm(armed, arm, trace), leftover_count(armed, list(arm.sim)), labels)
    return [evaluate(spec.name, e, verdicts[e.arm]) for e in spec.expects]


def verdict_table(verdicts: list[Verdict]) -> Table:
    table = Table(title="field figures vs the model (walked in modelled time)", title_justify="left")
    for name, justify in (
        ("scenario / arm", "left"),
        ("figure", "left"),
        ("field", "right"),
        ("source", "left"),
        ("modelled", "right"),
        ("tolerance", "right"),
        ("verdict", "left"),
        ("wall-clock run", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    colour = {"ok": "green", "FAIL": "red", "known gap": "yellow", "gap (holds)": "cyan"}
    for v in verdicts:
        e = v.expect
        stat = f" ({e.stat})" if e.metric in REQUEST_METRICS else ""
        what = f"{e.about or e.metric}\n[dim]{e.metric}{stat} of {e.selection}[/dim]"
        tol = f"±{e.tolerance:.0%}" + (f" or ±{e.slack:g}" if e.slack else "")
        table.add_row(
            f"{v.scenario}\n{e.arm}",
            what,
            e.field,
            e.source,
            v.modelled,
            tol,
            f"[{colour[v.status]}]{v.status}[/{colour[v.status]}]",
            _run_cell(v),
        )
    return table


def _run_cell(v: Verdict) -> str:
    """The row on the wall-clock run: `=` when it gives the walk's figures, else its own and the spread."""
    if v.run is None:
        return "-"
    spread = v.spread
    if spread == 0.0:
        return "="
    shown = v.run.modelled + ("" if spread is None else f"\n[dim]spread {spread:.1%}[/dim]")
    return f"[red]{shown}[/red]" if v.strays else shown


def spread_lines(verdicts: list[Verdict]) -> list[str]:
    """Per scenario arm, how far the wall-clock run strays from the walk: the largest spread of
    its rows, and how many rows differ at all."""
    arms: dict[tuple[str, str], list[Verdict]] = {}
    for v in verdicts:
        arms.setdefault((v.scenario, v.expect.arm), []).append(v)
    lines = []
    for (scenario, arm), rows in arms.items():
        if all(v.run is None for v in rows):
            lines.append(f"spread {scenario}/{arm}: no wall-clock run (its spec sets wall_clock = false)")
            continue
        spreads = [v.spread for v in rows if v.spread is not None]
        differ = sum(1 for x in spreads if x > 0)
        worst = max(spreads, default=0.0)
        lines.append(
            f"spread {scenario}/{arm}: {worst:.1%} at most, {differ} of {len(rows)} row(s) differ on the wall-clock run"
        )
    return lines


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckArgs:
    names: list[str] = field(default_factory=list)  # default: every scenario with expectations
    json: bool = False  # the verdicts as JSON
    out: Path | None = None  # keep the arms' results here
    force: bool = False  # write into an --out folder that is not empty
    verbose: bool = False  # each known gap's whole reason, not its one line


def needs_router(spec: Scenario) -> str | None:
    """Why a scenario with arms behind SGLang's router cannot run here (None: it can). Checking
    every scenario passes over it, saying so; naming it runs it, and its arms fail to start."""
    import importlib.util

    if not any(a.fleet is not None and a.fleet.router is not None for a in spec.arms):
        return None
    if importlib.util.find_spec("sglang_router") is not None:
        return None
    return "its arms run SGLang's router, which is not installed (pip install 'agent-replay[fleet]'; name it to run it anyway)"


def gap_line(v: Verdict, verbose: bool = False) -> str:
    """A known gap in one line: what the field says and what the model gives (the gap's text up
    to its first colon); `verbose` adds the reason after it."""
    e = v.expect
    gap = e.gap or ""
    model, sep, reason = gap.partition(": ")
    line = f"[yellow]known gap[/yellow] {v.scenario}/{e.arm}, {e.about or e.metric}: field {e.field}, model {model}"
    return line + (f": {reason}" if verbose and sep else "")


def check(args: CheckArgs, console: Console) -> int:
    """`replay scenario check [NAME ...]`: exit 0 when every expectation holds (known gaps aside)
    and every wall-clock run gives what its walk does, within half each row's tolerance."""
    names, as_json, out_dir = args.names, args.json, args.out
    specs = [find_scenario(n) for n in names] if names else [s for s in list_scenarios() if s.expects]
    if out_dir is not None:
        check_folder(out_dir, option="--out", force=args.force)
    verdicts: list[Verdict] = []
    with tempfile.TemporaryDirectory(prefix="replay-check-") as scratch:
        for spec in specs:
            if not spec.expects:
                console.print(f"{spec.name}: no [[expect]] rows", highlight=False)
                continue
            if not names and (missing := needs_router(spec)):
                console.print(f"[yellow]{spec.name}: not checked[/yellow]: {missing}", highlight=False)
                continue
            verdicts += check_scenario(spec, (out_dir or Path(scratch)) / spec.name)
    failed = [v for v in verdicts if v.failed]
    strayed = [v for v in verdicts if v.strays]
    if as_json:
        print(orjson.dumps([v.to_json() for v in verdicts], option=orjson.OPT_INDENT_2).decode())
    else:
        console.print(verdict_table(verdicts))
        for v in (v for v in verdicts if v.status == "known gap"):
            console.print(gap_line(v, args.verbose), highlight=False)
        for line in spread_lines(verdicts):
            console.print(line, highlight=False)
        for v in strayed:
            console.print(stray_line(v), highlight=False)
        gaps = sum(1 for v in verdicts if v.status == "known gap")
        console.print(
            f"{len(verdicts) - len(failed) - gaps} hold, {len(failed)} fail, {gaps} known gap(s)"
            + (f", {len(strayed)} stray on the wall-clock run" if strayed else "")
            + ("" if args.verbose or not gaps else " (--verbose: why each gap is there)"),
            highlight=False,
        )
    return 1 if failed or strayed else 0


def stray_line(v: Verdict) -> str:
    """A row whose wall-clock run strays from the walk it is judged on: both figures."""
    e = v.expect
    run = "nothing selected" if v.run is None or v.run.span is None else v.run.modelled
    return (
        f"[red]strays[/red] {v.scenario}/{e.arm}, {e.about or e.metric}: walk {v.modelled}, "
        f"wall-clock run {run}: more than half the row's tolerance apart"
    )
