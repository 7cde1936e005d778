"""Runs the llama model against the wall clock for the HTTP server.

Modelled time is wall time since the start times `--time-scale`. A driver task advances the model
to "now" whenever its loop's next step is due (or a task arrives), writes the log lines of the
events, and hands each request its own events; slot file actions get their answer the same way.
Slot files are written to and read from `--slot-save-path` (a small JSON file per slot file: the
tokens and state the model needs to restore it, and its modelled size).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TextIO

from replay import clock as _clock
from replay.sim.model.llama import events as ev
from replay.sim.model.llama.config import LlamaConfig
from replay.sim.model.llama.context import SlotFile
from replay.sim.model.llama.engine import LlamaModel
from replay.sim.model.llama.prompt import LlamaJob
from replay.sim.server.llama.log import LlamaLog

STREAM_POLL_S = 0.02


class LineSink:
    """Log lines to a text stream, flushed per line (drivers tail the file)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, lines: list[str]) -> None:
        if lines:
            self.stream.write("\n".join(lines) + "\n")
            self.stream.flush()


class JobHandle:
    """One request's events, in order, ending with its `Finished` event."""

    def __init__(self, job: LlamaJob) -> None:
        self.job = job
        self.queue: asyncio.Queue[ev.Event] = asyncio.Queue()
        self.result: ev.LlamaResult | None = None

    async def events(self) -> AsyncIterator[ev.Event]:
        while True:
            event = await self.queue.get()
            yield event
            if isinstance(event, ev.Finished):
                return


@dataclass
class Counters:
    """`/metrics`' counters (llama-server's `server_metrics`)."""

    prompt_tokens: int = 0
    prompt_cached: int = 0
    prompt_s: float = 0.0
    predicted: int = 0
    predicted_s: float = 0.0
    decodes: int = 0
    n_tokens_max: int = 0

    def add(self, r: ev.LlamaResult, held: int) -> None:
        if r.error is not None:
            return
        self.prompt_tokens += r.prompt_n
        self.prompt_cached += r.cache_n
        self.prompt_s += r.prompt_s
        self.predicted += r.predicted_n
        self.predicted_s += r.predicted_s
        self.decodes += max(0, r.predicted_n)
        self.n_tokens_max = max(self.n_tokens_max, held)


