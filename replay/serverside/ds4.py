"""Attach ds4 log events to the requests of a run, as `server` records for the results file.

ds4 prints no request id (and batched mode interleaves requests), so a log request is matched to
a run request by its numbers: the span `ctx=A..B:C` of the log must equal the usage the client got
back (A = cached tokens, B = prompt tokens). Matching walks both lists in order — the log in the
order requests started, the run in send order — and looks a few requests ahead, because with
requests in flight together the server may start them in a different order than they were sent.
A run request without usage (an error) is matched by order only when the numbers cannot decide.

Each record holds numbers and closed-vocabulary names only, never text from the log.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from drivers.logs import ds4
from drivers.logs.ds4_requests import Ds4Request, assemble

LOOKAHEAD = 16
"""How far past the oldest unmatched run request a log request may match (requests in flight)."""


def _num(d: Mapping[str, Any], key: str) -> int | None:
    v = d.get(key)
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


_NONE = -(2**63)  # a number column's None


def match_requests(
    requests: Iterable[Mapping[str, Any]], log_requests: Sequence[Ds4Request]
) -> dict[int, int]:
    """Map log request index -> run request `seq`, in send order and by span.

    Linear in the requests, in memory and time: the run's three numbers in columns (not a
    dict a request), and the window of the `LOOKAHEAD` oldest unmatched requests found through
    a next-unmatched index with path halving (150,000 requests scanned from the first each
    time took over 15 minutes)."""
    seqs, prompts, cacheds = array("q"), array("q"), array("q")
    for r in requests:
        seqs.append(r["seq"])
        prompt, cached = _num(r, "prompt_tokens"), _num(r, "cached_tokens")
        prompts.append(_NONE if prompt is None else prompt)
        cacheds.append(_NONE if cached is None else cached)
    order = sorted(range(len(seqs)), key=seqs.__getitem__)  # send order (stable)
    seqs = array("q", (seqs[i] for i in order))
    prompts = array("q", (prompts[i] for i in order))
    cacheds = array("q", (cacheds[i] for i in order))
    del order
    n = len(seqs)
    after = array("q", range(n + 1))  # i -> an index <= the first unmatched one at or after i

    def unmatched(i: int) -> int:
        while after[i] != i:
            after[i] = after[after[i]]  # path halving
            i = after[i]
        return i

    out: dict[int, int] = {}
    for lr in log_requests:
        window: list[int] = []
        i = unmatched(0)
        while i < n and len(window) < LOOKAHEAD:
            window.append(i)
            i = unmatched(i + 1)
        prompt = _NONE if lr.prompt is None else lr.prompt
        cached = _NONE if lr.cached is None else lr.cached
        pick = next((i for i in window if prompts[i] == prompt and cacheds[i] == cached), None)
        if pick is None:
            pick = next((i for i in window if prompts[i] == prompt and cacheds[i] == _NONE), None)
        if pick is None and window and prompts[window[0]] == _NONE:
            pick = window[0]  # the oldest unmatched request got no usage back: order is all we have
        if pick is not None:
            after[pick] = pick + 1
            out[lr.index] = seqs[pick]
    return out


def _record(seq: int | None, event: str, ev: ds4.Event, **fields: object) -> dict[str, object]:
    return {"kind": "server", "request_seq": seq, "event": event, "line": ev.line, "log_t": ev.t, **fields}


def _cache_records(seq: int | None, ev: ds4.Event, prompt: int | None = None) -> dict[str, object] | None:
    if isinstance(ev, ds4.LiveMiss):
        return _record(
            seq, "live_miss", ev, live=ev.live, prompt=ev.prompt, common=ev.common, reason=ev.reason
        )
    if isinstance(ev, ds4.DiskHit):
        coverage = ev.tokens / prompt if prompt and ev.tokens is not None else None
        return _record(
            seq,
            "restore",
            ev,
            tokens=ev.tokens,
            text_bytes=ev.text_bytes,
            key=ev.key,
            load_ms=ev.load_ms,
            consumed=ev.consumed,
            coverage=coverage,
        )
    if isinstance(ev, ds4.Store):
        return _record(
            seq,
            "store",
            ev,
            reason=ev.reason,
            tokens=ev.tokens,
            trimmed=ev.trimmed,
            key=ev.key,
            mib=ev.mib,
            ms=ev.ms,
        )
    if isinstance(ev, ds4.Eviction):
        return _record(seq, "evict", ev, tokens=ev.tokens, hits=ev.hits, mib=ev.mib)
    return None


def correlate(requests: Sequence[Mapping[str, Any]], events: Sequence[ds4.Event]) -> list[dict[str, object]]:
    """`server` records in log order: one `request` record per log request (the server's own
    span, prefill seconds, decode rate, finish) and one record per cache event (`live_miss`,
    `restore`, `store`, `evict`). `request_seq` is null where no run request matches (another
    client, a request before the run) and for events no request owns (shutdown saves, startup
    evictions)."""
    asm = assemble(events)
    seq_of = match_requests(requests, asm.requests)
    out: list[dict[str, object]] = []
    for lr in asm.requests:
        seq = seq_of.get(lr.index)
        fin = lr.finish
        out.append(
            {
                "kind": "server",
                "request_seq": seq,
                "event": "request",
                "line": lr.line,
                "log_t": lr.t,
                "cached": lr.cached,
                "prompt": lr.prompt,
                "prefill": lr.todo,
                "prompt_done_s": lr.prompt_done_s,
                "decode_tps": lr.decode.avg_tps if lr.decode else None,
                "gen": fin.gen if fin else None,
                "finish": fin.reason if fin else None,
                "error": fin.error if fin else None,
                "seconds": fin.seconds if fin else None,
                "tool_calls": lr.tool_calls,
            }
        )
        cache_events: list[ds4.Event] = [e for e in (lr.live_miss, lr.restore) if e is not None]
        cache_events += [*lr.stores, *lr.evictions]
        for ev in cache_events:
            rec = _cache_records(seq, ev, lr.prompt)
            if rec is not None:
                out.append(rec)
    for ev in asm.orphans:
        rec = _cache_records(None, ev)
        if rec is not None:
            out.append(rec)
    out.sort(key=lambda r: r["line"])  # type: ignore[arg-type, return-value]
    return out
