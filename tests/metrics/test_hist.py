"""Merged summaries give the same percentiles as one summary over every request."""

import random

from replay.metrics.hist import Summary
from replay.metrics.results import ResultsWriter, merged_summary, read_results


def recs(seed, n):
    rng = random.Random(seed)
    for i in range(n):
        yield {
            "status": "ok" if i % 17 else "http_error",
            "switch": [rng.choice(["cold", "continue", "switch"])] + (["concurrent"] if i % 3 == 0 else []),
            "ttft_s": rng.expovariate(1 / 2.0),
            "latency_s": rng.expovariate(1 / 20.0),
            "reprocessed_tokens": rng.randrange(0, 130_000),
            "prompt_tokens": 100_000,
            "cached_tokens": rng.randrange(0, 100_000),
            "output_tokens": 64,
        }


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
        (w1 if i < 200 else w2).request({"kind": "request", **rec})
    w1.close()
    w2._out.close()  # cut short: no summary line, rebuilt from request lines
    single = Summary()
    for rec in all_recs:
        single.add(rec)
    merged = merged_summary([read_results(tmp_path / "a.jsonl"), read_results(tmp_path / "b.jsonl")])
    assert merged.classes["all"].count == 400
    assert merged.classes["switch"].percentile("ttft_us", 99) == single.classes["switch"].percentile(
        "ttft_us", 99
    )
