"""The per-switch-class table, for people (rich) and for machines (a plain dict)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from replay.metrics.hist import ALL, ClassStats, Summary
from replay.metrics.switch import CLASSES

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


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return f"{value:,}"


def class_table(
    summary: Summary, title: str = "Requests by switch class", time_scale: float | None = None
) -> Table:
    """TTFT and latency as the client measured them; on the simulator the caption says how much
    faster than the modelled server that clock ran (the HTML report shows the modelled times)."""
    caption = (
        "Times measured here on the simulator, which ran modelled time "
        f"{time_scale:g}x faster: the server it models would take about {time_scale:g}x longer "
        "(`replay report --html` shows the modelled times)."
        if time_scale
        else "Times measured here (wall clock)."
    )
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    for col, justify in (
        ("class", "left"),
        ("n", "right"),
        ("err", "right"),
        ("TTFT p50 s", "right"),
        ("p90", "right"),
        ("p99", "right"),
        ("max", "right"),
        ("latency p50 s", "right"),
        ("re-processed (mean)", "right"),
        ("cached (mean)", "right"),
    ):
        table.add_column(col, justify=justify)
    for name, row in summary_rows(summary).items():
        table.add_row(
            name,
            _fmt(row["count"]),
            _fmt(row["errors"]),
            _fmt(row["ttft_p50_s"]),
            _fmt(row["ttft_p90_s"]),
            _fmt(row["ttft_p99_s"]),
            _fmt(row["ttft_max_s"]),
            _fmt(row["latency_p50_s"]),
            _fmt(row["mean_reprocessed"]),
            _fmt(row["mean_cached"]),
            style="bold" if name == ALL else None,
        )
    return table
