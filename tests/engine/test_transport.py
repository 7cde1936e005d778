"""Kernel receive stamps land on the monotonic clock even when a thread switch splits the clock reads."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from types import SimpleNamespace

import httpx
import pytest

from replay import clock
from replay.engine import transport

WALL = 1_700_000_000_000_000_000  # the wall clock minus the monotonic clock, in this fake world


@pytest.fixture(autouse=True)
def measured_afresh() -> None:
    """Each test measures the clock offset with its own clocks, not one kept from before."""
    transport.wall_minus_monotonic.forget()


def fake_clocks(monkeypatch: pytest.MonkeyPatch, mono: list[int], wall: list[int]) -> None:
    """Our clock (`replay.clock.now_ns`) reads `mono`, the kernel's wall clock reads `wall`."""
    mono_it, wall_it = iter(mono), iter(wall)
    monkeypatch.setattr(clock, "now_ns", lambda: next(mono_it))
    monkeypatch.setattr(transport, "time", SimpleNamespace(time_ns=lambda: next(wall_it)))


def scm_timestamp(wall_ns: int) -> list[tuple[int, int, bytes]]:
    sec, nsec = divmod(wall_ns, 1_000_000_000)
    return [(socket.SOL_SOCKET, 35, struct.pack("@ll", sec, nsec))]


@pytest.mark.skipif(transport._SO_TIMESTAMPNS is None, reason="kernel receive stamps are Linux-only")
def test_a_thread_switch_between_clock_reads_does_not_move_the_stamp(monkeypatch: pytest.MonkeyPatch) -> None:
    # The first bracket is split by a 5 ms switch to another thread; the second is tight.
    fake_clocks(
        monkeypatch,
        mono=[100_000, 5_100_100, 5_200_000, 5_200_020],
        wall=[WALL + 5_100_000, WALL + 5_200_010],
    )
    # The packet arrived at monotonic 50 µs and was read at 100 µs.
    assert transport.kernel_stamp(scm_timestamp(WALL + 50_000), now=100_000) == 50_000


def test_the_offset_matches_the_clocks_when_nothing_interrupts(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_clocks(monkeypatch, mono=[7_000, 7_010], wall=[WALL + 7_005])
    assert transport.wall_minus_monotonic() == WALL


def test_a_tight_offset_serves_100_ms_and_a_wide_one_is_measured_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every one of 16 brackets is split by a 1 ms preemption: the best is used but not kept.
    mono, wall = [], []
    for i in range(16):
        t = 1_000_000 + i * 10_000_000
        mono += [t, t + 1_000_000]
        wall.append(WALL + t + 900_000)
    # Then one tight bracket (width 10 ns), kept: two reads 50 ms later take no wall clock.
    t = 200_000_000
    mono += [t, t + 10, t + 50_000_000, t + 99_000_000]
    wall.append(WALL + t + 5)
    fake_clocks(monkeypatch, mono, wall)
    assert transport.wall_minus_monotonic() == WALL + 400_000  # off by the split, once
    assert transport.wall_minus_monotonic() == WALL
    assert transport.wall_minus_monotonic() == WALL
    assert transport.wall_minus_monotonic() == WALL


def test_a_jump_of_our_clock_measures_the_offset_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # A tight offset would serve 100 ms, but a test's fake clock jumped 20 ms in between (say,
    # over a sleep): kept, it would put every kernel stamp 20 ms before its read.
    fake_clocks(
        monkeypatch, mono=[1_000, 1_010, 2_000, 20_002_000, 20_002_010], wall=[WALL + 1_005, WALL + 2_005]
    )
    assert transport.wall_minus_monotonic() == WALL
    clock.jumped()  # the fake clock is now 20 ms ahead of the wall clock's pace
    assert transport.wall_minus_monotonic() == WALL - 20_000_000


def test_a_stamp_after_the_read_or_far_before_it_falls_back_to_the_read_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for packet_wall in (WALL + 200_000, WALL + 100_000 - 61_000_000_000):  # a stepped wall clock
        fake_clocks(monkeypatch, mono=[100_000, 100_010], wall=[WALL + 100_005])
        assert transport.kernel_stamp(scm_timestamp(packet_wall), now=100_000) == 100_000


def test_httpx_streams_read_through_the_stamped_socket_and_split_a_read_keeping_its_stamp() -> None:
    async def main() -> None:
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        stream = transport._StampedStream(ours, asyncio.get_running_loop())
        try:
            before = time.perf_counter_ns()
            theirs.sendall(b"abcdef")
            theirs.shutdown(socket.SHUT_WR)
            assert await stream.read(4, timeout=2) == b"abcd"
            stamp = stream.rx_ns
            assert stamp is not None and before <= stamp <= time.perf_counter_ns()
            assert await stream.read(100, timeout=2) == b"ef"
            assert stream.rx_ns == stamp  # the rest of the same network read
            assert await stream.read(100, timeout=2) == b""
            assert stream.get_extra_info("is_readable")
        finally:
            await stream.aclose()
            theirs.close()

    asyncio.run(main())


def test_the_ca_bundle_is_loaded_at_the_first_https_request_not_by_the_client() -> None:
    transport._tls_context.cache_clear()
    with socket.socket() as closed:  # a port nobody listens on: the https request fails at connect
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]

    async def main() -> None:
        async with transport.make_client(connect_timeout_s=2.0) as client:
            assert transport._tls_context.cache_info().currsize == 0  # a plain-http run never loads it
            with pytest.raises(httpx.ConnectError):
                await client.get(f"https://127.0.0.1:{port}/")
            assert transport._tls_context.cache_info().currsize == 1

    asyncio.run(main())
