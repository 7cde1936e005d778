"""Which part of a trace one replay sends: a shard of the sessions, the parts of its workers, and
the `probe` requests left out.

Each session belongs to one shard, chosen by a stable hash of its id (the same on every host and
Python version), so a session's turns, history and live replies never leave the process that
owns them. Host k of N runs `replay run TRACE --shard k/N`; inside one run, `--workers M` splits
the selected sessions again with the same hash over N*M shards, which keeps shard k's sessions
(and only them) and spreads them evenly (a hash taken modulo M alone would send every session of
shard 1/2 to one of two workers).
"""

from __future__ import annotations

import dataclasses
import hashlib

from replay.errors import UsageError
from replay.trace.model import Trace

PROBE_TAG = "probe"  # a request that stands for "save the slot, restart the server, restore, resend"
SKIP_NOTICE = (
    "{n} request(s) tagged 'probe' ({ids}) left out: each stands for 'save the slot, restart the "
    "server, restore, resend', which `replay run` cannot do; `replay probe --server FILE` runs them."
)


def parse_shard(spec: str) -> tuple[int, int]:
    """`"2/4"` -> (2, 4); shards are numbered from 1."""
    index, slash, count = spec.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i = n = 0
    if not slash or n < 1 or not 1 <= i <= n:
        raise UsageError(f"--shard must be i/N with 1 <= i <= N (e.g. 1/2), not {spec!r}")
    return i, n


def shard_of(session_id: str, count: int) -> int:
    """The shard (1..count) that owns a session: a hash that no process or host can disagree on."""
    digest = hashlib.blake2b(session_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count + 1


def select_shard(trace: Trace, index: int, count: int) -> Trace:
    """The part of `trace` that shard `index` of `count` replays.

    A request that waited (`after.request`) for a request of another shard would wait forever
    in this process, so that one dependency is dropped; its own session's replies stay.
    """
    if not 1 <= index <= count:
        raise UsageError(f"shard {index} is not between 1 and {count}")
    sessions = {sid: s for sid, s in trace.sessions.items() if shard_of(sid, count) == index}
    mine = {r.id for r in trace.requests if r.session in sessions}
    requests = []
    for req in trace.requests:
        if req.session not in sessions:
            continue
        after = req.after
        if after and after.get("request") is not None and after["request"] not in mine:
            after = {k: v for k, v in after.items() if k != "request"}
            req = dataclasses.replace(req, after=after)
        requests.append(req)
    return Trace(path=trace.path, header=trace.header, sessions=sessions, requests=requests)


def split_workers(trace: Trace, workers: int, shard: tuple[int, int] = (1, 1)) -> list[Trace]:
    """`trace` (shard `shard` of a whole trace, already selected) cut into one part per worker.

    Worker w of shard i/N replays global shard i + N*(w-1) of N*M: a session in shard i/N has
    hash % N == i-1, so it lands in exactly one of those M finer shards. With N = 1 this is the
    plain split by `shard_of(session, M)`.
    """
    if workers < 1:
        raise UsageError("--workers must be at least 1")
    index, count = shard
    return [select_shard(trace, index + count * w, count * workers) for w in range(workers)]


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
