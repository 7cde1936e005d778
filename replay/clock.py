"""THE clock the engine and the simulator read: monotonic nanoseconds, the wall clock, a sleep.

Every reading of the time on the engine's path (the request record's stamps, the schedule, the
loop-delay watch, the kernel stamps' offset) and the simulator's (modelled time, the log's epoch,
the driver's wait for the next event) goes through this module's attributes, read at call time:

    clock.now_ns()          # time.perf_counter_ns unless a test installed another clock
    await clock.sleep(s)    # asyncio.sleep
    clock.wall()            # time.time
    await clock.wait(event, timeout_s)   # the event set, or the timeout passed

By default they ARE the standard functions (no wrapper): `clock.now_ns()` costs what
`time.perf_counter_ns()` did (a module attribute and a call), in compiled modules too. A test puts
a clock of its own behind them with `installed(...)` (tests/support/fakeclock.py: time that jumps
over sleeps, so a timing test asserts on modelled time, not on how late a loaded machine woke
it up). `jumps` counts the jumps a clock made, so a cached offset to another clock (the kernel's
wall-clock stamps) is measured again after one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Protocol


async def _wait(event: asyncio.Event, timeout_s: float | None) -> bool:
    """True when `event` was set, False when `timeout_s` passed first."""
    if event.is_set():
        return True
    try:
        await asyncio.wait_for(event.wait(), timeout_s)
    except TimeoutError:
        return False
    return True


now_ns: Callable[[], int] = time.perf_counter_ns
wall: Callable[[], float] = time.time
sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
wait: Callable[[asyncio.Event, float | None], Awaitable[bool]] = _wait
jumps = 0


class Clock(Protocol):
    def now_ns(self) -> int: ...

    def wall(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...

    async def wait(self, event: asyncio.Event, timeout_s: float | None) -> bool: ...


def monotonic() -> float:
    """`now_ns()` in seconds (the simulator's unit)."""
    return now_ns() / 1e9


@contextlib.contextmanager
def installed(clock: Clock) -> Iterator[Clock]:
    """Read the time from `clock` inside the block (this process, every thread); then the system's."""
    global now_ns, wall, sleep, wait
    saved = now_ns, wall, sleep, wait
    now_ns, wall, sleep, wait = clock.now_ns, clock.wall, clock.sleep, clock.wait
    try:
        yield clock
    finally:
        now_ns, wall, sleep, wait = saved


def jumped() -> None:
    """Called by a clock whose time jumped (not by the system's, which only runs)."""
    global jumps
    jumps += 1
