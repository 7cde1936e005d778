"""`replay report RESULTS... --html DIR`: one self-contained HTML page and a markdown summary.

Each results file is one run (an arm of an A/B when there are several) seen as a `RunView`: every
request with its phases in seconds, and the disk events of the server log. Phases are the
simulator's modelled seconds when the results carry them (`modelled`, placed on the simulator's
clock: send time x time scale), else the measured ones (queue + prefill from the server log's
`prompt done` when the log was correlated, TTFT otherwise). The page embeds its figures as SVG and
loads nothing from the network, so it can be mailed or attached to an issue as it is.
"""

from __future__ import annotations

import html
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from replay.metrics.hist import Summary
from replay.metrics.results import RunResults, read_results, time_scale
from replay.report import plots
from replay.report.glossary import GLOSSARY, TERMS
from replay.report.table import summary_rows
from replay.report.verdict import verdict
from replay.runs.serverlog import DS4_FORMAT_KINDS, server_records

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


@dataclass(slots=True)
class RequestView:
    """One request as the report draws it; phase lengths in seconds of the run's clock."""

    seq: int
    id: int
    session: str
    tag: str
    switch: tuple[str, ...]
    status: str
    start: float
    queue: float
    io: float
    prefill: float
    decode: float
    prompt: int
    cached: int
    reprocessed: int
    output: int
    restored: int = 0
    cache_source: str | None = None

    @property
    def end(self) -> float:
        return self.start + self.queue + self.io + self.prefill + self.decode

    @property
    def ttft(self) -> float:
        """Submit to first token: queue, disk work and prefill."""
        return self.queue + self.io + self.prefill

    @property
    def decode_rate(self) -> float | None:
        return self.output / self.decode if self.output > 1 and self.decode > 0 else None

    @property
    def prefill_rate(self) -> float | None:
        return self.reprocessed / self.prefill if self.reprocessed > 0 and self.prefill > 0 else None


@dataclass(slots=True)
class DiskPoint:
    t: float
    used_mib: float
    event: str  # store | evict | restore
    tokens: int
    hits: int | None = None
    reason: str | None = None


