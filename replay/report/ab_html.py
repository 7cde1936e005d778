"""The A/B report as a static page and a markdown summary, in the scenario report's style.

It is rendered from ``ab.json`` alone (plus the arm runs' results files it names, for the
timelines), so ``replay report ab.json`` (or the A/B folder) redraws it at any time. No scripts:
the verdict, who the arms are and how they differ, the B/A table with intervals, per-run-pair
timelines with their disk/cache strips side by side (A left, B right), and the run order with
timestamps.
"""

from __future__ import annotations

import html
import sys
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console

from replay.errors import UsageError
from replay.outputs import write_text
from replay.report import plots
from replay.report.ab import FORMATS, STATS_COLUMNS, add_clocks, clock_note, render, short_value, stats_cells
from replay.report.ab_stats import change_text
from replay.report.html import CSS, _table, load_run

SUMMARY_FILE = "ab.json"


def is_ab(path: Path) -> bool:
    """An `ab.json`, or a folder holding one."""
    if path.is_dir():
        return (path / SUMMARY_FILE).is_file()
    if path.suffix != ".json" or not path.is_file():
        return False
    try:
        return orjson.loads(path.read_bytes()).get("format") in FORMATS
    except (orjson.JSONDecodeError, AttributeError):
        return False


def load_ab(path: Path) -> tuple[dict[str, Any], Path]:
    """The A/B summary and the folder its relative paths are read against."""
    file = path / SUMMARY_FILE if path.is_dir() else path
    try:
        doc = orjson.loads(file.read_bytes())
    except (OSError, orjson.JSONDecodeError) as e:
        raise UsageError(f"{file}: not a readable A/B summary ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") not in FORMATS:
        raise UsageError(f"{file}: format is not one of {', '.join(FORMATS)}")
    return add_clocks(doc), file.parent


