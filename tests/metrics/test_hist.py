"""Merged summaries give the same percentiles as one summary over every request."""

import random

from hypothesis import given
from hypothesis import strategies as st

from replay.metrics.hist import Summary
from replay.metrics.record import RequestRecord, Usage, micros
from replay.metrics.results import ResultsWriter, merged_summary, read_results, request_line


def recs(seed, n):
    rng = random.Random(seed)
    for i in range(n):
        sent = rng.randrange(0, 10**12)
        yield RequestRecord(
            status="ok" if i % 17 else "http_error",
            switch=(rng.choice(["cold", "continue", "switch"]),) + (("concurrent",) if i % 3 == 0 else ()),
            t_sent=sent,
            t_first_token=sent + int(rng.expovariate(1 / 2.0) * 1e9),
            t_end=sent + int(rng.expovariate(1 / 20.0) * 1e9),
            usage=Usage(
                prompt_tokens=100_000,
                cached_tokens=rng.randrange(0, 100_000),
                reprocessed_tokens=rng.randrange(0, 130_000),
                output_tokens=64,
            ),
        )


def test_merge_equals_single_run():
    whole, a, b = Summary(), Summary(), Summary()
    for i, rec in enumerate(recs(1, 3000)):
        whole.add(rec)
        (a if i % 2 else b).add(rec)
    merged = Summary.decode(a.encode())
    merged.merge(Summary.decode(b.encode()))
    for cls, stats in whole.classes.items():
        other = merged.classes[cls]
        assert (stats.count, stats.errors, stats.sums) == (other.count, other.errors, other.sums)
        for metric in ("ttft_us", "latency_us", "reprocessed"):
            for pct in (50, 90, 99, 100):
                assert stats.percentile(metric, pct) == other.percentile(metric, pct)


def test_results_files_merge_and_survive_a_missing_summary(tmp_path):
    all_recs = list(recs(2, 400))
    w1 = ResultsWriter(tmp_path / "a.jsonl", {"target": {}})
    w2 = ResultsWriter(tmp_path / "b.jsonl", {"target": {}})
    for i, rec in enumerate(all_recs):
        (w1 if i < 200 else w2).request(rec)
    w1.close()
    w2._out.close()  # cut short: no summary line, rebuilt from request lines
    single = Summary()
    for rec in all_recs:
        single.add(rec)
    merged = merged_summary([read_results(tmp_path / "a.jsonl"), read_results(tmp_path / "b.jsonl")])
    assert merged.classes["all"].count == 400
    for cls, stats in single.classes.items():
        other = merged.classes[cls]
        assert (other.count, other.errors, other.sums) == (stats.count, stats.errors, stats.sums)
        for metric in ("ttft_us", "latency_us", "reprocessed"):
            for pct in (50, 99, 100):
                assert other.percentile(metric, pct) == stats.percentile(metric, pct)


@given(st.integers(0, 10**13), st.integers(0, 4 * 10**12))
def test_printed_seconds_give_back_the_microseconds_histograms_recorded(sent, ttft_ns):
    """A summary rebuilt from request lines sees the integers the live summary saw."""
    rec = RequestRecord(t_sent=sent, t_first_token=sent + ttft_ns, t_end=sent + ttft_ns)
    line = request_line(rec)
    live, rebuilt = Summary(), Summary()
    live.add(rec)
    rebuilt.add_line(line)
    assert rec.ttft_us == micros(ttft_ns) == round(line["ttft_s"] * 1e6)
    assert live.encode() == rebuilt.encode()


@given(st.integers(0, 10**15))
def test_micros_rounds_to_the_nearest_microsecond_ties_to_even(ns):
    us = micros(ns)
    assert abs(us * 1000 - ns) <= 500
    if abs(us * 1000 - ns) == 500:
        assert us % 2 == 0
