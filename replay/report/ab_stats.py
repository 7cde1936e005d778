"""B/A ratios with confidence intervals from matched pairs, and the verdict they support.

The unit is a *matched pair*: one request of the trace as answered by the A run and by the B run of
the same adjacent pair of runs (A B or B A). The interval is a two-stage (hierarchical) bootstrap
with a fixed seed: each resample draws the run pairs with replacement, then the matched requests
inside each drawn run pair with replacement, and recomputes the statistic (ratio of sums for
per-request means, ratio of percentiles for TTFT percentiles). Drawing run pairs first puts the
run-to-run drift (page cache, warm-up) into the interval instead of hiding it behind many requests.

A ratio names a difference only when its interval excludes 1 AND its point estimate is beyond the
metric's floor (tokens 5%, seconds 10%): a smaller effect is below what this method can resolve on
a busy machine, and is reported as "no difference detected". Intervals are per metric, not
corrected for the number of metrics compared; the verdict therefore rests on a few headline
metrics chosen before looking (re-processed tokens per switch, TTFT p99 per switch, outputs).
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
FLOORS = {"tokens": 0.05, "seconds": 0.10}
METHOD = (
    "two-stage bootstrap over matched pairs (run pairs drawn with replacement, then the requests "
    "inside each), {resamples} resamples, seed {seed}, {conf:.0%} percentile interval; a difference is "
    "named only when the interval excludes 1 and the effect exceeds the floor (tokens {tok:.0%}, "
    "seconds {sec:.0%})"
)


@dataclass(frozen=True, slots=True)
class Metric:
    key: str  # field of a matched unit's values
    name: str  # as shown
    unit: str  # "tokens" | "seconds": picks the floor
    stat: str  # "sum" (ratio of sums = ratio of means) or "pNN" (ratio of percentiles)


METRICS = (
    Metric("reprocessed", "re-processed tokens per request", "tokens", "sum"),
    Metric("prefill_s", "prefill s per request", "seconds", "sum"),
    Metric("ttft_s", "TTFT p50", "seconds", "p50"),
    Metric("ttft_s", "TTFT p99", "seconds", "p99"),
)


@dataclass(slots=True)
class Unit:
    """One request answered by both runs of one run pair."""

    block: int  # index of the run pair
    request: int
    classes: tuple[str, ...]  # "all" plus the A run's switch flags
    a: dict[str, float] = field(default_factory=dict)
    b: dict[str, float] = field(default_factory=dict)


def matched_units(
    run_pairs: Sequence[tuple[Sequence[dict[str, Any]], Sequence[dict[str, Any]]]],
    prefill: Sequence[tuple[dict[int, float], dict[int, float]]] | None = None,
) -> list[Unit]:
    """Matched requests of each (A records, B records) run pair; `prefill` maps seq -> seconds."""
    units: list[Unit] = []
    for block, (a_recs, b_recs) in enumerate(run_pairs):
        pa, pb = prefill[block] if prefill else ({}, {})
        b_by_id = {r["id"]: r for r in b_recs if r.get("status") == "ok"}
        for ra in a_recs:
            rb = b_by_id.get(ra["id"])
            if ra.get("status") != "ok" or rb is None:
                continue
            unit = Unit(block, ra["id"], (ALL, *ra.get("switch", ())))
            for side, rec, pre in ((unit.a, ra, pa), (unit.b, rb, pb)):
                if rec.get("reprocessed_tokens") is not None:
                    side["reprocessed"] = float(rec["reprocessed_tokens"])
                if rec.get("ttft_s") is not None:
                    side["ttft_s"] = float(rec["ttft_s"])
                if rec.get("seq") in pre:
                    side["prefill_s"] = float(pre[rec["seq"]])
            units.append(unit)
    return units


def _statistic(values: np.ndarray, stat: str) -> float:
    """Sum, or the NN-th percentile (inverted CDF: a value that occurred, as in the resamples)."""
    if stat == "sum":
        return float(values.sum())
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
    tail = (1 - confidence) / 2 * 100
    min_pairs = min_pairs_for(confidence)
    out_rows: list[dict[str, Any]] = []
    for got, cell in zip(ratios, cells, strict=True):
        n = len(cell.rows)
        per = n if cell.metric.stat == "sum" else 1
        sa, sb = _statistic(cell.a, cell.metric.stat), _statistic(cell.b, cell.metric.stat)
        lo, hi = (
            (float(np.percentile(got, tail)), float(np.percentile(got, 100 - tail))) if got else (None, None)
        )
        row = {
            "class": cell.cls,
            "metric": cell.metric.name,
            "unit": cell.metric.unit,
            "pairs": n,
            "run_pairs": len(set(blocks[cell.rows].tolist())),
            "a": _round(sa / per),
            "b": _round(sb / per),
            "ratio": _round(_ratio(sb, sa)),
            "low": _round(lo),
            "high": _round(hi),
            "floor": FLOORS[cell.metric.unit],
            "few_pairs": n < min_pairs,
        }
        row["difference"] = differs(row)
        out_rows.append(row)
    return out_rows


def min_pairs_for(confidence: float) -> int:
    """Matched pairs below which a percentile interval at `confidence` rests on a handful of
    extreme resamples: 1 / (1 - confidence), i.e. 20 pairs for 95%."""
    return math.ceil(1 / (1 - confidence) - 1e-9)


def differs(row: dict[str, Any]) -> bool:
    """An interval that excludes 1 and a point estimate beyond the floor."""
    r, lo, hi = row["ratio"], row["low"], row["high"]
    if r is None or lo is None or hi is None:
        return False
    if lo <= 1.0 <= hi:
        return False
    return max(r, 1 / r if r else math.inf) > 1 + row["floor"]


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def method_note(confidence: float = CONFIDENCE, resamples: int = RESAMPLES, seed: int = SEED) -> str:
    return METHOD.format(
        resamples=resamples, seed=seed, conf=confidence, tok=FLOORS["tokens"], sec=FLOORS["seconds"]
    )


# --- the headline ------------------------------------------------------------------------------


def _x(v: float) -> str:
    """Two decimals near 1 (1.07x), one above 2 (7.9x), as a reader says them."""
    return f"{v:.2f}x" if v < 2 else f"{v:.1f}x"


def _interval(row: dict[str, Any], invert: bool = False) -> str:
    lo, hi = row["low"], row["high"]
    if lo is None or hi is None:
        return ""
    if invert:
        lo, hi = (1 / hi if hi else math.inf), (1 / lo if lo else math.inf)
    return f" ({_x(lo).removesuffix('x')}-{_x(hi)})"


def phrase(row: dict[str, Any]) -> str:
    """One row as a sentence about B: '7.9x (7.1-8.8x) more', 'no difference detected', ..."""
    r = row["ratio"]
    what = row["metric"]
    where = "" if row["class"] in (ALL, "switch") else f" ({row['class']})"
    if r is None:
        return f"{what}{where}: not comparable (A is 0)"
    if not row["difference"]:
        return f"{what}{where}: no difference detected ({_x(r)}{_interval(row)})"
    if row["metric"].startswith("re-processed"):
        scope = "per switch" if row["class"] == "switch" else f"per request{where}"
        if r > 1:
            return f"B re-processes {_x(r)}{_interval(row)} more tokens {scope}"
        return f"B re-processes {_x(1 / r)}{_interval(row, invert=True)} fewer tokens {scope}"
    word = "worse" if r > 1 else "better"
    shown = r if r > 1 else 1 / r
    return f"{what}{where} {_x(shown)}{_interval(row, invert=r < 1)} {word}"


def headline_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows the verdict speaks of: re-processed tokens and TTFT p99 of switches (else of all)."""
    cls = "switch" if any(r["class"] == "switch" for r in rows) else ALL
    picked = [r for r in rows if r["class"] == cls and r["metric"] in (METRICS[0].name, METRICS[3].name)]
    return picked


def verdict(rows: list[dict[str, Any]], outputs: dict[str, Any]) -> dict[str, Any]:
    """The one-line verdict and what it rests on."""
    heads = headline_rows(rows)
    parts = [phrase(r) for r in heads]
    status = outputs.get("status")
    if status == "match":
        parts.append("outputs identical")
    elif status == "differ":
        parts.append(f"outputs differ ({outputs.get('matched')}/{outputs.get('compared')} identical)")
    else:
        parts.append("outputs not compared")
    any_diff = any(r["difference"] for r in rows)
    if not rows:
        text = "no request succeeded in both arms of any run pair: nothing to compare; " + parts[-1]
    elif not any(r["difference"] for r in heads) and not any_diff:
        text = "no difference detected in any metric; " + parts[-1]
    else:
        text = "; ".join(parts)
    return {
        "text": text,
        "difference": any_diff,
        "headline": heads,
        "few_pairs": any(r["few_pairs"] for r in heads),
    }
