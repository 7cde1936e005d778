"""`replay logs summary LOG...`: the figures field reports computed by hand from days of server log.

Windows split where the startup settings change, not at every restart: a restart that keeps the
settings is the same experiment, and splitting there would hide restores that happen across
restarts (a checkpoint written before a restart and restored after it). Rates per hour use the
server's uptime inside the window (first to last stamped line of each run), not wall time between
runs.

Definitions (so the figures mean the same thing on every API):
- continuation rate: finished requests whose span did not start at ctx=0 (A > 0), over all
  finished requests;
- full prefill: a finished request with A = 0;
- restore coverage: restored tokens / effective prompt tokens (B) of the request it served;
- tokens saved by restores: sum of restored tokens; as a share, saved / (saved + tokens actually
  prefilled, the sum of C);
- decode rate of a request: the `avg=` of its last `decoding` line; its depth is B; time-weighted
  average = sum(avg * decode seconds) / sum(decode seconds).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from drivers.logs import ds4, llamacpp
from drivers.logs.base import ParseStats
from drivers.logs.ds4_requests import Ds4Request, Run, assemble
from drivers.logs.effective import llamacpp_settings
from replay.errors import UsageError

_R = TypeVar("_R")

BAND_TOKENS = 50_000
COVERAGE_BUCKETS = ((0.0, 0.25), (0.25, 0.50), (0.50, 0.75), (0.75, 0.90), (0.90, 0.99), (0.99, 1.0001))


def _median(xs: Sequence[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def _band_label(depth: int) -> str:
    lo = depth // BAND_TOKENS * BAND_TOKENS
    return f"{lo // 1000}-{(lo + BAND_TOKENS) // 1000}K"


def _bands(points: Iterable[tuple[int, float]]) -> list[dict[str, object]]:
    """Median rate per depth band; `points` are (depth tokens, tok/s)."""
    by: dict[int, list[float]] = {}
    for depth, tps in points:
        by.setdefault(depth // BAND_TOKENS, []).append(tps)
    return [
        {"band": _band_label(k * BAND_TOKENS), "requests": len(v), "median_tps": _median(v)}
        for k, v in sorted(by.items())
    ]


def _coverage_summary(ratios: Sequence[float]) -> dict[str, object]:
    xs = sorted(ratios)
    buckets = {
        f"{int(lo * 100)}-{min(100, int(round(hi * 100)))}%": sum(1 for x in xs if lo <= x < hi)
        for lo, hi in COVERAGE_BUCKETS
    }
    out: dict[str, object] = {"count": len(xs), "buckets": buckets, "values": [round(x, 4) for x in xs]}
    if xs:
        q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
        out.update(min=xs[0], p25=q[0], median=q[1], p75=q[2], max=xs[-1])
    return out


# ---------------------------------------------------------------------------------------------
# ds4


@dataclass
class Ds4Window:
    index: int
    runs: int
    settings: dict[str, object]
    t_first: float | None
    t_last: float | None
    hours: float
    requests: int
    finish_reasons: dict[str, int]
    finish_errors: int
    error_lines: int
    continuation_rate: float | None
    full_prefills: int
    full_prefills_per_hour: float | None
    depth_median: float | None
    depth_max: int | None
    prefill_tps_median: float | None
    live_misses: int
    live_miss_reasons: dict[str, int]
    restores: int
    restore_coverage: dict[str, object]
    restored_tokens: int
    restore_saved_pct: float | None
    stores: dict[str, dict[str, float]]
    stores_skipped: int
    evictions: int
    evictions_zero_hit: int
    evicted_mib: float
    decode_bands: list[dict[str, object]]
    decode_tps_median: float | None
    decode_tps_time_weighted: float | None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _ds4_window(index: int, runs: Sequence[Run], requests: Sequence[Ds4Request]) -> Ds4Window:
    events = [ev for run in runs for ev in run.events]
    kinds = Counter(ev.kind for ev in events)
    finished = [r for r in requests if r.finish is not None]
    hours = sum(run.seconds for run in runs) / 3600.0
    full = sum(1 for r in finished if r.cached == 0)
    reasons = Counter(r.finish.reason or "unknown" for r in finished if r.finish)
    finish_errors = sum(1 for r in finished if r.finish and (r.finish.error or r.finish.reason == "error"))
    error_lines = finish_errors + kinds["request_abort"] + kinds["disk_error"] + kinds["listen_failed"]

    hits = [ev for ev in events if isinstance(ev, ds4.DiskHit)]
    restored = sum(h.tokens or 0 for h in hits)
    prefilled = sum(r.todo for r in finished)
    coverage = [
        r.restore.tokens / r.prompt
        for r in requests
        if r.restore and r.restore.tokens is not None and r.prompt > 0
    ]

    stores: dict[str, dict[str, float]] = {}
    for s in (ev for ev in events if isinstance(ev, ds4.Store)):
        row = stores.setdefault(s.reason or "unknown", {"count": 0, "tokens": 0, "mib": 0.0, "ms": 0.0})
        row["count"] += 1
        row["tokens"] += s.tokens or 0
        row["mib"] += s.mib or 0.0
        row["ms"] += s.ms or 0.0
    evictions = [ev for ev in events if isinstance(ev, ds4.Eviction)]
    misses = [ev for ev in events if isinstance(ev, ds4.LiveMiss)]

    decoded = [r for r in finished if r.decode is not None and r.decode.avg_tps is not None]
    weights = [(r.decode.avg_tps, r.decode.seconds) for r in decoded if r.decode and r.decode.seconds]
    total_s = sum(s for _, s in weights if s)
    prefill_rates = [r.todo / r.prompt_done_s for r in finished if r.prompt_done_s and r.todo >= 2048]
    depths = [r.prompt for r in finished]
    t_stamps = [t for run in runs for t in (run.t_first, run.t_last) if t is not None]
    return Ds4Window(
        index=index,
        runs=len(runs),
        settings=runs[0].settings if runs else {},
        t_first=min(t_stamps) if t_stamps else None,
        t_last=max(t_stamps) if t_stamps else None,
        hours=hours,
        requests=len(finished),
        finish_reasons=dict(sorted(reasons.items())),
        finish_errors=finish_errors,
        error_lines=error_lines,
        continuation_rate=(len(finished) - full) / len(finished) if finished else None,
        full_prefills=full,
        full_prefills_per_hour=full / hours if hours > 0 else None,
        depth_median=_median(depths),
        depth_max=max(depths) if depths else None,
        prefill_tps_median=_median(prefill_rates),
        live_misses=len(misses),
        live_miss_reasons=dict(sorted(Counter(m.reason or "unknown" for m in misses).items())),
        restores=len(hits),
        restore_coverage=_coverage_summary(coverage),
        restored_tokens=restored,
        restore_saved_pct=100.0 * restored / (restored + prefilled) if restored + prefilled else None,
        stores=dict(sorted(stores.items())),
        stores_skipped=kinds["store_skipped"],
        evictions=len(evictions),
        evictions_zero_hit=sum(1 for e in evictions if e.hits == 0),
        evicted_mib=sum(e.mib or 0.0 for e in evictions),
        decode_bands=_bands((r.prompt, r.decode.avg_tps) for r in decoded if r.decode and r.decode.avg_tps),
        decode_tps_median=_median([r.decode.avg_tps for r in decoded if r.decode and r.decode.avg_tps]),
        decode_tps_time_weighted=sum(a * s for a, s in weights if s) / total_s if total_s else None,
    )


def _group_runs(runs: Sequence[_R], settings_of: Callable[[_R], dict[str, object]]) -> list[list[_R]]:
    """Consecutive runs with equal startup settings form one window."""
    groups: list[list[_R]] = []
    for run in runs:
        if groups and settings_of(groups[-1][0]) == settings_of(run):
            groups[-1].append(run)
        else:
            groups.append([run])
    return groups


def summarize_ds4(events: Sequence[ds4.Event]) -> tuple[list[Ds4Window], Ds4Window]:
    asm = assemble(events)
    windows = []
    for i, group in enumerate(_group_runs(asm.runs, lambda r: r.settings)):
        idx = {run.index for run in group}
        windows.append(_ds4_window(i, group, [r for r in asm.requests if r.run in idx]))
    total = _ds4_window(-1, asm.runs, asm.requests)
    total.settings = {}
    return windows, total


# ---------------------------------------------------------------------------------------------
# llama.cpp


@dataclass
class LlamaRun:
    index: int
    startup: list[llamacpp.Event] = field(default_factory=list)
    events: list[llamacpp.Event] = field(default_factory=list)
    t_first: float | None = None
    t_last: float | None = None

    @property
    def settings(self) -> dict[str, object]:
        return llamacpp_settings(self.startup)

    @property
    def seconds(self) -> float:
        if self.t_first is None or self.t_last is None:
            return 0.0
        return max(0.0, self.t_last - self.t_first)


def _llama_runs(events: Iterable[llamacpp.Event]) -> list[LlamaRun]:
    runs: list[LlamaRun] = []
    in_startup = False
    for ev in events:
        if isinstance(ev, llamacpp.STARTUP_KINDS):
            if not in_startup and runs and (runs[-1].events or runs[-1].startup):
                runs.append(LlamaRun(index=len(runs)))
            in_startup = True
        else:
            in_startup = False
        if not runs:
            runs.append(LlamaRun(index=0))
        run = runs[-1]
        if isinstance(ev, llamacpp.STARTUP_KINDS):
            run.startup.append(ev)
        run.events.append(ev)
        if ev.t is not None:
            run.t_first = ev.t if run.t_first is None else run.t_first
            run.t_last = ev.t
    return runs


@dataclass
class LlamaWindow:
    index: int
    runs: int
    settings: dict[str, object]
    hours: float
    requests: int
    continuation_rate: float | None
    full_prefills: int
    full_prefills_per_hour: float | None
    forced_full_reprocess: int
    prompt_tokens_processed: int
    prompt_tps_median: float | None
    slot_selected: dict[str, int]
    lcp_sim_median: float | None
    checkpoints_created: int
    checkpoints_restored: int
    checkpoints_erased: int
    prompt_cache_saves: int
    prompt_cache_loads: int
    prompt_cache_evictions: int
    decode_bands: list[dict[str, object]]
    decode_tps_median: float | None
    decode_tps_time_weighted: float | None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _llama_window(index: int, runs: Sequence[LlamaRun]) -> LlamaWindow:
    L = llamacpp
    tasks: dict[tuple[int, int | None, int | None], dict[str, object]] = {}
    for run in runs:
        for ev in run.events:
            if not isinstance(ev, L.SlotEvent) or ev.task is None or ev.task < 0:
                continue
            rec = tasks.setdefault((run.index, ev.slot, ev.task), {})
            if isinstance(ev, L.NewPrompt):
                rec["depth"] = ev.n_tokens
            elif isinstance(ev, L.SeqRemove):
                rec.setdefault("kept", ev.n_tokens)
            elif isinstance(ev, L.PromptTiming):
                rec["prompt"] = ev
            elif isinstance(ev, L.EvalTiming):
                rec["eval"] = ev
    events = [ev for run in runs for ev in run.events]
    hours = sum(run.seconds for run in runs) / 3600.0
    kept = [rec["kept"] for rec in tasks.values() if "kept" in rec]
    full = sum(1 for k in kept if k == 0)
    prompts = [rec["prompt"] for rec in tasks.values() if "prompt" in rec]
    evals = [(rec.get("depth"), rec["eval"]) for rec in tasks.values() if "eval" in rec]
    sel = Counter(ev.by or "unknown" for ev in events if isinstance(ev, L.SlotSelected))
    sims = [ev.sim for ev in events if isinstance(ev, L.SlotSelected) and ev.sim is not None]
    eval_ms = sum(e.ms for _, e in evals if e.tokens > 0)
    eval_tokens = sum(e.tokens for _, e in evals if e.tokens > 0)
    kinds = Counter(ev.kind for ev in events)
    return LlamaWindow(
        index=index,
        runs=len(runs),
        settings=runs[0].settings if runs else {},
        hours=hours,
        requests=len(prompts),
        continuation_rate=(len(kept) - full) / len(kept) if kept else None,
        full_prefills=full,
        full_prefills_per_hour=full / hours if hours > 0 else None,
        forced_full_reprocess=kinds["full_reprocess"],
        prompt_tokens_processed=sum(p.tokens for p in prompts),  # type: ignore[attr-defined]
        prompt_tps_median=_median([p.tps for p in prompts if p.tps]),  # type: ignore[attr-defined]
        slot_selected=dict(sorted(sel.items())),
        lcp_sim_median=_median(sims),
        checkpoints_created=kinds["checkpoint_created"],
        checkpoints_restored=kinds["checkpoint_restored"],
        checkpoints_erased=kinds["checkpoint_erased"],
        prompt_cache_saves=kinds["prompt_cache_save"],
        prompt_cache_loads=kinds["prompt_cache_load"],
        prompt_cache_evictions=kinds["prompt_cache_evict"],
        decode_bands=_bands((int(d), e.tps) for d, e in evals if d is not None and e.tps),
        decode_tps_median=_median([e.tps for _, e in evals if e.tps]),
        decode_tps_time_weighted=1000.0 * eval_tokens / eval_ms if eval_ms > 0 else None,
    )


def summarize_llamacpp(events: Sequence[llamacpp.Event]) -> tuple[list[LlamaWindow], LlamaWindow]:
    runs = _llama_runs(events)
    windows = [_llama_window(i, g) for i, g in enumerate(_group_runs(runs, lambda r: r.settings))]
    total = _llama_window(-1, runs)
    total.settings = {}
    return windows, total


# ---------------------------------------------------------------------------------------------
# Entry point, JSON and rendering


@dataclass
class LogSummary:
    kind: str  # "ds4" | "llamacpp"
    files: list[str]
    stats: ParseStats
    windows: list[Ds4Window] | list[LlamaWindow]
    total: Ds4Window | LlamaWindow

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "files": self.files,
            "parse": self.stats.to_dict(),
            "windows": [w.to_dict() for w in self.windows],
            "total": self.total.to_dict(),
        }


def detect_kind(paths: Sequence[str | Path], sniff_lines: int = 5000) -> str:
    """`ds4` or `llamacpp`, from which server's markers appear in the first lines of the logs."""
    ds4_hits = llama_hits = 0
    for p in paths:
        with open(p, encoding="utf-8", errors="replace") as fh:
            for i, line in enumerate(fh):
                if i >= sniff_lines:
                    break
                if "ds4-server: " in line:
                    ds4_hits += 1
                elif ("slot " in line and "| task " in line) or "srv " in line or "llama_" in line:
                    llama_hits += 1
    if ds4_hits == 0 and llama_hits == 0:
        raise UsageError("cannot tell which server wrote these logs (no ds4-server or llama-server lines)")
    return "ds4" if ds4_hits >= llama_hits else "llamacpp"


