"""The simulator's log is stamped in modelled time, from `--clock` when a scenario gives one."""

from __future__ import annotations

import io
import time

from sim_workloads import Convo, system_message

from replay.sim.model.config import config_for
from replay.sim.server.options import parse
from replay.sim.server.runtime import LogSink, SimRuntime


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
    runtime = SimRuntime(cfg, kv_dir=None, time_scale=3600.0, log=sink, clock=1788245100.0)  # 06:45 UTC
    sink.write("before")  # the process start does not count: modelled time starts with a request
    job = Convo("a", system_message(1_000), 2_000, 1).job(1, cfg, max_tokens=10)
    runtime.submit(job)
    runtime.t0 -= 1.0  # one wall second later, at 3600x: one modelled hour
    sink.write("after")
    lines = out.getvalue().splitlines()  # the request's own lines come between, at 06:45:00
    assert lines[0].startswith("0901 06:45:00 ds4-server: before")
    assert all(line.startswith("0901 06:45:0") for line in lines[1:-1])
    assert lines[-1].startswith("0901 07:45:0") and lines[-1].endswith("after")


def test_without_a_clock_modelled_time_runs_from_the_start() -> None:
    out = io.StringIO()
    sink = LogSink(out)
    runtime = SimRuntime(config_for(), kv_dir=None, time_scale=7200.0, log=sink)
    runtime.t0 -= 1.0  # two modelled hours after the start
    sink.write("x")
    (line,) = out.getvalue().splitlines()
    hh, mm = (int(x) for x in line.split()[1].split(":")[:2])
    now = time.localtime(runtime.epoch0 + 7200.0)
    assert (hh * 60 + mm - (now.tm_hour * 60 + now.tm_min)) % 1440 in (0, 1)  # a minute may turn meanwhile


def test_a_request_arrives_when_its_body_is_read_not_after_this_host_tokenizes_it() -> None:
    """The host's parsing and tokenizing (tens of ms for a 90K-token prompt, times the scale)
    take no modelled time: the first request starts the clock when it is read, and a request
    is handed to the model at the time it was read."""
    cfg = config_for()
    runtime = SimRuntime(cfg, kv_dir=None, time_scale=1000.0, log=LogSink(io.StringIO()), clock=1788245100.0)
    first = runtime.arrived()
    runtime.t0 -= 0.05  # 50 ms of this host's work before the job is built, at 1000x: 50 s
    runtime.submit(Convo("a", system_message(1_000), 2_000, 1).job(1, cfg, max_tokens=10), first)
    assert first == 0.0 and runtime.model.now == 0.0  # not 50 s after the clock started
    second = runtime.arrived()
    runtime.t0 -= 0.05
    runtime.submit(Convo("b", system_message(1_000), 2_000, 1).job(2, cfg, max_tokens=10), second)
    assert runtime.model.now == second and 49.0 < runtime.vnow() - second < 60.0
