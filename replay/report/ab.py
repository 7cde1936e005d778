"""The A/B report: ratios first, absolute figures after, from the results files of every arm run.

Absolute times drift from run to run as the OS page cache warms (seed figures section 3: a first
round's prefill went 38.3 -> 27.9 -> 25.2 -> 23.3 s over four runs of the same build), so the
figures that can be trusted are ratios taken inside one run (round k of each session over its
round 1) and B/A ratios of two runs taken next to each other. The arms run A B, B A, ... so each
adjacent pair sees the drift in both directions; the spread of a ratio across pairs says how far
to trust it.

A "round" is the k-th request of each session in trace order. Prefill time comes from the
simulator's modelled seconds when the target is the simulator, else from the server's log
(ds4's prompt-done time), else TTFT as measured.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from statistics import fmean
from typing import Any

from rich.console import Console
from rich.table import Table

from replay.metrics.hist import ALL, Summary
from replay.metrics.results import RunResults, time_scale
from replay.report import ab_stats, units
from replay.report.table import ORDER, class_row

# /2: B/A intervals (`stats`, `verdict`, `method`), arm `identity` and `differences`, `run_times`;
# no `winner` in the per-pair `ab` rows; `--repeat` counts A B B A blocks; a run's cache is
# `fresh` when no disk cache carried over (a new process with no disk cache is fresh).
# /3: each seconds row of `stats` names its `clock` (wall, modelled, server log) and each run its
# `time_scale` (the simulator's, else null); an older file's clocks are worked out when it is read.
FORMAT = "agent-replay-ab/3"
FORMATS = ("agent-replay-ab/1", "agent-replay-ab/2", FORMAT)  # all are read by `replay report`
ARMS = ("A", "B")
DRIFT_NOTE = (
    "Absolute times drift from run to run as the page cache warms (model file, checkpoints), so "
    "compare ratios: round k over round 1 inside one run, and B/A of runs taken next to each other "
    "(order A B, B A, ...). Absolute figures are shown last, for reference."
)
_MODELLED = ("prefill_s", "restore_s", "total_s")
_SHOWN_MISMATCHES = 10


@dataclass(frozen=True, slots=True)
class ArmRun:
    """One run of one arm: its results and how its cache started."""

    index: int  # 1-based position in the run order
    arm: str  # "A" or "B"
    results: RunResults
    exit_code: int
    # dir, fresh (empty or missing when the server started), files and bytes at the end, removed
    cache: dict[str, Any]


# --- one run -----------------------------------------------------------------------------------


def _ok(rec: dict[str, Any]) -> bool:
    return rec.get("status") == "ok"


def prefill_times(res: RunResults) -> tuple[str, dict[int, float]]:
    """Prefill seconds per request seq, and where they came from (modelled, server-log or ttft)."""
    ok = [r for r in res.requests if _ok(r)]
    modelled = {
        r["seq"]: r["modelled"]["prefill_s"]
        for r in ok
        if (r.get("modelled") or {}).get("prefill_s") is not None
    }
    if ok and len(modelled) == len(ok):
        return "modelled", modelled
    logged = {
        s["request_seq"]: s["prompt_done_s"]
        for s in res.server
        if s.get("event") == "request"
        and s.get("request_seq") is not None
        and s.get("prompt_done_s") is not None
    }
    if ok and all(r["seq"] in logged for r in ok):
        return "server-log", {r["seq"]: logged[r["seq"]] for r in ok}
    return "ttft", {r["seq"]: r["ttft_s"] for r in ok if r.get("ttft_s") is not None}


def rounds(res: RunResults) -> tuple[str, list[dict[int, dict[str, float]]]]:
    """Per round k (list index k-1): {session index: {reprocessed, prefill_s}} of its ok requests."""
    source, prefill = prefill_times(res)
    by_session: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rec in res.requests:
        by_session[rec["session"]].append(rec)
    out: list[dict[int, dict[str, float]]] = []
    for n, sid in enumerate(sorted(by_session)):
        for k, rec in enumerate(sorted(by_session[sid], key=lambda r: r["id"])):
            while len(out) <= k:
                out.append({})
            if not _ok(rec):
                continue
            values: dict[str, float] = {}
            if rec.get("reprocessed_tokens") is not None:
                values["reprocessed"] = rec["reprocessed_tokens"]
            if rec["seq"] in prefill:
                values["prefill_s"] = prefill[rec["seq"]]
            out[k][n] = values
    return source, out


def _ratio(num: float, den: float) -> float | None:
    if den == 0:
        return 1.0 if num == 0 else None
    return round(num / den, 4)


def within_ratios(per_round: list[dict[int, dict[str, float]]]) -> dict[str, dict[str, Any]]:
    """Round k over round 1, summed over the sessions that have both (same sessions top and bottom)."""
    out: dict[str, dict[str, Any]] = {}
    first = per_round[0] if per_round else {}
    for k in range(2, len(per_round) + 1):
        row: dict[str, Any] = {}
        for metric, name in (("reprocessed", "reprocessed"), ("prefill_s", "prefill")):
            both = [s for s, v in per_round[k - 1].items() if metric in v and metric in first.get(s, {})]
            row[name] = (
                _ratio(sum(per_round[k - 1][s][metric] for s in both), sum(first[s][metric] for s in both))
                if both
                else None
            )
            row[f"{name}_sessions"] = len(both)
        out[f"{k}/1"] = row
    return out


def modelled_means(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean modelled seconds per switch class (the simulator's, independent of its time scale)."""
    acc: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for rec in records:
        m = rec.get("modelled")
        if not _ok(rec) or not m:
            continue
        for cls in (ALL, *rec.get("switch", ())):
            for key in _MODELLED:
                if m.get(key) is not None:
                    acc[cls][key].append(m[key])
    return {cls: {k: round(fmean(v), 4) for k, v in keys.items()} for cls, keys in acc.items()}


