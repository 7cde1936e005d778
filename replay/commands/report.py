"""`replay report` (results files) and `replay logs summary` (server logs)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from replay.commands import print_json
from replay.metrics.results import merged_summary, read_results, time_scale
from replay.outputs import check_folder
from replay.report.table import class_table, summary_rows
from replay.runs.barrier import spread_s
from replay.runs.serverlog import records_beside


@dataclass(frozen=True, kw_only=True, slots=True)
class ReportArgs:
    results: list[Path]
    as_json: bool = False
    html: Path | None = None  # also write the HTML report (and summary.md) here
    force: bool = False  # write into an --html folder that is not empty


def report(args: ReportArgs, console: Console) -> int:
    from replay.report.ab_html import is_ab, show_ab

    paths = args.results
    if args.html is not None:
        check_folder(args.html, option="--html", force=args.force)
    if len(paths) == 1 and is_ab(paths[0]):  # an A/B summary (ab.json) or its folder
        show_ab(paths[0], as_json=args.as_json, console=console, html=args.html)
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
    summary = merged_summary(results)
    spread = spread_s([res.run for res in results])
    if args.as_json:
        print_json(
            {"files": [str(p) for p in paths], "classes": summary_rows(summary), "start_spread_s": spread}
        )
        return 0
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
    if spread is not None:
        planned = {(res.run.get("start") or {}).get("planned") for res in results}
        console.print(
            f"{len(results)} shards started within {spread * 1000:,.1f} ms of each other"
            + (f" (planned {planned.pop()})" if len(planned) == 1 else " (planned starts differ)"),
            highlight=False,
        )
    return 0


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
