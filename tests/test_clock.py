"""The one clock (`replay.clock`) and the tests' fake clock behind it (tests/support/fakeclock.py)."""

from __future__ import annotations

import asyncio
import time

from replay import clock
from tests.support.fakeclock import WALL0, FakeClock


def test_the_system_clock_is_the_standard_functions_themselves() -> None:
    # No wrapper on the hot path: reading the clock costs what time.perf_counter_ns() did.
    assert clock.now_ns is time.perf_counter_ns
    assert clock.wall is time.time
    assert clock.sleep is asyncio.sleep


def test_installed_puts_a_clock_behind_the_module_and_takes_it_away() -> None:
    fake = FakeClock()
    jumps = clock.jumps
    with fake.installed():
        assert clock.now_ns() == 0 and clock.wall() == WALL0
        fake.advance(2.5)
        assert clock.now_ns() == 2_500_000_000 and clock.monotonic() == 2.5
        assert clock.wall() == WALL0 + 2.5
        assert clock.jumps == jumps + 1  # a cached offset to the kernel's clock is measured again
    assert clock.now_ns is time.perf_counter_ns


def test_sleepers_wake_in_deadline_order_each_at_its_modelled_time() -> None:
    woke: list[tuple[str, int]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock.now_ns()))

    async def main() -> None:
        # Registered longest first: a clock that jumped on each sleep would wake `short` at 5 s.
        await asyncio.gather(sleeper("long", 5.0), sleeper("mid", 2.0), sleeper("short", 0.5))
        await clock.sleep(3600.0)  # an hour, at once

    started = time.perf_counter()
    with FakeClock().installed() as fake:
        asyncio.run(main())
        assert fake.now_ns() == 5_000_000_000 + 3600 * 10**9
    assert woke == [("short", 500_000_000), ("mid", 2_000_000_000), ("long", 5_000_000_000)]
    assert time.perf_counter() - started < 30  # an hour and five seconds modelled, not waited


def test_time_stands_still_while_anything_can_run() -> None:
    async def main() -> list[int]:
        seen: list[int] = []

        async def busy() -> None:
            for _ in range(50):  # fifty passes of the loop, each with work ready
                seen.append(clock.now_ns())
                await asyncio.sleep(0)

        await asyncio.gather(busy(), clock.sleep(1.0))
        seen.append(clock.now_ns())
        return seen

    with FakeClock().installed():
        seen = asyncio.run(main())
    assert set(seen[:-1]) == {0} and seen[-1] == 1_000_000_000


def test_wait_returns_on_the_event_or_at_its_timeout_in_modelled_time() -> None:
    async def main() -> tuple[bool, int, bool, int]:
        event = asyncio.Event()
        timed_out = await clock.wait(event, 4.0)
        at_timeout = clock.now_ns()

        async def setter() -> None:
            await clock.sleep(1.0)
            event.set()

        task = asyncio.ensure_future(setter())
        got = await clock.wait(event, 10.0)
        await task
        return timed_out, at_timeout, got, clock.now_ns()

    with FakeClock().installed():
        timed_out, at_timeout, got, at_event = asyncio.run(main())
    assert (timed_out, at_timeout) == (False, 4_000_000_000)
    assert (got, at_event) == (True, 5_000_000_000)
