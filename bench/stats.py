"""TTFT error against server truth, and the few statistics the benchmark reports.

Error = the client's TTFT minus the server's own (first-token send minus arrival), for the same
request, matched by key (X-Request-ID, or the server id the reply text starts with), never by
order. Positive error is time the client added; most of it is on the receive side.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

COL_ARRIVAL, COL_FIRST = 2, 3


def percentile(values: list[float], pct: float) -> float | None:
    """Nearest-rank percentile of an already sorted list (None when empty)."""
    if not values:
        return None
    rank = max(1, math.ceil(pct / 100 * len(values)))
    return values[min(rank, len(values)) - 1]


@dataclass(slots=True)
class ErrorStats:
    """TTFT error distribution in milliseconds, plus how much of the run it covers."""

    n: int = 0
    unmatched: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    mean_ms: float | None = None
    truth_p50_ms: float | None = None  # the server's own TTFT, to show it stayed on time
    truth_p99_ms: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def server_ttft_ms(row: list[Any]) -> float | None:
    if row[COL_FIRST] is None:
        return None
    return (row[COL_FIRST] - row[COL_ARRIVAL]) / 1e6


def ttft_errors(client_ttft_ms: Mapping[str, float], truth: Mapping[str, list[Any]]) -> ErrorStats:
    """Match client TTFTs (by key) with the server's stamps and summarise the difference."""
    errors: list[float] = []
    truths: list[float] = []
    unmatched = 0
    for key, ttft in client_ttft_ms.items():
        row = truth.get(key)
        server = server_ttft_ms(row) if row is not None else None
        if server is None:
            unmatched += 1
            continue
        errors.append(ttft - server)
        truths.append(server)
    return summarise(errors, truths, unmatched)


def summarise(errors: list[float], truths: Iterable[float] = (), unmatched: int = 0) -> ErrorStats:
    errors = sorted(errors)
    truths = sorted(truths)
    if not errors:
        return ErrorStats(unmatched=unmatched)
    return ErrorStats(
        n=len(errors),
        unmatched=unmatched,
        p50_ms=percentile(errors, 50),
        p99_ms=percentile(errors, 99),
        max_ms=errors[-1],
        mean_ms=sum(errors) / len(errors),
        truth_p50_ms=percentile(truths, 50),
        truth_p99_ms=percentile(truths, 99),
    )


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing or b is zero."""
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 2)
