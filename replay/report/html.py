"""`replay report RESULTS... --html DIR`: one self-contained HTML page and a markdown summary.

Each results file is one run (an arm of an A/B when there are several) seen as a `RunView`
(`replay.report.view`). The page embeds its figures as SVG and loads nothing from the network, so
it can be mailed or attached to an issue as it is.
"""

from __future__ import annotations

import dataclasses
import html
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replay.outputs import write_text
from replay.report import fleet, plots, units
from replay.report.fanout import GROUP_HEADER, RESUME_HEADER, SUBAGENT_HEADER, fan_out_view
from replay.report.glossary import GLOSSARY, TERMS
from replay.report.table import summary_rows
from replay.report.verdict import verdict
from replay.report.view import RunView, ServerLog, figures_from, load_run
from replay.twin.compare import read_twin

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

COLUMN_TIPS = {
    "n": "requests in this class",
    "err": "requests that did not end ok",
    "TTFT p50 s": "time to first token, median",
    "p90": "90th percentile",
    "max": "the slowest",
    "latency p50 s": "send to last token, median",
    "re-processed (mean)": TERMS["re-processed"],
    "cached (mean)": TERMS["cached"],
    "class": "the switch class (see the glossary)",
}


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


def _fmt(value: Any, key: str = "") -> str:
    """A table cell by its field's unit (`replay.report.units`); two decimals for a field without one."""
    if key in units.FIELDS:
        return units.field(value, key)
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.2f}"
    return f"{value:,}"


