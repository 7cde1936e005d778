"""Subagents in a run: the subagent sessions, and what their fan-out cost the parent.

The trace (format /2) says which sessions are subagents (`role: subagent`, or a first request with
`after.spawn`) and which parent requests waited for them (`after.waits`). A results file names its
trace; when that file is still there, the report reads those links from it (one light pass, no
messages kept) and puts them beside the measured requests: the subagents' requests, and the
parent's requests that resumed after their subagents returned (their switch class, TTFT and the
prompt tokens the server re-processed) against the parent's other requests. `replay report` prints
that in two lines (`fan_out_lines`, from the results' own fields); the HTML page (`fan_out_view`,
on the run's clock like the rest of the page) adds a row per subagent session and per resume.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from replay.report.view import RequestView, RunView


@dataclass(slots=True)
class FanOut:
    subagents: set[str] = field(default_factory=set)  # subagent session ids
    parents: set[str] = field(default_factory=set)  # sessions with a request that waited
    joins: dict[int, int] = field(default_factory=dict)  # request id -> how many subagents it waited for
    spawned_by: dict[str, int] = field(
        default_factory=dict
    )  # subagent session -> the request that spawned it
    waited: dict[int, tuple[int, ...]] = field(
        default_factory=dict
    )  # request id -> the subagent requests it waited for


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
                    if isinstance(after.get("request"), int):
                        found.spawned_by[str(obj.get("session"))] = after["request"]
                waits = after.get("waits")
                if isinstance(waits, list) and waits and isinstance(obj.get("id"), int):
                    found.joins[obj["id"]] = len(waits)
                    found.waited[obj["id"]] = tuple(w for w in waits if isinstance(w, int))
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


# The page's tables: at most this many rows each (a public corpus may hold thousands of subagents).
MAX_ROWS = 50
GROUP_HEADER = [
    "requests of",
    "sessions",
    "requests",
    "failed",
    "by switch class",
    "TTFT p50 (s)",
    "re-read tokens (mean)",
]
SUBAGENT_HEADER = [
    "subagent session",
    "spawned by",
    "requests",
    "failed",
    "TTFT p50 (s)",
    "re-read tokens",
    "the parent resumed at",
]
RESUME_HEADER = [
    "parent request",
    "session",
    "subagents waited for",
    "switch class",
    "TTFT (s)",
    "re-read tokens",
]


@dataclass(slots=True)
class FanOutView:
    """A run's subagents as the HTML page shows them: one row per group of requests (the
    subagents', the parent's resumes after its fan-out, the parent's other requests), one per
    subagent session and one per resume; each list cut at `MAX_ROWS` (`more_*` say how many were left)."""

    groups: list[list[str]]
    subagents: list[list[str]]
    resumes: list[list[str]]
    summary: str
    more_subagents: int = 0
    more_resumes: int = 0


def _ttft_p50(views: list[RequestView]) -> str:
    ok = [v.ttft for v in views if v.status == "ok"]
    return f"{statistics.median(ok):.3f}" if ok else "-"


def _group_row(name: str, views: list[RequestView]) -> list[str]:
    ok = [v for v in views if v.status == "ok"]
    classes: dict[str, int] = {}
    for v in views:
        for c in v.switch:
            classes[c] = classes.get(c, 0) + 1
    return [
        name,
        str(len({v.session for v in views})),
        str(len(views)),
        str(len(views) - len(ok)),
        ", ".join(f"{c} {n}" for c, n in sorted(classes.items())) or "-",
        _ttft_p50(views),
        f"{statistics.fmean(v.reprocessed for v in ok):,.0f}" if ok else "-",
    ]


def fan_out_view(run: RunView) -> FanOutView | None:
    """The run's subagents and their cost to the parent; None when its trace names none (or is gone)."""
    path = (run.header.get("trace") or {}).get("path")
    links = read_fan_out(path) if path else None
    if links is None:
        return None
    by_id = {v.id: v for v in run.requests}
    subs = [v for v in run.requests if v.session in links.subagents]
    resumes = sorted((v for v in run.requests if v.id in links.joins), key=lambda v: v.seq)
    others = [v for v in run.requests if v.session in links.parents and v.id not in links.joins]
    # Which resume waited for each subagent: the request whose `waits` names one of its requests.
    resumed_at: dict[str, int] = {}
    for rid, waited in links.waited.items():
        for w in waited:
            if w in by_id:
                resumed_at.setdefault(by_id[w].session, rid)
    per_session: dict[str, list[RequestView]] = {}
    for v in sorted(subs, key=lambda v: v.seq):
        per_session.setdefault(v.session, []).append(v)
    sub_rows = []
    for sid, views in per_session.items():
        spawner = by_id.get(links.spawned_by[sid]) if sid in links.spawned_by else None
        spawned = (
            "-"
            if sid not in links.spawned_by
            else f"{spawner.session} #{spawner.id}"
            if spawner
            else f"#{links.spawned_by[sid]} (not sent)"
        )
        ok = [v for v in views if v.status == "ok"]
        sub_rows.append(
            [
                sid,
                spawned,
                str(len(views)),
                str(len(views) - len(ok)),
                _ttft_p50(views),
                f"{sum(v.reprocessed for v in ok):,}",
                f"#{resumed_at[sid]}" if sid in resumed_at else "-",
            ]
        )
    resume_rows = [
        [
            f"#{v.id}",
            v.session,
            str(links.joins[v.id]),
            ", ".join(v.switch) or "-",
            f"{v.ttft:.3f}" if v.status == "ok" else v.status,
            f"{v.reprocessed:,}" if v.status == "ok" else "-",
        ]
        for v in resumes
    ]
    ok_resumes = [v for v in resumes if v.status == "ok"]
    ok_others = [v for v in others if v.status == "ok"]
    summary = (
        f"{len(per_session)} of {len(links.subagents)} subagent sessions ran ({len(subs)} requests). "
        + (
            f"The parent resumed {len(resumes)} times after {sum(links.joins[v.id] for v in resumes)} "
            f"subagent returns: TTFT p50 {_ttft_p50(ok_resumes)} s vs {_ttft_p50(ok_others)} s for its other "
            f"requests, re-read tokens mean "
            + (f"{statistics.fmean(v.reprocessed for v in ok_resumes):,.0f}" if ok_resumes else "-")
            + " vs "
            + (f"{statistics.fmean(v.reprocessed for v in ok_others):,.0f}" if ok_others else "-")
            + "."
            if resumes
            else "No request of the parent that waited for them was sent."
        )
    )
    return FanOutView(
        groups=[
            _group_row("subagents", subs),
            _group_row("the parent, resuming after its fan-out", resumes),
            _group_row("the parent, its other requests", others),
        ],
        subagents=sub_rows[:MAX_ROWS],
        resumes=resume_rows[:MAX_ROWS],
        summary=summary,
        more_subagents=max(0, len(sub_rows) - MAX_ROWS),
        more_resumes=max(0, len(resume_rows) - MAX_ROWS),
    )
