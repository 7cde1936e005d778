"""HDR histograms per switch class, encoded into the results so runs merge exactly.

Merging two encoded histograms gives the same percentiles as one histogram that saw every value,
which is what lets `--workers N`, `--shard i/N` and several result files report as one run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hdrh.histogram import HdrHistogram

# Microseconds up to ~3 h for times; up to 10M tokens for counts; 3 significant figures.
_RANGES = {"ttft_us": 10_800_000_000, "latency_us": 10_800_000_000, "reprocessed": 10_000_000}
_SUMS = ("prompt_tokens", "cached_tokens", "reprocessed_tokens", "output_tokens")


def new_histogram(metric: str) -> HdrHistogram:
    return HdrHistogram(1, _RANGES[metric], 3)


@dataclass(slots=True)
class ClassStats:
    """Counts, token sums and histograms of one switch class."""

    count: int = 0
    errors: int = 0
    sums: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_SUMS, 0))
    hists: dict[str, HdrHistogram] = field(default_factory=lambda: {m: new_histogram(m) for m in _RANGES})

    def add(self, rec: dict[str, Any]) -> None:
        self.count += 1
        if rec.get("status") != "ok":
            self.errors += 1
            return
        for key in _SUMS:
            self.sums[key] += rec.get(key) or 0
        if rec.get("ttft_s") is not None:
            self.hists["ttft_us"].record_value(min(int(rec["ttft_s"] * 1e6), _RANGES["ttft_us"]))
        if rec.get("latency_s") is not None:
            self.hists["latency_us"].record_value(min(int(rec["latency_s"] * 1e6), _RANGES["latency_us"]))
        if rec.get("reprocessed_tokens") is not None:
            self.hists["reprocessed"].record_value(
                min(int(rec["reprocessed_tokens"]), _RANGES["reprocessed"])
            )

    def merge(self, other: ClassStats) -> None:
        self.count += other.count
        self.errors += other.errors
        for key in _SUMS:
            self.sums[key] += other.sums.get(key, 0)
        for metric, hist in other.hists.items():
            self.hists[metric].add(hist)

    @property
    def ok(self) -> int:
        return self.count - self.errors

    def mean(self, key: str) -> float | None:
        return self.sums[key] / self.ok if self.ok else None

    def percentile(self, metric: str, pct: float) -> int | None:
        hist = self.hists[metric]
        return hist.get_value_at_percentile(pct) if hist.get_total_count() else None

    def max(self, metric: str) -> int | None:
        hist = self.hists[metric]
        return hist.get_max_value() if hist.get_total_count() else None

    def encode(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "errors": self.errors,
            "sums": dict(self.sums),
            "hist": {m: h.encode().decode("ascii") for m, h in self.hists.items()},
        }

    @classmethod
    def decode(cls, obj: dict[str, Any]) -> ClassStats:
        stats = cls(count=obj["count"], errors=obj["errors"])
        stats.sums.update(obj.get("sums", {}))
        for metric, enc in obj.get("hist", {}).items():
            if metric in _RANGES:
                stats.hists[metric] = HdrHistogram.decode(enc.encode("ascii"))
        return stats


ALL = "all"


@dataclass(slots=True)
class Summary:
    """Per-class statistics of one or more runs; 'all' counts every request once."""

    classes: dict[str, ClassStats] = field(default_factory=dict)

    def _stats(self, cls: str) -> ClassStats:
        stats = self.classes.get(cls)
        if stats is None:  # not setdefault: a ClassStats builds three histograms
            stats = self.classes[cls] = ClassStats()
        return stats

    def add(self, rec: dict[str, Any]) -> None:
        for cls in (ALL, *rec.get("switch", ())):
            self._stats(cls).add(rec)

    def merge(self, other: Summary) -> None:
        for cls, stats in other.classes.items():
            self._stats(cls).merge(stats)

    def encode(self) -> dict[str, Any]:
        return {cls: stats.encode() for cls, stats in self.classes.items()}

    @classmethod
    def decode(cls, obj: dict[str, Any]) -> Summary:
        return cls({name: ClassStats.decode(stats) for name, stats in obj.items()})
