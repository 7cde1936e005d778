"""Group ds4 events into process runs and per-request views.

ds4 prints no request id, and in batched mode (`--batched-session N`) the lines of several
requests interleave. What ties lines together is the span `ctx=A..B:C` (identical on `prompt
start`, `prefill chunk`, `prompt done` and `finish`) and the order of the cache-decision lines,
which a slot prints just before its `prompt start` (reference/ds4-server.md 3.4):
live miss -> evict store (+ evictions) -> disk hit -> optional live continuation -> prompt start.

Attribution rules, in the order they apply:
- cache-decision lines wait for the next `prompt start`. With one session they all belong to it;
  with several, a block (starting at a live miss) is attached only if its miss `prompt=` and
  its restored tokens agree with that request's span, else it waits for a later one;
- `cold` / `continued` stores belong to a request still in flight whose numbers fit (cold:
  nothing cached, and the store is its whole prompt or its cold cut; continued: beyond what was
  cached, nearest to where its prefill or decode has got to);
- evictions follow the store they make room for: the one just before them in the same stretch of
  lines (ds4 A prints them after a store), else the one just after (B prints them before);
- shutdown stores, startup evictions and anything else left over are orphans of their run.
A run is one process lifetime: it starts at the first startup line after other activity.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from drivers.logs import ds4
from drivers.logs.effective import ds4_settings

_MAX_WAIT = 8
"""Prompt starts a batched-mode decision block may wait for its request before it is orphaned."""


@dataclass
class Run:
    """One process lifetime in the log."""

    index: int
    startup: list[ds4.Event] = field(default_factory=list)
    t_first: float | None = None
    t_last: float | None = None
    events: list[ds4.Event] = field(default_factory=list)
    orphans: list[ds4.Event] = field(default_factory=list)

    @property
    def settings(self) -> dict[str, object]:
        return ds4_settings(self.startup)

    @property
    def sessions(self) -> int:
        for ev in self.startup:
            if isinstance(ev, ds4.BatchedMode) and ev.resident_sessions:
                return ev.resident_sessions
        return 1

    @property
    def seconds(self) -> float:
        if self.t_first is None or self.t_last is None:
            return 0.0
        return max(0.0, self.t_last - self.t_first)

    def add(self, ev: ds4.Event) -> None:
        self.orphans.append(ev)


@dataclass
class Ds4Request:
    """Everything the log says about one request, in log order of its `prompt start`."""

    index: int
    run: int
    api: str
    cached: int
    prompt: int
    todo: int
    flags: frozenset[str]
    line: int
    t: float | None
    prompt_done_s: float | None = None
    decode: ds4.Decoding | None = None
    finish: ds4.Finish | None = None
    abort: str | None = None
    tool_calls: int | None = None
    live_miss: ds4.LiveMiss | None = None
    restore: ds4.DiskHit | None = None
    continuation: ds4.Continuation | None = None
    stores: list[ds4.Store] = field(default_factory=list)
    evictions: list[ds4.Eviction] = field(default_factory=list)
    pos: int = 0
    """Last known position of this request's session (prefill progress, prompt end, decode end)."""

    @property
    def span(self) -> tuple[int, int, int]:
        return (self.cached, self.prompt, self.todo)

    def add(self, ev: ds4.Event) -> None:
        if isinstance(ev, ds4.LiveMiss):
            self.live_miss = ev
        elif isinstance(ev, ds4.DiskHit):
            self.restore = ev
        elif isinstance(ev, ds4.Continuation):
            self.continuation = ev
        elif isinstance(ev, ds4.Store):
            self.stores.append(ev)
        elif isinstance(ev, ds4.Eviction):
            self.evictions.append(ev)


@dataclass
class _Block:
    """Cache-decision lines printed for one request that has not started yet."""

    events: list[ds4.Event] = field(default_factory=list)
    waited: int = 0

    def add(self, ev: ds4.Event) -> None:
        self.events.append(ev)

    def get(self, cls: type) -> ds4.Event | None:
        return next((e for e in self.events if isinstance(e, cls)), None)

    def fits(self, r: Ds4Request) -> bool:
        miss = self.get(ds4.LiveMiss)
        if isinstance(miss, ds4.LiveMiss) and miss.prompt is not None and not _close(miss.prompt, r.prompt):
            return False
        hit = self.get(ds4.DiskHit)
        return not (
            isinstance(hit, ds4.DiskHit) and hit.tokens is not None and not _close(hit.tokens, r.cached)
        )


