"""`replay demo`: why the disk budget matters, in under a minute, with no GPU and no model.

Generates the `switching` scenario (two tool-heavy conversations of 70K and 80K tokens alternating),
replays it on the embedded simulator at ds4's default 4 GB disk budget and at 64 GB, prints what
each switch cost in both, and writes the HTML report.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from replay.commands.scenario import digest_table, run_and_report
from replay.outputs import output_folder
from replay.report.html import digest
from replay.scenario.catalog import find_scenario

SCENARIO = "switching"
ARMS = ["4G", "64G"]


RUNS = Path("replay-demo")  # where the demo makes run-N without --out


@dataclass(frozen=True, kw_only=True, slots=True)
class DemoArgs:
    out: Path | None = None  # traces, results and the HTML report (default: a new replay-demo/run-N)
    force: bool = False  # write into an --out folder that is not empty


def demo(args: DemoArgs, console: Console) -> int:
    """Run both arms, print the comparison and the report path; returns the exit code."""
    started = time.monotonic()
    spec = find_scenario(SCENARIO)
    console.print(f"[bold]{spec.name}[/bold]: {spec.title}", highlight=False)
    console.print(
        "Replaying it on the embedded ds4 simulator (one live slot, modelled time running "
        f"{spec.run.time_scale:g}x faster than a real server) at two disk-KV budgets:",
        highlight=False,
    )
    with output_folder(args.out, RUNS, force=args.force) as out_dir:
        code, _, written = run_and_report(spec, out_dir, console, arms=ARMS)
    if written is None:
        return code
    console.print(digest_table(written, "What each conversation switch cost (modelled seconds)"))
    low, high = (digest(view) for view in written.runs)
    console.print(
        f"At {low['label']} a switch re-read {low['reprocessed_per_switch_mean']:,} tokens on average and "
        f"waited {low['wait_per_switch_mean_s']} s for its first token; at {high['label']} "
        f"{high['reprocessed_per_switch_mean']:,} tokens and {high['wait_per_switch_mean_s']} s. "
        f"{low['evictions_zero_hits']} of the {low['evictions']} checkpoints evicted at {low['label']} "
        "had never been restored: the budget, not the server's speed, decides every switch.",
        highlight=False,
    )
    console.print(f"HTML report: {written.html.resolve()}", highlight=False)
    console.print(f"Summary for an issue: {written.markdown.resolve()}", highlight=False)
    console.print(f"Done in {time.monotonic() - started:.1f} s.", highlight=False)
    return 0
