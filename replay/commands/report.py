"""`replay report` (results files) and `replay logs summary` (server logs)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from replay.commands import print_json
from replay.metrics.results import RunResults, merged_summary, read_results, time_scale
from replay.outputs import check_folder
from replay.report.failures import failure_groups, failure_lines
from replay.report.fanout import fan_out_lines
from replay.report.table import class_table, runs_table, summary_rows
from replay.report.view import run_label
from replay.runs.barrier import spread_s
from replay.serverside.logs import records_beside


@dataclass(frozen=True, kw_only=True, slots=True)
class ReportArgs:
    results: list[Path]
    as_json: bool = False
    html: Path | None = None  # also write the HTML report (and summary.md) here
    force: bool = False  # write into an --html folder that is not empty
    merge: bool = False  # pool the files into one run (shards of one run), instead of side by side
    verbose: bool = False  # an A/B summary: its method, ratio tables and per-class figures too


def report(args: ReportArgs, console: Console) -> int:
    """Each results file is one run, shown beside the others; `merge` pools them (a run's shards)."""
    from replay.report.ab_html import is_ab, show_ab

    paths = args.results
    if args.html is not None:
        check_folder(args.html, option="--html", force=args.force)
    if len(paths) == 1 and is_ab(paths[0]):  # an A/B summary (ab.json) or its folder
        show_ab(paths[0], as_json=args.as_json, console=console, html=args.html, verbose=args.verbose)
        return 0
    results = [read_results(p) for p in paths]
    for res in results:
        if res.truncated_line is not None:
            Console(stderr=True).print(
                f"warning: {res.path}:{res.truncated_line}: last line cut short (the run was killed "
                "while writing it); left out",
                highlight=False,
                soft_wrap=True,
            )
    if args.html is not None:
        from replay.report.html import write_report

        written = write_report(paths, args.html, server_log=records_beside)
        console.print(f"report: {written.html}\nmarkdown summary: {written.markdown}", highlight=False)
    labels = _labels(results)
    spread = spread_s([res.run for res in results])
    failures = [failure_groups(res.requests) for res in results]
    if args.as_json:
        doc: dict[str, Any] = {"files": [str(p) for p in paths]}
        if args.merge or len(results) == 1:
            doc["classes"] = summary_rows(merged_summary(results))
        doc["runs"] = [
            {
                "file": res.path,
                "label": label,
                "outcome": (res.summary_line or {}).get("outcome"),
                "classes": summary_rows(res.summary),
                "failures": [g.to_dict() for g in groups],
            }
            for res, label, groups in zip(results, labels, failures, strict=True)
        ]
        doc["start_spread_s"] = spread
        # What the page shows besides: the verdict, the walker and clock, the digest, the classes
        # on the run's own clock (modelled seconds on the simulator).
        from replay.report.html import report_json
        from replay.report.view import load_run

        page = report_json([load_run(p, records_beside) for p in paths])
        doc["verdict"] = page["verdict"]
        doc["action"] = page["action"]
        doc["units"] = page["units"]
        for run, shown in zip(doc["runs"], page["runs"], strict=True):
            run["clock"] = shown["clock"]
            run["figures_from"] = shown["figures_from"]
            run["time_scale"] = shown["time_scale"]
            run["digest"] = shown["digest"]
            run["classes_on_clock"] = shown["classes"]
            run["disk"] = shown["disk"]
        print_json(doc)
        return 0
    if args.merge:
        scales = {time_scale(res.run) for res in results}
        title = "Requests by switch class" + (f" ({len(paths)} files merged)" if len(paths) > 1 else "")
        scale = scales.pop() if len(scales) == 1 else None
        console.print(class_table(merged_summary(results), title=title, time_scale=scale))
    else:
        title = "Requests by switch class" + (", run by run" if len(results) > 1 else "")
        runs = [(label, res.summary, time_scale(res.run)) for res, label in zip(results, labels, strict=True)]
        console.print(runs_table(runs, title=title))
        if len(results) > 1 and all(res.run.get("shard") for res in results):
            console.print(
                "These are shards of one run: `--merge` pools them into one table.", highlight=False
            )
    for res, label, groups in zip(results, labels, failures, strict=True):
        for line in failure_lines(groups, len(res.requests), label if len(results) > 1 else ""):
            console.print(line, highlight=False, markup=False, soft_wrap=True)
    for res in results:  # subagent sessions and what their fan-out cost the parent (format /2)
        for text in fan_out_lines(res.run, res.requests):
            console.print(text, highlight=False, markup=False, soft_wrap=True)
    for res in results:
        line = next((r for r in [res.summary_line] if r), None)
        if line and line.get("lag_p99_s") is not None:
            console.print(
                f"{Path(res.path).name}: outcome {line.get('outcome')}, schedule lag p50 "
                f"{line.get('lag_p50_s'):.4f} s, p99 {line.get('lag_p99_s'):.4f} s",
                highlight=False,
            )
    if spread is not None:
        planned = {(res.run.get("start") or {}).get("planned") for res in results}
        console.print(
            f"{len(results)} shards started within {spread * 1000:,.1f} ms of each other"
            + (f" (planned {planned.pop()})" if len(planned) == 1 else " (planned starts differ)"),
            highlight=False,
        )
    return 0


def _labels(results: list[RunResults]) -> list[str]:
    """Each run's name (its arm, or its file's); the paths where two names are the same."""
    labels = [run_label(res) for res in results]
    return labels if len(set(labels)) == len(labels) else [res.path for res in results]


@dataclass(frozen=True, kw_only=True, slots=True)
class LogsSummaryArgs:
    logs: list[Path]
    kind: str = "auto"
    year: int | None = None
    as_json: bool = False


def logs_summary(args: LogsSummaryArgs, console: Console) -> int:
    from replay.report.logs import print_summary, summarize

    summary = summarize(args.logs, kind=args.kind, year=args.year)
    if args.as_json:
        print_json(summary.to_dict())
    else:
        print_summary(summary, console=console)
    return 0
