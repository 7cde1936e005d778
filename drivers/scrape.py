"""Prometheus `/metrics` scraping: counter deltas over a phase, checked against client usage.

llama-server (`--metrics`), vLLM and SGLang expose token counters. Their deltas over a phase are
the server's own account of the work, independent of what each response's `usage` said; when the
two disagree (a request the client never saw, cached tokens counted differently, a counter that
reset because the server restarted) the results should say so rather than pick one silently.

Only counters and gauges matter here, so the exposition parser is small: `# TYPE` lines give the
family type, every sample line is `name{labels} value [timestamp]`.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from replay.errors import TargetError

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_TYPE = re.compile(r"^#\s*TYPE\s+([a-zA-Z_:][a-zA-Z0-9_:]*)\s+(\w+)")
_FAMILY_SUFFIXES = ("_bucket", "_sum", "_count", "_created", "_total", "_info")


def _value(text: str) -> float:
    low = text.lower()
    if low in ("+inf", "inf"):
        return math.inf
    if low == "-inf":
        return -math.inf
    if low == "nan":
        return math.nan
    return float(text)


def _labels(text: str | None) -> str:
    """Canonical `{a="x",b="y"}` (sorted) so the same series compares equal across scrapes."""
    if not text:
        return ""
    pairs = sorted(_LABEL.findall(text[1:-1]))
    return "{" + ",".join(f'{k}="{v}"' for k, v in pairs) + "}" if pairs else ""


def _family(name: str, types: Mapping[str, str]) -> str:
    if name in types:
        return name
    for suffix in _FAMILY_SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in types:
            return name[: -len(suffix)]
    return name


@dataclass(frozen=True)
class Snapshot:
    """One scrape: series key (`name{labels}`) -> value, and each key's metric type."""

    t_ns: int
    values: dict[str, float]
    types: dict[str, str]

    def is_counter(self, key: str) -> bool:
        kind = self.types.get(key, "untyped")
        name = key.split("{", 1)[0]
        if kind == "counter":
            return True
        if kind in ("histogram", "summary"):
            return name.endswith(("_sum", "_count"))
        return kind == "untyped" and name.endswith("_total")


def parse_exposition(text: str, t_ns: int | None = None) -> Snapshot:
    """Parse Prometheus text format (0.0.4) into a snapshot; malformed lines are skipped."""
    family_types: dict[str, str] = {}
    samples: list[tuple[str, str, float]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            m = _TYPE.match(line)
            if m:
                family_types[m.group(1)] = m.group(2).lower()
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = _value(m.group(3))
        except ValueError:
            continue
        samples.append((m.group(1), _labels(m.group(2)), value))
    values: dict[str, float] = {}
    types: dict[str, str] = {}
    for name, labels, value in samples:
        key = name + labels
        values[key] = value
        types[key] = family_types.get(_family(name, family_types), "untyped")
    return Snapshot(t_ns=time.perf_counter_ns() if t_ns is None else t_ns, values=values, types=types)


@dataclass
class Deltas:
    """Counter increases between two snapshots; a counter that went down restarted from zero."""

    seconds: float
    values: dict[str, float]
    resets: list[str] = field(default_factory=list)
    gauges: dict[str, tuple[float, float]] = field(default_factory=dict)

    def total(self, name: str) -> float | None:
        """Sum of a metric's delta over all its label sets; None when the server does not expose it."""
        hits = [v for k, v in self.values.items() if k == name or k.startswith(name + "{")]
        return sum(hits) if hits else None

    def to_dict(self) -> dict[str, object]:
        return {
            "seconds": self.seconds,
            "counters": dict(sorted(self.values.items())),
            "resets": list(self.resets),
            "gauges": {k: {"before": a, "after": b} for k, (a, b) in sorted(self.gauges.items())},
        }


def counter_deltas(before: Snapshot, after: Snapshot) -> Deltas:
    values: dict[str, float] = {}
    resets: list[str] = []
    gauges: dict[str, tuple[float, float]] = {}
    for key, b in after.values.items():
        if after.is_counter(key):
            a = before.values.get(key, 0.0)
            if b < a:
                resets.append(key)
                values[key] = b
            else:
                values[key] = b - a
        elif after.types.get(key) == "gauge" and key in before.values:
            gauges[key] = (before.values[key], b)
    return Deltas(seconds=(after.t_ns - before.t_ns) / 1e9, values=values, resets=resets, gauges=gauges)


def accumulate(snapshots: Sequence[Snapshot]) -> Deltas:
    """Counter deltas summed scrape to scrape, so a restart mid-phase loses only the increase
    between the last scrape before it and the restart, not everything before it."""
    total = counter_deltas(snapshots[0], snapshots[1])
    for before, after in zip(snapshots[1:], snapshots[2:], strict=False):
        step = counter_deltas(before, after)
        for k, v in step.values.items():
            total.values[k] = total.values.get(k, 0.0) + v
        total.resets += [k for k in step.resets if k not in total.resets]
    first, last = snapshots[0], snapshots[-1]
    total.seconds = (last.t_ns - first.t_ns) / 1e9
    total.gauges = counter_deltas(first, last).gauges
    return total


# ---------------------------------------------------------------------------------------------
# Comparing with per-request usage


@dataclass(frozen=True)
class UsageMetrics:
    """Which counters hold a server's prompt, cached and output token totals."""

    prompt: str
    prompt_includes_cached: bool
    cached: str | None
    output: str | None


USAGE_METRICS: dict[str, UsageMetrics] = {
    # llama.cpp counts only the tokens it evaluated (prompt_n), cached ones separately.
    "llamacpp": UsageMetrics(
        prompt="llamacpp:prompt_tokens_total",
        prompt_includes_cached=False,
        cached="llamacpp:prompt_tokens_cached_total",
        output="llamacpp:tokens_predicted_total",
    ),
    "vllm": UsageMetrics(
        prompt="vllm:prompt_tokens_total",
        prompt_includes_cached=True,
        cached="vllm:prefix_cache_hits_total",
        output="vllm:generation_tokens_total",
    ),
    "sglang": UsageMetrics(
        prompt="sglang:prompt_tokens_total",
        prompt_includes_cached=True,
        cached="sglang:cached_tokens_total",
        output="sglang:generation_tokens_total",
    ),
}


@dataclass(frozen=True)
class UsageCheck:
    what: str  # "prompt" | "cached" | "output"
    metric: str
    server: float
    client: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return abs(self.server - self.client) <= self.tolerance

    def message(self) -> str:
        return (
            f"{self.what} tokens: server counter {self.metric} grew by {self.server:,.0f}, "
            f"requests' usage sums to {self.client:,.0f} (difference {self.server - self.client:+,.0f})"
        )


def _usage_sum(requests: Iterable[Mapping[str, Any]], key: str) -> tuple[float, int]:
    total, n = 0.0, 0
    for r in requests:
        v = r.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool):
            total += v
            n += 1
    return total, n


