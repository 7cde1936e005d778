"""B/A ratios with confidence intervals from matched pairs, and the verdict they support.

The unit is a *matched pair*: one request of the trace as answered by the A run and by the B run of
the same adjacent pair of runs (A B or B A). The interval is a two-stage (hierarchical) bootstrap
with a fixed seed: each resample draws the run pairs with replacement, then the matched requests
inside each drawn run pair with replacement, and recomputes the statistic (ratio of sums for
per-request means, ratio of percentiles for TTFT percentiles). Drawing run pairs first puts the
run-to-run drift (page cache, warm-up) into the interval instead of hiding it behind many requests.

A ratio names a difference only when its interval excludes 1 AND its point estimate is beyond the
metric's floor (tokens 5%, seconds and rates 10%): a smaller effect is below what this method can
resolve on a busy machine, and is reported as "no difference detected". Intervals are per metric,
not corrected for the number of metrics compared; the verdict therefore rests on a few headline
metrics chosen before looking (re-processed tokens and TTFT p99 per switch, decode tok/s and
end-to-end seconds per request, run wall time and throughput, outputs).

An interval is printed only where the bootstrap can give one: a percentile needs enough pairs
beyond it (a p99 is the largest of 32 values, and no resample exceeds it: `TAIL_MIN` values past
the percentile, so 500 pairs for a p99), and the estimate must lie strictly inside its resamples'
interval. Otherwise the row says why and how many repeats would do, and names no difference; a
ratio that every resample reproduces exactly (B is 2.00x A in every request) needs no interval.
Run-level metrics (wall time, throughput) have one value per run, so their bootstrap draws run
pairs only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ALL = "all"
SEED = 20260101
RESAMPLES = 2000
CONFIDENCE = 0.95
# Below these relative effects a ratio is "no difference detected" even when its interval excludes 1.
FLOORS = {"tokens": 0.05, "seconds": 0.10, "rate": 0.10}
# A percentile's interval needs this many matched values beyond it (p99: 500 pairs, p50: 10).
TAIL_MIN = 5
SAME = "same in every resample"
EDGE = "estimate at the edge of its resamples"
METHOD = (
    "two-stage bootstrap over matched pairs (run pairs drawn with replacement, then the requests "
    "inside each; run-level metrics draw run pairs), {resamples} resamples, seed {seed}, {conf:.0%} "
    "percentile interval, printed only when the estimate lies strictly inside it and, for a "
    "percentile, at least {tail} pairs lie beyond it; a difference is named only when the interval "
    "excludes 1 and the effect exceeds the floor (tokens {tok:.0%}, seconds and rates {sec:.0%})"
)


@dataclass(frozen=True, slots=True)
class Metric:
    key: str  # field of a matched unit's values
    name: str  # as shown
    unit: str  # "tokens" | "seconds" | "rate": picks the floor
    # "sum" (ratio of sums = ratio of means), "hmean" (ratio of harmonic means: a rate averaged
    # over the time it took, tokens over seconds) or "pNN" (ratio of percentiles)
    stat: str
    better: str = "lower"  # "higher" for rates


REPROCESSED = Metric("reprocessed", "re-processed tokens per request", "tokens", "sum")
TTFT_P99 = Metric("ttft_s", "TTFT p99", "seconds", "p99")
# A mean of per-request rates is ruled by the fastest requests and a mean of seconds by the slowest;
# the harmonic mean is the decode speed over the time decoding took.
DECODE = Metric("decode_tps", "decode tok/s per request", "rate", "hmean", "higher")
LATENCY = Metric("latency_s", "end-to-end s per request", "seconds", "sum")
METRICS = (
    REPROCESSED,
    Metric("prefill_s", "prefill s per request", "seconds", "sum"),
    Metric("ttft_s", "TTFT p50", "seconds", "p50"),
    TTFT_P99,
    DECODE,
    LATENCY,
)
RUN = "run"  # the class of run-level rows
WALL = Metric("duration_s", "run wall time s", "seconds", "sum")
THROUGHPUT = Metric("throughput", "throughput, output tok/s", "rate", "sum", "higher")
RUN_METRICS = (WALL, THROUGHPUT)


@dataclass(slots=True)
class Unit:
    """One request answered by both runs of one run pair."""

    block: int  # index of the run pair
    request: int
    classes: tuple[str, ...]  # "all" plus the A run's switch flags
    a: dict[str, float] = field(default_factory=dict)
    b: dict[str, float] = field(default_factory=dict)
    # An earlier reply of its session differed between the two runs: in live history its prompt
    # differs too, so its figures compare two prompts, not two builds.
    drift: bool = False


def matched_units(
    run_pairs: Sequence[tuple[Sequence[dict[str, Any]], Sequence[dict[str, Any]]]],
    prefill: Sequence[tuple[dict[int, float], dict[int, float]]] | None = None,
) -> list[Unit]:
    """Matched requests of each (A records, B records) run pair; `prefill` maps seq -> seconds.

    Decode speed is the server's own (`server_decode_tps`, llama-server's
    `timings.predicted_per_second`) when both runs have it, else the stream's (`decode_tps`).
    """
    units: list[Unit] = []
    for block, (a_recs, b_recs) in enumerate(run_pairs):
        pa, pb = prefill[block] if prefill else ({}, {})
        b_by_id = {r["id"]: r for r in b_recs if r.get("status") == "ok"}
        drifted = _drifted(a_recs, b_recs)
        for ra in a_recs:
            rb = b_by_id.get(ra["id"])
            if ra.get("status") != "ok" or rb is None:
                continue
            unit = Unit(block, ra["id"], (ALL, *ra.get("switch", ())), drift=ra["id"] in drifted)
            server_rate = ra.get("server_decode_tps") is not None and rb.get("server_decode_tps") is not None
            for side, rec, pre in ((unit.a, ra, pa), (unit.b, rb, pb)):
                for key, name in (
                    ("reprocessed_tokens", "reprocessed"),
                    ("ttft_s", "ttft_s"),
                    ("latency_s", "latency_s"),
                ):
                    if rec.get(key) is not None:
                        side[name] = float(rec[key])
                rate = rec.get("server_decode_tps") if server_rate else rec.get("decode_tps")
                if rate is not None:
                    side["decode_tps"] = float(rate)
                if rec.get("seq") in pre:
                    side["prefill_s"] = float(pre[rec["seq"]])
            units.append(unit)
    return units


def _drifted(a_recs: Sequence[dict[str, Any]], b_recs: Sequence[dict[str, Any]]) -> set[int]:
    """Request ids that follow, in their session, a reply the two runs did not give alike."""
    b_out = {r["id"]: r.get("output_sha1") if r.get("status") == "ok" else None for r in b_recs}
    differed: set[str] = set()
    out: set[int] = set()
    for ra in sorted(a_recs, key=lambda r: r["id"]):
        session = ra.get("session")
        if session in differed:
            out.add(ra["id"])
        a_sha = ra.get("output_sha1") if ra.get("status") == "ok" else None
        if a_sha is None or a_sha != b_out.get(ra["id"]):
            differed.add(session)  # type: ignore[arg-type]
    return out


def _statistic(values: np.ndarray, stat: str) -> float:
    """Sum, harmonic mean, or the NN-th percentile (inverted CDF: a value that occurred, as in the
    resamples)."""
    if stat == "sum":
        return float(values.sum())
    if stat == "hmean":
        return float(len(values) / (1.0 / values).sum())
    return float(np.percentile(values, float(stat[1:]), method="inverted_cdf"))


@dataclass(slots=True)
class _Cell:
    """One (class, metric): its units' values, pre-sorted so a resample costs O(units)."""

    cls: str
    metric: Metric
    rows: np.ndarray  # indices of the units that have the value in both arms
    a: np.ndarray
    b: np.ndarray
    order_a: np.ndarray
    order_b: np.ndarray

    def value(self, side: str, counts: np.ndarray) -> float | None:
        """The statistic over a resample given as how many times each unit was drawn."""
        c = counts[self.rows]
        total = int(c.sum())
        if total == 0:
            return None
        vals, order = (self.a, self.order_a) if side == "a" else (self.b, self.order_b)
        if self.metric.stat == "sum":
            return float((c * vals).sum())
        if self.metric.stat == "hmean":
            return float(total / (c / vals).sum())
        cum = np.cumsum(c[order])
        rank = max(1, math.ceil(float(self.metric.stat[1:]) / 100 * total))
        return float(vals[order][int(np.searchsorted(cum, rank))])


