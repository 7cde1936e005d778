"""The server's Prometheus counters against the run's own per-request usage; its memory.

A response's `usage` is the server's word about one request; `/metrics` is its running account of
all of them. Both come from the same server, but through different code paths, so summing one and
differencing the other is a cheap check that neither is lying (a request the client never saw, a
cached count reported under another name, a counter reset by a restart). The run keeps going
whatever the check finds: a missing or failing endpoint becomes a `skipped` reason, never an error.

Wrap a run in `watch_counters(served)` (before, every few seconds during, after) and call what it
yields with the records; or call `scrape_before(served)` and `check_after(served, before, records)` around
one phase. Either returns a results-file line (`kind: metrics`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drivers.sampler import read_samples, start_sampler_child
from drivers.scrape import (
    USAGE_METRICS,
    MetricsSampler,
    Snapshot,
    accumulate,
    check_usage,
    disagreements,
    scrape_sync,
)
from replay.errors import TargetError
from replay.serverside.logs import log_kind

if TYPE_CHECKING:
    from drivers.launch import Served

# Counters shown in the record (the exposition has more; these are the ones usage can explain).
SHOWN_PREFIXES = ("llamacpp:", "vllm:", "sglang:")


def usage_kind(served: Served) -> str:
    """Whose counters the server exposes: the simulator playing llama-server exposes llama-server's."""
    return log_kind(served.target.kind, served.build.get("argv") or [])


def metrics_url(served: Served) -> str | None:
    """The target's metrics URL, or None when its kind exposes no counters we can compare."""
    path = served.build.get("metrics_path")
    if not path or usage_kind(served) not in USAGE_METRICS:
        return None
    return served.url.rstrip("/") + path


def gauge_peaks(snapshots: Sequence[Snapshot]) -> dict[str, dict[str, float]]:
    """The server's gauges (queue, requests in flight, KV use) over the run's scrapes: first, last
    and highest seen, for those `SHOWN_PREFIXES` name."""
    out: dict[str, dict[str, float]] = {}
    for snap in snapshots:
        for key, value in snap.values.items():
            if snap.types.get(key) != "gauge" or not key.startswith(SHOWN_PREFIXES):
                continue
            seen = out.get(key)
            if seen is None:
                out[key] = {"first": value, "last": value, "max": value}
            else:
                seen["last"] = value
                seen["max"] = max(seen["max"], value)
    return dict(sorted(out.items()))


def scrape_before(served: Served) -> Snapshot | None:
    """The counters before the run; None when there is nothing to compare (see `check_after`)."""
    url = metrics_url(served)
    if url is None:
        return None
    try:
        return scrape_sync(url)
    except TargetError:
        return None


