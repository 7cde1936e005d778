"""A fake clock for timing tests: time stands still while anything can run, and jumps to the next
sleeper's deadline when nothing can (the time-traveller idea of aiperf's tests, written here for
our one clock, `replay.clock`).

    with FakeClock().installed() as fake:
        ...                     # the engine and the simulator read fake.now_ns(), fake.wall()
        fake.advance(1.5)       # a test may move it by hand

`sleep(s)` and `wait(event, s)` register a deadline in modelled time. The event loop is idle when,
for several passes in a row, nothing but our own check is ready to run (no task, no callback, no
socket with data: a socket's data schedules its callback on the next pass); then the earliest
deadline is reached: modelled time jumps to it and its sleeper wakes. So sleepers wake in deadline
order, each at exactly its modelled time, however late a loaded machine would have woken it.

Only for code that runs in this process's asyncio loop (the simulator's runtime, the engine against
an in-process server): a server in another process goes on in wall time, which this clock does not
see. It reads the loop's ready queue (`loop._ready`, asyncio's own loops; not uvloop).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Iterator
from contextlib import contextmanager

from replay import clock

IDLE_PASSES = 3  # passes of the loop with nothing else ready before time may jump
WALL0 = 1_788_237_900.0  # 2026-09-01 04:45 UTC: modelled time 0 on the wall clock


class FakeClock:
    def __init__(self, *, wall0: float = WALL0) -> None:
        self.t_ns = 0
        self.wall0 = wall0
        self._sleepers: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._checking = False

    # The clock's face.
    def now_ns(self) -> int:
        return self.t_ns

    def wall(self) -> float:
        return self.wall0 + self.t_ns / 1e9

    def advance(self, seconds: float) -> None:
        """Move modelled time on by `seconds` (no sleeper wakes until the loop is idle)."""
        assert seconds >= 0, seconds
        self.t_ns += round(seconds * 1e9)
        clock.jumped()

    @contextmanager
    def installed(self) -> Iterator[FakeClock]:
        with clock.installed(self):
            yield self

    # Waiting in modelled time.
    async def sleep(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._add(loop, self.t_ns + max(0, round(seconds * 1e9)), fut)
        try:
            await fut
        finally:
            if not fut.done():
                fut.cancel()  # a cancelled sleeper leaves the queue at the next check

    async def wait(self, event: asyncio.Event, timeout_s: float | None) -> bool:
        if event.is_set():
            return True
        if timeout_s is None:
            await event.wait()
            return True
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._add(loop, self.t_ns + max(0, round(timeout_s * 1e9)), fut)
        waiter = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait({fut, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            if not fut.done():
                fut.cancel()
        return event.is_set()

    # The jump: when the loop has nothing else to run, wake the earliest sleeper.
    def _add(self, loop: asyncio.AbstractEventLoop, deadline: int, fut: asyncio.Future[None]) -> None:
        heapq.heappush(self._sleepers, (deadline, next(self._seq), fut))
        if not self._checking:
            self._checking = True
            loop.call_soon(self._check, loop, IDLE_PASSES)

    def _check(self, loop: asyncio.AbstractEventLoop, passes: int) -> None:
        busy = len(loop._ready) > 0  # type: ignore[attr-defined]
        if busy or passes > 0:
            loop.call_soon(self._check, loop, IDLE_PASSES if busy else passes - 1)
            return
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)  # cancelled
        if not self._sleepers:
            self._checking = False
            return
        deadline, _, fut = heapq.heappop(self._sleepers)
        if deadline > self.t_ns:
            self.t_ns = deadline
            clock.jumped()
        fut.set_result(None)
        loop.call_soon(self._check, loop, IDLE_PASSES)