def summary_markdown(runs: Sequence[RunView], title: str | None = None) -> str:
    """A summary to paste into an issue: the verdict, the switch digest (arms side by side), then
    per-class tables, each figure on the clock the note under the title names."""
    digests = [digest(run) for run in runs]
    lines = [f"## {title or default_title(runs)}", "", verdict(runs, digests), ""]
    sources = sorted({str((run.header.get("trace") or {}).get("source") or "") for run in runs} - {""})
    if sources:
        lines += [f"Trace: {', '.join(sources)}; {len(runs)} run(s).", ""]
    lines += [time_note(runs), "", walker_note(runs), ""]
    lines.append("| | " + " | ".join(d["label"] for d in digests) + " |")
    lines.append("|---|" + "---|" * len(digests))
    for _, name, fmt in DIGEST_ROWS:
        lines.append(f"| {name} | " + " | ".join(fmt(d) for d in digests) + " |")
    for run in runs:
        lines += ["", f"### {run.label}: requests by switch class", ""]
        lines.append("| " + " | ".join(_class_header(run)) + " |")
        lines.append("|---|" + "---:|" * len(TABLE_COLUMNS))
        for cls, row in class_rows(run).items():
            lines.append(f"| {cls} | " + " | ".join(_fmt(row[k], k) for k, _ in TABLE_COLUMNS) + " |")
    lines += ["", "Terms: " + "; ".join(f"**{term}**: {text}" for term, text in GLOSSARY[:4] + GLOSSARY[5:6])]
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
.verdict { font-size: 15px; background: #f3f6fb; border-left: 4px solid #2f6db5; padding: 8px 12px; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 4px 16px; } dt { font-weight: 600; }
dd { margin: 0; } th[title], td[title] { text-decoration: underline dotted; cursor: help; }
"""


def _table(
    rows: list[list[str]],
    header: list[str],
    tips: dict[str, str] | None = None,
    row_tips: dict[str, str] | None = None,
) -> str:
    """A table whose headers (and first cells) carry `title` tooltips where a tip is known."""
    tips, row_tips = tips or {}, row_tips or {}
    head = "".join(
        f'<th title="{html.escape(tips[h])}">{html.escape(h)}</th>'
        if h in tips
        else f"<th>{html.escape(h)}</th>"
        for h in header
    )
    body = "".join(
        "<tr>"
        + "".join(
            f'<td title="{html.escape(row_tips[c])}">{html.escape(c)}</td>'
            if i == 0 and c in row_tips
            else f"<td>{html.escape(c)}</td>"
            for i, c in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def default_title(runs: Sequence[RunView]) -> str:
    """`switching: 4G vs 64G` when every run replayed one scenario, else a plain title."""
    sources = {str((run.header.get("trace") or {}).get("source") or "") for run in runs}
    if len(sources) == 1 and (source := sources.pop()).startswith("scenario:"):
        return f"{source.removeprefix('scenario:')}: {' vs '.join(run.label for run in runs)}"
    return "agent-replay report"


DIGEST_TIPS = {
    "switches": TERMS["switch"],
    "re-processed tokens per switch, mean / max": TERMS["re-processed"],
    "wait per switch (to first token), mean / max": "queue + disk work + prefill of each switch",
    "disk restores / live misses": TERMS["restore"] + " " + TERMS["live miss"],
    "evictions (with zero hits)": TERMS["eviction"],
    "stores by reason": TERMS["store reasons"],
}


def walker_note(runs: Sequence[RunView]) -> str:
    """Which walker produced the figures, once when every run shares it."""
    notes: dict[str, list[str]] = {}
    for run in runs:
        notes.setdefault(figures_from(run), []).append(run.label)
    if len(notes) == 1:
        return f"Figures from {next(iter(notes))}."
    return "Figures from " + "; ".join(f"{', '.join(labels)}: {note}" for note, labels in notes.items()) + "."


def time_note(runs: Sequence[RunView]) -> str:
    """Which clock the figures are on: modelled (what the real server would take) or measured here."""
    notes: dict[str, list[str]] = {}
    for run in runs:
        if run.clock == "modelled":
            scale = run.time_scale
            faster = f"; the simulator ran {scale:g}x faster than that" if scale else ""
            note = f"times are modelled seconds, what the real server would take{faster}"
        else:
            note = "times are measured wall-clock seconds on this machine"
        notes.setdefault(note, []).append(run.label)
    if len(notes) == 1:
        return next(iter(notes)).capitalize() + "."
    return "; ".join(f"{', '.join(labels)}: {note}" for note, labels in notes.items()) + "."


def class_rows(run: RunView) -> dict[str, dict[str, Any]]:
    """The per-class table on the run's own clock: modelled times from the views on the simulator,
    the client's measured histograms otherwise."""
    rows = summary_rows(run.summary)
    if run.clock != "modelled":
        return rows
    for cls, row in rows.items():
        members = [r for r in run.requests if r.status == "ok" and (cls == "all" or cls in r.switch)]
        ttft = sorted(r.ttft for r in members)
        latency = sorted(r.end - r.start for r in members)
        row.update(
            ttft_p50_s=_pct(ttft, 50),
            ttft_p90_s=_pct(ttft, 90),
            ttft_p99_s=_pct(ttft, 99),
            ttft_max_s=round(ttft[-1], 3) if ttft else None,
            latency_p50_s=_pct(latency, 50),
            latency_p99_s=_pct(latency, 99),
        )
    return rows


def _pct(values: list[float], q: int) -> float | None:
    """Nearest-rank percentile of sorted values."""
    if not values:
        return None
    return round(values[max(0, -(-q * len(values) // 100) - 1)], 3)


def _class_header(run: RunView) -> list[str]:
    return ["class", *(f"{h} ({run.clock})" if h.endswith(" s") else h for _, h in TABLE_COLUMNS)]


def _code(text: str) -> str:
    """Escaped text with its `backquoted` commands and flags set as code, as markdown would."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def glossary_html() -> str:
    items = "".join(f"<dt>{html.escape(term)}</dt><dd>{html.escape(text)}</dd>" for term, text in GLOSSARY)
    return f'<section id="glossary"><h2>Glossary</h2><dl>{items}</dl></section>'


def twin_sections(runs: Sequence[RunView]) -> list[str]:
    """A section per run that `replay twin` held against the model (its RESULTS.twin.json beside
    the results): the agreement, the per-request rows on both sides, each disagreement's first
    divergence."""
    out: list[str] = []
    for run in runs:
        doc = read_twin(run.path)
        if doc is None:
            continue
        head = [
            "request",
            "session",
            "prompt",
            "re-processed (real)",
            "re-processed (model)",
            "cached (real)",
            "cached (model)",
            "restores (real / model)",
            "evictions (real / model)",
            "checkpoints made/used (real | model)",
        ]
        rows = []
        for r in doc["rows"]:
            a, b = r["real"], r.get("model") or {}
            rows.append(
                [
                    str(r["id"]),
                    str(r.get("session") or ""),
                    str(r.get("prompt")),
                    str(a.get("reprocessed")),
                    str(b.get("reprocessed")),
                    str(a.get("cached")),
                    str(b.get("cached")),
                    f"{a.get('restores')} / {b.get('restores')}",
                    f"{a.get('evictions')} / {b.get('evictions')}",
                    f"{a.get('checkpoints_made')}/{a.get('checkpoints_used')} | "
                    f"{b.get('checkpoints_made')}/{b.get('checkpoints_used')}",
                ]
            )
        out.append(
            f'<section id="twin" data-run="{html.escape(run.label)}"><h2>Twin: the model against this server</h2>'
        )
        out.append(
            f'<p class="verdict">agreement {doc["agreement"]:.3f}: {doc["equal"]} of {doc["requests"]} '
            f"requests re-process the same tokens on the real server and on the model configured from its "
            f"settings ({doc['all_fields_equal']} agree on every figure)</p>"
        )
        out.append(_table(rows, head))
        for d in doc.get("disagreements") or ():
            div = d.get("first_divergence")
            shown = (
                "the two logs show the same events for it"
                if div is None
                else (
                    f"first divergence at event {div['index']}: real {_event(div.get('real'))}; model {_event(div.get('model'))}"
                )
            )
            out.append(
                f'<p class="note">request {d["id"]}: real re-processed {d["real"]}, model {d["model"]}; '
                f"{html.escape(shown)}</p>"
            )
        out.append("</section>")
    return out


def _event(rec: dict[str, Any] | None) -> str:
    return "(no event)" if rec is None else " ".join(f"{k}={v}" for k, v in rec.items())


def render_page(runs: Sequence[RunView], title: str | None = None) -> str:
    """The whole page as one string: the verdict first, then the numbers that back it."""
    title = title or default_title(runs)
    digests = [digest(run) for run in runs]
    tips = {
        **COLUMN_TIPS,
        **{f"{h} ({c})": COLUMN_TIPS[h] for h in COLUMN_TIPS for c in ("modelled", "measured")},
    }
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="verdict" id="verdict">{_code(verdict(runs, digests))}</p>',
        f'<p class="note" id="clock">{html.escape(time_note(runs))}</p>',
        f'<p class="note" id="walker">{_code(walker_note(runs))}</p>',
        '<p class="note">' + html.escape(", ".join(Path(run.path).name for run in runs)) + "</p>",
        '<section id="digest"><h2>What the switches cost</h2>',
        _table(
            [[name, *(fmt(d) for d in digests)] for _, name, fmt in DIGEST_ROWS],
            ["", *(d["label"] for d in digests)],
            row_tips=DIGEST_TIPS,
        ),
        "</section>",
        '<section id="timeline"><h2>Timeline</h2>',
        '<p class="note">One lane per session; each request is a bar split into queue, disk work (evict save and '
        "restore), prefill and decode; markers above a bar: switch, compaction, first request of a session; "
        "outlined bars were sent while another request was in flight. Underneath, when the server's log was "
        "read: disk KV in use, restores and evictions. ds4's May build writes a checkpoint and only then "
        "evicts, so the line can rise above the budget by one file for a moment (`replay size sweep` reports "
        "the same peak).</p>",
    ]
    same_clock = len({run.clock for run in runs}) == 1
    x_max = max((r.end for run in runs for r in run.requests), default=0.0) if same_clock else None
    for run in runs:
        parts.append(f'<figure class="plot" data-plot="timeline" data-run="{html.escape(run.label)}">')
        parts.append(plots.timeline(run, x_max))
        parts.append("</figure>")
    parts.append("</section>")
    parts += _replicas(runs, x_max)
    parts += _fan_out(runs)
    parts += [
        '<section id="classes"><h2>By switch class</h2>',
        '<figure class="plot" data-plot="classes">',
        plots.by_class(runs),
        "</figure>",
        '<div class="arms">',
    ]
    for run in runs:
        rows = [[cls, *(_fmt(row[k], k) for k, _ in TABLE_COLUMNS)] for cls, row in class_rows(run).items()]
        parts.append(f"<div><h3>{html.escape(run.label)}</h3>{_table(rows, _class_header(run), tips)}</div>")
    parts += [
        "</div></section>",
        '<section id="depth"><h2>Rates by depth</h2>',
        '<figure class="plot" data-plot="depth">',
        plots.by_depth(runs),
        "</figure></section>",
        *twin_sections(runs),
        glossary_html(),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def report_json(runs: Sequence[RunView]) -> dict[str, Any]:
    """Everything the page shows, as data: the verdict, which walker and clock each run's figures
    come from, the switch digest (restores, evictions, stores, waits) and the per-class table on
    the run's own clock (modelled seconds on the simulator)."""
    digests = [digest(run) for run in runs]
    text = verdict(runs, digests)
    return {
        "verdict": text,
        "action": text[text.rindex("Action: ") + len("Action: ") :] if "Action: " in text else None,
        "units": units.FIELDS,
        "runs": [
            {
                "file": run.path,
                "label": run.label,
                "clock": run.clock,
                "figures_from": figures_from(run),
                "time_scale": run.time_scale,
                "digest": d,
                "classes": class_rows(run),
                "disk": {
                    "kind": run.cache,
                    "budget_mib": run.budget_mib,
                    "peak_mib": round(max((p.used_mib for p in run.disk), default=0.0), 1),
                },
            }
            for run, d in zip(runs, digests, strict=True)
        ],
    }


def _replicas(runs: Sequence[RunView], x_max: float | None) -> list[str]:
    """Runs over several backends: a table per replica, how often sessions moved replica and what
    the moves re-read, and one timeline per replica. Nothing for a run of one target."""
    fleet_runs = [run for run in runs if len(fleet.backends(run)) > 1]
    if not fleet_runs:
        return []
    parts = [
        '<section id="replicas"><h2>Replicas</h2>',
        '<p class="note">A move is a request whose session\'s previous request went to another replica: '
        "the new one does not hold the conversation, so it re-reads it.</p>",
    ]
    for run in fleet_runs:
        parts.append(f"<h3>{html.escape(run.label)}</h3>")
        parts.append(_table(fleet.replica_rows(run), fleet.REPLICA_HEADER))
        parts += [f'<p class="moves">{html.escape(line)}</p>' for line in fleet.move_lines(run)]
        for backend in fleet.backends(run):
            mine = dataclasses.replace(
                run, requests=[r for r in run.requests if r.backend == backend], disk=[]
            )
            parts.append(
                f'<figure class="plot" data-plot="replica-timeline" data-run="{html.escape(run.label)}" '
                f'data-backend="{html.escape(backend)}"><figcaption>{html.escape(backend)}</figcaption>'
            )
            parts.append(plots.timeline(mine, x_max))
            parts.append("</figure>")
    parts.append("</section>")
    return parts


def _fan_out(runs: Sequence[RunView]) -> list[str]:
    """Runs whose trace has subagents (format /2): each subagent session, and each request of the
    parent that resumed after its subagents returned (its switch class, TTFT and re-read tokens,
    set beside the parent's other requests). Nothing when no run's trace names a subagent."""
    views = [(run, fan_out_view(run)) for run in runs]
    shown = [(run, view) for run, view in views if view is not None]
    if not shown:
        return []
    parts = [
        '<section id="subagents"><h2>Subagents</h2>',
        '<p class="note">A subagent is a session its parent spawned (the trace\'s <code>after.spawn</code>); '
        "the parent's request that waited for their last replies (<code>after.waits</code>) resumes the "
        "parent's conversation after they ran, and what it re-reads there is the fan-out's cost. TTFT on "
        "the run's clock.</p>",
    ]
    for run, view in shown:
        parts.append(f"<h3>{html.escape(run.label)}</h3>")
        parts.append(f'<p class="fan-out">{html.escape(view.summary)}</p>')
        parts.append(_table(view.groups, GROUP_HEADER))
        parts.append(_table(view.subagents, SUBAGENT_HEADER))
        if view.more_subagents:
            parts.append(f'<p class="note">... and {view.more_subagents:,} more subagent sessions.</p>')
        if view.resumes:
            parts.append(_table(view.resumes, RESUME_HEADER))
        if view.more_resumes:
            parts.append(f'<p class="note">... and {view.more_resumes:,} more resumes.</p>')
    parts.append("</section>")
    return parts


@dataclass(slots=True)
class Written:
    html: Path
    markdown: Path
    runs: list[RunView]


def write_report(
    paths: Sequence[str | Path],
    out_dir: str | Path,
    title: str | None = None,
    server_log: ServerLog | None = None,
) -> Written:
    """Write `index.html` and `summary.md` into `out_dir` (each whole, then renamed into place);
    each results file is one run (an arm)."""
    runs = [load_run(p, server_log) for p in paths]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    page = write_text(out / "index.html", render_page(runs, title))
    md = write_text(out / "summary.md", summary_markdown(runs, title))
    return Written(html=page, markdown=md, runs=runs)
