"""Runs the pure cache model against the wall clock for the HTTP server.

Virtual time is wall time since start (`replay.clock`: a test may put a fake clock behind it)
multiplied by `--time-scale`; a driver task advances the model to "now" whenever its next event
is due (or a job arrives), writes ds4 log lines and placeholder files for the events, and hands
each job's events to the request that submitted it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TextIO

from replay import clock as _clock
from replay.sim.model import events as ev
from replay.sim.model.config import SimConfig
from replay.sim.model.engine import CacheModel
from replay.sim.model.job import Job
from replay.sim.model.tokenizer import cache_fill
from replay.sim.server import log as simlog
from replay.sim.server.files import CheckpointFiles

STREAM_POLL_S = 0.02


def _wall() -> float:
    return _clock.wall()  # read at call time: a test's fake clock is installed later


class LogSink:
    """ds4-format lines to a text stream, flushed per line (drivers tail the file), stamped by
    `clock` (the modelled time as an epoch, once a runtime sets it; the wall clock before)."""

    def __init__(self, stream: TextIO, utc_offset_s: float | None = None) -> None:
        self.stream = stream
        self.utc_offset_s = utc_offset_s
        self.clock: Callable[[], float] = _wall

    def write(self, message: str) -> None:
        self.stream.write(simlog.line(message, self.clock(), self.utc_offset_s) + "\n")
        self.stream.flush()


class JobHandle:
    """One submitted job's events, in order, ending with its `Finished` event."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.queue: asyncio.Queue[ev.Event] = asyncio.Queue()
        self.result: ev.Result | None = None

    async def events(self) -> AsyncIterator[ev.Event]:
        while True:
            event = await self.queue.get()
            yield event
            if isinstance(event, ev.Finished):
                return


