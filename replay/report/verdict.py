"""The answer to a run's question, in one or two sentences, for the top of every report.

A person opens a report to learn one thing: with several disk budgets, which one to set; with one
run, whether switching conversations hurt, where and how badly. The sentences are built only from
the digest's numbers (`report.html.digest`), so the terminal, the page and `summary.md` say the same.
A switch "hurt" when it re-read more than half of its prompt: the server had to rebuild the
conversation instead of resuming it from live or disk KV.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replay.report.view import RequestView, RunView

# A budget "keeps switches as cheap as the best run" within this margin of the best run's mean
# re-read per switch (a few checkpoint-alignment steps of noise, not a different behaviour).
CHEAP_RATIO = 1.1
CHEAP_SLACK_TOKENS = 2048


def verdict(runs: Sequence[RunView], digests: list[dict[str, Any]]) -> str:
    """One or two sentences: the budget to set when runs differ by budget, else what switching cost.
    `digests` are `report.html.digest` of each run, in the same order."""
    if _budget_comparison(runs, digests):
        return _budget_verdict(runs, digests)
    return " ".join(_run_verdict(run, d, label=len(runs) > 1) for run, d in zip(runs, digests, strict=True))


def hurt(request: RequestView) -> bool:
    """A switch that rebuilt most of its conversation instead of resuming it."""
    return "switch" in request.switch and request.status == "ok" and request.reprocessed * 2 > request.prompt


def _budget_comparison(runs: Sequence[RunView], digests: list[dict[str, Any]]) -> bool:
    budgets = [run.budget_mib for run in runs]
    return (
        len(runs) > 1
        and all(b is not None for b in budgets)
        and len(set(budgets)) == len(budgets)
        and all(d["switches"] for d in digests)
    )


def _budget_verdict(runs: Sequence[RunView], digests: list[dict[str, Any]]) -> str:
    order = sorted(range(len(runs)), key=lambda i: runs[i].budget_mib or 0.0)
    best = min(d["reprocessed_per_switch_mean"] for d in digests)
    goal = best * CHEAP_RATIO + CHEAP_SLACK_TOKENS
    enough = next(i for i in order if digests[i]["reprocessed_per_switch_mean"] <= goal)
    smallest = order[0]
    chosen, low = digests[enough], digests[smallest]
    flag = f"`--kv-disk-space-mb {int(runs[enough].budget_mib or 0)}`"
    sweep = (
        "`replay size sweep TRACE --budgets ...` finds the smallest budget between the ones tried, "
        "in seconds and without a server."
    )
    if enough == smallest:
        return (
            f"Every budget tried keeps switches cheap: the smallest, {chosen['label']} ({flag}), re-reads "
            f"{chosen['reprocessed_per_switch_mean']:,} tokens per switch and waits "
            f"{chosen['wait_per_switch_mean_s']:,} s ({chosen['clock']}). {sweep}"
        )
    return (
        f"Set {flag}: {chosen['label']} is the smallest budget tried that keeps switches as cheap as the "
        f"best run ({chosen['reprocessed_per_switch_mean']:,} tokens re-read and "
        f"{chosen['wait_per_switch_mean_s']:,} s to the first token per switch, {chosen['clock']}); at "
        f"{low['label']} a switch re-read {low['reprocessed_per_switch_mean']:,} tokens and waited "
        f"{low['wait_per_switch_mean_s']:,} s, and {low['evictions_zero_hits']} of its "
        f"{low['evictions']} evicted checkpoints had never been restored. {sweep}"
    )


def _run_verdict(run: RunView, d: dict[str, Any], *, label: bool) -> str:
    who = f"{run.label}: " if label else ""
    if not d["requests"]:
        return f"{who}no request finished, so there is nothing to judge."
    failed = f" {d['errors']} of {d['requests']} requests failed." if d["errors"] else ""
    if not d["switches"]:
        return f"{who}no conversation switch in this run ({d['requests']} requests).{failed}"
    switches = [r for r in run.requests if "switch" in r.switch and r.status == "ok"]
    bad = [r for r in switches if hurt(r)]
    if not bad:
        return (
            f"{who}switching did not hurt: all {len(switches)} switches resumed their conversation, "
            f"re-reading {d['reprocessed_per_switch_mean']:,} tokens on average "
            f"({d['wait_per_switch_mean_s']:,} s to the first token, {run.clock}).{failed}"
        )
    worst = max(bad, key=lambda r: r.ttft)
    first, last = min(r.start for r in bad), max(r.start for r in bad)
    return (
        f"{who}the switch pathology appeared: {len(bad)} of {len(switches)} switches re-read most of "
        f"their conversation (mean {round(sum(r.reprocessed for r in bad) / len(bad)):,} tokens) between "
        f"{when(run, first)} and {when(run, last)}; the worst, in session {worst.session} at "
        f"{when(run, worst.start)}, waited {worst.ttft:,.1f} s ({run.clock}) for its first token "
        f"after re-reading {worst.reprocessed:,} tokens.{failed}"
    )


def when(run: RunView, t: float) -> str:
    """A moment of the run: the wall-clock time when the trace carries one, else seconds from its start."""
    clock = run.clock_start
    if clock is None:
        return f"{t:,.0f} s"
    seconds = int(round(clock + t)) % 86_400
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}"
