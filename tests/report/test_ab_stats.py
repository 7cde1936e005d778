"""B/A intervals from matched pairs: identical arms never show a difference, a real one does."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.report.ab_stats import compare, matched_units, min_pairs_for, phrase, verdict


def records(values: list[tuple[int, float]], switch: tuple[str, ...] = ("switch",)) -> list[dict[str, Any]]:
    return [
        {"id": i, "seq": i, "status": "ok", "switch": list(switch), "reprocessed_tokens": tok, "ttft_s": ttft}
        for i, (tok, ttft) in enumerate(values, 1)
    ]


def rows_by(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["class"], r["metric"]): r for r in rows}


def test_identical_arms_show_no_difference_in_any_metric() -> None:
    rng = random.Random(1)
    pairs = []
    for _ in range(4):
        vals = [(rng.randint(100, 5000), rng.uniform(0.1, 3.0)) for _ in range(12)]
        pairs.append((records(vals), records(vals)))
    rows = compare(matched_units(pairs))
    assert rows and all(not r["difference"] and r["ratio"] == 1.0 for r in rows)
    assert (
        verdict(rows, {"status": "match"})["text"]
        == "no difference detected in any metric; outputs identical"
    )


def test_eight_times_more_reprocessing_is_named_with_its_interval() -> None:
    rng = random.Random(2)
    pairs = []
    for _ in range(4):
        a = [(rng.randint(900, 1100), rng.uniform(0.9, 1.1)) for _ in range(20)]
        b = [(int(t * rng.uniform(7.5, 8.5)), s * 4) for t, s in a]
        pairs.append((records(a), records(b)))
    rows = rows_by(compare(matched_units(pairs)))
    re = rows[("switch", "re-processed tokens per request")]
    assert re["difference"] and 7.5 < re["low"] < re["ratio"] < re["high"] < 8.5
    assert phrase(re).startswith("B re-processes 8.0x (7.9-8.") and "more tokens per switch" in phrase(re)
    assert "TTFT p99 4." in phrase(rows[("switch", "TTFT p99")]) and "worse" in phrase(
        rows[("switch", "TTFT p99")]
    )
    text = verdict(list(rows.values()), {"status": "match"})["text"]
    assert (
        text.startswith("B re-processes 8.0x") and "TTFT p99" in text and text.endswith("outputs identical")
    )


def test_an_effect_under_the_floor_is_no_difference_even_when_consistent() -> None:
    a = [(1000, 1.0)] * 20
    b = [(1030, 1.05)] * 20  # 3% more tokens, 5% slower: consistent but under the floors
    rows = compare(matched_units([(records(a), records(b)), (records(a), records(b))]))
    assert all(not r["difference"] for r in rows)
    assert all(r["low"] > 1 for r in rows)  # the interval excludes 1; the floor decides


def test_few_pairs_are_flagged() -> None:
    rows = compare(matched_units([(records([(10, 1.0)] * 3), records([(80, 1.0)] * 3))]))
    assert all(r["few_pairs"] for r in rows) and min_pairs_for(0.95) == 20
    assert verdict(rows, {"status": "unknown"})["few_pairs"] is True


def test_failed_requests_and_requests_missing_in_one_arm_are_not_paired() -> None:
    a = records([(10, 1.0), (20, 1.0), (30, 1.0)])
    b = records([(10, 1.0), (20, 1.0)])
    a[0]["status"] = "error"
    units = matched_units([(a, b)])
    assert [u.request for u in units] == [2]


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.integers(0, 10_000), st.floats(0.001, 100.0)), min_size=1, max_size=15),
        min_size=1,
        max_size=4,
    )
)
def test_same_values_in_both_arms_never_differ(blocks: list[list[tuple[int, float]]]) -> None:
    pairs = [(records(v), records(v)) for v in blocks]
    rows = compare(matched_units(pairs), resamples=50)
    assert all(not r["difference"] for r in rows)
    assert all(r["ratio"] == 1.0 for r in rows)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 1e4), st.integers(0, 4)), min_size=1, max_size=30),
    st.sampled_from(["sum", "p50", "p99"]),
)
def test_a_resample_by_counts_equals_the_statistic_of_the_drawn_values(
    drawn: list[tuple[float, int]], stat: str
) -> None:
    import numpy as np

    from replay.report.ab_stats import Metric, _Cell, _statistic

    vals = np.array([v for v, _ in drawn])
    counts = np.array([c for _, c in drawn])
    cell = _Cell(
        "all",
        Metric("x", "x", "seconds", stat),
        np.arange(len(vals)),
        vals,
        vals,
        np.argsort(vals),
        np.argsort(vals),
    )
    got = cell.value("a", counts)
    if counts.sum() == 0:
        assert got is None
    else:
        assert got == pytest.approx(_statistic(np.repeat(vals, counts), stat))
