"""The per-switch-class table, for people (rich) and for machines (a plain dict)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich import box
from rich.table import Table

from replay.metrics.hist import ALL, ClassStats, Summary
from replay.metrics.switch import CLASSES
from replay.report import units

ORDER = (ALL, *CLASSES)


def _s(us: int | None) -> float | None:
    return None if us is None else round(us / 1e6, 3)


def class_row(stats: ClassStats) -> dict[str, Any]:
    mean = stats.mean
    return {
        "count": stats.count,
        "errors": stats.errors,
        "ttft_p50_s": _s(stats.percentile("ttft_us", 50)),
        "ttft_p90_s": _s(stats.percentile("ttft_us", 90)),
        "ttft_p99_s": _s(stats.percentile("ttft_us", 99)),
        "ttft_max_s": _s(stats.max("ttft_us")),
        "latency_p50_s": _s(stats.percentile("latency_us", 50)),
        "latency_p99_s": _s(stats.percentile("latency_us", 99)),
        "reprocessed_p50": stats.percentile("reprocessed", 50),
        "reprocessed_max": stats.max("reprocessed"),
        "mean_reprocessed": None if mean("reprocessed_tokens") is None else round(mean("reprocessed_tokens")),
        "mean_cached": None if mean("cached_tokens") is None else round(mean("cached_tokens")),
        "mean_prompt": None if mean("prompt_tokens") is None else round(mean("prompt_tokens")),
    }


def summary_rows(summary: Summary) -> dict[str, dict[str, Any]]:
    """Rows in a fixed class order, so two reports line up."""
    names = [c for c in ORDER if c in summary.classes] + sorted(set(summary.classes) - set(ORDER))
    return {name: class_row(summary.classes[name]) for name in names}


# Headers of one line each (rich would cut a figure, not wrap it, to fit 80 columns); their units
# are in the caption (`UNITS`).
COLUMNS = (
    ("n", "count"),
    ("err", "errors"),
    ("TTFT p50", "ttft_p50_s"),
    ("p90", "ttft_p90_s"),
    ("p99", "ttft_p99_s"),
    ("max", "ttft_max_s"),
    ("latency p50", "latency_p50_s"),
    ("re-processed", "mean_reprocessed"),
    ("cached", "mean_cached"),
)
UNITS = "TTFT and latency in seconds; re-processed and cached: mean tokens per request. "


def _caption(scales: dict[str, float | None]) -> str:
    """Which clock the times are on: the client's; on the simulator, how much faster than the
    modelled server it ran (the HTML report shows the modelled times)."""
    distinct = set(scales.values())
    if distinct == {None}:
        return "Times measured here (wall clock)."
    if len(distinct) == 1:
        scale = distinct.pop()
        return (
            f"Times measured here on the simulator, which ran modelled time {scale:g}x faster: the "
            f"server it models would take about {scale:g}x longer (`replay report --html` shows the "
            "modelled times)."
        )
    each = ", ".join(
        f"{label} {scale:g}x" if scale else f"{label} wall clock" for label, scale in scales.items()
    )
    return (
        f"Times measured here; the simulator ran modelled time faster than the server it models ({each}): "
        "`replay report --html` shows the modelled times."
    )


def class_table(
    summary: Summary, title: str = "Requests by switch class", time_scale: float | None = None
) -> Table:
    """One run's (or pooled runs') TTFT and latency by class, as the client measured them."""
    return runs_table([("", summary, time_scale)], title=title)


def runs_table(
    runs: Sequence[tuple[str, Summary, float | None]], title: str = "Requests by switch class"
) -> Table:
    """Runs side by side, never pooled: each class's rows one run under the other, so the same
    class of two runs (a 4G and a 64G budget) reads as two adjacent lines. `runs` holds each run's
    label, summary and simulator time scale (None on a real server); one run gets no run column."""
    several = len(runs) > 1
    rows = [summary_rows(summary) for _, summary, _ in runs]
    names = list(dict.fromkeys(name for run_rows in rows for name in run_rows))
    names = [c for c in ORDER if c in names] + [c for c in names if c not in ORDER]
    lines = []  # (cells, bold, last of its class)
    for name in names:
        for j, ((label, _, _), run_rows) in enumerate(zip(runs, rows, strict=True)):
            row = run_rows.get(name)
            cells = [name if j == 0 else "", *([label] if several else [])]
            cells += [units.field(row[key], key) if row else "-" for _, key in COLUMNS]
            lines.append((cells, name == ALL, j == len(runs) - 1))
    table = Table(
        title=title,
        title_justify="left",
        caption=UNITS + _caption({label: scale for label, _, scale in runs}),
        caption_justify="left",
        box=box.SIMPLE_HEAD,  # no vertical rules: room for the numbers at 80 columns
        show_edge=False,
        padding=(0, 0),  # the rule's blank columns part the figures
    )
    # Too narrow a terminal folds a header or a figure onto two lines, never cuts one (`101,3…`);
    # the class and the run keep their width.
    for k, name in enumerate(["class", "run"] if several else ["class"]):
        table.add_column(
            name, no_wrap=True, min_width=max((len(cells[k]) for cells, _, _ in lines), default=0)
        )
    for header, _ in COLUMNS:
        table.add_column(header, justify="right", overflow="fold")
    for n, (cells, bold, last) in enumerate(lines):
        table.add_row(
            *cells, style="bold" if bold else None, end_section=several and last and n < len(lines) - 1
        )
    return table
