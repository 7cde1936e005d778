"""The simulator's log is stamped in modelled time, from `--clock` when a scenario gives one.

On the fake clock (tests/support/fakeclock.py): wall seconds pass only when a test says so.
"""

from __future__ import annotations

import asyncio
import io
import time

import pytest

from replay.sim.model.config import config_for
from replay.sim.model.events import Result
from replay.sim.server.options import parse
from replay.sim.server.runtime import LogSink, SimRuntime
from tests.support.fakeclock import FakeClock
from tests.support.sim_workloads import Convo, system_message


def test_clock_flag_gives_the_epoch_and_offset_of_the_first_request() -> None:
    _, opts = parse(["--clock", "2026-09-01T06:45:00+02:00"])
    assert opts.utc_offset_s == 7200.0
    assert opts.clock == 1788237900.0  # 2026-09-01 04:45 UTC
    _, plain = parse([])
    assert plain.clock is None and plain.utc_offset_s is None


def test_log_lines_carry_modelled_time_from_the_first_request() -> None:
    out = io.StringIO()
    sink = LogSink(out, utc_offset_s=0.0)
    cfg = config_for()
    with FakeClock().installed() as fake:
        runtime = SimRuntime(cfg, kv_dir=None, time_scale=3600.0, log=sink, clock=1788245100.0)  # 06:45 UTC
        fake.advance(5.0)  # the process start does not count: modelled time starts with a request
        sink.write("before")
        job = Convo("a", system_message(1_000), 2_000, 1).job(1, cfg, max_tokens=10)
        runtime.submit(job)
        fake.advance(1.0)  # one wall second later, at 3600x: one modelled hour
        sink.write("after")
    lines = out.getvalue().splitlines()  # the request's own lines come between, at 06:45:00
    assert lines[0].startswith("0901 06:45:00 ds4-server: before")
    assert all(line.startswith("0901 06:45:00") for line in lines[1:-1])
    assert lines[-1].startswith("0901 07:45:00") and lines[-1].endswith("after")


def test_without_a_clock_modelled_time_runs_from_the_start() -> None:
    out = io.StringIO()
    sink = LogSink(out)
    with FakeClock().installed() as fake:
        runtime = SimRuntime(config_for(), kv_dir=None, time_scale=7200.0, log=sink)
        assert runtime.epoch0 == fake.wall()  # the start, on the wall clock
        fake.advance(1.0)  # two modelled hours after the start
        sink.write("x")
    (line,) = out.getvalue().splitlines()
    assert line.split()[1] == time.strftime("%H:%M:%S", time.localtime(runtime.epoch0 + 7200.0))


def test_a_prefill_at_time_scale_one_takes_its_modelled_seconds_and_no_wall_seconds() -> None:
    # At --time-scale 1 the runtime's driver waits in wall seconds for each event the model has
    # due; on the fake clock those waits are jumps, each to the model's own next time.
    cfg = config_for()
    job = Convo("a", system_message(20_000), 40_000, 1).job(1, cfg, max_tokens=16)

    async def run() -> tuple[float, Result]:
        runtime = SimRuntime(cfg, kv_dir=None, time_scale=1.0, log=LogSink(io.StringIO()))
        await runtime.start()
        handle = runtime.submit(job)
        while handle.result is None:
            await handle.queue.get()
        await runtime.close()
        return runtime.vnow(), handle.result

    started = time.perf_counter()
    with FakeClock().installed():
        modelled_s, result = asyncio.run(run())
    wall_s = time.perf_counter() - started
    assert result.cache_source == "none" and result.prefill_s > 5.0  # 40K tokens cold: modelled seconds
    # Woken at each event's time (to the nanosecond the clock keeps), not later.
    assert result.total_s - 1e-9 <= modelled_s < result.total_s + 0.001
    assert wall_s < modelled_s / 2


def test_a_request_arrives_when_its_body_is_read_not_after_this_host_tokenizes_it() -> None:
    """The host's parsing and tokenizing (tens of ms for a 90K-token prompt, times the scale)
    take no modelled time: the first request starts the clock when it is read, and a request
    is handed to the model at the time it was read."""
    cfg = config_for()
    with FakeClock().installed() as fake:
        runtime = SimRuntime(
            cfg, kv_dir=None, time_scale=1000.0, log=LogSink(io.StringIO()), clock=1788245100.0
        )
        first = runtime.arrived()
        fake.advance(0.05)  # 50 ms of this host's work before the job is built, at 1000x: 50 s
        runtime.submit(Convo("a", system_message(1_000), 2_000, 1).job(1, cfg, max_tokens=10), first)
        assert first == 0.0 and runtime.model.now == 0.0  # not 50 s after the clock started
        second = runtime.arrived()
        fake.advance(0.05)
        runtime.submit(Convo("b", system_message(1_000), 2_000, 1).job(2, cfg, max_tokens=10), second)
        assert runtime.model.now == second
        assert runtime.vnow() - second == pytest.approx(50.0)