def _f(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def stats_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    return stats_cells(rows)


STATS_HEADER = list(STATS_COLUMNS)


def order_rows(doc: dict[str, Any]) -> list[list[str]]:
    times = {t["index"]: t for t in doc.get("run_times") or ()}
    rows = []
    for r in doc.get("runs") or ():
        t = times.get(r["index"], {})
        cache = r.get("cache") or {}
        rows.append(
            [
                f"{r['index']:02d}",
                r["arm"],
                t.get("started", "-"),
                t.get("ended", "-"),
                _f(r["requests"]),
                _f(r["errors"]),
                r.get("outcome", "-"),
                "fresh" if cache.get("fresh") else "reused",
                _f(cache.get("files")),
                Path(r["results"]).name,
            ]
        )
    return rows


ORDER_HEADER = [
    "run",
    "arm",
    "started (UTC)",
    "ended",
    "requests",
    "failed",
    "outcome",
    "cache",
    "disk files",
    "results",
]


def _identity(doc: dict[str, Any]) -> list[list[str]]:
    ident = doc.get("identity") or {}
    targets = doc.get("targets") or {}
    return [
        [arm, (targets.get(arm) or {}).get("name", arm), (ident.get(arm) or {}).get("summary", "-")]
        for arm in ("A", "B")
    ]


def _diff_rows(doc: dict[str, Any]) -> list[list[str]]:
    """Field, A, B: hashes cut to 12 digits (the full ones are in ab.json), flags by name."""
    rows = []
    for d in doc.get("differences") or ():
        field = d["field"].removeprefix("flag ")
        rows.append([field, short_value(d["a"]), short_value(d["b"])])
    return rows


def _change_line(doc: dict[str, Any]) -> str:
    """B's change as one would type it (`--cache-ram 8192 -> 0`), above the table of differences."""
    return f"B changes: {change_text(list(doc.get('differences') or []))}"


# Paths and long values wrap inside the page instead of widening it.
_AB_CSS = (
    ".wrap table { table-layout: fixed; width: 100%; } .wrap td { word-break: break-all; text-align: left; } "
    ".ident th:nth-child(1) { width: 3em; } .ident th:nth-child(2) { width: 12em; } "
    ".diffs th:nth-child(1) { width: 16em; }"
)


def outputs_text(out: dict[str, Any]) -> str:
    if out.get("status") in (None, "unknown"):
        return f"Outputs at temperature 0: not compared ({out.get('reason', 'no request ran in both arms')})."
    text = f"Outputs at temperature 0: {out['status']}, {out['matched']}/{out['compared']} requests identical in every run."
    if out["status"] == "differ":
        firsts = ", ".join(f"{s} at request {r}" for s, r in out["first_difference_per_session"].items())
        text += f" First diverging request per session: {firsts}."
        if out.get("note"):
            text += f" Note: {out['note']}."
    return text


def render_ab_page(doc: dict[str, Any], base: Path) -> str:
    targets = doc.get("targets") or {}
    title = f"A/B: {(targets.get('A') or {}).get('name', 'A')} vs {(targets.get('B') or {}).get('name', 'B')}"
    esc = html.escape
    verdict = (doc.get("verdict") or {}).get("text", "no verdict (an older ab.json)")
    action = (doc.get("verdict") or {}).get("action")
    if action:
        verdict += f". Action: {action}."
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{esc(title)}</title><style>{CSS}{_AB_CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f'<p class="verdict" id="verdict">{esc(verdict)}</p>',
    ]
    for w in doc.get("warnings") or ():
        parts.append(f'<p class="verdict" style="border-color:#c0392b">warning: {esc(w)}</p>')
    parts += [
        '<section id="arms"><h2>The arms</h2>',
        '<div class="wrap ident">' + _table(_identity(doc), ["arm", "name", "build"]) + "</div>",
    ]
    diffs = _diff_rows(doc)
    parts.append(
        "<h3>Every difference between the arms</h3>"
        + f'<p class="note" id="change">{esc(_change_line(doc))}</p>'
        + f'<div class="wrap diffs">{_table(diffs, ["field", "A", "B"])}</div>'
        if diffs
        else '<p class="note">The arms do not differ (an A/A noise check).</p>'
    )
    parts += [
        "</section>",
        '<section id="ratios"><h2>B / A with intervals</h2>',
        _table(stats_rows(doc.get("stats") or []), STATS_HEADER),
        f'<p class="note" id="clocks">{esc(clock_note(doc))}</p>',
        f'<p class="note">{esc(doc.get("method", ""))}. Lower is better except decode tok/s and throughput; '
        "decode tok/s is the server's own figure where it reports one (llama-server's "
        "timings.predicted_per_second), else the stream's; run-level rows have one value per run.</p>",
        *_drift_table(doc),
        f'<p class="note">{esc(outputs_text(doc.get("outputs") or {}))}</p>',
        f'<p class="note">{esc(doc.get("note", ""))}</p>',
        "</section>",
        '<section id="order"><h2>Run order</h2>',
        _table(order_rows(doc), ORDER_HEADER),
        "</section>",
        '<section id="timeline"><h2>Timelines, one run pair per row (A left, B right)</h2>',
        '<p class="note">One lane per session; each bar a request split into queue, disk work, prefill and '
        "decode; underneath, when the server's log was read, the cache it keeps between requests: disk KV in "
        "use (ds4, the simulator) or, for llama-server, its host-RAM prompt cache (--cache-ram), with restores "
        "and evictions.</p>",
    ]
    runs = [r for r in doc.get("runs") or () if _results_path(r, base).is_file()]
    views = [load_run(_results_path(r, base)) for r in runs]
    x_max = max((q.end for v in views for q in v.requests), default=0.0) or None
    for i in range(0, len(views), 2):
        pair = sorted(zip(runs[i : i + 2], views[i : i + 2], strict=True), key=lambda rv: rv[0]["arm"])
        parts.append('<div class="arms">')
        for run, view in pair:
            parts.append(
                f"<div><h3>run {run['index']:02d}: {esc(run['arm'])}</h3>"
                f'<figure class="plot" data-plot="timeline" data-run="{run["index"]}">'
                f"{plots.timeline(view, x_max, compact=True)}</figure></div>"
            )
        parts.append("</div>")
    parts += ["</section>", "</body></html>"]
    return "\n".join(parts) + "\n"


def _drift_table(doc: dict[str, Any]) -> list[str]:
    rows = doc.get("stats_with_drift") or []
    if not rows:
        return []
    drift = doc.get("drift") or {}
    return [
        "<h3>Including the requests after a reply that differed (live history)</h3>",
        f'<p class="note">The table above uses the {drift.get("clean")} of {drift.get("pairs")} request pairs '
        "whose prompts were the same in both arms; these rows use them all, so they mix the build with "
        "the drift of the replies.</p>",
        _table(stats_rows(rows), STATS_HEADER),
    ]


def _results_path(run: dict[str, Any], base: Path) -> Path:
    p = Path(run["results"])
    return p if p.is_absolute() or p.exists() else base / p.name


def _md_table(rows: list[list[str]], header: list[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def ab_markdown(doc: dict[str, Any]) -> str:
    targets = doc.get("targets") or {}
    out = [
        f"# A/B: {(targets.get('A') or {}).get('name', 'A')} vs {(targets.get('B') or {}).get('name', 'B')}",
        "",
        f"**Verdict:** {(doc.get('verdict') or {}).get('text', '-')}",
        "",
        *(
            [f"**Action:** {doc['verdict']['action']}", ""]
            if (doc.get("verdict") or {}).get("action")
            else []
        ),
    ]
    out += [f"> warning: {w}" for w in doc.get("warnings") or ()]
    out += ["", "## The arms", "", _md_table(_identity(doc), ["arm", "name", "build"]), ""]
    diffs = _diff_rows(doc)
    out += (
        ["Every difference:", "", _change_line(doc), "", _md_table(diffs, ["field", "A", "B"])]
        if diffs
        else ["The arms do not differ (an A/A noise check)."]
    )
    out += [
        "",
        "## B / A with intervals",
        "",
        _md_table(stats_rows(doc.get("stats") or []), STATS_HEADER),
        "",
        *([clock_note(doc), ""] if clock_note(doc) else []),
        *(
            [
                "Including the requests after a reply that differed (live history: these mix the build "
                "with the drift):",
                "",
                _md_table(stats_rows(doc["stats_with_drift"]), STATS_HEADER),
                "",
            ]
            if doc.get("stats_with_drift")
            else []
        ),
        f"Method: {doc.get('method', '-')}.",
        "",
        outputs_text(doc.get("outputs") or {}),
        "",
        "## Run order",
        "",
        _md_table(order_rows(doc), ORDER_HEADER),
        "",
    ]
    return "\n".join(out)


def write_ab_report(doc: dict[str, Any], out_dir: Path, base: Path | None = None) -> Path:
    """`index.html` and `summary.md` in `out_dir` (each whole, then renamed into place); returns
    the page's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    page = write_text(out_dir / "index.html", render_ab_page(doc, base or out_dir.parent))
    write_text(out_dir / "summary.md", ab_markdown(doc))
    return page


def show_ab(
    path: Path, *, as_json: bool, console: Console, html: Path | None = None, verbose: bool = False
) -> None:
    """`replay report ab.json` (or the A/B folder): the console report, its JSON, or the page."""
    doc, base = load_ab(path)
    if as_json:
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    render(doc, console, verbose=verbose)
    out = html if html is not None else base / "report"
    page = write_ab_report(doc, out, base)
    console.print(f"report: {page}\nmarkdown summary: {page.parent / 'summary.md'}", highlight=False)
