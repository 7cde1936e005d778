"""A results file as the report sees it (`RunView`): every request with its phases in seconds, and
the disk events of the server log.

Phases are the simulator's modelled seconds when the results carry them (`modelled`, placed on the
simulator's clock: send time x time scale), else the measured ones (queue + prefill from the server
log's `prompt done` when the log was correlated, TTFT otherwise). The page, its plots and the
verdict all read these views; none of them imports another's module for them.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from replay.metrics.hist import Summary
from replay.metrics.results import RunResults, read_results, time_scale


@dataclass(slots=True)
class RequestView:
    """One request as the report draws it; phase lengths in seconds of the run's clock."""

    seq: int
    id: int
    session: str
    tag: str
    switch: tuple[str, ...]
    status: str
    start: float
    queue: float
    io: float
    prefill: float
    decode: float
    prompt: int
    cached: int
    reprocessed: int
    output: int
    restored: int = 0
    cache_source: str | None = None
    backend: str | None = None  # which of several targets served it (results version 2)

    @property
    def end(self) -> float:
        return self.start + self.queue + self.io + self.prefill + self.decode

    @property
    def ttft(self) -> float:
        """Submit to first token: queue, disk work and prefill."""
        return self.queue + self.io + self.prefill

    @property
    def decode_rate(self) -> float | None:
        return self.output / self.decode if self.output > 1 and self.decode > 0 else None

    @property
    def prefill_rate(self) -> float | None:
        return self.reprocessed / self.prefill if self.reprocessed > 0 and self.prefill > 0 else None


@dataclass(slots=True)
class DiskPoint:
    """The server's cache after one event: disk KV files (ds4, the simulator) or, for llama-server,
    the host-RAM prompt cache (`--cache-ram`)."""

    t: float
    used_mib: float
    event: str  # store | evict | restore | host_cache_state (the server's own figure)
    tokens: int
    hits: int | None = None
    reason: str | None = None
    line: int | None = None  # of the server log