@dataclass(slots=True)
class RunView:
    path: str
    label: str
    clock: str  # "modelled" | "measured"
    requests: list[RequestView]
    disk: list[DiskPoint]
    summary: Summary
    budget_mib: float | None
    server: list[dict[str, Any]] = field(default_factory=list)
    header: dict[str, Any] = field(default_factory=dict)

    @property
    def clock_start(self) -> float | None:
        """Seconds after midnight at the trace's t=0, when the trace carries its wall clock."""
        start = (self.header.get("trace") or {}).get("start")
        if not isinstance(start, str):
            return None
        try:
            moment = datetime.fromisoformat(start) if "T" in start else datetime.strptime(start, "%H:%M")
        except ValueError:
            return None
        return float(moment.hour * 3600 + moment.minute * 60 + moment.second)

    @property
    def time_scale(self) -> float | None:
        """How much faster than modelled time the simulator ran (None for a real server)."""
        return time_scale(self.header) if self.clock == "modelled" else None

    @property
    def sessions(self) -> list[str]:
        return list(dict.fromkeys(r.session for r in sorted(self.requests, key=lambda r: r.start)))

    def decode_bands(self, width: int) -> dict[int, float]:
        """Median decode rate per depth band (band index -> tok/s)."""
        bands: dict[int, list[float]] = {}
        for r in self.requests:
            if r.decode_rate is not None and r.status == "ok":
                bands.setdefault(r.prompt // width, []).append(r.decode_rate)
        return {b: statistics.median(v) for b, v in bands.items()}


# --- building views --------------------------------------------------------------------------


def _label(res: RunResults) -> str:
    target = res.run.get("target") or {}
    if target.get("arm"):
        return str(target["arm"])
    return Path(res.path).name.removesuffix(".jsonl").removesuffix(".results")


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def _requests(res: RunResults) -> tuple[list[RequestView], str]:
    recs = [r for r in res.requests if r.get("status") != "cancelled"]
    modelled = bool(recs) and all(
        isinstance(r.get("modelled"), dict) for r in recs if r.get("status") == "ok"
    )
    scale = time_scale(res.run) if modelled else None
    server_req = {s.get("request_seq"): s for s in res.server if s.get("event") == "request"}
    restored = {
        s.get("request_seq"): _int(s.get("tokens")) for s in res.server if s.get("event") == "restore"
    }
    clock = _ModelledClock(scale) if modelled else None
    views: list[RequestView] = []
    for rec in sorted(recs, key=lambda r: (r.get("sent_s") or 0.0, r.get("seq") or 0)):
        m = rec.get("modelled") if modelled else None
        sent = float(rec.get("sent_s") or 0.0)
        ttft = float(rec.get("ttft_s") or 0.0)
        latency = float(rec.get("latency_s") or ttft)
        if m and clock is not None:
            queue = float(m.get("queue_s") or 0.0)
            io = float(m.get("restore_s") or 0.0) + float(m.get("evict_save_s") or 0.0)
            prefill = float(m.get("prefill_s") or 0.0)
            decode = float(m.get("decode_s") or 0.0)
            start = clock.place(rec, queue + io + prefill + decode)
        else:
            done = server_req.get(rec.get("seq"), {}).get("prompt_done_s")
            prefill = min(float(done), ttft) if isinstance(done, int | float) else ttft
            queue, io = max(0.0, ttft - prefill), 0.0
            decode = max(0.0, latency - ttft)
            start = sent
        views.append(
            RequestView(
                seq=_int(rec.get("seq")),
                id=_int(rec.get("id")),
                session=str(rec.get("session")),
                tag=str(rec.get("tag") or ""),
                switch=tuple(rec.get("switch") or ()),
                status=str(rec.get("status") or ""),
                start=start,
                queue=queue,
                io=io,
                prefill=prefill,
                decode=decode,
                prompt=_int(rec.get("prompt_tokens")),
                cached=_int(rec.get("cached_tokens")),
                reprocessed=_int(rec.get("reprocessed_tokens")),
                output=_int(rec.get("output_tokens")),
                restored=restored.get(rec.get("seq"), 0),
                cache_source=(m or {}).get("cache_source"),
            )
        )
    return views, "modelled" if modelled else "measured"


class _ModelledClock:
    """Places requests on the simulator's clock (send time x time scale) without the client's overhead.

    Under a time scale of 1000, 50 ms the client spends building a 100K-token request become 50
    modelled seconds in which the simulated server sat idle. Positions inside a busy period are
    kept exactly (they are the simulator's own clock); an idle gap is cut down to what the plan
    meant it to be (the time between the previous reply and the request's scheduled send). With no
    time scale known, requests are laid end to end in send order.
    """

    def __init__(self, scale: float | None) -> None:
        self.scale = scale
        self.shift = 0.0
        self.busy_until = 0.0  # on the raw clock
        self.last_done = 0.0  # wall seconds: latest reply seen so far
        self.cursor = 0.0

    def place(self, rec: dict[str, Any], total: float) -> float:
        sent = float(rec.get("sent_s") or 0.0)
        scheduled = float(rec.get("scheduled_s") if rec.get("scheduled_s") is not None else sent)
        latency = float(rec.get("latency_s") or 0.0)
        if self.scale is None:
            start = self.cursor
            self.cursor += total
        else:
            raw = sent * self.scale
            if raw > self.busy_until:
                intended = max(0.0, scheduled - self.last_done) * self.scale
                self.shift += max(0.0, (raw - self.busy_until) - intended)
            start = raw - self.shift
            self.busy_until = max(self.busy_until, raw + total)
        self.last_done = max(self.last_done, sent + latency)
        return start


def _disk(res: RunResults, requests: list[RequestView]) -> list[DiskPoint]:
    """Disk usage after each store/evict/restore, placed inside the request that caused it.

    The log has no usable clock under a time scale (and only whole seconds otherwise), so each
    event is placed by order: the events of one request are spread over its queue, disk and
    prefill phases in log order; events no request owns (shutdown saves) go at the end.
    """
    by_seq = {r.seq: r for r in requests}
    events = [s for s in res.server if s.get("event") in ("store", "evict", "restore")]
    events.sort(key=lambda s: _int(s.get("line")))
    owned: dict[Any, list[dict[str, Any]]] = {}
    for s in events:
        owned.setdefault(s.get("request_seq"), []).append(s)
    end = max((r.end for r in requests), default=0.0)
    times: dict[int, float] = {}
    for seq, group in owned.items():
        req = by_seq.get(seq)
        for i, s in enumerate(group):
            if req is None:
                times[id(s)] = end
            else:
                span = req.queue + req.io + req.prefill + req.decode
                times[id(s)] = req.start + req.queue + span * (i + 1) / (len(group) + 1)
    used = 0.0
    out: list[DiskPoint] = []
    for s in sorted(events, key=lambda s: (times[id(s)], _int(s.get("line")))):
        mib = float(s.get("mib") or 0.0)
        kind = str(s.get("event"))
        if kind == "store":
            used += mib
        elif kind == "evict":
            used = max(0.0, used - mib)
        hits = s.get("hits")
        out.append(
            DiskPoint(
                times[id(s)],
                used,
                kind,
                _int(s.get("tokens")),
                _int(hits) if hits is not None else None,
                s.get("reason"),
            )
        )
    return out


def _server_from_log(res: RunResults) -> list[dict[str, Any]]:
    """`server` records from the ds4-format log beside the results (`X.server.log`, or the one the
    header names) when the results file carries none: the report then still shows the disk."""
    target = res.run.get("target") or {}
    candidates = [target.get("log"), Path(res.path).with_suffix(".server.log")]
    kind = str(target.get("kind") or "ds4")
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return server_records(kind if kind in DS4_FORMAT_KINDS else "ds4", Path(candidate), res.requests)
    return []


def load_run(path: str | Path) -> RunView:
    res = read_results(path)
    if not res.server:
        res.server = _server_from_log(res)
    requests, clock = _requests(res)
    effective = (res.run.get("target") or {}).get("effective") or {}
    budget = effective.get("kv_disk_budget_mib")
    return RunView(
        path=str(path),
        label=_label(res),
        clock=clock,
        requests=requests,
        disk=_disk(res, requests),
        summary=res.summary,
        budget_mib=float(budget) if isinstance(budget, int | float) else None,
        server=res.server,
        header=res.run,
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
    """A summary to paste into an issue: the verdict, the switch digest (arms side by side), then
    per-class tables, each figure on the clock the note under the title names."""
    digests = [digest(run) for run in runs]
    lines = [f"## {title or default_title(runs)}", "", verdict(runs, digests), ""]
    sources = sorted({str((run.header.get("trace") or {}).get("source") or "") for run in runs} - {""})
    if sources:
        lines += [f"Trace: {', '.join(sources)}; {len(runs)} run(s).", ""]
    lines += [time_note(runs), ""]
    lines.append("| | " + " | ".join(d["label"] for d in digests) + " |")
    lines.append("|---|" + "---|" * len(digests))
    for _, name, fmt in DIGEST_ROWS:
        lines.append(f"| {name} | " + " | ".join(fmt(d) for d in digests) + " |")
    for run in runs:
        lines += ["", f"### {run.label}: requests by switch class", ""]
        lines.append("| " + " | ".join(_class_header(run)) + " |")
        lines.append("|---|" + "---:|" * len(TABLE_COLUMNS))
        for cls, row in class_rows(run).items():
            lines.append(f"| {cls} | " + " | ".join(_fmt(row[k]) for k, _ in TABLE_COLUMNS) + " |")
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
            ttft_max_s=round(ttft[-1], 3) if ttft else None,
            latency_p50_s=_pct(latency, 50),
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
    parts += [
        "</section>",
        '<section id="classes"><h2>By switch class</h2>',
        '<figure class="plot" data-plot="classes">',
        plots.by_class(runs),
        "</figure>",
        '<div class="arms">',
    ]
    for run in runs:
        rows = [[cls, *(_fmt(row[k]) for k, _ in TABLE_COLUMNS)] for cls, row in class_rows(run).items()]
        parts.append(f"<div><h3>{html.escape(run.label)}</h3>{_table(rows, _class_header(run), tips)}</div>")
    parts += [
        "</div></section>",
        '<section id="depth"><h2>Rates by depth</h2>',
        '<figure class="plot" data-plot="depth">',
        plots.by_depth(runs),
        "</figure></section>",
        glossary_html(),
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