def check_after(
    served: Served,
    before: Snapshot | None,
    records: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """Counter deltas since `before` compared with the sums of the records' usage.

    `records` are the run's request records (any status: a failed request has no usage, and if the
    server still counted its tokens the disagreement is worth seeing). `ok` is True when every
    compared counter matches within one token per request, None when nothing could be compared.
    """
    url = metrics_url(served)
    if url is not None and before is None:
        return {
            "kind": "metrics",
            "server": served.target.kind,
            "ok": None,
            "skipped": f"{url} did not answer before the run",
        }
    if url is None or before is None:
        return compare(served, [], records)
    try:
        after = scrape_sync(url)
    except TargetError as e:
        return {"kind": "metrics", "server": served.target.kind, "ok": None, "skipped": str(e)}
    return compare(served, [before, after], records)


@dataclass(frozen=True, slots=True)
class _RequestLines:
    """The `request` records among `records` (without the cancelled ones if `cancelled` is
    False), filtered afresh on each pass."""

    records: Iterable[Mapping[str, Any]]
    cancelled: bool = True

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        for r in self.records:
            if r.get("kind", "request") == "request" and (self.cancelled or r.get("status") != "cancelled"):
                yield r


def compare(
    served: Served, snapshots: Sequence[Snapshot], records: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The `metrics` results line: counter increases over `snapshots` (summed scrape to scrape, so
    a restart loses only what changed since the scrape before it) against the records' usage."""
    kind = served.target.kind
    out: dict[str, Any] = {"kind": "metrics", "server": kind}
    url = metrics_url(served)
    if url is None:
        return {**out, "ok": None, "skipped": f"kind {kind!r} has no usage counters to compare"}
    if len(snapshots) < 2:
        return {**out, "ok": None, "skipped": f"{url} did not answer before and after the run"}
    deltas = accumulate(snapshots)
    # Read as they are summed, never held (a million records read back from the results file).
    requests = _RequestLines(records)
    # A request cancelled in flight (Ctrl-C, --max-duration) was counted by the server but its
    # usage never came back: it is left out of the sums, and a counter that is higher than the
    # sums is then no disagreement. One that is lower still is.
    cancelled = [r for r in requests if r.get("status") == "cancelled"]
    measured = _RequestLines(records, cancelled=False) if cancelled else requests
    checks = check_usage(deltas, measured, usage_kind(served))
    explained = {id(c) for c in checks if cancelled and not c.ok and c.server > c.client}
    problems = disagreements([c for c in checks if id(c) not in explained], deltas)
    counters = {k: v for k, v in sorted(deltas.values.items()) if k.startswith(SHOWN_PREFIXES)}
    if cancelled:
        out["cancelled_in_flight"] = [r.get("id") for r in cancelled]
    return {
        **out,
        "ok": (not problems) if checks else None,
        "requests": sum(1 for _ in requests),
        "scrapes": len(snapshots),
        "seconds": round(deltas.seconds, 3),
        "counters": counters,
        "gauges": gauge_peaks(snapshots),
        "checks": [
            {
                "what": c.what,
                "metric": c.metric,
                "server": c.server,
                "requests": c.client,
                "difference": c.server - c.client,
                "tolerance": c.tolerance,
                "ok": c.ok,
                **({"explained_by": "requests cancelled in flight"} if id(c) in explained else {}),
            }
            for c in checks
        ],
        "disagreements": problems,
    }


@contextmanager
def watch_counters(
    served: Served, interval_s: float = 5.0
) -> Iterator[Callable[[Sequence[Mapping[str, Any]]], dict[str, Any]]]:
    """Scrape the server's counters before the block, every `interval_s` during it and after it;
    yields the function that turns the run's records into the `metrics` line (call it after)."""
    url = metrics_url(served)
    if url is None:
        yield lambda records: compare(served, [], records)
        return
    with MetricsSampler(url, interval=interval_s) as sampler:
        yield lambda records: _with_failures(compare(served, sampler.snapshots, records), sampler.failures)


def _with_failures(line: dict[str, Any], failures: int) -> dict[str, Any]:
    return {**line, "failed_scrapes": failures} if failures else line


@contextmanager
def server_memory(served: Served, workdir: Path, interval_s: float = 1.0) -> Iterator[list[dict[str, Any]]]:
    """Sample the server's memory (RSS of its process tree) in a child with its own PID for the
    length of the block; on leaving, the list holds one `memory` results line (none for a server
    the tool did not start). A server that starts is no evidence that it fits: watch the peak."""
    lines: list[dict[str, Any]] = []
    if served.process is None or served.pid is None:
        yield lines
        return
    path = workdir / f"memory-{served.pid}.jsonl"
    with start_sampler_child(served.pid, path, interval_s=interval_s):
        yield lines
    samples = read_samples(path) if path.exists() else []
    # One line per server process even when the block ended before the sampler's first sample (a
    # short probe step on a loaded machine): `samples: 0` says so instead of a missing line.
    wired = [s.wired_bytes for s in samples if s.wired_bytes is not None]
    lines.append(
        {
            "kind": "memory",
            "pid": served.pid,
            "samples": len(samples),
            "interval_s": interval_s,
            "peak_rss_bytes": max((s.rss_bytes for s in samples), default=None),
            "last_rss_bytes": samples[-1].rss_bytes if samples else None,
            "peak_wired_bytes": max(wired) if wired else None,
            "peak_processes": max((s.processes for s in samples), default=None),
        }
    )
