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


def _statistic(values: np.ndarray, stat: str) -> np.ndarray:
    """Along the last axis: sum, or the NN-th percentile."""
    if stat == "sum":
        return values.sum(axis=-1)
    return np.percentile(values, float(stat[1:]), axis=-1)


def _ratio(b: float, a: float) -> float | None:
    if a == 0:
        return 1.0 if b == 0 else None
    return b / a


def _resample_indices(blocks: np.ndarray, rng: np.random.Generator, resamples: int) -> list[np.ndarray]:
    """Per resample, indices into the units: run pairs drawn with replacement, then units inside."""
    members = [np.flatnonzero(blocks == k) for k in np.unique(blocks)]
    out = []
    for _ in range(resamples):
        chosen = rng.integers(0, len(members), size=len(members))
        parts = [members[k][rng.integers(0, len(members[k]), size=len(members[k]))] for k in chosen]
        out.append(np.concatenate(parts))
    return out


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
    blocks_all = np.array([u.block for u in units])
    index = _resample_indices(blocks_all, np.random.default_rng(seed), resamples)
    min_pairs = min_pairs_for(confidence)
    rows: list[dict[str, Any]] = []
    for cls in classes:
        in_cls = np.array([cls in u.classes for u in units])
        for m in METRICS:
            has = np.array([m.key in u.a and m.key in u.b for u in units]) & in_cls
            n = int(has.sum())
            if n == 0:
                continue
            a = np.array([u.a.get(m.key, 0.0) for u in units])
            b = np.array([u.b.get(m.key, 0.0) for u in units])
            point = _ratio(float(_statistic(b[has], m.stat)), float(_statistic(a[has], m.stat)))
            ratios = []
            for idx in index:
                pick = idx[has[idx]]
                if len(pick) == 0:
                    continue
                r = _ratio(float(_statistic(b[pick], m.stat)), float(_statistic(a[pick], m.stat)))
                if r is not None:
                    ratios.append(r)
            tail = (1 - confidence) / 2 * 100
            lo, hi = (
                (float(np.percentile(ratios, tail)), float(np.percentile(ratios, 100 - tail)))
                if ratios
                else (None, None)
            )
            row = {
                "class": cls,
                "metric": m.name,
                "unit": m.unit,
                "pairs": n,
                "run_pairs": len({units[i].block for i in np.flatnonzero(has)}),
                "a": _round(float(_statistic(a[has], m.stat)) / (n if m.stat == "sum" else 1)),
                "b": _round(float(_statistic(b[has], m.stat)) / (n if m.stat == "sum" else 1)),
                "ratio": _round(point),
                "low": _round(lo),
                "high": _round(hi),
                "floor": FLOORS[m.unit],
                "few_pairs": n < min_pairs,
            }
            row["difference"] = differs(row)
            rows.append(row)
    return rows


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