def _cold_cut(prompt: int, trim: int, align: int) -> int:
    """ds4's fallback cold-save length (reference 4.2): (P - trim) rounded down to `align`."""
    if align <= 0 or prompt <= trim:
        return prompt
    return (prompt - trim) // align * align


def _close(a: int, b: int) -> bool:
    """Token counts that agree up to re-tokenisation of a restored prefix's tail."""
    return abs(a - b) <= max(64, 0.02 * max(a, b))


@dataclass
class Assembly:
    runs: list[Run]
    requests: list[Ds4Request]

    @property
    def orphans(self) -> list[ds4.Event]:
        return [ev for run in self.runs for ev in run.orphans]


_STARTUP_COMPANIONS = (ds4.Eviction, ds4.DiskError, ds4.StoreSkipped)
"""Lines a starting server may print between its startup lines (B trims the cache to budget)."""


class _Assembler:
    def __init__(self) -> None:
        self.runs: list[Run] = []
        self.requests: list[Ds4Request] = []
        self.open: list[Ds4Request] = []
        self.blocks: list[_Block] = []
        self.in_startup = False
        self.last_store_sink: object | None = None  # where the last store of this stretch went
        self.evict_wait: list[ds4.Eviction] = []

    @property
    def run(self) -> Run:
        if not self.runs:
            self.runs.append(Run(index=0))
        return self.runs[-1]

    def feed(self, ev: ds4.Event) -> None:
        if isinstance(ev, ds4.STARTUP_KINDS):
            if not self.in_startup and (len(self.runs) > 0 or self.requests):
                self._end_run()
                self.runs.append(Run(index=len(self.runs)))
            self.in_startup = True
            self._boundary()
            self.run.startup.append(ev)
        elif not isinstance(ev, _STARTUP_COMPANIONS):
            self.in_startup = False
        run = self.run
        run.events.append(ev)
        if ev.t is not None:
            run.t_first = ev.t if run.t_first is None else run.t_first
            run.t_last = ev.t
        handler = getattr(self, "_on_" + ev.kind, None)
        if handler is not None:
            handler(ev)

    def done(self) -> Assembly:
        self._end_run()
        return Assembly(runs=self.runs, requests=self.requests)

    # -- helpers -------------------------------------------------------------------------------

    def _end_run(self) -> None:
        self._boundary()
        for block in self.blocks:
            self.run.orphans.extend(block.events)
        self.blocks = []
        self.open = []

    def _boundary(self) -> None:
        """End of a stretch of lines: evictions still waiting for a store stay with the last one."""
        sink = self.last_store_sink if self.last_store_sink is not None else self.run
        for e in self.evict_wait:
            sink.add(e)  # type: ignore[attr-defined]
        self.evict_wait = []
        self.last_store_sink = None

    def _by_span(self, ev: ds4.SpanEvent) -> Ds4Request | None:
        for r in reversed(self.open):
            if r.span == (ev.cached, ev.prompt, ev.todo) and r.api == ev.api:
                return r
        return None

    def _decision_block(self, start_new: bool) -> _Block:
        if start_new or not self.blocks:
            self.blocks.append(_Block())
        return self.blocks[-1]

    # -- handlers ------------------------------------------------------------------------------

    def _new_request(self, ev: ds4.PromptStart | ds4.Finish, **extra: Any) -> Ds4Request:
        """A log request from the span line that opens (or, cut off by the log's start, closes) it."""
        return Ds4Request(
            index=len(self.requests),
            run=self.run.index,
            api=ev.api,
            cached=ev.cached,
            prompt=ev.prompt,
            todo=ev.todo,
            flags=ev.flags,
            line=ev.line,
            t=ev.t,
            **extra,
        )

    def _on_prompt_start(self, ev: ds4.PromptStart) -> None:
        self._boundary()
        r = self._new_request(ev, pos=ev.cached)
        if self.run.sessions <= 1:
            for block in self.blocks:
                for e in block.events:
                    r.add(e)
            self.blocks = []
        else:
            for i, block in enumerate(self.blocks):
                if block.fits(r):
                    for e in block.events:
                        r.add(e)
                    del self.blocks[i]
                    break
            for block in self.blocks:
                block.waited += 1
            for block in [b for b in self.blocks if b.waited > _MAX_WAIT]:
                self.run.orphans.extend(block.events)
                self.blocks.remove(block)
        self.requests.append(r)
        self.open.append(r)

    def _on_finish(self, ev: ds4.Finish) -> None:
        self._boundary()
        r = self._by_span(ev)
        if r is None:  # started before the log begins
            r = self._new_request(ev)
            self.requests.append(r)
        else:
            self.open.remove(r)
        r.finish = ev
        r.flags = r.flags | ev.flags

    def _on_prompt_done(self, ev: ds4.PromptDone) -> None:
        if r := self._by_span(ev):
            r.prompt_done_s = ev.seconds
            r.pos = r.prompt

    def _on_prefill_progress(self, ev: ds4.PrefillProgress) -> None:
        if r := self._by_span(ev):
            r.pos = r.cached + ev.done

    def _on_request_abort(self, ev: ds4.RequestAbort) -> None:
        if r := self._by_span(ev):
            r.abort = ev.cause

    def _on_decoding(self, ev: ds4.Decoding) -> None:
        # The decode span is absolute positions; its start is the prompt's end (or, in builds that
        # print the request's own start, the cached prefix with an end past the prompt).
        match = [r for r in self.open if r.prompt == ev.cached and r.api == ev.api]
        if not match:
            match = [
                r for r in self.open if r.cached == ev.cached and ev.prompt >= r.prompt and r.api == ev.api
            ]
        if not match and len(self.open) == 1:
            match = self.open
        if match:
            match[-1].decode = ev
            match[-1].pos = ev.prompt

    def _on_tool_calls(self, ev: ds4.ToolCalls) -> None:
        match = [r for r in self.open if r.span == (ev.cached, ev.prompt, ev.todo)] or self.open[-1:]
        if match:
            match[-1].tool_calls = ev.n

    def _on_live_miss(self, ev: ds4.LiveMiss) -> None:
        self._decision_block(start_new=True).add(ev)

    def _on_disk_hit(self, ev: ds4.DiskHit) -> None:
        current = self.blocks[-1] if self.blocks else None
        new = (
            current is None
            or current.get(ds4.DiskHit) is not None
            or current.get(ds4.Continuation) is not None
        )
        self._decision_block(start_new=new).add(ev)

    def _on_continuation(self, ev: ds4.Continuation) -> None:
        current = self.blocks[-1] if self.blocks else None
        new = current is None or current.get(ds4.Continuation) is not None
        self._decision_block(start_new=new).add(ev)

    def _on_store(self, ev: ds4.Store) -> None:
        sink: object
        if ev.reason == "evict" and self.blocks:
            sink = self.blocks[-1]
        elif ev.reason in ("cold", "continued"):
            sink = self._store_owner(ev) or self.run
        else:
            sink = self.run
        sink.add(ev)  # type: ignore[attr-defined]
        for e in self.evict_wait:
            sink.add(e)  # type: ignore[attr-defined]
        self.evict_wait = []
        self.last_store_sink = sink

    def _store_owner(self, ev: ds4.Store) -> Ds4Request | None:
        """With one request in flight it is that one; with several, the one whose numbers fit:
        a cold cut of its prompt (whole prompt, or (P - trim) rounded down to the alignment),
        or a continued save at the position its prefill or decode just reached."""
        tokens = ev.tokens or 0
        if ev.reason == "cold":
            cands = [r for r in self.open if r.cached == 0 and tokens <= r.prompt]
            settings = self.run.settings
            trim = int(settings.get("kv_cache_boundary_trim_tokens", 32))  # type: ignore[call-overload]
            align = int(settings.get("kv_cache_boundary_align_tokens", 2048))  # type: ignore[call-overload]
            exact = [r for r in cands if tokens in (r.prompt, _cold_cut(r.prompt, trim, align))]
            cands = exact or cands
        else:
            cands = sorted(
                (r for r in self.open if tokens > r.cached), key=lambda r: abs(r.pos - tokens), reverse=True
            )
        return (cands or self.open or [None])[-1]

    def _on_eviction(self, ev: ds4.Eviction) -> None:
        if self.last_store_sink is not None:
            self.last_store_sink.add(ev)  # type: ignore[attr-defined]
        else:
            self.evict_wait.append(ev)


def assemble(events: Iterable[ds4.Event]) -> Assembly:
    a = _Assembler()
    for ev in events:
        a.feed(ev)
    return a.done()
