"""HDR histograms per switch class, encoded into the results so runs merge exactly.

Live runs feed them from records' integer stamps; a results file cut short before its summary
line is summarised again from its request lines, whose seconds are the same microseconds printed.
Merging two encoded histograms gives the same percentiles as one histogram that saw every value,
which is what lets `--workers N`, `--shard i/N` and several result files report as one run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hdrh.histogram import HdrHistogram

from replay.metrics.record import RequestRecord

# Microseconds up to ~3 h for times; up to 10M tokens for counts; 3 significant figures.
_RANGES = {"ttft_us": 10_800_000_000, "latency_us": 10_800_000_000, "reprocessed": 10_000_000}
_SUMS = ("prompt_tokens", "cached_tokens", "reprocessed_tokens", "output_tokens")
_Tokens = tuple[int | None, int | None, int | None, int | None]


def new_histogram(metric: str) -> HdrHistogram:
    return HdrHistogram(1, _RANGES[metric], 3)


@dataclass(slots=True)
class ClassStats:
    """Counts, token sums and histograms of one switch class."""

    count: int = 0
    errors: int = 0
    sums: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_SUMS, 0))
    hists: dict[str, HdrHistogram] = field(default_factory=lambda: {m: new_histogram(m) for m in _RANGES})

    def add(self, ok: bool, ttft_us: int | None, latency_us: int | None, tokens: _Tokens) -> None:
        """One request; `tokens` are (prompt, cached, reprocessed, output) as in `_SUMS`."""
        self.count += 1
        if not ok:
            self.errors += 1
            return
        sums = self.sums
        for key, value in zip(_SUMS, tokens, strict=True):
            sums[key] += value or 0
        if ttft_us is not None:
            self.hists["ttft_us"].record_value(min(ttft_us, _RANGES["ttft_us"]))
        if latency_us is not None:
            self.hists["latency_us"].record_value(min(latency_us, _RANGES["latency_us"]))
        reprocessed = tokens[2]
        if reprocessed is not None:
            self.hists["reprocessed"].record_value(min(int(reprocessed), _RANGES["reprocessed"]))

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


def _micros(seconds: float | None) -> int | None:
    # Lines print seconds to the microsecond: round, never truncate, to get the same integer back.
    return None if seconds is None else round(seconds * 1e6)


@dataclass(slots=True)
class Summary:
    """Per-class statistics of one or more runs; 'all' counts every request once."""

    classes: dict[str, ClassStats] = field(default_factory=dict)

    def _stats(self, cls: str) -> ClassStats:
        stats = self.classes.get(cls)
        if stats is None:  # not setdefault: a ClassStats builds three histograms
            stats = self.classes[cls] = ClassStats()
        return stats

    def add(self, rec: RequestRecord) -> None:
        usage = rec.usage
        tokens = (usage.prompt_tokens, usage.cached_tokens, usage.reprocessed_tokens, usage.output_tokens)
        ok, ttft_us, latency_us = rec.ok, rec.ttft_us, rec.latency_us
        for cls in (ALL, *rec.switch):
            self._stats(cls).add(ok, ttft_us, latency_us, tokens)

    def add_line(self, line: dict[str, Any]) -> None:
        """A `request` line read back from a results file."""
        tokens = (
            line.get("prompt_tokens"),
            line.get("cached_tokens"),
            line.get("reprocessed_tokens"),
            line.get("output_tokens"),
        )
        ok = line.get("status") == "ok"
        ttft_us, latency_us = _micros(line.get("ttft_s")), _micros(line.get("latency_s"))
        for cls in (ALL, *line.get("switch", ())):
            self._stats(cls).add(ok, ttft_us, latency_us, tokens)

    def merge(self, other: Summary) -> None:
        for cls, stats in other.classes.items():
            self._stats(cls).merge(stats)

    def encode(self) -> dict[str, Any]:
        return {cls: stats.encode() for cls, stats in self.classes.items()}

    @classmethod
    def decode(cls, obj: dict[str, Any]) -> Summary:
        return cls({name: ClassStats.decode(stats) for name, stats in obj.items()})