def summarize(paths: Sequence[str | Path], *, kind: str = "auto", year: int | None = None) -> LogSummary:
    """Parse the logs (in the order given, as one stream) and compute the per-window figures."""
    if not paths:
        raise UsageError("no log files given")
    missing = [str(p) for p in paths if not Path(p).is_file()]
    if missing:
        raise UsageError(f"log file not found: {missing[0]}")
    if kind == "auto":
        kind = detect_kind(paths)
    if kind == "ds4":
        log = ds4.parse_files(paths, year=year)
        windows, total = summarize_ds4(log.events)
        return LogSummary("ds4", [str(p) for p in paths], log.stats, windows, total)
    if kind == "llamacpp":
        llog = llamacpp.parse_files(paths)
        lwindows, ltotal = summarize_llamacpp(llog.events)
        return LogSummary("llamacpp", [str(p) for p in paths], llog.stats, lwindows, ltotal)
    raise UsageError(f"unknown log kind {kind!r} (expected ds4, llamacpp or auto)")


def _fmt(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.2f}" if abs(v) < 1e6 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _settings_text(settings: dict[str, object]) -> str:
    return ", ".join(f"{k}={v}" for k, v in settings.items()) or "(no startup lines in this window)"


def _ds4_table(w: Ds4Window) -> Table:
    title = "all windows" if w.index < 0 else f"window {w.index + 1}"
    t = Table(title=f"{title}: {w.runs} run(s), {w.hours:.2f} h up", show_header=False, title_justify="left")
    t.add_column("figure", style="bold")
    t.add_column("value")
    if w.index >= 0:
        t.add_row("settings", _settings_text(w.settings))
    t.add_row("requests completed", _fmt(w.requests))
    t.add_row("finish reasons", ", ".join(f"{k} {v:,}" for k, v in w.finish_reasons.items()) or "-")
    t.add_row("error lines", f"{w.error_lines:,} (finish=error {w.finish_errors:,})")
    t.add_row("continuation rate (ctx > 0)", _pct(w.continuation_rate))
    t.add_row("full prefills", f"{w.full_prefills:,} ({_fmt(w.full_prefills_per_hour)}/h)")
    t.add_row("depth median / max", f"{_fmt(w.depth_median)} / {_fmt(w.depth_max)}")
    t.add_row("prefill tok/s median (C >= 2048)", _fmt(w.prefill_tps_median))
    t.add_row("live misses", f"{w.live_misses:,} " + str(w.live_miss_reasons or ""))
    cov = w.restore_coverage
    cov_txt = "-"
    if cov.get("count"):
        cov_txt = (
            f"min {_pct(cov['min'])}, median {_pct(cov['median'])}, max {_pct(cov['max'])}; "  # type: ignore[arg-type]
            + ", ".join(f"{k}: {v}" for k, v in cov["buckets"].items() if v)  # type: ignore[union-attr]
        )
    t.add_row("restores", f"{w.restores:,}, coverage {cov_txt}")
    saved_pct = "-" if w.restore_saved_pct is None else f"{w.restore_saved_pct:.1f}%"
    t.add_row("tokens saved by restores", f"{w.restored_tokens:,} ({saved_pct} of prefill work)")
    stores = "; ".join(
        f"{k} {int(v['count']):,} ({int(v['tokens']):,} tok, {v['mib']:,.0f} MiB)"
        for k, v in w.stores.items()
    )
    t.add_row(
        "stores by reason", (stores or "-") + (f"; skipped {w.stores_skipped:,}" if w.stores_skipped else "")
    )
    t.add_row(
        "evictions", f"{w.evictions:,} ({w.evictions_zero_hit:,} with zero hits, {w.evicted_mib:,.0f} MiB)"
    )
    t.add_row(
        "decode tok/s median / time-weighted",
        f"{_fmt(w.decode_tps_median)} / {_fmt(w.decode_tps_time_weighted)}",
    )
    return t


