"""Subagents in a run: the subagent sessions, and what their fan-out cost the parent.

The trace (format /2) says which sessions are subagents (`role: subagent`, or a first request with
`after.spawn`) and which parent requests waited for them (`after.waits`). A results file names its
trace; when that file is still there, the report reads those links from it (one light pass, no
messages kept) and puts them beside the measured requests: the subagents' requests, and the
parent's requests that resumed after their subagents returned (their switch class, TTFT and the
prompt tokens the server re-processed) against the parent's other requests.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson


@dataclass(slots=True)
class FanOut:
    subagents: set[str] = field(default_factory=set)  # subagent session ids
    parents: set[str] = field(default_factory=set)  # sessions with a request that waited
    joins: dict[int, int] = field(default_factory=dict)  # request id -> how many subagents it waited for


def read_fan_out(trace_path: str | Path) -> FanOut | None:
    """The trace's subagent links; None when the file is gone or names none."""
    found = FanOut()
    try:
        handle = open(trace_path, "rb")  # noqa: SIM115 - closed below
    except OSError:
        return None
    with handle:
        for raw in handle:
            if b'"subagent"' not in raw and b'"waits"' not in raw and b'"spawn"' not in raw:
                continue
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(obj, dict):
                continue
            if obj.get("kind") == "session" and obj.get("role") == "subagent":
                found.subagents.add(str(obj.get("id")))
            elif obj.get("kind") == "request" and isinstance(obj.get("after"), dict):
                after = obj["after"]
                if after.get("spawn"):
                    found.subagents.add(str(obj.get("session")))
                waits = after.get("waits")
                if isinstance(waits, list) and waits and isinstance(obj.get("id"), int):
                    found.joins[obj["id"]] = len(waits)
                    found.parents.add(str(obj.get("session")))
    return found if found.subagents or found.joins else None


def _p50(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} s" if values else "-"


def _mean(values: list[int]) -> str:
    return f"{statistics.fmean(values):,.0f}" if values else "-"


def fan_out_lines(run: dict[str, Any], requests: list[dict[str, Any]]) -> list[str]:
    """Plain lines for the report; none when the run's trace has no subagents (or is gone)."""
    path = (run.get("trace") or {}).get("path")
    links = read_fan_out(path) if path else None
    if links is None:
        return []
    subs = [r for r in requests if r.get("session") in links.subagents]
    joins = [r for r in requests if r.get("id") in links.joins]
    others = [
        r
        for r in requests
        if r.get("session") in links.parents and r.get("id") not in links.joins and r.get("status") == "ok"
    ]
    ok_subs = [r for r in subs if r.get("status") == "ok"]
    out = [
        f"Subagents: {len({r.get('session') for r in subs})} of {len(links.subagents)} subagent sessions ran, "
        f"{len(subs)} requests, TTFT p50 {_p50([r['ttft_s'] for r in ok_subs if r.get('ttft_s') is not None])}"
    ]
    if joins:
        classes: dict[str, int] = {}
        for r in joins:
            for c in r.get("switch") or ():
                classes[c] = classes.get(c, 0) + 1
        ok = [r for r in joins if r.get("status") == "ok"]
        out.append(
            f"Fan-out cost to the parent: {len(joins)} requests resumed after "
            f"{sum(links.joins[r['id']] for r in joins)} subagent returns; switch "
            + (", ".join(f"{c} {n}" for c, n in sorted(classes.items())) or "-")
            + f"; TTFT p50 {_p50([r['ttft_s'] for r in ok if r.get('ttft_s') is not None])} "
            f"vs {_p50([r['ttft_s'] for r in others if r.get('ttft_s') is not None])} for the parent's other requests; "
            f"re-processed prompt tokens mean {_mean([r['reprocessed_tokens'] for r in ok if r.get('reprocessed_tokens') is not None])} "
            f"vs {_mean([r['reprocessed_tokens'] for r in others if r.get('reprocessed_tokens') is not None])}"
        )
    return out
