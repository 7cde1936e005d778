"""Plans: in which order requests go out, how many at once, and when each may be sent.

Every plan answers the same three questions for the engine: the dispatch order, which earlier
requests a request must wait for (its `waits_for`), and the moment it is due once those are done
(its `release_ns`, relative to the run's start). A request never goes out before the replies it
carries in its history, whatever the plan.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any, Protocol

from replay.errors import UsageError
from replay.trace.model import Request

_S = 1_000_000_000


def reply_deps(req: Request) -> tuple[int, ...]:
    """Requests whose replies `req` carries in its appended history, plus its recorded `after`
    and the subagents it waited for (`after.waits`)."""
    deps = [m["$reply"] for m in req.append if "$reply" in m]
    after = (req.after or {}).get("request")
    if after is not None and after not in deps:
        deps.append(after)
    for sub in (req.after or {}).get("waits") or ():  # subagents this request waited for
        if sub not in deps:
            deps.append(sub)
    return tuple(deps)


class Plan(Protocol):
    name: str
    capacity: int | None

    def order(self, requests: list[Request]) -> list[Request]: ...

    def waits_for(self, req: Request, prev: Request | None) -> tuple[int, ...]: ...

    def release_ns(self, req: Request, deps_done_ns: int) -> int: ...

    def describe(self) -> dict[str, Any]: ...


@dataclass(slots=True)
class Alternate:
    """One request in flight; sessions in trace order, or taking turns (`round_robin`)."""

    round_robin: bool = False
    name: str = "alternate"
    capacity: int | None = 1

    def order(self, requests: list[Request]) -> list[Request]:
        if not self.round_robin:
            return list(requests)
        queues: dict[str, deque[Request]] = defaultdict(deque)
        for req in requests:
            queues[req.session].append(req)
        out: list[Request] = []
        while queues:
            for sid in list(queues):
                out.append(queues[sid].popleft())
                if not queues[sid]:
                    del queues[sid]
        return out

    def waits_for(self, req: Request, prev: Request | None) -> tuple[int, ...]:
        deps = reply_deps(req)
        return deps if prev is None or prev.id in deps else (*deps, prev.id)

    def release_ns(self, req: Request, deps_done_ns: int) -> int:
        return deps_done_ns

    def describe(self) -> dict[str, Any]:
        return {"plan": self.name, "round_robin": self.round_robin}


@dataclass(slots=True)
class Overlap:
    """Up to K requests in flight, in trace order, each as soon as its history is ready."""

    concurrency: int = 2
    name: str = "overlap"

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise UsageError("--concurrency must be at least 1")

    @property
    def capacity(self) -> int | None:
        return self.concurrency

    def order(self, requests: list[Request]) -> list[Request]:
        return list(requests)

    def waits_for(self, req: Request, prev: Request | None) -> tuple[int, ...]:
        return reply_deps(req)

    def release_ns(self, req: Request, deps_done_ns: int) -> int:
        return deps_done_ns

    def describe(self) -> dict[str, Any]:
        return {"plan": self.name, "concurrency": self.concurrency}


@dataclass(slots=True)
class _Paced:
    """What the time-driven plans share: a speed-up of trace time and an optional in-flight cap."""

    speed: float = 1.0
    concurrency: int | None = None
    name: str = ""

    def __post_init__(self) -> None:
        if self.speed <= 0:
            raise UsageError("--speed must be greater than 0")

    @property
    def capacity(self) -> int | None:
        return self.concurrency

    def waits_for(self, req: Request, prev: Request | None) -> tuple[int, ...]:
        return reply_deps(req)

    def describe(self) -> dict[str, Any]:
        return {"plan": self.name, "speed": self.speed, "concurrency": self.concurrency}

    def _trace_time_ns(self, req: Request) -> int:
        return int(req.t / self.speed * _S)


@dataclass(slots=True)
class Timed(_Paced):
    """Trace timestamps divided by `speed`; a late request is measured from when it was due."""

    name: str = "timed"

    def order(self, requests: list[Request]) -> list[Request]:
        return sorted(requests, key=lambda r: (r.t, r.id))

    def release_ns(self, req: Request, deps_done_ns: int) -> int:
        return max(self._trace_time_ns(req), deps_done_ns)


@dataclass(slots=True)
class ClosedLoop(_Paced):
    """Each session waits for its previous reply plus its recorded tool time (divided by `speed`)."""

    name: str = "closed-loop"

    def order(self, requests: list[Request]) -> list[Request]:
        return list(requests)

    def release_ns(self, req: Request, deps_done_ns: int) -> int:
        if not reply_deps(req):
            return self._trace_time_ns(req)
        delay = float((req.after or {}).get("delay_s") or 0.0)
        return deps_done_ns + int(delay / self.speed * _S)


PLANS = ("alternate", "overlap", "timed", "closed-loop")


def make_plan(
    name: str, concurrency: int | None = None, speed: float = 1.0, round_robin: bool = False
) -> Plan:
    if concurrency is not None and concurrency < 1:
        raise UsageError(f"--concurrency must be at least 1, not {concurrency}")
    if not speed > 0 or speed == float("inf"):
        raise UsageError(f"--speed must be a number greater than 0, not {speed:g}")
    if name == "alternate":
        return Alternate(round_robin=round_robin)
    if name == "overlap":
        return Overlap(concurrency=concurrency or 2)
    if name == "timed":
        return Timed(speed=speed, concurrency=concurrency)
    if name == "closed-loop":
        return ClosedLoop(speed=speed, concurrency=concurrency)
    raise UsageError(f"unknown plan {name!r} (expected one of {', '.join(PLANS)})")