def _llama_table(w: LlamaWindow) -> Table:
    title = "all windows" if w.index < 0 else f"window {w.index + 1}"
    t = Table(title=f"{title}: {w.runs} run(s), {w.hours:.2f} h up", show_header=False, title_justify="left")
    t.add_column("figure", style="bold")
    t.add_column("value")
    if w.index >= 0:
        t.add_row("settings", _settings_text(w.settings))
    t.add_row("requests completed", _fmt(w.requests))
    t.add_row("continuation rate (kept > 0)", _pct(w.continuation_rate))
    t.add_row("full prefills", f"{w.full_prefills:,} ({_fmt(w.full_prefills_per_hour)}/h)")
    t.add_row("forced full re-processing", _fmt(w.forced_full_reprocess))
    t.add_row("prompt tokens processed", _fmt(w.prompt_tokens_processed))
    t.add_row("prompt tok/s median", _fmt(w.prompt_tps_median))
    t.add_row("slot selected by", ", ".join(f"{k} {v:,}" for k, v in w.slot_selected.items()) or "-")
    t.add_row("LCP similarity median", _fmt(w.lcp_sim_median))
    t.add_row(
        "context checkpoints",
        f"created {w.checkpoints_created:,}, restored {w.checkpoints_restored:,}, erased {w.checkpoints_erased:,}",
    )
    t.add_row(
        "prompt cache (RAM)",
        f"saves {w.prompt_cache_saves:,}, loads {w.prompt_cache_loads:,}, evictions {w.prompt_cache_evictions:,}",
    )
    t.add_row(
        "decode tok/s median / time-weighted",
        f"{_fmt(w.decode_tps_median)} / {_fmt(w.decode_tps_time_weighted)}",
    )
    return t


