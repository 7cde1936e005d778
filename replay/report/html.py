"""`replay report RESULTS... --html DIR`: one self-contained HTML page and a markdown summary.

Each results file is one run (an arm of an A/B when there are several) seen as a `RunView`
(`replay.report.view`). The page embeds its figures as SVG and loads nothing from the network, so
it can be mailed or attached to an issue as it is.
"""

from __future__ import annotations

import html
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replay.report import plots
from replay.report.table import summary_rows
from replay.report.view import RunView, load_run

TABLE_COLUMNS = (
    ("count", "n"),
    ("errors", "err"),
    ("ttft_p50_s", "TTFT p50 s"),
    ("ttft_p90_s", "p90"),
    ("ttft_max_s", "max"),
    ("latency_p50_s", "latency p50 s"),
    ("mean_reprocessed", "re-processed (mean)"),
    ("mean_cached", "cached (mean)"),
)


# --- numbers -------------------------------------------------------------------------------


def digest(run: RunView) -> dict[str, Any]:
    """What the switches cost: the numbers `replay demo` prints and the summary leads with."""
    switches = [r for r in run.requests if "switch" in r.switch and r.status == "ok"]
    evictions = [s for s in run.server if s.get("event") == "evict"]
    stores: dict[str, int] = {}
    for s in run.server:
        if s.get("event") == "store":
            reason = str(s.get("reason") or "other")
            stores[reason] = stores.get(reason, 0) + 1
    wait = [r.ttft for r in switches]
    reread = [r.reprocessed for r in switches]
    return {
        "label": run.label,
        "clock": run.clock,
        "requests": len(run.requests),
        "errors": sum(1 for r in run.requests if r.status != "ok"),
        "switches": len(switches),
        "reprocessed_per_switch_mean": round(statistics.mean(reread)) if reread else None,
        "reprocessed_per_switch_max": max(reread) if reread else None,
        "wait_per_switch_mean_s": round(statistics.mean(wait), 1) if wait else None,
        "wait_per_switch_max_s": round(max(wait), 1) if wait else None,
        "restores": sum(1 for s in run.server if s.get("event") == "restore"),
        "live_misses": sum(1 for s in run.server if s.get("event") == "live_miss"),
        "stores": stores,
        "evictions": len(evictions),
        "evictions_zero_hits": sum(1 for s in evictions if not s.get("hits")),
        "busy_s": round(sum(r.end - r.start for r in run.requests), 1),
    }


DIGEST_ROWS = (
    ("requests", "requests (errors)", lambda d: f"{d['requests']} ({d['errors']})"),
    ("switches", "switches", lambda d: f"{d['switches']}"),
    (
        "reread",
        "re-processed tokens per switch, mean / max",
        lambda d: f"{_n(d['reprocessed_per_switch_mean'])} / {_n(d['reprocessed_per_switch_max'])}",
    ),
    (
        "wait",
        "wait per switch (to first token), mean / max",
        lambda d: f"{_s(d['wait_per_switch_mean_s'])} / {_s(d['wait_per_switch_max_s'])} ({d['clock']})",
    ),
    ("restores", "disk restores / live misses", lambda d: f"{d['restores']} / {d['live_misses']}"),
    ("evictions", "evictions (with zero hits)", lambda d: f"{d['evictions']} ({d['evictions_zero_hits']})"),
    (
        "stores",
        "stores by reason",
        lambda d: ", ".join(f"{k} {v}" for k, v in sorted(d["stores"].items())) or "-",
    ),
)


def _n(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f} s"


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.2f}"
    return f"{value:,}"


def summary_markdown(runs: Sequence[RunView], title: str | None = None) -> str:
    """A summary to paste into an issue: the switch digest (arms side by side), then per-class tables."""
    digests = [digest(run) for run in runs]
    lines = [f"## {title or default_title(runs)}", ""]
    sources = sorted({str((run.header.get("trace") or {}).get("source") or "") for run in runs} - {""})
    if sources:
        lines += [f"Trace: {', '.join(sources)}; {len(runs)} run(s).", ""]
    lines.append("| | " + " | ".join(d["label"] for d in digests) + " |")
    lines.append("|---|" + "---|" * len(digests))
    for _, name, fmt in DIGEST_ROWS:
        lines.append(f"| {name} | " + " | ".join(fmt(d) for d in digests) + " |")
    for run in runs:
        lines += ["", f"### {run.label}: requests by switch class", ""]
        lines.append("| class | " + " | ".join(h for _, h in TABLE_COLUMNS) + " |")
        lines.append("|---|" + "---:|" * len(TABLE_COLUMNS))
        for cls, row in summary_rows(run.summary).items():
            lines.append(f"| {cls} | " + " | ".join(_fmt(row[k]) for k, _ in TABLE_COLUMNS) + " |")
    lines += [
        "",
        "TTFT in the tables is measured by the client; waits above are "
        + ", ".join(sorted({d["clock"] for d in digests}))
        + " seconds.",
    ]
    return "\n".join(lines) + "\n"