@dataclass(slots=True)
class RunView:
    path: str
    label: str
    clock: str  # "modelled" | "measured"
    requests: list[RequestView]
    disk: list[DiskPoint]
    summary: Summary
    budget_mib: float | None
    server: list[dict[str, Any]] = field(default_factory=list)
    header: dict[str, Any] = field(default_factory=dict)
    cache: str = "disk"  # what `disk` follows: "disk" (KV files) or "host" (llama-server's --cache-ram)

    @property
    def clock_start(self) -> float | None:
        """Seconds after midnight at the trace's t=0, when the trace carries its wall clock."""
        start = (self.header.get("trace") or {}).get("start")
        if not isinstance(start, str):
            return None
        try:
            moment = datetime.fromisoformat(start) if "T" in start else datetime.strptime(start, "%H:%M")
        except ValueError:
            return None
        return float(moment.hour * 3600 + moment.minute * 60 + moment.second)

    @property
    def time_scale(self) -> float | None:
        """How much faster than modelled time the simulator ran (None for a real server)."""
        return time_scale(self.header) if self.clock == "modelled" else None

    @property
    def sessions(self) -> list[str]:
        return list(dict.fromkeys(r.session for r in sorted(self.requests, key=lambda r: r.start)))

    def decode_bands(self, width: int) -> dict[int, float]:
        """Median decode rate per depth band (band index -> tok/s)."""
        bands: dict[int, list[float]] = {}
        for r in self.requests:
            if r.decode_rate is not None and r.status == "ok":
                bands.setdefault(r.prompt // width, []).append(r.decode_rate)
        return {b: statistics.median(v) for b, v in bands.items()}


# --- building views --------------------------------------------------------------------------


def run_label(res: RunResults) -> str:
    """An arm's name, or the file's name without `.jsonl` (and `.results`)."""
    target = res.run.get("target") or {}
    if target.get("arm"):
        return str(target["arm"])
    return Path(res.path).name.removesuffix(".jsonl").removesuffix(".results")


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def _requests(res: RunResults) -> tuple[list[RequestView], str]:
    recs = [r for r in res.requests if r.get("status") != "cancelled"]
    modelled = bool(recs) and all(
        isinstance(r.get("modelled"), dict) for r in recs if r.get("status") == "ok"
    )
    scale = time_scale(res.run) if modelled else None
    server_req = {s.get("request_seq"): s for s in res.server if s.get("event") == "request"}
    restored = {
        s.get("request_seq"): _int(s.get("tokens")) for s in res.server if s.get("event") == "restore"
    }
    clock = _ModelledClock(scale) if modelled else None
    views: list[RequestView] = []
    for rec in sorted(recs, key=lambda r: (r.get("sent_s") or 0.0, r.get("seq") or 0)):
        m = rec.get("modelled") if modelled else None
        sent = float(rec.get("sent_s") or 0.0)
        ttft = float(rec.get("ttft_s") or 0.0)
        latency = float(rec.get("latency_s") or ttft)
        if m and clock is not None:
            queue = float(m.get("queue_s") or 0.0)
            io = float(m.get("restore_s") or 0.0) + float(m.get("evict_save_s") or 0.0)
            prefill = float(m.get("prefill_s") or 0.0)
            decode = float(m.get("decode_s") or 0.0)
            start = clock.place(rec, queue + io + prefill + decode)
        else:
            done = server_req.get(rec.get("seq"), {}).get("prompt_done_s")
            prefill = min(float(done), ttft) if isinstance(done, int | float) else ttft
            queue, io = max(0.0, ttft - prefill), 0.0
            decode = max(0.0, latency - ttft)
            start = sent
        views.append(
            RequestView(
                seq=_int(rec.get("seq")),
                id=_int(rec.get("id")),
                session=str(rec.get("session")),
                tag=str(rec.get("tag") or ""),
                switch=tuple(rec.get("switch") or ()),
                status=str(rec.get("status") or ""),
                start=start,
                queue=queue,
                io=io,
                prefill=prefill,
                decode=decode,
                prompt=_int(rec.get("prompt_tokens")),
                cached=_int(rec.get("cached_tokens")),
                reprocessed=_int(rec.get("reprocessed_tokens")),
                output=_int(rec.get("output_tokens")),
                restored=restored.get(rec.get("seq"), 0),
                cache_source=(m or {}).get("cache_source"),
                backend=rec.get("backend") if isinstance(rec.get("backend"), str) else None,
            )
        )
    return views, "modelled" if modelled else "measured"


class _ModelledClock:
    """Places requests on the simulator's clock (send time x time scale) without the client's overhead.

    Under a time scale of 1000, 50 ms the client spends building a 100K-token request become 50
    modelled seconds in which the simulated server sat idle. Positions inside a busy period are
    kept exactly (they are the simulator's own clock); an idle gap is cut down to what the plan
    meant it to be (the time between the previous reply and the request's scheduled send). With no
    time scale known, requests are laid end to end in send order.
    """

    def __init__(self, scale: float | None) -> None:
        self.scale = scale
        self.shift = 0.0
        self.busy_until = 0.0  # on the raw clock
        self.last_done = 0.0  # wall seconds: latest reply seen so far
        self.cursor = 0.0

    def place(self, rec: dict[str, Any], total: float) -> float:
        sent = float(rec.get("sent_s") or 0.0)
        scheduled = float(rec.get("scheduled_s") if rec.get("scheduled_s") is not None else sent)
        latency = float(rec.get("latency_s") or 0.0)
        if self.scale is None:
            start = self.cursor
            self.cursor += total
        else:
            raw = sent * self.scale
            if raw > self.busy_until:
                intended = max(0.0, scheduled - self.last_done) * self.scale
                self.shift += max(0.0, (raw - self.busy_until) - intended)
            start = raw - self.shift
            self.busy_until = max(self.busy_until, raw + total)
        self.last_done = max(self.last_done, sent + latency)
        return start


HOST = "host_cache"


def is_host_cache(rec: dict[str, Any]) -> bool:
    """A record about llama-server's host-RAM prompt cache (store, restore, eviction, state)."""
    return HOST in (str(rec.get("reason") or ""), str(rec.get("source") or "")) or str(
        rec.get("reason") or ""
    ).startswith(HOST + "_")


def disk_at_start(header: dict[str, Any]) -> float:
    """MiB of disk KV already on disk when the run started (a scenario's earlier day: its
    `[[leftovers]]`), so the strip's line and its evictions of those files agree."""
    value = (header.get("target") or {}).get("disk_at_start_mib")
    return float(value) if isinstance(value, int | float) and value > 0 else 0.0


def cache_kind(res: RunResults) -> str:
    """`host` when the server's log speaks of a host-RAM prompt cache (llama-server), else `disk`."""
    return "host" if any(is_host_cache(s) for s in res.server) else "disk"


def _disk(res: RunResults, requests: list[RequestView], kind: str) -> list[DiskPoint]:
    """Cache in use after each store/evict/restore, placed inside the request that caused it.

    Disk KV (ds4, the simulator): a store adds its file, an eviction removes one, a restore reads
    one and leaves it. Host memory (llama-server's `--cache-ram`, ``kind == "host"``): a save adds
    its entry, an eviction removes one, and a restore takes the entry it loads out of the cache
    (`server_prompt_cache::load` erases it); the context checkpoints of a slot are not in it.

    The log has no usable clock under a time scale (and only whole seconds otherwise), so each
    event is placed by order: the events of one request are spread over its queue, disk and
    prefill phases in log order; events no request owns (shutdown saves) go at the end.
    """
    by_seq = {r.seq: r for r in requests}
    events = [s for s in res.server if s.get("event") in ("store", "evict", "restore")]
    if kind == "host":
        # The server's own `cache state` lines put the level back on its figure: sizes in the log
        # are rounded, and a long run would otherwise drift by their rounding.
        events = [s for s in res.server if is_host_cache(s) or s.get("event") == "host_cache_state"]
        events = [s for s in events if s.get("event") in ("store", "evict", "restore", "host_cache_state")]
    events.sort(key=lambda s: _int(s.get("line")))
    owned: dict[Any, list[dict[str, Any]]] = {}
    for s in events:
        owned.setdefault(s.get("request_seq"), []).append(s)
    end = max((r.end for r in requests), default=0.0)
    times: dict[int, float] = {}
    for seq, group in owned.items():
        req = by_seq.get(seq)
        for i, s in enumerate(group):
            if req is None:
                times[id(s)] = end
            else:
                span = req.queue + req.io + req.prefill + req.decode
                times[id(s)] = req.start + req.queue + span * (i + 1) / (len(group) + 1)
    used = disk_at_start(res.run) if kind == "disk" else 0.0
    out: list[DiskPoint] = []
    for s in sorted(events, key=lambda s: (times[id(s)], _int(s.get("line")))):
        # A host-cache save makes an entry of its state and the slot's checkpoints (`entry_mib`).
        mib = float(s.get("entry_mib") or s.get("mib") or 0.0)
        event = str(s.get("event"))
        if event == "store":
            used += mib
        elif event == "evict" or (event == "restore" and s.get("taken")):
            used = max(0.0, used - mib)
        elif event == "host_cache_state":
            used = mib
        hits = s.get("hits")
        out.append(
            DiskPoint(
                times[id(s)],
                used,
                event,
                _int(s.get("tokens")),
                _int(hits) if hits is not None else None,
                s.get("reason"),
                _int(s.get("line")) or None,
            )
        )
    return out


def figures_from(run: RunView) -> str:
    """Which walker produced the run's figures: `replay size sweep` and `scenario check` walk the
    cache model in process in modelled time; `replay sim serve` runs the same rules on a wall
    clock, so the two can place a closed-loop request differently; a real server is measured."""
    kind = (run.header.get("target") or {}).get("kind")
    if kind == "model":
        return "the in-process walk in modelled time (what `replay size sweep` and `scenario check` walk)"
    if kind == "sim":
        how = "its modelled seconds" if run.clock == "modelled" else "measured here"
        return (
            f"the simulator (`replay sim serve`, the event-loop model on a wall clock; {how}); "
            "`replay size sweep` walks the same rules in modelled time and can differ on closed-loop plans"
        )
    return f"measured on the server ({kind or 'unknown kind'})"


# Reads `server` records for results that carry none (`serverside.logs.records_beside`: the log
# left beside old results); handed in by the caller, since parsing logs is the runs' business.
ServerLog = Callable[[RunResults], list[dict[str, Any]]]


def load_run(path: str | Path, server_log: ServerLog | None = None) -> RunView:
    res = read_results(path)
    if not res.server and server_log is not None:
        res.server = server_log(res)
    requests, clock = _requests(res)
    effective = (res.run.get("target") or {}).get("effective") or {}
    kind = cache_kind(res)
    budget = effective.get("cache_ram_mib" if kind == "host" else "kv_disk_budget_mib")
    return RunView(
        path=str(path),
        label=run_label(res),
        clock=clock,
        requests=requests,
        disk=_disk(res, requests, kind),
        summary=res.summary,
        budget_mib=float(budget) if isinstance(budget, int | float) and budget > 0 else None,
        server=res.server,
        header=res.run,
        cache=kind,
    )