def class_figures(summary: Summary, records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per class: TTFT p50/p99, end-to-end p50, mean decode tok/s, mean re-processed and cached
    tokens, modelled seconds where known."""
    modelled = modelled_means(records)
    decode = decode_means(records)
    names = [c for c in ORDER if c in summary.classes] + sorted(set(summary.classes) - set(ORDER))
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        row = class_row(summary.classes[name])
        out[name] = {
            "count": row["count"],
            "errors": row["errors"],
            "ttft_p50_s": row["ttft_p50_s"],
            "ttft_p99_s": row["ttft_p99_s"],
            "latency_p50_s": row["latency_p50_s"],
            "mean_decode_tps": decode.get(name),
            "mean_reprocessed": row["mean_reprocessed"],
            "mean_cached": row["mean_cached"],
            "modelled": modelled.get(name),
        }
    return out


def decode_rate(rec: dict[str, Any]) -> float | None:
    """The request's decode speed: the server's own (llama-server's `timings.predicted_per_second`)
    where it reported one, else the stream's."""
    rate = rec.get("server_decode_tps")
    return float(rate) if rate is not None else rec.get("decode_tps")


def decode_means(records: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Mean decode tok/s per switch class."""
    acc: dict[str, list[float]] = defaultdict(list)
    for rec in records:
        rate = decode_rate(rec) if _ok(rec) else None
        if rate is not None:
            for cls in (ALL, *rec.get("switch", ())):
                acc[cls].append(rate)
    return {cls: round(fmean(v), 2) for cls, v in acc.items()}


def run_level(res: RunResults) -> dict[str, float]:
    """A run's wall time (its summary's `duration_s`) and throughput (output tokens of its
    successful requests per second of it)."""
    duration = (res.summary_line or {}).get("duration_s")
    if not isinstance(duration, int | float) or duration <= 0:
        return {}
    tokens = sum(int(r.get("output_tokens") or 0) for r in res.requests if _ok(r))
    return {"duration_s": float(duration), "throughput": tokens / float(duration)}


def log_parse(res: RunResults) -> dict[str, Any] | None:
    """How much of the server's log was understood (its `log_parse` record), if it was read."""
    found = [s for s in res.server if s.get("event") == "log_parse"]
    if not found:
        return None
    return {k: found[-1].get(k) for k in ("lines", "recognised", "unrecognised", "unrecognised_cache")}


def run_figures(run: ArmRun) -> dict[str, Any]:
    res = run.results
    source, per_round = rounds(res)
    restores = [s for s in res.server if s.get("event") == "restore"]
    return {
        "log": log_parse(res),
        "index": run.index,
        "arm": run.arm,
        "results": res.path,
        "cache": run.cache,
        "exit_code": run.exit_code,
        "outcome": (res.summary_line or {}).get("outcome", "cut short"),
        "requests": len(res.requests),
        "errors": sum(1 for r in res.requests if not _ok(r)),
        **run_level(res),
        "restores": len(restores) if res.server else None,
        "prefill_source": source,
        "time_scale": time_scale(res.run),
        "rounds": [
            {
                "round": k,
                "sessions": len(per),
                "reprocessed": sum(v.get("reprocessed", 0) for v in per.values()),
                "prefill_s": round(sum(v.get("prefill_s", 0.0) for v in per.values()), 6),
            }
            for k, per in enumerate(per_round, 1)
        ],
        "within": within_ratios(per_round),
        "classes": class_figures(res.summary, res.requests),
    }


# --- across runs -------------------------------------------------------------------------------


def _spread(values: list[float | None]) -> dict[str, Any]:
    got = [v for v in values if v is not None]
    return {
        "values": values,
        "min": min(got) if got else None,
        "max": max(got) if got else None,
        "mean": round(fmean(got), 4) if got else None,
    }


def pairs(runs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(A run, B run) for each adjacent pair in run order; an unfinished last pair is left out."""
    out = []
    for i in range(0, len(runs) - 1, 2):
        two = {runs[i]["arm"]: runs[i], runs[i + 1]["arm"]: runs[i + 1]}
        if set(two) == set(ARMS):
            out.append((two["A"], two["B"]))
    return out


Getter = Callable[[dict[str, Any]], float | None]


def _class_getter(cls: str, key: str) -> Getter:
    def get(run: dict[str, Any]) -> float | None:
        row = run["classes"].get(cls)
        if row is None:
            return None
        if key.startswith("modelled_"):
            return (row["modelled"] or {}).get(key.removeprefix("modelled_"))
        return row[key]

    return get


def _within_getter(k: str, name: str) -> Getter:
    return lambda run: run["within"].get(k, {}).get(name)


def ab_ratios(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """B/A of each metric for every adjacent pair, with its spread (no test: see ab_stats for that)."""
    paired = pairs(runs)
    if not paired:
        return []
    metrics: list[tuple[str, str, Getter]] = []
    for k in paired[0][0]["within"]:
        for name in ("reprocessed", "prefill"):
            metrics.append((f"round {k}", name, _within_getter(k, name)))
    classes = [c for c in paired[0][0]["classes"] if c in paired[0][1]["classes"]]
    for cls in classes:
        for key in ("mean_reprocessed", "ttft_p50_s", "ttft_p99_s", "modelled_prefill_s", "modelled_total_s"):
            metrics.append((cls, key, _class_getter(cls, key)))
    out = []
    for scope, metric, get in metrics:
        values = [(get(a), get(b)) for a, b in paired]
        if all(a is None and b is None for a, b in values):
            continue
        ratios = [None if a is None or b is None else _ratio(b, a) for a, b in values]
        out.append({"scope": scope, "metric": metric, **_spread(ratios)})
    return out


def arm_within(runs: list[dict[str, Any]], arm: str) -> dict[str, dict[str, Any]]:
    mine = [r for r in runs if r["arm"] == arm]
    keys = list(dict.fromkeys(k for r in mine for k in r["within"]))
    return {
        k: {
            name: _spread([r["within"].get(k, {}).get(name) for r in mine])
            for name in ("reprocessed", "prefill")
        }
        for k in keys
    }


def compare_outputs(runs: list[ArmRun], temp0_ids: set[int] | None) -> dict[str, Any]:
    """Did every run give the same reply to each temperature-0 request? Compared by `output_sha1`.

    In live history mode a reply that differs changes every later prompt of its session, so the
    first differing request of each session is the one to look at.
    """
    if not any("output_sha1" in r for run in runs for r in run.results.requests):
        return {"status": "unknown", "reason": "the results carry no output_sha1"}
    hashes: dict[int, dict[str, list[str]]] = defaultdict(lambda: {a: [] for a in ARMS})
    session_of: dict[int, str] = {}
    for run in runs:
        for rec in run.results.requests:
            if not _ok(rec) or rec.get("output_sha1") is None:
                continue
            if temp0_ids is not None and rec["id"] not in temp0_ids:
                continue
            hashes[rec["id"]][run.arm].append(rec["output_sha1"])
            session_of[rec["id"]] = rec["session"]
    compared = sorted(rid for rid, h in hashes.items() if h["A"] and h["B"])
    between = [rid for rid in compared if set(hashes[rid]["A"]) != set(hashes[rid]["B"])]
    unstable = {a: [rid for rid in compared if len(set(hashes[rid][a])) > 1] for a in ARMS}
    first: dict[str, int] = {}
    for rid in sorted(set(between) | set(unstable["A"]) | set(unstable["B"])):
        first.setdefault(session_of[rid], rid)
    if not compared:
        status = "unknown"
    elif between or unstable["A"] or unstable["B"]:
        status = "differ"
    else:
        status = "match"
    return {
        "status": status,
        "compared": len(compared),
        "matched": len(compared) - len(set(between) | set(unstable["A"]) | set(unstable["B"])),
        "differ_between_arms": between[:_SHOWN_MISMATCHES],
        "unstable_within_arm": {a: v[:_SHOWN_MISMATCHES] for a, v in unstable.items()},
        "first_difference_per_session": first,
    }


def _run_pairs(runs: list[ArmRun]) -> list[tuple[ArmRun, ArmRun]]:
    out = []
    for i in range(0, len(runs) - 1, 2):
        two = {runs[i].arm: runs[i], runs[i + 1].arm: runs[i + 1]}
        if set(two) == set(ARMS):
            out.append((two["A"], two["B"]))
    return out


@dataclass(slots=True)
class PairedStats:
    """B/A rows, and when live history let replies change later prompts, which figures those are."""

    rows: list[dict[str, Any]]
    with_drift: list[dict[str, Any]]  # every request pair, drift and all (empty when there is none)
    drift: dict[str, Any] | None  # {"clean": pairs without drift, "pairs": all}


def paired_stats(
    runs: list[ArmRun], confidence: float = ab_stats.CONFIDENCE, live: bool = False
) -> PairedStats:
    """B/A with intervals from the matched requests of each adjacent (A, B) pair of runs, and from
    the pairs' run-level figures (wall time, throughput).

    In live history a request whose session had an earlier reply that differed between the two
    runs was sent a different prompt by each; its figures compare prompts, not builds. Then the
    rows come from the other requests, and `with_drift` keeps the rows over every request (and the
    run-level ones are marked: a run's wall time includes them all)."""
    pairs = _run_pairs(runs)
    units = ab_stats.matched_units(
        [(a.results.requests, b.results.requests) for a, b in pairs],
        [(prefill_times(a.results)[1], prefill_times(b.results)[1]) for a, b in pairs],
    )
    run_rows = ab_stats.compare_runs(
        [(run_level(a.results), run_level(b.results)) for a, b in pairs], confidence
    )
    clean = [u for u in units if not u.drift]
    if not live or len(clean) == len(units):
        return PairedStats(ab_stats.compare(units, confidence=confidence) + run_rows, [], None)
    for row in run_rows:
        row["drift"] = True
    rows = ab_stats.compare(clean, confidence=confidence) + run_rows
    return PairedStats(
        rows, ab_stats.compare(units, confidence=confidence), {"clean": len(clean), "pairs": len(units)}
    )


# Where a run's prefill seconds came from (`prefill_times`) -> the clock they are on.
_PREFILL_CLOCK = {"modelled": "modelled", "server-log": "server log", "ttft": "wall"}


def add_clocks(doc: dict[str, Any]) -> dict[str, Any]:
    """Name the clock of every seconds row of the B/A tables from what the runs say: prefill on its
    source's clock (the simulator's modelled seconds, the server's log, or TTFT as measured), every
    other time measured by the client (wall). A row that already names its clock keeps it."""
    keys = {m.name: m.key for m in (*ab_stats.METRICS, *ab_stats.RUN_METRICS)}
    sources = {r.get("prefill_source") for r in doc.get("runs") or ()} - {None}
    prefill = "/".join(sorted({_PREFILL_CLOCK.get(s, "wall") for s in sources})) or "wall"
    for row in [*(doc.get("stats") or ()), *(doc.get("stats_with_drift") or ())]:
        if row.get("unit") == "seconds" and not row.get("clock"):
            row["clock"] = prefill if keys.get(row["metric"]) == "prefill_s" else "wall"
    return doc


def clock_note(doc: dict[str, Any]) -> str:
    """What each clock the B/A tables name means, with the simulator's time scale when it ran one."""
    clocks = {r.get("clock") for r in [*(doc.get("stats") or ()), *(doc.get("stats_with_drift") or ())]}
    scales = sorted({r["time_scale"] for r in doc.get("runs") or () if r.get("time_scale")})
    notes = []
    if "wall" in clocks:
        faster = (
            f" (the simulator ran {', '.join(f'{s:g}x' for s in scales)} faster than the server it models)"
            if scales
            else ""
        )
        notes.append(f"s (wall): wall-clock seconds measured here by the client{faster}")
    if any(c and "modelled" in c for c in clocks):
        notes.append("s (modelled): the simulator's modelled seconds, what the real server would take")
    if any(c and "server log" in c for c in clocks):
        notes.append("s (server log): the server's own prompt time from its log")
    return "; ".join(notes) + "." if notes else ""


def analyze(
    runs: list[ArmRun],
    temp0_ids: set[int] | None = None,
    header: dict[str, Any] | None = None,
    confidence: float = ab_stats.CONFIDENCE,
) -> dict[str, Any]:
    """The whole A/B summary as one JSON-able dict (what ab.json holds and the console shows)."""
    figures = [run_figures(r) for r in runs]
    live = (header or {}).get("history") == "live"
    paired = paired_stats(runs, confidence, live=live)
    stats = paired.rows
    outputs = compare_outputs(runs, temp0_ids)
    if live and outputs.get("status") == "differ":
        outputs["note"] = (
            "in live history mode a differing reply goes back into its session's history, so every later "
            "prompt of that session differs between the arms and their timings compare different prompts; "
            "the B/A figures use only the requests before each session's first difference, and "
            "--history recorded (the default) compares the same prompts throughout"
        )
    warnings = list((header or {}).get("warnings") or [])
    for fig in figures:
        unknown = (fig.get("log") or {}).get("unrecognised_cache")
        if unknown:
            warnings.append(
                f"run {fig['index']:02d} ({fig['arm']}): the server log has {unknown} line(s) about its caches "
                "that this tool does not recognise; its stores, restores and evictions may be undercounted"
            )
    n_pairs = len(runs) // 2
    if n_pairs < 2:
        warnings.append(
            f"only {n_pairs} run pair(s): run-to-run drift is sampled once; use --repeat 2 or more"
        )
    few = sorted({r["class"] for r in stats if r["few_pairs"] and r["class"] != ab_stats.RUN})
    if few:
        warnings.append(
            f"fewer than {ab_stats.min_pairs_for(confidence)} matched pairs for a {confidence:.0%} interval "
            f"in class(es) {', '.join(few)}: those intervals are rough; use a longer trace or more --repeat"
        )
    arms: dict[str, Any] = {}
    for arm in ARMS:
        mine = [r for r in runs if r.arm == arm]
        summary = Summary()
        records: list[dict[str, Any]] = []
        for r in mine:
            summary.merge(r.results.summary)
            records += r.results.requests
        arms[arm] = {
            "runs": [r.index for r in mine],
            "classes": class_figures(summary, records),
            "within": arm_within(figures, arm),
        }
    return add_clocks(
        {
            "format": FORMAT,
            **(header or {}),
            "order": [r.arm for r in runs],
            "note": DRIFT_NOTE,
            "runs": figures,
            "arms": arms,
            "verdict": ab_stats.verdict(
                [r for r in stats if not r.get("drift")],
                outputs,
                paired.drift,
                list((header or {}).get("differences") or []),
            ),
            "method": ab_stats.method_note(confidence),
            "confidence": confidence,
            "warnings": warnings,
            "stats": stats,
            "drift": paired.drift,
            "stats_with_drift": paired.with_drift,
            "ab": ab_ratios(figures),
            "outputs": outputs,
        }
    )


# --- console -----------------------------------------------------------------------------------


def _f(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return f"{value:,}"


def _range(spread: dict[str, Any], digits: int = 3) -> str:
    lo, hi = spread["min"], spread["max"]
    if lo is None:
        return "-"
    return _f(lo, digits) if lo == hi else f"{_f(lo, digits)}..{_f(hi, digits)}"


def render(doc: dict[str, Any], console: Console, verbose: bool = False) -> None:
    """The A/B in the terminal: the arms, the verdict, the B/A table, the outputs and, last, what
    to do; `verbose` adds the method, the within-run and per-pair ratio tables and each arm's
    absolute figures per switch class."""
    say = console.print
    arm_names = {a: (doc.get("targets") or {}).get(a, {}) for a in ARMS}
    say(
        "[bold]A/B[/bold]  "
        + "  ".join(f"{a} = {arm_names[a].get('name', a)} ({arm_names[a].get('file', '?')})" for a in ARMS)
        + f"  order {' '.join(doc['order'])}"
        + ("  cache: reused per arm" if doc.get("reuse_cache") else "  cache: fresh per arm run"),
        highlight=False,
    )
    for line in identity_lines(doc):
        say(line, highlight=False, markup=False)
    verdict = doc.get("verdict") or {}
    if verdict:
        say(f"[bold]verdict:[/bold] {verdict['text']}", highlight=False)
    for w in doc.get("warnings") or ():
        say(f"[bold yellow]warning:[/bold yellow] {w}", highlight=False)
    if doc.get("stats"):
        console.print(_stats_table(doc, doc["stats"]))
        if verbose and doc.get("stats_with_drift"):
            console.print(_stats_table(doc, doc["stats_with_drift"], drift=True))
        if clock_note(doc):
            say(clock_note(doc), highlight=False, markup=False)
        if verbose:
            say(f"method: {doc.get('method', '')}", highlight=False)
    if verbose:
        say(f"[yellow]note:[/yellow] {doc['note']}", highlight=False)
        console.print(_within_table(doc))
        if doc["ab"]:
            console.print(_ab_table(doc))
        console.print(_class_table(doc))
        firsts = [(r["arm"], (r["rounds"] or [{}])[0].get("prefill_s")) for r in doc["runs"]]
        if firsts:
            source = doc["runs"][0]["prefill_source"]
            why = "modelled, so no drift" if source == "modelled" else "drift here is page cache and warm-up"
            say(
                f"round-1 prefill ({source}, summed over sessions) per run, in order: "
                + " -> ".join(f"{a} {_f(v, 2)} s" for a, v in firsts)
                + f" ({why})",
                highlight=False,
            )
    say(_outputs_line(doc["outputs"]), highlight=False)
    if not verbose:
        say(
            "[dim]--verbose adds the method, the within-run and per-pair ratio tables and each arm's "
            "figures per switch class[/dim]",
            highlight=False,
        )
    if verdict.get("action"):
        say(f"[bold]action:[/bold] {verdict['action']}", highlight=False, soft_wrap=True)


def _within_table(doc: dict[str, Any]) -> Table:
    sources = sorted({r["prefill_source"] for r in doc["runs"]}) or ["-"]
    t = Table(
        title=f"Within-run ratios: round k / round 1 of the same sessions (prefill from {', '.join(sources)})",
        title_justify="left",
    )
    for col in ("run", "arm", "rounds", "re-processed", "prefill", "restores", "cache"):
        t.add_column(col, justify="left" if col in ("run", "arm", "rounds", "cache") else "right")
    for r in doc["runs"]:
        for k, row in r["within"].items() or [("-", {})]:
            t.add_row(
                f"{r['index']:02d}",
                r["arm"],
                k,
                _f(row.get("reprocessed")),
                _f(row.get("prefill")),
                _f(r["restores"]),
                _cache_cell(r["cache"]),
            )
    for arm in ARMS:
        for k, row in doc["arms"][arm]["within"].items():
            t.add_row("all", arm, k, _range(row["reprocessed"]), _range(row["prefill"]), "", "", style="bold")
    return t


def _cache_cell(cache: dict[str, Any]) -> str:
    if cache.get("dir") is None:
        return "fresh (in memory)" if cache.get("fresh") else "none"
    return "fresh" if cache.get("fresh") else "reused"


def _ab_table(doc: dict[str, Any]) -> Table:
    t = Table(
        title="Per run pair, for reference: B / A of each adjacent pair of runs (no test; below 1: B lower)",
        title_justify="left",
    )
    for col in ("scope", "metric", "B/A min..max", "mean", "pairs"):
        t.add_column(col, justify="right" if col in ("B/A min..max", "mean", "pairs") else "left")
    for row in doc["ab"]:
        t.add_row(
            row["scope"],
            row["metric"],
            _range(row),
            _f(row["mean"]),
            str(len(row["values"])),
            style="bold" if row["scope"].startswith("round") else None,
        )
    return t


def _stats_table(doc: dict[str, Any], rows: list[dict[str, Any]], drift: bool = False) -> Table:
    conf = doc.get("confidence", ab_stats.CONFIDENCE)
    if drift:
        title = (
            "For reference, every request pair including those after a reply that differed (live history: "
            "their prompts differ between the arms, so these mix the build with the drift)"
        )
    else:
        title = (
            f"B / A per switch class, {conf:.0%} interval from matched pairs "
            "(lower is better except decode tok/s and throughput)"
        )
    t = Table(title=title, title_justify="left")
    for col in STATS_COLUMNS:
        t.add_column(col, justify="left" if col in ("class", "metric", "result") else "right")
    for cells, row in zip(stats_cells(rows), rows, strict=True):
        t.add_row(*cells, style="bold" if row["difference"] and not drift else None)
    return t


STATS_COLUMNS = ("class", "metric", "A", "B", "B/A", "interval", "pairs", "result")


def stats_cells(rows: list[dict[str, Any]]) -> list[list[str]]:
    """The B/A table's cells, shared by the console, the page and the markdown: the estimate with
    the decimals that show it inside its interval, or why there is no interval."""
    out = []
    for row in rows:
        d = ab_stats.digits(row)
        result = ab_stats.result_text(row)
        if row.get("drift"):
            result += "; includes drift"
        unit = row.get("unit", "")
        clock = f" ({row['clock']})" if row.get("clock") else ""
        a, b = (
            (units.figure(v, unit) + (clock if v is not None else "")) if unit else _f(v)
            for v in (row["a"], row["b"])
        )
        out.append(
            [
                row["class"],
                row["metric"],
                a,
                b,
                "-" if row["ratio"] is None else f"{row['ratio']:.{d}f}",
                ab_stats.interval_text(row),
                f"{row['pairs']}" + (" (few)" if row["few_pairs"] else ""),
                result,
            ]
        )
    return out


def short_value(value: Any) -> str:
    """A difference's value as read: a sha256 cut to 12 hex digits, nothing as `(not set)`."""
    if value is None:
        return "(not set)"
    text = str(value)
    return text[:12] if len(text) == 64 and all(c in "0123456789abcdef" for c in text) else text


def difference_text(d: dict[str, Any]) -> str:
    """`--cache-ram: 0 -> 8192`, `library.libllama.so: 4fc8d2911c26 -> 9a1f03c2b7de`: one change
    per field, from its two values (an older ab.json's 'B removes 0; B adds 8192' is not reused)."""
    field = str(d["field"]).removeprefix("flag ")
    return f"{field}: {short_value(d['a'])} -> {short_value(d['b'])}"


def identity_lines(doc: dict[str, Any]) -> list[str]:
    """Which build each arm ran (binary and library hashes, package, checkout) and how the arms
    differ, one difference a line."""
    lines = []
    for arm in ARMS:
        ident = ((doc.get("identity") or {}).get(arm)) or {}
        if ident:
            lines.append(f"{arm}: {ident.get('summary', '')}")
    diffs = doc.get("differences") or []
    if diffs:
        lines.append(f"arms differ in {len(diffs)} field(s):")
        lines += [f"  {difference_text(d)}" for d in diffs]
    return lines


def _class_table(doc: dict[str, Any]) -> Table:
    t = Table(title="Per switch class, each arm (its runs merged; absolute, drifts)", title_justify="left")
    cols = (
        "class",
        "arm",
        "n",
        "err",
        "TTFT p50 s (wall)",
        "TTFT p99 s (wall)",
        "e2e p50 s (wall)",
        "decode tok/s",
        "re-processed tokens",
        "cached tokens",
        "prefill s (modelled)",
        "total s (modelled)",
    )
    for col in cols:
        t.add_column(col, justify="left" if col in ("class", "arm") else "right")
    names = list(dict.fromkeys(c for a in ARMS for c in doc["arms"][a]["classes"]))
    for cls in names:
        for arm in ARMS:
            row = doc["arms"][arm]["classes"].get(cls)
            if row is None:
                continue
            m = row["modelled"] or {}
            t.add_row(
                cls,
                arm,
                units.field(row["count"], "count"),
                units.field(row["errors"], "errors"),
                units.field(row["ttft_p50_s"], "ttft_p50_s"),
                units.field(row["ttft_p99_s"], "ttft_p99_s"),
                units.field(row.get("latency_p50_s"), "latency_p50_s"),
                units.field(row.get("mean_decode_tps"), "mean_decode_tps"),
                units.field(row["mean_reprocessed"], "mean_reprocessed"),
                units.field(row["mean_cached"], "mean_cached"),
                units.field(m.get("prefill_s"), "prefill_s"),
                units.field(m.get("total_s"), "total_s"),
                style="bold" if cls == ALL else None,
            )
    return t


def _outputs_line(out: dict[str, Any]) -> str:
    if out["status"] == "unknown":
        return f"outputs at temperature 0: not compared ({out.get('reason', 'no request ran in both arms')})"
    line = f"outputs at temperature 0: {out['status']}, {out['matched']}/{out['compared']} requests identical in every run"
    if out["status"] == "differ":
        firsts = ", ".join(f"{s} at request {r}" for s, r in out["first_difference_per_session"].items())
        line += f"; first diverging request per session: {firsts}"
        if out.get("note"):
            line += f". Note: {out['note']}"
    return line
