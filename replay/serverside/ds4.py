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

from collections.abc import Mapping, Sequence
from typing import Any

from drivers.logs import ds4
from drivers.logs.ds4_requests import Ds4Request, assemble

LOOKAHEAD = 16
"""How far past the oldest unmatched run request a log request may match (requests in flight)."""


def _num(d: Mapping[str, Any], key: str) -> int | None:
    v = d.get(key)
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def match_requests(
    requests: Sequence[Mapping[str, Any]], log_requests: Sequence[Ds4Request]
) -> dict[int, int]:
    """Map log request index -> run request `seq`, in send order and by span."""
    pending = sorted(requests, key=lambda r: r["seq"])
    used: set[int] = set()
    out: dict[int, int] = {}
    for lr in log_requests:
        window: list[Mapping[str, Any]] = []
        for r in pending:
            if r["seq"] in used:
                continue
            window.append(r)
            if len(window) >= LOOKAHEAD:
                break
        pick = next(
            (
                r
                for r in window
                if _num(r, "prompt_tokens") == lr.prompt and _num(r, "cached_tokens") == lr.cached
            ),
            None,
        )
        if pick is None:
            pick = next(
                (
                    r
                    for r in window
                    if _num(r, "prompt_tokens") == lr.prompt and _num(r, "cached_tokens") is None
                ),
                None,
            )
        if pick is None and window and _num(window[0], "prompt_tokens") is None:
            pick = window[0]  # the oldest unmatched request got no usage back: order is all we have
        if pick is not None:
            used.add(pick["seq"])
            out[lr.index] = pick["seq"]
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
