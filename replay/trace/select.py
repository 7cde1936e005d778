"""Which part of a trace one replay sends: a shard of the sessions, the parts of its workers, and
the `probe` requests left out.

Each session belongs to one shard, so its turns, history and live replies never leave the process
that owns them. Shards are balanced by work, not by count: a session's work is the prompt tokens it
sends over the trace (recorded usage where the trace has it, else an estimate from its messages),
and sessions are dealt, heaviest first, to the shard with the least work so far (ties to the lower
shard, then the session id), so every host computes the same split and no shard is empty while
another holds two 100K conversations. Host k of N runs `replay run TRACE --shard k/N` (in a
Kubernetes Indexed Job, `--shard auto/N` takes k from `JOB_COMPLETION_INDEX`); inside one run,
`--workers M` deals the shard's sessions the same way over M workers.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from replay.errors import UsageError
from replay.trace.model import Trace
from replay.trace.prompts import prompt_sizes

COMPLETION_INDEX = "JOB_COMPLETION_INDEX"  # set by Kubernetes in each pod of an Indexed Job
PROBE_TAG = "probe"  # a request that stands for "save the slot, restart the server, restore, resend"
SKIP_NOTICE = (
    "{n} request(s) tagged 'probe' ({ids}) left out: each stands for 'save the slot, restart the "
    "server, restore, resend', which `replay run` cannot do; `replay probe --server FILE` runs them."
)


def parse_shard(spec: str, environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """`"2/4"` -> (2, 4); shards are numbered from 1. `"auto/4"` takes the shard from the
    Kubernetes Indexed Job's `JOB_COMPLETION_INDEX` (0-based): index 1 -> shard 2/4."""
    index, slash, count = spec.partition("/")
    if index == "auto" and slash:
        env = os.environ if environ is None else environ
        raw = env.get(COMPLETION_INDEX)
        if raw is None:
            raise UsageError(
                f"--shard {spec}: {COMPLETION_INDEX} is not set (it is, in a Kubernetes Indexed Job)"
            )
        if not raw.isdigit():
            raise UsageError(f"--shard {spec}: {COMPLETION_INDEX}={raw!r} is not a whole number")
        index = str(int(raw) + 1)
    try:
        i, n = int(index), int(count)
    except ValueError:
        i = n = 0
    if not slash or n < 1 or not 1 <= i <= n:
        raise UsageError(f"--shard must be i/N or auto/N with 1 <= i <= N (e.g. 1/2), not {spec!r}")
    return i, n


def session_work(trace: Trace) -> dict[str, int]:
    """Prompt tokens each session sends over the trace (`prompts.prompt_sizes`: recorded usage
    where the trace has it, else an estimate). Only the balance of shards depends on it."""
    work: dict[str, int] = dict.fromkeys(trace.sessions, 0)
    for req, tokens in prompt_sizes(trace.requests):
        work[req.session] = work.get(req.session, 0) + tokens
    return work


def assign_shards(work: Mapping[str, int], count: int) -> dict[str, int]:
    """Session -> shard (1..count): heaviest session first, each to the least-loaded shard."""
    loads = [0] * count
    out: dict[str, int] = {}
    for sid in sorted(work, key=lambda s: (-work[s], s)):
        shard = min(range(count), key=lambda k: (loads[k], k))
        loads[shard] += max(1, work[sid])
        out[sid] = shard + 1
    return out


def select_shard(trace: Trace, index: int, count: int) -> Trace:
    """The part of `trace` that shard `index` of `count` replays.

    A request that waited (`after.request`) for a request of another shard would wait forever
    in this process, so that one dependency is dropped; its own session's replies stay.
    """
    if not 1 <= index <= count:
        raise UsageError(f"shard {index} is not between 1 and {count}")
    owner = assign_shards(session_work(trace), count)
    return _part(trace, {sid for sid, shard in owner.items() if shard == index})


def split_workers(trace: Trace, workers: int) -> list[Trace]:
    """`trace` (a whole trace, or one shard of one) dealt by work over `workers` processes."""
    if workers < 1:
        raise UsageError("--workers must be at least 1")
    owner = assign_shards(session_work(trace), workers)
    return [_part(trace, {sid for sid, w in owner.items() if w == k}) for k in range(1, workers + 1)]


def _part(trace: Trace, chosen: set[str]) -> Trace:
    sessions = {sid: s for sid, s in trace.sessions.items() if sid in chosen}
    mine = {r.id for r in trace.requests if r.session in sessions}
    requests = []
    for req in trace.requests:
        if req.session not in sessions:
            continue
        after = req.after
        if after and after.get("request") is not None and after["request"] not in mine:
            after = {k: v for k, v in after.items() if k != "request"}
            req = req.replaced(after=after)
        requests.append(req)
    return Trace(path=trace.path, header=trace.header, sessions=sessions, requests=requests)


def skip_probes(trace: Trace) -> tuple[Trace, str | None]:
    """The trace without its `probe` requests, and the one-line notice to print (None if none).

    Nothing in a scenario's trace depends on a probe request (a probe is not a turn: no later
    request carries its reply or waits for it); a trace where something does keeps that probe,
    since leaving it out would leave a request waiting for a reply that never comes.
    """
    needed = _depended_on(trace)
    dropped = [r.id for r in trace.requests if r.tag == PROBE_TAG and r.id not in needed]
    if not dropped:
        return trace, None
    gone = set(dropped)
    kept = [r for r in trace.requests if r.id not in gone]
    ids = ", ".join(f"#{i}" for i in dropped[:8]) + (" ..." if len(dropped) > 8 else "")
    notice = SKIP_NOTICE.format(n=len(dropped), ids=ids)
    return dataclasses.replace(trace, requests=kept), notice


def _depended_on(trace: Trace) -> set[int]:
    out: set[int] = set()
    for r in trace.requests:
        out.update(m["$reply"] for m in r.append if "$reply" in m)
        after = (r.after or {}).get("request")
        if after is not None:
            out.add(after)
    return out