def _ratio(b: float, a: float) -> float | None:
    if a == 0:
        return 1.0 if b == 0 else None
    return b / a


def _resample(members: list[np.ndarray], n: int, rng: np.random.Generator) -> np.ndarray:
    """How many times each unit is drawn: run pairs with replacement, then the units inside each."""
    chosen = rng.integers(0, len(members), size=len(members))
    idx = np.concatenate([members[k][rng.integers(0, len(members[k]), size=len(members[k]))] for k in chosen])
    return np.bincount(idx, minlength=n)


def compare(
    units: list[Unit],
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> list[dict[str, Any]]:
    """One row per (switch class, metric) with B/A, its interval and whether a difference shows."""
    if not units:
        return []
    classes = list(dict.fromkeys(c for u in units for c in u.classes))
    classes.sort(key=lambda c: (c != ALL, c))
    blocks = np.array([u.block for u in units])
    members = [np.flatnonzero(blocks == k) for k in np.unique(blocks)]
    cells: list[_Cell] = []
    for cls in classes:
        for m in METRICS:
            rows = np.array(
                [i for i, u in enumerate(units) if cls in u.classes and m.key in u.a and m.key in u.b],
                dtype=int,
            )
            if len(rows):
                a = np.array([units[i].a[m.key] for i in rows])
                b = np.array([units[i].b[m.key] for i in rows])
                cells.append(
                    _Cell(cls, m, rows, a, b, np.argsort(a, kind="stable"), np.argsort(b, kind="stable"))
                )
    # One resample at a time (memory stays O(units)), every cell read from the same draw.
    rng = np.random.default_rng(seed)
    ratios: list[list[float]] = [[] for _ in cells]
    for _ in range(resamples):
        counts = _resample(members, len(units), rng)
        for out, cell in zip(ratios, cells, strict=True):
            va, vb = cell.value("a", counts), cell.value("b", counts)
            r = None if va is None or vb is None else _ratio(vb, va)
            if r is not None:
                out.append(r)
    out_rows: list[dict[str, Any]] = []
    for got, cell in zip(ratios, cells, strict=True):
        n = len(cell.rows)
        per = n if cell.metric.stat == "sum" else 1
        sa, sb = _statistic(cell.a, cell.metric.stat), _statistic(cell.b, cell.metric.stat)
        run_pairs = len(set(blocks[cell.rows].tolist()))
        out_rows.append(
            _row(cell.cls, cell.metric, n, run_pairs, sa / per, sb / per, _ratio(sb, sa), got, confidence)
        )
    return out_rows


def compare_runs(
    values: Sequence[tuple[dict[str, float], dict[str, float]]],
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> list[dict[str, Any]]:
    """Run-level rows (class `run`): each run pair's (A, B) wall time and throughput, B/A as a ratio
    of sums over run pairs drawn with replacement."""
    rng = np.random.default_rng(seed)
    out = []
    for m in RUN_METRICS:
        pairs = [(a[m.key], b[m.key]) for a, b in values if m.key in a and m.key in b]
        if not pairs:
            continue
        a, b = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
        got = []
        for _ in range(resamples):
            pick = rng.integers(0, len(pairs), size=len(pairs))
            r = _ratio(float(b[pick].sum()), float(a[pick].sum()))
            if r is not None:
                got.append(r)
        ratio = _ratio(float(b.sum()), float(a.sum()))
        out.append(
            _row(RUN, m, len(pairs), len(pairs), float(a.mean()), float(b.mean()), ratio, got, confidence)
        )
    return out


def _row(
    cls: str,
    metric: Metric,
    n: int,
    run_pairs: int,
    a: float,
    b: float,
    ratio: float | None,
    resampled: list[float],
    confidence: float,
) -> dict[str, Any]:
    tail = (1 - confidence) / 2 * 100
    lo, hi = (
        (float(np.percentile(resampled, tail)), float(np.percentile(resampled, 100 - tail)))
        if resampled
        else (None, None)
    )
    needed = pairs_for_percentile(metric.stat)
    row: dict[str, Any] = {
        "class": cls,
        "metric": metric.name,
        "unit": metric.unit,
        "better": metric.better,
        "pairs": n,
        "run_pairs": run_pairs,
        "a": _round(a),
        "b": _round(b),
        "ratio": _round(ratio, 6),
        "low": None,
        "high": None,
        "interval_note": None,
        "floor": FLOORS[metric.unit],
        "few_pairs": n < min_pairs_for(confidence),
    }
    if needed is not None and n < needed:
        row["interval_note"] = f"a {metric.stat} needs {needed:,} pairs"
        row["pairs_needed"] = needed
        row["repeat_needed"] = math.ceil(needed / (n / max(run_pairs, 1)) / 2)  # A B B A: two run pairs
    elif ratio is None or lo is None or hi is None:
        row["interval_note"] = "no resample"
    elif math.isclose(lo, hi, rel_tol=1e-9, abs_tol=1e-12) and math.isclose(lo, ratio, rel_tol=1e-9):
        row["interval_note"] = SAME
    elif round(lo, 6) < round(ratio, 6) < round(hi, 6):
        row["low"], row["high"] = round(lo, 6), round(hi, 6)
    else:
        row["interval_note"] = EDGE
    row["difference"] = differs(row)
    return row


def pairs_for_percentile(stat: str) -> int | None:
    """Matched pairs a `pNN` interval needs: `TAIL_MIN` of them beyond the percentile."""
    if not stat.startswith("p"):
        return None
    q = float(stat[1:]) / 100
    return math.ceil(TAIL_MIN / min(q, 1 - q) - 1e-9)


def min_pairs_for(confidence: float) -> int:
    """Matched pairs below which a percentile interval at `confidence` rests on a handful of
    extreme resamples: 1 / (1 - confidence), i.e. 20 pairs for 95%."""
    return math.ceil(1 / (1 - confidence) - 1e-9)


def differs(row: dict[str, Any]) -> bool:
    """An interval that excludes 1 (or a ratio every resample reproduces) and a point estimate
    beyond the floor."""
    r, lo, hi = row["ratio"], row["low"], row["high"]
    if r is None:
        return False
    if row.get("interval_note") == SAME:
        lo = hi = r
    if lo is None or hi is None or lo <= 1.0 <= hi:
        return False
    return max(r, 1 / r if r else math.inf) > 1 + row["floor"]


def _round(v: float | None, digits: int = 4) -> float | None:
    return None if v is None else round(v, digits)


def method_note(confidence: float = CONFIDENCE, resamples: int = RESAMPLES, seed: int = SEED) -> str:
    return METHOD.format(
        resamples=resamples,
        seed=seed,
        conf=confidence,
        tail=TAIL_MIN,
        tok=FLOORS["tokens"],
        sec=FLOORS["seconds"],
    )


def digits(row: dict[str, Any]) -> int:
    """Decimals that show the estimate strictly inside its interval (3 where they suffice)."""
    r, lo, hi = row["ratio"], row["low"], row["high"]
    if r is None or lo is None or hi is None:
        return 3
    for d in (3, 4, 5, 6):
        if round(lo, d) < round(r, d) < round(hi, d):
            return d
    return 6


def interval_text(row: dict[str, Any]) -> str:
    """`0.812-0.953`, or why there is none: `none (a p99 needs 500 pairs: about --repeat 32)`."""
    if row["low"] is not None:
        d = digits(row)
        return f"{row['low']:.{d}f}-{row['high']:.{d}f}"
    note = row.get("interval_note") or "none"
    if row.get("repeat_needed"):
        return f"none ({note}: about --repeat {row['repeat_needed']})"
    return note if note == SAME else f"none ({note})"


def result_text(row: dict[str, Any]) -> str:
    """The row's finding, with whether higher is better for its metric."""
    if not row["difference"]:
        return "no difference detected"
    higher = row["ratio"] > 1
    good = higher == (row.get("better") == "higher")
    return f"B {'higher' if higher else 'lower'} ({'better' if good else 'worse'})"


# --- the headline ------------------------------------------------------------------------------


def _x(v: float, d: int = 2) -> str:
    """Two decimals near 1 (1.07x), one above 2 (7.9x), as a reader says them; more when the
    interval needs them to show the estimate inside it."""
    return f"{v:.{d}f}x" if v < 2 or d > 2 else f"{v:.1f}x"


def _interval(row: dict[str, Any], invert: bool = False) -> tuple[str, int]:
    """` (7.1-8.8x)` and the decimals that keep the estimate visibly inside it."""
    lo, hi, r = row["low"], row["high"], row["ratio"]
    if lo is None or hi is None or r is None:
        return "", 2
    if invert:
        lo, hi, r = (1 / hi if hi else math.inf), (1 / lo if lo else math.inf), (1 / r if r else math.inf)
    for d in (2, 3, 4, 5, 6):
        fmt = (lambda v, d=d: f"{v:.{d}f}") if d > 2 or max(lo, r, hi) < 2 else (lambda v: f"{v:.1f}")
        if float(fmt(lo)) < float(fmt(r)) < float(fmt(hi)):
            return f" ({fmt(lo)}-{fmt(hi)}x)", d
    return f" ({lo:.6f}-{hi:.6f}x)", 6


def _no_interval(row: dict[str, Any]) -> str:
    note = row.get("interval_note")
    if note == SAME:
        return ", the same in every resample"
    if row.get("repeat_needed"):
        return f", no interval ({row['pairs']} pairs; {note}: about --repeat {row['repeat_needed']})"
    return f", no interval ({note})" if note else ""


def _where(row: dict[str, Any]) -> str:
    if row["class"] == "switch":
        return " (switches)"
    return "" if row["class"] in (ALL, RUN) else f" ({row['class']})"


def phrase(row: dict[str, Any]) -> str:
    """One row as a sentence about B: '7.9x (7.1-8.8x) more', 'no difference detected', ..."""
    r = row["ratio"]
    what = row["metric"]
    where = _where(row)
    if r is None:
        return f"{what}{where}: not comparable (A is 0)"
    if not row["difference"] and row["low"] is None and row.get("interval_note") != SAME:
        return f"{what}{where}: {_x(r)}{_no_interval(row)}"  # not tested: no interval to test with
    if not row["difference"]:
        text, d = _interval(row)
        return f"{what}{where}: no difference detected ({_x(r, d)}{text}{_no_interval(row)})"
    up = r > 1
    text, d = _interval(row, invert=not up)
    shown = _x(r if up else 1 / r, d) + text
    same = " (the same in every resample)" if row.get("interval_note") == SAME else ""
    if what == REPROCESSED.name:
        scope = "per switch" if row["class"] == "switch" else f"per request{where}"
        return f"B re-processes {shown} {'more' if up else 'fewer'} tokens {scope}{same}"
    if what == DECODE.name:
        return f"B decodes {shown} {'faster' if up else 'slower'}{where}{same}"
    if what == THROUGHPUT.name:
        return f"B's throughput is {shown} {'higher' if up else 'lower'}{same}"
    if what == WALL.name:
        return f"B's runs are {shown} {'slower' if up else 'faster'} (wall time){same}"
    return f"{what}{where} {shown} {'worse' if up else 'better'}{same}"


HEADLINE = (REPROCESSED.name, TTFT_P99.name, DECODE.name, LATENCY.name, WALL.name, THROUGHPUT.name)


def headline_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows the verdict speaks of, in this order: re-processed tokens and TTFT p99 of switches
    (else of all requests), decode tok/s and end-to-end seconds of all requests, run wall time and
    throughput."""
    cls = "switch" if any(r["class"] == "switch" for r in rows) else ALL
    where = {REPROCESSED.name: cls, TTFT_P99.name: cls, DECODE.name: ALL, LATENCY.name: ALL}
    picked = []
    for name in HEADLINE:
        picked += [r for r in rows if r["metric"] == name and r["class"] == where.get(name, RUN)]
    return picked


def change_text(differences: list[dict[str, Any]]) -> str:
    """What B changes, as one would type it: a flag as `--cache-ram 8192 -> 65536` (one change
    per flag, whatever happened to its value), anything else as `build B`."""
    flags = [d for d in differences if str(d.get("field", "")).startswith("flag ")]
    if flags and len(flags) == len(differences):
        return ", ".join(flag_change(d) for d in flags)
    return "build B" + (f" ({', '.join(flag_change(d) for d in flags)})" if flags else "")


def flag_change(d: dict[str, Any]) -> str:
    name = str(d["field"]).removeprefix("flag ")
    a, b = d.get("a"), d.get("b")
    if a is None:
        return f"{name} {b}" if b not in (None, "", "(set)") else name
    if b is None:
        return f"drop {name}" + (f" {a}" if a not in ("", "(set)") else "")
    return f"{name} {a} -> {b}"


def action(rows: list[dict[str, Any]], outputs: dict[str, Any], differences: list[dict[str, Any]]) -> str:
    """What to do with the verdict: take B's change, keep A, or measure again, in one sentence
    that names the change (a flag, a build)."""
    change = change_text(differences) if differences else ""
    if not differences:
        return "nothing to change: the arms do not differ (an A/A check); its intervals are the noise floor"
    if outputs.get("status") == "differ":
        return f"check the outputs before taking {change}: at temperature 0 they differ between the arms"
    if not rows:
        return f"measure again: no request succeeded in both arms, so nothing says whether to take {change}"
    found = [r for r in headline_rows(rows) if r["difference"] and r["ratio"] is not None]
    good = [r for r in found if (r["ratio"] > 1) == (r.get("better") == "higher")]
    bad = [r for r in found if r not in good]
    if good and not bad:
        return f"take {change}: better in {', '.join(r['metric'] + _where(r) for r in good)}, worse in none"
    if bad and not good:
        return f"keep A (do not take {change}): worse in {', '.join(r['metric'] + _where(r) for r in bad)}"
    if good and bad:
        return (
            f"{change} is a trade: better in {', '.join(r['metric'] + _where(r) for r in good)}, "
            f"worse in {', '.join(r['metric'] + _where(r) for r in bad)}; take it if the first matter more"
        )
    return (
        f"no need for {change}: no difference detected; to find a smaller one, run again with a larger "
        "--repeat or a longer trace"
    )


def verdict(
    rows: list[dict[str, Any]],
    outputs: dict[str, Any],
    drift: dict[str, Any] | None = None,
    differences: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The one-line verdict and what it rests on: the headline rows that differ first, then those
    that do not, then the outputs. `drift` (live history, replies that differ): the token and time
    figures come from the requests whose prompts the arms shared, and the verdict says so."""
    heads = headline_rows(rows)
    status = outputs.get("status")
    if status == "match":
        tail = "outputs identical"
    elif status == "differ":
        tail = f"outputs differ ({outputs.get('matched')}/{outputs.get('compared')} identical)"
    else:
        tail = "outputs not compared"
    if drift:
        tail += (
            f"; figures from the {drift['clean']} of {drift['pairs']} request pairs whose prompts were the same "
            "in both arms (in live history a reply that differs changes its session's later prompts; "
            "run-level figures, which include them, are left out of this line)"
        )
    any_diff = any(r["difference"] for r in rows)
    found = [phrase(r) for r in heads if r["difference"]]
    quiet = [r for r in heads if not r["difference"]]
    untested = [
        r for r in quiet if r["low"] is None and r.get("interval_note") != SAME and r["ratio"] is not None
    ]
    bounded = [f"{r['metric']}{_where(r)}" for r in quiet if r not in untested]
    unbounded = [phrase(r) for r in untested]
    if not rows:
        text = "no request succeeded in both arms of any run pair: nothing to compare; " + tail
    elif not found and not any_diff:
        lead = "no difference detected in any metric" + (" with an interval" if unbounded else "")
        text = "; ".join([lead, *unbounded, tail])
    else:
        parts = [*found]
        if bounded:
            parts.append("no difference detected in " + ", ".join(bounded))
        text = "; ".join([*parts, *unbounded, tail])
    return {
        "text": text,
        "action": action(rows, outputs, differences or []),
        "difference": any_diff,
        "headline": heads,
        "few_pairs": any(r["few_pairs"] for r in heads),
    }