# --- the page ------------------------------------------------------------------------------

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, Segoe UI, sans-serif; margin: 24px auto; max-width: 1180px;
       color: #1d1f23; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 32px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 8px 0 16px; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid #d9dbe0; padding: 4px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; } th { background: #f3f4f6; }
.arms { display: flex; flex-wrap: wrap; gap: 24px; } .arms > div { flex: 1 1 420px; }
figure.plot { margin: 8px 0 24px; } figure.plot svg { width: 100%; height: auto; }
.note { color: #555; font-size: 12px; }
"""


def _table(rows: list[list[str]], header: list[str]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def default_title(runs: Sequence[RunView]) -> str:
    """`switching: 4G vs 64G` when every run replayed one scenario, else a plain title."""
    sources = {str((run.header.get("trace") or {}).get("source") or "") for run in runs}
    if len(sources) == 1 and (source := sources.pop()).startswith("scenario:"):
        return f"{source.removeprefix('scenario:')}: {' vs '.join(run.label for run in runs)}"
    return "agent-replay report"


def render_page(runs: Sequence[RunView], title: str | None = None) -> str:
    """The whole page as one string."""
    title = title or default_title(runs)
    digests = [digest(run) for run in runs]
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        '<p class="note">' + html.escape(", ".join(Path(run.path).name for run in runs)) + "</p>",
        '<section id="digest"><h2>What the switches cost</h2>',
        _table(
            [[name, *(fmt(d) for d in digests)] for _, name, fmt in DIGEST_ROWS],
            ["", *(d["label"] for d in digests)],
        ),
        "</section>",
        '<section id="timeline"><h2>Timeline</h2>',
        '<p class="note">One lane per session; each request is a bar split into queue, disk work (evict save and '
        "restore), prefill and decode; markers above a bar: switch, compaction, first request of a session; "
        "outlined bars were sent while another request was in flight. Underneath: disk KV in use, restores and "
        "evictions from the server log.</p>",
    ]
    same_clock = len({run.clock for run in runs}) == 1
    x_max = max((r.end for run in runs for r in run.requests), default=0.0) if same_clock else None
    for run in runs:
        parts.append(f'<figure class="plot" data-plot="timeline" data-run="{html.escape(run.label)}">')
        parts.append(plots.timeline(run, x_max))
        parts.append("</figure>")
    parts += [
        "</section>",
        '<section id="classes"><h2>By switch class</h2>',
        '<figure class="plot" data-plot="classes">',
        plots.by_class(runs),
        "</figure>",
        '<div class="arms">',
    ]
    for run in runs:
        rows = [
            [cls, *(_fmt(row[k]) for k, _ in TABLE_COLUMNS)] for cls, row in summary_rows(run.summary).items()
        ]
        parts.append(
            f"<div><h3>{html.escape(run.label)}</h3>{_table(rows, ['class', *(h for _, h in TABLE_COLUMNS)])}</div>"
        )
    parts += [
        "</div></section>",
        '<section id="depth"><h2>Rates by depth</h2>',
        '<figure class="plot" data-plot="depth">',
        plots.by_depth(runs),
        "</figure></section>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


@dataclass(slots=True)
class Written:
    html: Path
    markdown: Path
    runs: list[RunView]


def write_report(paths: Sequence[str | Path], out_dir: str | Path, title: str | None = None) -> Written:
    """Write `index.html` and `summary.md` into `out_dir`; each results file is one run (an arm)."""
    runs = [load_run(p) for p in paths]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    page = out / "index.html"
    page.write_text(render_page(runs, title), encoding="utf-8")
    md = out / "summary.md"
    md.write_text(summary_markdown(runs, title), encoding="utf-8")
    return Written(html=page, markdown=md, runs=runs)