class LlamaRuntime:
    def __init__(self, cfg: LlamaConfig, *, time_scale: float, sink: LineSink, log: LlamaLog) -> None:
        self.cfg = cfg
        self.scale = time_scale
        self.sink = sink
        self.log = log
        self.t0 = _clock.monotonic()
        self.started_unix = int(_clock.wall())
        self.model = LlamaModel(cfg)
        self.handles: dict[int, JobHandle] = {}
        self.actions: dict[int, asyncio.Future[ev.SlotAction]] = {}
        self.counters = Counters()
        self._ids = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.stopping = False

    def vnow(self) -> float:
        return (_clock.monotonic() - self.t0) * self.scale

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    def start(self, model_path: str | None) -> None:
        self.sink.write(self.log.startup(model_path, self.cfg.n_parallel < 0))
        self._task = asyncio.create_task(self._drive())

    def listening(self, host: str, port: int) -> None:
        self.sink.write(self.log.listening(self.vnow(), host, port))

    def submit(self, job: LlamaJob) -> JobHandle:
        handle = JobHandle(job)
        self.handles[job.id] = handle
        now = self.vnow()
        self._handle(self.model.advance(now))
        self.model.submit(job, now)
        self._handle(self.model.drain())
        self._wake.set()
        return handle

    async def slot_action(
        self, slot: int, action: str, filename: str, file: SlotFile | None
    ) -> tuple[ev.SlotAction, SlotFile | None]:
        """Queue a save, restore or erase and wait for the loop to do it."""
        action_id = self.next_id()
        done: asyncio.Future[ev.SlotAction] = asyncio.get_running_loop().create_future()
        self.actions[action_id] = done
        now = self.vnow()
        self._handle(self.model.advance(now))
        self.model.slot_action(action_id, slot, action, filename, file, now)
        self._handle(self.model.drain())
        self._wake.set()
        result = await done
        return result, self.model.saved_file(action_id)

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
            if self.model.tasks:
                timeout = STREAM_POLL_S if timeout is None else min(timeout, STREAM_POLL_S)
            self._wake.clear()
            await _clock.wait(self._wake, timeout)

    def _handle(self, events: list[ev.Event]) -> None:
        busy = self.model.busy
        for event in events:
            self.sink.write(self.log.format(event, busy or not isinstance(event, ev.Finished)))
            if isinstance(event, ev.Finished):
                self.counters.add(event.result, event.n_tokens)
            if isinstance(event, ev.SlotAction):
                fut = self.actions.pop(event.action_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(event)
                continue
            job_id = getattr(event, "job_id", None)
            if job_id is not None and (handle := self.handles.get(job_id)) is not None:
                if isinstance(event, ev.Finished):
                    handle.result = event.result
                    del self.handles[job_id]
                handle.queue.put_nowait(event)

    # --- what the endpoints show ------------------------------------------------------------------

    def slots_json(self) -> list[dict[str, object]]:
        """`/slots`: per slot its id, context, whether it works, its last task and token counts."""
        out: list[dict[str, object]] = []
        for slot in self.model.slots:
            task = self.model.task_of(slot)
            item: dict[str, object] = {
                "id": slot.index,
                "n_ctx": self.cfg.n_ctx_slot,
                "speculative": False,
                "is_processing": slot.busy,
            }
            if slot.task >= 0:
                held = len(slot.tokens) + (max(0, task.gen - 1) if task is not None else 0)
                item.update(
                    id_task=slot.task,
                    n_prompt_tokens=held,
                    n_prompt_tokens_processed=slot.n_prompt_processed if slot.busy else 0,
                    n_prompt_tokens_cache=slot.n_prompt_cached if slot.busy else 0,
                    next_token=[
                        {
                            "has_next_token": slot.busy,
                            "has_new_line": False,
                            "n_remain": -1,
                            "n_decoded": task.gen if task is not None else 0,
                        }
                    ],
                )
            out.append(item)
        return out

    def metrics_text(self) -> str:
        """`/metrics` in llama-server's Prometheus text (`server_task_result_metrics::to_metrics`)."""
        c = self.counters
        busy = sum(1 for s in self.model.slots if s.busy)
        rows = [
            (
                "prompt_tokens_total",
                "counter",
                "Number of prompt tokens processed, excluding cached tokens",
                c.prompt_tokens,
            ),
            (
                "prompt_tokens_cached_total",
                "counter",
                "Number of prompt tokens reused from the cache",
                c.prompt_cached,
            ),
            ("prompt_seconds_total", "counter", "Total time spent processing prompts", round(c.prompt_s, 6)),
            ("tokens_predicted_total", "counter", "Number of generation tokens processed", c.predicted),
            (
                "tokens_predicted_seconds_total",
                "counter",
                "Total time spent generating tokens",
                round(c.predicted_s, 6),
            ),
            (
                "n_decode_total",
                "counter",
                "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
                c.decodes,
            ),
            (
                "n_tokens_max",
                "counter",
                "Largest observed sequence length (prompt + generation)",
                c.n_tokens_max,
            ),
            (
                "prompt_tokens_seconds",
                "gauge",
                "Average prompt throughput in tokens/s",
                round(c.prompt_tokens / c.prompt_s, 2) if c.prompt_s else 0,
            ),
            (
                "predicted_tokens_seconds",
                "gauge",
                "Average generation throughput in tokens/s",
                round(c.predicted / c.predicted_s, 4) if c.predicted_s else 0,
            ),
            ("requests_processing", "gauge", "Number of requests processing", busy),
            ("requests_deferred", "gauge", "Number of requests deferred", len(self.model.queue)),
        ]
        lines: list[str] = []
        for name, kind, help_, value in rows:
            lines += [
                f"# HELP llamacpp:{name} {help_}",
                f"# TYPE llamacpp:{name} {kind}",
                f"llamacpp:{name} {value}",
            ]
        return "\n".join(lines) + "\n"