@dataclass
class Stats:
    """Process-wide counters in the shape of ds4's C-era `/stats`."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    last_prefill_tps: float = 0.0
    last_decode_tps: float = 0.0
    cache: dict[str, int] = field(
        default_factory=lambda: {
            "hits": 0,
            "cold": 0,
            "memory_token": 0,
            "memory_text": 0,
            "responses_visible": 0,
            "responses_tool_output": 0,
            "anthropic_tool_output": 0,
            "thinking_visible": 0,
            "tool_visible": 0,
            "disk_text": 0,
        }
    )

    def add(self, r: ev.Result) -> None:
        self.requests += 1
        self.prompt_tokens += r.prompt_tokens
        self.cached_tokens += r.cached_tokens
        self.generated_tokens += r.completion_tokens
        if r.prefill_s > 0 and r.reprocessed_tokens:
            self.last_prefill_tps = r.reprocessed_tokens / r.prefill_s
        if r.decode_s > 0 and r.completion_tokens:
            self.last_decode_tps = r.completion_tokens / r.decode_s
        key = r.cache_source.replace("-", "_")
        if r.cache_source == "none":
            self.cache["cold"] += 1
        elif key in self.cache:
            self.cache[key] += 1
            self.cache["hits"] += 1


class SimRuntime:
    def __init__(
        self,
        cfg: SimConfig,
        *,
        kv_dir: str | None,
        time_scale: float,
        log: LogSink,
        clock: float | None = None,
    ) -> None:
        self.cfg = cfg = cfg.with_(disk=kv_dir is not None)
        self.kv_dir = kv_dir
        self.scale = time_scale
        self.log = log
        self.epoch0 = _clock.wall() if clock is None else clock
        self.t0 = _clock.monotonic()
        # With a clock, modelled time starts with the first request: the report's clock is that
        # request's time, whatever the process start took in wall seconds times the scale.
        self._waiting_first = clock is not None
        log.clock = lambda: self.epoch0 + self.vnow()
        self.files = CheckpointFiles(kv_dir, self.epoch0) if kv_dir else None
        checkpoints, bad = self.files.load() if self.files else ([], [])
        for path, why in bad:
            self.log.write(f"kv cache load failed {path}: {why} load=0.0 ms")
        self.model = CacheModel(cfg, checkpoints)
        self.handles: dict[int, JobHandle] = {}
        self.stats = Stats()
        self._ids = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._shutdown_done = asyncio.Event()
        self.stopping = False

    def vnow(self) -> float:
        if self._waiting_first:
            return 0.0
        return (_clock.monotonic() - self.t0) * self.scale

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    async def start(self) -> None:
        """Print ds4's startup lines (with the startup eviction pass) and start the driver."""
        for message in simlog.startup_lines(self.model.cfg):
            self.log.write(message)
        self._handle(self.model.startup())
        if self.kv_dir:
            self.log.write(simlog.kv_disk_line(self.model.cfg, self.kv_dir))
        self._task = asyncio.create_task(self._drive())

    def arrived(self) -> float:
        """The modelled time a request is in (its body read), before this host parses and
        tokenizes it, work the modelled server does not spend; the first starts the clock."""
        if self._waiting_first:
            self._waiting_first = False
            self.t0 = _clock.monotonic()
            return 0.0
        return self.vnow()

    def submit(self, job: Job, arrived: float | None = None) -> JobHandle:
        """Hand `job` to the model at `arrived` (`arrived()`), or now; never before what the
        model has already run."""
        handle = JobHandle(job)
        self.handles[job.id] = handle
        if self._waiting_first:
            self._waiting_first = False
            self.t0 = _clock.monotonic()
        now = self.vnow()
        if arrived is not None:
            now = max(min(arrived, now), self.model.now)
        self._handle(self.model.advance(now))
        self.model.submit(job, now)
        self._handle(self.model.drain())
        self._wake.set()
        return handle

    async def shutdown(self) -> None:
        """Drain as ds4 does on the first signal, then write the shutdown checkpoints."""
        if self.stopping:
            return
        self.stopping = True
        self.log.write(simlog.SHUTDOWN_REQUESTED)
        now = self.vnow()
        self._handle(self.model.advance(now))
        self.model.shutdown(now)
        self._handle(self.model.drain())
        self._wake.set()
        await self._shutdown_done.wait()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _drive(self) -> None:
        while True:
            self._handle(self.model.advance(self.vnow()))
            nxt = self.model.next_time()
            timeout = None if nxt is None else max(0.0, (nxt - self.vnow()) / self.scale)
            gpu = self.model.gpu
            if gpu is not None and gpu.kind == "decode":
                timeout = STREAM_POLL_S if timeout is None else min(timeout, STREAM_POLL_S)
            self._wake.clear()
            await _clock.wait(self._wake, timeout)

    def _handle(self, events: list[ev.Event]) -> None:
        for event in events:
            message = simlog.format_event(event, self.model.cfg, self.kv_dir or "")
            if message is not None:
                self.log.write(message)
            self._files(event)
            job_id = getattr(event, "job_id", None)
            if isinstance(event, ev.Finished):
                self.stats.add(event.result)
            if job_id is not None and (handle := self.handles.get(job_id)) is not None:
                if isinstance(event, ev.Finished):
                    handle.result = event.result
                    del self.handles[job_id]
                handle.queue.put_nowait(event)
            if isinstance(event, ev.ShutdownComplete):
                self._shutdown_done.set()

    def _files(self, event: ev.Event) -> None:
        if self.files is None:
            return
        match event:
            case ev.Stored():
                self.files.write(event.checkpoint)
            case ev.Evicted() | ev.Removed():
                self.files.delete(event.checkpoint)
            case ev.DiskHit():
                self.files.update(event.checkpoint)

    def stats_json(self) -> dict[str, object]:
        model = self.model
        disk = model.disk
        return {
            "uptime_s": int(_clock.monotonic() - self.t0),
            "busy": model.busy,
            "queue_depth": len(model.queue),
            "clients": len(self.handles),
            "live_tokens": sum(len(s.seq) for s in model.slots),
            "ctx_size": self.cfg.ctx,
            "requests": self.stats.requests,
            "queue_rejected": 0,
            "queue_dropped_disconnected": 0,
            "prefill_cancelled": 0,
            "prompt_tokens": self.stats.prompt_tokens,
            "cached_tokens": self.stats.cached_tokens,
            "generated_tokens": self.stats.generated_tokens,
            "last_prefill_tps": round(self.stats.last_prefill_tps, 2),
            "last_decode_tps": round(self.stats.last_decode_tps, 2),
            "cache": dict(self.stats.cache),
            "x_sim": {
                "virtual_s": round(self.vnow(), 3),
                "time_scale": self.scale,
                "slots": [
                    {"slot": s.index, "live_tokens": len(s.seq), "phase": s.phase} for s in model.slots
                ],
                "disk_files": len(disk.files) if disk else 0,
                "disk_bytes": disk.total if disk else 0,
                "disk_budget_bytes": disk.budget if disk else 0,
                "tokenizer_cache": cache_fill(),
            },
        }
