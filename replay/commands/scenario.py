"""What `replay scenario list|show|generate|run` do, with plain arguments (the CLI only parses)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from replay.report.html import DIGEST_ROWS, Written, digest, write_report
from replay.runs.scenario import ArmRun, run_arms
from replay.scenario.build import generate
from replay.scenario.catalog import find_scenario, list_scenarios
from replay.scenario.show import describe, list_table
from replay.scenario.spec import Scenario, parse_params


def list_command(console: Console) -> int:
    console.print(list_table(list_scenarios()))
    return 0


def show_command(name: str, console: Console, params: list[str] | None = None) -> int:
    console.print(describe(find_scenario(name, parse_params(params or []))))
    return 0


def generate_command(name: str, out: Path | None, params: list[str], console: Console) -> int:
    """Write the trace (default `NAME.jsonl` in the current directory) and say what is in it."""
    spec = find_scenario(name, parse_params(params))
    path = out or Path(f"{spec.name}.jsonl")
    result = generate(spec, path)
    tags = ", ".join(f"{n} {tag}" for tag, n in sorted(result.tags.items()))
    console.print(
        f"{path}: {result.requests} requests ({tags}) in {result.sessions} sessions from scenario {spec.name}",
        highlight=False,
    )
    if result.notice:
        console.print(f"[yellow]note:[/yellow] {result.notice}", highlight=False)
    return 0


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
) -> tuple[int, list[ArmRun], Written | None]:
    """Each arm on its own simulator (all at once), then the HTML report of all of them in
    `out_dir/report`."""
    chosen = arms or [a.name for a in spec.arms]
    console.print(f"running {len(chosen)} arm(s) side by side: {', '.join(chosen)}", highlight=False)
    runs = run_arms(spec, out_dir, chosen, time_scale=time_scale, console=console)
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
    written = write_report([r.results for r in runs], out_dir / "report")
    return 0, runs, written


def run_command(
    name: str,
    out_dir: Path,
    params: list[str],
    console: Console,
    arms: list[str] | None = None,
    time_scale: float | None = None,
) -> int:
    """`replay scenario run NAME`: every arm (or `--arm`s) on the simulator, compared, reported."""
    spec = find_scenario(name, parse_params(params))
    console.print(f"[bold]{spec.name}[/bold]: {spec.title}", highlight=False)
    code, _, written = run_and_report(spec, out_dir, console, arms=arms, time_scale=time_scale)
    if written is None:
        return code
    console.print(digest_table(written, f"{spec.name}: what each switch cost"))
    console.print(f"HTML report: {written.html.resolve()}", highlight=False)
    console.print(f"Summary for an issue: {written.markdown.resolve()}", highlight=False)
    return code
