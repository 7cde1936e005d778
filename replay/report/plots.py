"""The report's figures (matplotlib, rendered to inline SVG so the page needs nothing else).

Each function takes the `RunView`s of `replay.report.view` and returns SVG text. Colours are fixed
per phase and per arm so two reports put side by side read the same way.
"""

from __future__ import annotations

import html
import io
import re
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")

from matplotlib import pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from replay.report.glossary import LEGEND  # noqa: E402
from replay.report.view import RunView, disk_at_start

PHASES = (
    ("queue", "#c9ccd1", "queued"),
    ("io", "#8e6bbf", "evict save + restore"),
    ("prefill", "#e8913a", "prefill"),
    ("decode", "#3c9a5f", "decode"),
)
ARM_COLOURS = ("#2f6db5", "#d0553a", "#3c9a5f", "#8e6bbf", "#b58a2f", "#4aa3a3")
CLASS_ORDER = ("cold", "continue", "switch", "compaction", "concurrent")
MARKERS = {"switch": ("v", "#d0553a"), "compaction": ("*", "#8e1b1b"), "cold": ("o", "#555555")}
BAND_STEPS = (1024, 2048, 4096, 8192, 10_000, 20_000, 25_000, 50_000, 100_000)

plt.rcParams.update({"svg.fonttype": "none", "font.size": 9, "axes.titlesize": 10})
# Legends at 9 pt read at >= 10 px when a full-width figure is drawn 1100+ px wide (a 1400 px
# window); the A/B page's half-width thumbnails are drawn narrower (`timeline(compact=True)`).
LEGEND_SIZE = 9