def check_usage(
    deltas: Deltas,
    requests: Iterable[Mapping[str, Any]],  # read once per sum
    server: str,
    *,
    slack_per_request: float = 1.0,
) -> list[UsageCheck]:
    """Compare counter deltas with the sum of `prompt_tokens`, `cached_tokens`, `output_tokens`
    of the phase's requests. Counters the server does not expose are left out; requests without
    usage (errors) are left out of the sums, which is itself a likely cause of disagreement."""
    m = USAGE_METRICS[server]
    prompt, n = _usage_sum(requests, "prompt_tokens")
    cached, _ = _usage_sum(requests, "cached_tokens")
    output, n_out = _usage_sum(requests, "output_tokens")
    tol = slack_per_request * max(n, 1)
    checks: list[UsageCheck] = []
    got = deltas.total(m.prompt)
    if got is not None:
        want = prompt if m.prompt_includes_cached else prompt - cached
        checks.append(UsageCheck("prompt", m.prompt, got, want, tol))
    if m.cached and (got := deltas.total(m.cached)) is not None:
        checks.append(UsageCheck("cached", m.cached, got, cached, tol))
    if m.output and n_out and (got := deltas.total(m.output)) is not None:
        checks.append(UsageCheck("output", m.output, got, output, slack_per_request * n_out))
    return checks


def disagreements(checks: Sequence[UsageCheck], deltas: Deltas | None = None) -> list[str]:
    out = [c.message() for c in checks if not c.ok]
    if deltas is not None and deltas.resets:
        out.append(f"{len(deltas.resets)} counter(s) went down during the phase: the server restarted")
    return out


# ---------------------------------------------------------------------------------------------
# Scraping


async def scrape(client: httpx.AsyncClient, url: str) -> Snapshot:
    try:
        resp = await client.get(url)
    except httpx.HTTPError as e:
        raise TargetError(f"cannot scrape {url}: {type(e).__name__}") from e
    if resp.status_code != 200:
        raise TargetError(
            f"{url} answered {resp.status_code} (llama-server exposes metrics only with --metrics)"
        )
    return parse_exposition(resp.text)


def scrape_sync(url: str, timeout: float = 5.0) -> Snapshot:
    try:
        resp = httpx.get(url, timeout=timeout)
    except httpx.HTTPError as e:
        raise TargetError(f"cannot scrape {url}: {type(e).__name__}") from e
    if resp.status_code != 200:
        raise TargetError(
            f"{url} answered {resp.status_code} (llama-server exposes metrics only with --metrics)"
        )
    return parse_exposition(resp.text)


class MetricsSampler:
    """Scrapes once on entry (before), every `interval` seconds during the phase, once on exit
    (after). A failed scrape is counted, not raised: a phase must not die because its metrics
    endpoint hiccuped. The scrapes during the phase run in a thread of their own (a blocking GET
    every few seconds), so whatever the phase runs, an event loop included, never waits on them."""

    def __init__(self, url: str, interval: float = 5.0) -> None:
        self.url = url
        self.interval = interval
        self.snapshots: list[Snapshot] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> MetricsSampler:
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="metrics-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._thread is not None
        self._stop.set()
        self._thread.join()
        self._sample()

    def _sample(self) -> None:
        try:
            self.snapshots.append(scrape_sync(self.url))
        except TargetError:
            self.failures += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def deltas(self) -> Deltas:
        if len(self.snapshots) < 2:
            raise TargetError(f"{self.url}: fewer than two scrapes, no delta")
        return accumulate(self.snapshots)
