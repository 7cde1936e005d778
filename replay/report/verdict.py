"""The answer to a run's question, in one or two sentences, for the top of every report.

A person opens a report to learn one thing: with several disk budgets, which one to set; with one
run, whether switching conversations hurt, where and how badly. The sentences are built only from
the digest's numbers (`report.html.digest`), so the terminal, the page and `summary.md` say the same.
A switch "hurt" when it re-read more than half of its prompt: the server had to rebuild the
conversation instead of resuming it from live or disk KV.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from replay.report.view import RequestView, RunView

# A budget "keeps switches as cheap as the best run" within this margin of the best run's mean
# re-read per switch (a few checkpoint-alignment steps of noise, not a different behaviour).
CHEAP_RATIO = 1.1
CHEAP_SLACK_TOKENS = 2048


def verdict(runs: Sequence[RunView], digests: list[dict[str, Any]]) -> str:
    """One or two sentences: the budget to set when runs differ by budget, else what switching cost;
    every verdict ends with what to do (`action`). `digests` are `report.html.digest` of each run,
    in the same order."""
    if _budget_comparison(runs, digests):
        return _budget_verdict(runs, digests)
    if len(runs) > 1 and all(d["switches"] for d in digests):
        return " ".join(
            [*(_arm_sentence(r, d) for r, d in zip(runs, digests, strict=True)), action(runs, digests)]
        )
    text = " ".join(_run_verdict(run, d, label=len(runs) > 1) for run, d in zip(runs, digests, strict=True))
    return f"{text} {action(runs, digests)}"


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?$")
# Server flags that say where a run ran, not how the server was set up.
_PLACE_FLAGS = frozenset({"--host", "--port", "--kv-disk-dir", "--clock", "--time-scale", "--model", "-m"})


def run_flags(run: RunView) -> dict[str, str]:
    """The server's own settings from the command line it ran (`target.build.argv`): each flag
    with its value (`""` for a flag alone), where it ran left out."""
    build = (run.header.get("target") or {}).get("build") or {}
    argv = [str(a) for a in build.get("argv") or ()]
    flags: dict[str, str] = {}
    i = 1  # argv[0] is the program; `python -m replay.sim` reads as the place flag -m
    while i < len(argv):
        name, eq, value = argv[i].partition("=")
        if not name.startswith("-"):
            i += 1
            continue
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if not eq and nxt is not None and not (nxt.startswith("-") and not _NUMBER.match(nxt)):
            value, i = nxt, i + 2
        else:
            i += 1
        if name not in _PLACE_FLAGS:
            flags[name] = value
    return flags


def action(runs: Sequence[RunView], digests: list[dict[str, Any]]) -> str:
    """What to do, in one sentence naming a flag, a budget or a build: with several runs, the
    settings of the one whose switches waited least, as they differ from the others'; with one,
    whether anything needs changing."""
    if not runs or not any(d["requests"] for d in digests):
        return "Action: run again; nothing finished to judge."
    if len(runs) == 1 or not all(d["switches"] for d in digests):
        hurting = [r for r in runs if any(hurt(q) for q in r.requests)]
        if not any(d["switches"] for d in digests):
            return "Action: nothing to change; no conversation switched."
        if not hurting:
            return "Action: nothing to change; switches resume their conversations."
        return (
            "Action: find the disk budget that keeps these switches cheap with "
            "`replay size sweep TRACE --budgets ...` (seconds, no server), then set `--kv-disk-space-mb`."
        )
    waits = [d["wait_per_switch_mean_s"] or 0.0 for d in digests]
    best = min(range(len(runs)), key=lambda i: (waits[i], digests[i]["reprocessed_per_switch_mean"] or 0))
    mine = run_flags(runs[best])
    # The settings the best run differs in from every other run: what it takes to be that run.
    changes: dict[str, str] | None = None
    for i, run in enumerate(runs):
        if i == best:
            continue
        theirs = run_flags(run)
        differ = {
            n: mine.get(n, "(not set)")
            for n in dict.fromkeys([*mine, *theirs])
            if mine.get(n) != theirs.get(n)
        }
        changes = differ if changes is None else {n: v for n, v in changes.items() if n in differ}
    changes = changes or {}
    tied = [runs[i].label for i in range(len(runs)) if i != best and waits[i] <= waits[best]]
    label = runs[best].label
    if tied:
        return f"Action: keep what you run; {label} and {', '.join(tied)} wait the same per switch."
    flags = " ".join(f"{n} {v}".strip() if v != "(not set)" else f"no {n}" for n, v in changes.items())
    what = f"set `{flags}`" if flags else f"run {label}'s build"
    return (
        f"Action: {what} ({label}: {waits[best]:,} s per switch to the first token, vs "
        + ", ".join(f"{runs[i].label} {waits[i]:,} s" for i in range(len(runs)) if i != best)
        + f", {runs[best].clock})."
    )


def _arm_sentence(run: RunView, d: dict[str, Any]) -> str:
    """One arm in one sentence: how many switches re-read most of their conversation, and the wait."""
    switches = [r for r in run.requests if "switch" in r.switch and r.status == "ok"]
    bad = [r for r in switches if hurt(r)]
    failed = f", {d['errors']} failed" if d["errors"] else ""
    return (
        f"{run.label}: {len(bad)} of {len(switches)} switches re-read most of their conversation, "
        f"{d['wait_per_switch_mean_s']:,} s to the first token per switch ({run.clock}){failed}."
    )


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
            f"{chosen['wait_per_switch_mean_s']:,} s ({chosen['clock']}). {sweep} Action: set {flag} or "
            "a smaller budget the sweep finds."
        )
    return (
        f"Set {flag}: {chosen['label']} is the smallest budget tried that keeps switches as cheap as the "
        f"best run ({chosen['reprocessed_per_switch_mean']:,} tokens re-read and "
        f"{chosen['wait_per_switch_mean_s']:,} s to the first token per switch, {chosen['clock']}); at "
        f"{low['label']} a switch re-read {low['reprocessed_per_switch_mean']:,} tokens and waited "
        f"{low['wait_per_switch_mean_s']:,} s, and {low['evictions_zero_hits']} of its "
        f"{low['evictions']} evicted checkpoints had never been restored. {sweep} Action: set {flag}."
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