def _bands_table(bands: list[dict[str, object]]) -> Table:
    t = Table(title="decode median per depth band", title_justify="left")
    t.add_column("depth")
    t.add_column("requests", justify="right")
    t.add_column("median tok/s", justify="right")
    for b in bands:
        t.add_row(str(b["band"]), _fmt(b["requests"]), _fmt(b["median_tps"]))
    return t


def render(summary: LogSummary) -> RenderableType:
    """The summary as rich tables: parse health first, then each window, then all pooled."""
    st = summary.stats
    parts: list[RenderableType] = [
        Text(
            f"{summary.kind} log: {st.lines:,} lines, {st.recognised:,} parsed, "
            f"{st.known_ignored:,} known but unused, {st.unrecognised:,} not recognised",
        )
    ]
    for w in st.warnings:
        parts.append(Text(f"warning: {w}", style="bold yellow"))
    table = _ds4_table if summary.kind == "ds4" else _llama_table
    windows = list(summary.windows)
    for w in windows:
        parts.append(table(w))  # type: ignore[arg-type]
        if w.decode_bands:
            parts.append(_bands_table(w.decode_bands))
    if len(windows) > 1:
        parts.append(table(summary.total))  # type: ignore[arg-type]
    return Group(*parts)


def print_summary(summary: LogSummary, console: Console | None = None) -> None:
    (console or Console()).print(render(summary))
