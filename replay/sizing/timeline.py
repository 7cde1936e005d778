"""A trace's requests sent as a replay plan sends them, walked on the event-loop model in
modelled time (compiled: the per-request path of a timed, closed-loop or overlapping sweep).

When a request may go depends on the plan: `alternate` sends one at a time in order; `overlap`
up to K at once, each as soon as the replies its history carries are back; `timed` at its trace
time, or later if those replies are late; `closed-loop` at its previous reply's end plus its
recorded tool time. The last three make which request the server sees next depend on how long
the server took, so the budget changes the order, and only a walk in modelled time gives what
`replay run --target sim` gives. The rules here are the engine's own (`replay.engine.plans`
and `Engine._one`: the dependency wait, the due time, the in-flight cap taken in FIFO order,
the lookahead window), restated for modelled time because sizing may not import the engine;
tests/sizing/test_timeline.py holds the two to the same release times.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from replay.metrics.switch import Switch, SwitchTracker
from replay.sim.model import events as ev
from replay.sim.model.checkpoint import Checkpoint
from replay.sim.model.config import SimConfig
from replay.sim.model.engine import CacheModel
from replay.sim.model.job import Job

PLANS: tuple[str, ...] = ("alternate", "overlap", "timed", "closed-loop")
# The engine's `lookahead` default: requests started (waiting for their turn) at most.
LOOKAHEAD = 4096


@dataclass(init=False, slots=True)
class Scheduled:
    """A job and what a plan needs to know to send it: its trace time, the requests whose
    replies it carries (and its recorded `after`), the tool time after them, whether it
    rewrites its history (a compaction, for the switch classes) and its trace tag."""

    t: float
    job: Job
    deps: tuple[int, ...]
    delay_s: float
    compaction: bool
    tag: str

    def __init__(
        self,
        t: float,
        job: Job,
        deps: tuple[int, ...] = (),
        delay_s: float = 0.0,
        compaction: bool = False,
        tag: str = "turn",
    ) -> None:
        self.t = t
        self.job = job
        self.deps = deps
        self.delay_s = delay_s
        self.compaction = compaction
        self.tag = tag


@dataclass(frozen=True, slots=True)
class Schedule:
    """A replay plan as `replay run` takes it: name, speed (trace seconds per modelled second),
    in-flight cap (`overlap`'s K, or an optional cap on `timed`/`closed-loop`), round robin."""

    plan: str = "alternate"
    speed: float = 1.0
    concurrency: int | None = None
    round_robin: bool = False
    lookahead: int = LOOKAHEAD

    def __post_init__(self) -> None:
        if self.plan not in PLANS:
            raise ValueError(f"unknown plan {self.plan!r} (expected one of {', '.join(PLANS)})")
        if not self.speed > 0:
            raise ValueError("speed must be greater than 0")

    @property
    def capacity(self) -> int | None:
        if self.plan == "alternate":
            return 1
        if self.plan == "overlap":
            return self.concurrency or 2
        return self.concurrency

    @property
    def one_at_a_time(self) -> bool:
        """Whether each request is sent only once the one before it in trace order is done:
        then the order cannot depend on modelled time (the sequential walk serves it)."""
        return self.plan == "alternate" and not self.round_robin

    def order(self, entries: Sequence[Scheduled]) -> list[Scheduled]:
        """The engine's dispatch order (`Plan.order`)."""
        if self.plan == "timed":
            return sorted(entries, key=lambda e: (e.t, e.job.id))
        if self.plan == "alternate" and self.round_robin:
            queues: dict[str | None, deque[Scheduled]] = {}
            for e in entries:
                queues.setdefault(e.job.session, deque()).append(e)
            out: list[Scheduled] = []
            while queues:
                for sid in list(queues):
                    out.append(queues[sid].popleft())
                    if not queues[sid]:
                        del queues[sid]
            return out
        return list(entries)

    def waits_for(self, entry: Scheduled, prev: Scheduled | None) -> tuple[int, ...]:
        """`Plan.waits_for`: the replies a request carries; `alternate` waits for the one before too."""
        if self.plan != "alternate" or prev is None or prev.job.id in entry.deps:
            return entry.deps
        return (*entry.deps, prev.job.id)

    def release(self, entry: Scheduled, deps_done: float, origin: float) -> float:
        """`Plan.release_ns`: when the request is due once its deps are done, in modelled seconds
        since `origin`. Reckoned on the engine's clock (trace time over speed) in its whole
        nanoseconds, as `Plan.release_ns` does: the model steps in fixed times, so a request a
        nanosecond later can miss a decode step (a closed-loop reply came 0.025 s later)."""
        base = origin / self.speed
        deps_ns = round((deps_done + base) * 1e9)
        if self.plan == "timed":
            due_ns = max(int(entry.t / self.speed * 1e9), deps_ns)
        elif self.plan == "closed-loop" and not entry.deps:
            due_ns = int(entry.t / self.speed * 1e9)
        elif self.plan == "closed-loop":
            due_ns = deps_ns + int(entry.delay_s / self.speed * 1e9)
        else:
            due_ns = deps_ns
        return due_ns / 1e9 - base


@dataclass(init=False, slots=True)
class Sent:
    """A request leaving the client at modelled time `t`, with its switch classes."""

    t: float
    entry: Scheduled
    switch: Switch

    def __init__(self, t: float, entry: Scheduled, switch: Switch) -> None:
        self.t = t
        self.entry = entry
        self.switch = switch


class Timeline:
    """Send `entries` as `schedule` would, to one `CacheModel`; iterating yields what happens
    in modelled time: each `Sent` just before the model gets the request, then the model's
    events (`model` is there to read afterwards: its disk's peak, say).

    Modelled time 0 is the trace time `origin` (default: the earliest request's), so files on
    disk before the first request (`checkpoints`, last used at negative times) keep their ages.
    A request whose dependency is not in `entries` waits for nothing.
    """

    def __init__(
        self,
        entries: Sequence[Scheduled],
        cfg: SimConfig,
        schedule: Schedule,
        checkpoints: Iterable[Checkpoint] = (),
        origin: float | None = None,
    ) -> None:
        self._walker = _Walker(entries, cfg, schedule, checkpoints, origin)
        self.model = self._walker.model

    def __iter__(self) -> Iterator[Sent | ev.Event]:
        yield from self.model.startup()
        yield from self._walker.run()


class _Walker:
    """The client side of `walk`: who waits for whom, what is due when, the in-flight cap."""

    def __init__(
        self,
        entries: Sequence[Scheduled],
        cfg: SimConfig,
        schedule: Schedule,
        checkpoints: Iterable[Checkpoint],
        origin: float | None,
    ) -> None:
        self.schedule = schedule
        self.order = order = schedule.order(entries)
        self.origin = min((e.t for e in order), default=0.0) if origin is None else origin
        self.model = CacheModel(cfg, checkpoints, progress=False)
        self.index_of = {e.job.id: i for i, e in enumerate(order)}
        self.waiting_on: list[tuple[int, ...]] = []
        self.dependents: dict[int, list[int]] = {}
        for i, e in enumerate(order):
            prev = order[i - 1] if i else None
            deps = tuple(d for d in schedule.waits_for(e, prev) if d in self.index_of)
            self.waiting_on.append(deps)
            for d in deps:
                self.dependents.setdefault(d, []).append(i)
        self.left = [len(deps) for deps in self.waiting_on]
        self.done_at: dict[int, float] = {}
        self.capacity = schedule.capacity
        self.in_flight = 0
        self.held: deque[int] = deque()  # due, waiting for a place under the cap (FIFO)
        self.due: list[tuple[float, int]] = []  # (due time, order index) of started requests
        self.started = 0  # requests started in order (the engine's lookahead window)
        self.open = 0  # started and not finished
        self.tracker = SwitchTracker()

    def run(self) -> Iterator[Sent | ev.Event]:
        model = self.model
        self._start_more(0.0)
        while True:
            t_model = model.next_time()
            if self.due and (t_model is None or self.due[0][0] <= t_model):
                t, i = heapq.heappop(self.due)
                if self.capacity is not None and self.in_flight >= self.capacity:
                    self.held.append(i)
                    continue
                yield from self._send(i, t)
                continue
            if t_model is None:
                break
            yield from self._handle(model.advance(t_model))
        if self.started < len(self.order) or self.held:
            raise RuntimeError("a request waits for a reply that never comes (a dependency cycle)")

    def _send(self, i: int, t: float) -> Iterator[Sent | ev.Event]:
        entry = self.order[i]
        self.in_flight += 1
        yield Sent(t, entry, self.tracker.on_send(entry.job.session, entry.compaction))
        self.model.submit(entry.job, t)
        yield from self._handle(self.model.drain())

    def _handle(self, events: list[ev.Event]) -> Iterator[Sent | ev.Event]:
        for event in events:
            yield event
            if isinstance(event, ev.Finished):
                yield from self._finished(event.job_id, event.t)

    def _finished(self, job_id: int, t: float) -> Iterator[Sent | ev.Event]:
        """A reply is done at `t`: the requests waiting on it may become due, and a place and
        a window slot are free."""
        self.done_at[job_id] = t
        self.tracker.on_done()
        self.in_flight -= 1
        self.open -= 1
        for j in self.dependents.get(job_id, ()):
            self.left[j] -= 1
            if self.left[j] == 0 and j < self.started:
                self._due(j, t)
        self._start_more(t)
        while self.held and (self.capacity is None or self.in_flight < self.capacity):
            yield from self._send(self.held.popleft(), t)

    def _start_more(self, t: float) -> None:
        while self.started < len(self.order) and self.open < self.schedule.lookahead:
            i = self.started
            self.started += 1
            self.open += 1
            if self.left[i] == 0:
                self._due(i, t)

    def _due(self, i: int, now: float) -> None:
        """Its deps are done (and it has started): it is due at the plan's release time, or now
        if that is past (the engine sends a late request at once)."""
        deps_done = max((self.done_at[d] for d in self.waiting_on[i]), default=0.0)
        release = self.schedule.release(self.order[i], deps_done, self.origin)
        heapq.heappush(self.due, (max(now, release), i))
