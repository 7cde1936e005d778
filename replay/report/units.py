"""One table of number formats and units for every figure the reports print: the terminal, the
JSON's `*_text` fields and the pages read it, so a token count reads `136,865 tokens` everywhere
(never `136865.000`) and a time always carries its unit beside it.

A figure's kind is its unit: `tokens` (counts, whole), `seconds` (three decimals: the first
token of a warm request is milliseconds), `rate` (tokens per second, one decimal), `ratio`
(B/A, decimals chosen by the caller to show the estimate inside its interval), `mib`.
"""

from __future__ import annotations

from typing import Any

# unit -> (symbol printed after the number, format of the number)
UNITS: dict[str, tuple[str, str]] = {
    "tokens": ("tokens", "{:,.0f}"),
    "seconds": ("s", "{:,.3f}"),
    "rate": ("tok/s", "{:,.1f}"),
    "mib": ("MiB", "{:,.0f}"),
    "count": ("", "{:,.0f}"),
    "ratio": ("", "{:.3f}"),
}

MISSING = "-"


def number(value: Any, unit: str) -> str:
    """The number alone, in its unit's format (`136,865`, `1.234`, `38.2`); `-` for none."""
    if value is None:
        return MISSING
    if not isinstance(value, int | float) or isinstance(value, bool):
        return str(value)
    return UNITS.get(unit, ("", "{:,.3f}"))[1].format(value)


def figure(value: Any, unit: str) -> str:
    """The number with its unit beside it (`136,865 tokens`, `1.234 s`, `38.2 tok/s`)."""
    text = number(value, unit)
    symbol = UNITS.get(unit, ("", ""))[0]
    return text if text == MISSING or not symbol else f"{text} {symbol}"


# The unit of every figure a report names by key (the switch digest, the per-class rows, the A/B
# class table): `report --json` carries this table beside the numbers; the tables format by it.
FIELDS: dict[str, str] = {
    "count": "count",
    "errors": "count",
    "requests": "count",
    "switches": "count",
    "restores": "count",
    "live_misses": "count",
    "evictions": "count",
    "evictions_zero_hits": "count",
    "ttft_p50_s": "seconds",
    "ttft_p90_s": "seconds",
    "ttft_p99_s": "seconds",
    "ttft_max_s": "seconds",
    "latency_p50_s": "seconds",
    "latency_p99_s": "seconds",
    "wait_per_switch_mean_s": "seconds",
    "wait_per_switch_max_s": "seconds",
    "busy_s": "seconds",
    "prefill_s": "seconds",
    "total_s": "seconds",
    "mean_decode_tps": "rate",
    "mean_reprocessed": "tokens",
    "mean_cached": "tokens",
    "mean_prompt": "tokens",
    "reprocessed_p50": "tokens",
    "reprocessed_max": "tokens",
    "reprocessed_per_switch_mean": "tokens",
    "reprocessed_per_switch_max": "tokens",
    "budget_mib": "mib",
    "peak_mib": "mib",
}


def field(value: Any, key: str) -> str:
    """A figure named by its key, as a table cell (number only: the column header names the unit)."""
    return number(value, FIELDS.get(key, ""))