def to_svg(fig: Figure) -> str:
    """The figure as an `<svg>` element (no XML prolog, no fixed pixel size: it scales with the page)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    text = _LEGEND_TEXT.sub(
        lambda m: f"{m.group(1)}<title>{html.escape(LEGEND[m.group(2)])}</title>{m.group(2)}<", text
    )
    return re.sub(r'(<svg[^>]*?) width="[^"]*" height="[^"]*"', r"\1", text, count=1)


# A legend label as matplotlib writes it (svg.fonttype none: the text itself), to add its tooltip.
_LEGEND_TEXT = re.compile(r"(<text [^>]*>)(" + "|".join(re.escape(k) for k in LEGEND) + r")<")


def arm_colour(index: int) -> str:
    return ARM_COLOURS[index % len(ARM_COLOURS)]


def timeline(run: RunView, x_max: float | None = None, compact: bool = False) -> str:
    """One lane per session, each request a bar split into its phases; the disk strip underneath.

    `x_max` puts several arms on one time range, so their timelines compare at a glance.
    `compact`: half a page wide (the A/B page's pairs), legends above and below the plot
    instead of beside it, so the figure keeps its width for the drawing and its text stays
    readable once scaled down.
    """
    sessions = run.sessions
    lanes = {sid: i for i, sid in enumerate(sessions)}
    height = 1.2 + 0.38 * len(sessions)
    width = 6.4 if compact else 11
    disk = None
    if run.disk:  # no server log read (an external server): no empty strip
        fig, (ax, disk) = plt.subplots(
            2, 1, figsize=(width, height + 1.6), sharex=True, gridspec_kw={"height_ratios": [height, 1.6]}
        )
    else:
        fig, ax = plt.subplots(figsize=(width, height + 0.5))
    for req in run.requests:
        y = lanes[req.session]
        x = req.start
        for name, colour, _ in PHASES:
            width = getattr(req, name)
            if width > 0:
                ax.broken_barh([(x, width)], (y - 0.35, 0.7), facecolors=colour, edgecolors="none")
            x += max(width, 0.0)
        if req.status != "ok":
            ax.broken_barh(
                [(req.start, max(req.end - req.start, 1e-9))],
                (y - 0.35, 0.7),
                facecolors="none",
                edgecolors="#c00000",
                hatch="xx",
            )
        if "concurrent" in req.switch:
            ax.broken_barh(
                [(req.start, req.end - req.start)],
                (y - 0.37, 0.74),
                facecolors="none",
                edgecolors="#333333",
                linewidths=0.6,
            )
        for flag in ("compaction", "switch", "cold"):
            if flag in req.switch:
                marker, colour = MARKERS[flag]
                ax.plot([req.start], [y + 0.5], marker=marker, color=colour, markersize=6, linestyle="none")
                break
    ax.set_yticks(range(len(sessions)), sessions)
    ax.set_ylim(-0.7, len(sessions) - 0.2)
    if x_max:
        ax.set_xlim(-0.02 * x_max, x_max * 1.02)
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)
    ax.set_ylabel("session")
    handles: list[Patch | Line2D] = [Patch(facecolor=c, label=label) for _, c, label in PHASES]
    handles += [
        Line2D([], [], marker=m, color=c, linestyle="none", label=flag) for flag, (m, c) in MARKERS.items()
    ]
    if compact:  # the page's heading names the run; the legend takes the title's place
        ax.legend(
            handles=handles,
            loc="lower left",
            bbox_to_anchor=(0.0, 1.0),
            ncol=4,
            fontsize=LEGEND_SIZE,
            frameon=False,
            columnspacing=1.0,
            handletextpad=0.4,
        )
    else:
        ax.set_title(f"{run.label}: requests per session ({run.clock} seconds)")
        ax.legend(
            handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=LEGEND_SIZE, frameon=False
        )
    if disk is None:
        _time_axis(ax, run)
    else:
        _disk_strip(disk, run, compact)
        _time_axis(disk, run)
    fig.tight_layout()
    return to_svg(fig)


def _disk_strip(ax: plt.Axes, run: RunView, compact: bool = False) -> None:
    """Disk KV in use (GiB) with its budget, or, for llama-server, its host-RAM prompt cache
    (`--cache-ram`) in MiB with its limit when the limit is on the scale; restores and evictions
    marked above."""
    points = run.disk
    host = run.cache == "host"
    scale = 1.0 if host else 1024.0
    unit = "MiB" if host else "GiB"
    what = "host-cache memory in use (--cache-ram)" if host else "disk KV in use"
    xs = [0.0] + [p.t for p in points]
    start = 0.0 if host else disk_at_start(run.header) / scale  # an earlier day's files
    ys = [start] + [p.used_mib / scale for p in points]
    ax.step(xs, ys, where="post", color="#2f6db5", linewidth=1.2, label=f"{what} ({unit})")
    ax.fill_between(xs, ys, step="post", color="#2f6db5", alpha=0.12)
    budget = (run.budget_mib or 0) / scale
    peak = max(ys)
    # A limit far above what was used would flatten the line: drawn only when it is on the scale.
    shown = budget if budget and (not host or budget <= 4 * max(peak, 1e-9)) else 0.0
    if shown:
        ax.axhline(shown, color="#555555", linestyle="--", linewidth=0.8, label="limit" if host else "budget")
    top = max(peak, shown) or 1.0
    restores = [p.t for p in points if p.event == "restore"]
    cold_evictions = [p.t for p in points if p.event == "evict" and not p.hits]
    hit_evictions = [p.t for p in points if p.event == "evict" and p.hits]
    ax.plot(restores, [top * 1.08] * len(restores), "^", color="#3c9a5f", markersize=5, label="restore")
    ax.plot(
        cold_evictions,
        [top * 1.16] * len(cold_evictions),
        "v",
        color="#c00000",
        markersize=5,
        label="evicted" if host else "evicted, 0 hits",
    )
    if not host:
        ax.plot(
            hit_evictions,
            [top * 1.16] * len(hit_evictions),
            "v",
            color="#e8913a",
            markersize=5,
            label="evicted, had hits",
        )
    ax.set_ylim(0, top * 1.25)
    ax.set_ylabel(f"host cache ({unit})" if host else f"disk KV ({unit})")
    if host and budget and not shown:
        ax.set_title(f"limit {run.budget_mib:,.0f} MiB, off the scale", fontsize=8, loc="right")
    ax.grid(alpha=0.3)
    if compact:  # under the time axis's label
        ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.55), ncol=3, fontsize=LEGEND_SIZE, frameon=False)
    else:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=LEGEND_SIZE, frameon=False)


def _time_axis(ax: plt.Axes, run: RunView) -> None:
    """Clock time (06:45, 07:46, ...) when the trace carries its wall clock, else seconds from the start."""
    if run.clock_start is None:
        ax.set_xlabel(f"{run.clock} seconds since the run started")
        return
    start = run.clock_start
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: _hhmm(start + x)))
    ax.set_xlabel(f"time of day ({run.clock} clock, from the trace's own start time)")


def _hhmm(seconds: float) -> str:
    s = int(round(seconds)) % 86_400
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}"


def by_class(runs: Sequence[RunView]) -> str:
    """TTFT and re-processed tokens per switch class, one box per arm."""
    classes = [c for c in CLASS_ORDER if any(c in r.switch for run in runs for r in run.requests)]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    clock = runs[0].clock if len({run.clock for run in runs}) == 1 else "modelled or measured"
    metrics = (
        (axes[0], "ttft", "time to first token by switch class", f"seconds ({clock})"),
        (axes[1], "reprocessed", "re-processed tokens by switch class", "tokens"),
    )
    width = 0.8 / max(1, len(runs))
    for ax, attr, title, unit in metrics:
        for i, run in enumerate(runs):
            data = [
                [getattr(r, attr) for r in run.requests if c in r.switch and r.status == "ok"]
                for c in classes
            ]
            positions = [k + (i - (len(runs) - 1) / 2) * width for k in range(len(classes))]
            keep = [(p, d) for p, d in zip(positions, data, strict=True) if d]
            if not keep:
                continue
            box = ax.boxplot(
                [d for _, d in keep],
                positions=[p for p, _ in keep],
                widths=width * 0.85,
                patch_artist=True,
                showfliers=True,
                manage_ticks=False,
            )
            for patch in box["boxes"]:
                patch.set_facecolor(arm_colour(i))
                patch.set_alpha(0.35)
            for median in box["medians"]:
                median.set_color("#111111")
            for p, d in keep:  # the points themselves: a box of identical values is a flat line
                jitter = [p + width * 0.25 * (((k * 7919) % 17) / 16 - 0.5) for k in range(len(d))]
                ax.plot(jitter, d, "o", color=arm_colour(i), markersize=3, alpha=0.8)
        ax.set_xticks(range(len(classes)), classes)
        ax.set_title(title)
        ax.set_xlabel("switch class")
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.margins(y=0.08)
        ax.grid(axis="y", alpha=0.3)
    # One legend above both plots, not one beside each: the plots keep the width their five
    # class labels need ("compaction" and "concurrent" touched beside a legend).
    fig.legend(
        handles=[Patch(facecolor=arm_colour(i), alpha=0.55, label=run.label) for i, run in enumerate(runs)],
        loc="lower center",
        bbox_to_anchor=(0.5, 1.0),
        ncol=len(runs),
        frameon=False,
        fontsize=LEGEND_SIZE,
    )
    fig.tight_layout()
    return to_svg(fig)


def band_width(max_depth: int) -> int:
    """A round band width giving at most about eight bands (50K for ds4's 250K-deep logs)."""
    for step in BAND_STEPS:
        if max_depth / step <= 8:
            return step
    return BAND_STEPS[-1]


def by_depth(runs: Sequence[RunView]) -> str:
    """Median decode rate per depth band, and the prefill rate of each request against its depth."""
    depths = [r.prompt for run in runs for r in run.requests if r.prompt]
    width = band_width(max(depths, default=1))
    fig, (dec, pre) = plt.subplots(1, 2, figsize=(11, 3.4))
    bar = 0.8 / max(1, len(runs))
    bands_all: set[int] = set()
    for i, run in enumerate(runs):
        bands = run.decode_bands(width)
        bands_all.update(bands)
        xs = [b + (i - (len(runs) - 1) / 2) * bar for b in sorted(bands)]
        dec.bar(xs, [bands[b] for b in sorted(bands)], width=bar * 0.9, color=arm_colour(i), label=run.label)
        points = [(r.prompt, r.prefill_rate) for r in run.requests if r.prefill_rate]
        if points:
            pre.plot(
                [p[0] / 1000 for p in points],
                [p[1] for p in points],
                "o",
                color=arm_colour(i),
                markersize=4,
                label=run.label,
            )
    ticks = sorted(bands_all)
    dec.set_xticks(ticks, [f"{b * width // 1000}-{(b + 1) * width // 1000}K" for b in ticks], rotation=30)
    dec.set_title("median decode rate per depth band")
    dec.set_xlabel("prompt depth band (tokens)")
    dec.set_ylabel("tokens / s")
    dec.grid(axis="y", alpha=0.3)
    pre.set_title("prefill rate of each request")
    pre.set_xlabel("prompt depth (K tokens)")
    pre.set_ylabel("re-processed tokens / prefill s")
    rates = [r.prefill_rate for run in runs for r in run.requests if r.prefill_rate]
    pre.set_ylim(0, max(rates, default=1.0) * 1.15)  # head room: no point sits on the frame
    pre.margins(x=0.05)
    pre.grid(alpha=0.3)
    for ax in (dec, pre):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=LEGEND_SIZE)
    fig.tight_layout()
    return to_svg(fig)
