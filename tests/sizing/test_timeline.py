"""`replay size sweep` under timed, closed-loop and overlapping plans sends each request when
`replay run` would: the engine's own plans (`replay.engine.plans`) walked in modelled time give
the same rows, on drawn traces; and a replay on the simulator over HTTP gives the same requests."""

from __future__ import annotations

from collections import deque
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay.engine.plans import Plan, make_plan
from replay.metrics.switch import SwitchTracker
from replay.scenario import generate, load_spec
from replay.sim.model import events as ev
from replay.sim.model.config import MiB, SimConfig, config_for
from replay.sim.model.engine import CacheModel
from replay.sizing import sweep, sweep_trace
from replay.sizing.jobs import scheduled_from_trace
from replay.sizing.rows import SweepRow
from replay.sizing.sweep import _Tally
from replay.sizing.timeline import Schedule, Scheduled, Sent
from replay.trace import read_trace
from replay.trace.model import Request

SPEC = """
[scenario]
name = "drawn"
title = "a drawn workload"
seed = {seed}

[run]
plan = "{plan}"

[prompt]
system_tokens = {system}
tools = ["read_file", "run_command"]

[defaults]
reply = "tool"
reply_tokens = {reply}
history_chunk = 800

{sessions}

[[steps]]
label = "turns"
order = "{order}"
sessions = [{names}]
repeat = {{ {repeat} }}
grow = {{ {grow} }}
start = {{ {start} }}
gap_s = {{ {gap} }}
"""


@st.composite
def drawn_traces(draw: st.DrawFn, tmp: Path) -> Path:
    n = draw(st.integers(1, 4))
    names = [f"s{i}" for i in range(n)]
    sessions = "\n".join(
        f"[sessions.{s}]\nstart_tokens = {draw(st.integers(1_500, 14_000))}\n"
        + ('reply = "text"\n' if draw(st.integers(0, 3)) == 0 else "")
        for s in names
    )

    def per(values: st.SearchStrategy[Any]) -> str:
        return ", ".join(f"{s} = {draw(values)}" for s in names)

    text = SPEC.format(
        seed=draw(st.integers(1, 99)),
        plan="closed-loop",
        system=draw(st.integers(600, 4_000)),
        reply=draw(st.sampled_from([20, 150, 400])),
        sessions=sessions,
        order=draw(st.sampled_from(["parallel", "parallel", "sequence"])),
        names=", ".join(f'"{s}"' for s in names),
        repeat=per(st.integers(1, 4)),
        grow=per(st.integers(200, 4_000)),
        start=per(st.sampled_from([0, 0, 3, 40, 200])),
        gap=per(st.sampled_from([0, 1, 5, 30])),
    )
    spec_path = tmp / "drawn.toml"
    spec_path.write_text(text)
    trace = tmp / "drawn.jsonl"
    generate(load_spec(spec_path), trace)
    return trace


def _configs(draw: st.DrawFn) -> SimConfig:
    return config_for(
        disk=True,
        kv_cache_continued_interval_tokens=draw(st.sampled_from([0, 2_048, 5_000])),
        prefill_chunk=draw(st.sampled_from([1_024, 2_048])),
        eviction=draw(st.sampled_from(["base", "aug"])),
        batched_sessions=draw(st.sampled_from([None, None, 2])),
        routing=draw(st.sampled_from(["upstream", "reuse-aware"])),
    )


def _engine_walk(path: Path, cfg: SimConfig, plan: Plan, budget: int) -> SweepRow:
    """A row as the engine's plan objects would send the trace to one model, in modelled time:
    each request waits for `plan.waits_for`, is due at `plan.release_ns`, then takes a place
    under `plan.capacity` in FIFO order. Written plainly, request by request, as a reference."""
    trace = read_trace(path)
    jobs = {e.job.id: e for e in scheduled_from_trace(trace.requests, cfg)}
    order: list[Request] = plan.order(trace.requests)
    origin = min(r.t for r in order)
    model = CacheModel(cfg.with_(kv_disk_space_mb=budget // MiB), progress=False)
    tally = _Tally(SweepRow(budget, cfg.slots, cfg.routing))
    tracker = SwitchTracker()
    done: dict[int, float] = {}
    waits = {r.id: plan.waits_for(r, order[i - 1] if i else None) for i, r in enumerate(order)}
    index = {r.id: i for i, r in enumerate(order)}
    unsent = list(order)
    queue: deque[Request] = deque()
    in_flight = 0

    def send(req: Request, t: float) -> None:
        nonlocal in_flight
        in_flight += 1
        entry = jobs[req.id]
        tally.add(Sent(t, entry, tracker.on_send(req.session, req.is_compaction)))
        model.submit(entry.job, t)
        handle(model.drain())

    def handle(events: list[ev.Event]) -> None:
        nonlocal in_flight
        for e in events:
            tally.add(e)
            if isinstance(e, ev.Finished):
                done[e.job_id] = e.t
                tracker.on_done()
                in_flight -= 1
                while queue and (plan.capacity is None or in_flight < plan.capacity):
                    send(queue.popleft(), e.t)

    for e in model.startup():
        tally.add(e)
    while unsent or model.busy:
        ready = [r for r in unsent if all(d in done for d in waits[r.id])]
        due = [
            (
                max(
                    0.0,
                    plan.release_ns(
                        r, int(round(max((done[d] for d in waits[r.id]), default=0.0) * 1e9 + origin * 1e9))
                    )
                    / 1e9
                    - origin,
                ),
                index[r.id],
                r,
            )
            for r in ready
        ]
        t_model = model.next_time()
        if due and (t_model is None or min(due)[0] <= t_model + 1e-9):
            t, _, req = min(due, key=lambda d: (d[0], d[1]))
            unsent.remove(req)
            if plan.capacity is not None and in_flight >= plan.capacity:
                queue.append(req)
            else:
                send(req, max(t, model.now))
            continue
        assert t_model is not None, "nothing due and nothing running"
        handle(model.advance(t_model))
    tally.row.peak_disk_bytes = model.disk.peak if model.disk else 0
    return tally.close()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_closed_loop_and_overlapping_sweeps_send_requests_as_the_engine_plans_do(
    data: st.DataObject, tmp_path: Path
) -> None:
    trace = data.draw(drawn_traces(tmp_path))
    cfg = _configs(data.draw)
    plan_name = data.draw(st.sampled_from(["closed-loop", "overlap", "timed"]))
    k = data.draw(st.sampled_from([1, 2, 3])) if plan_name == "overlap" else None
    budgets = sorted(data.draw(st.sets(st.integers(60, 2_000), min_size=1, max_size=3)))
    report = sweep_trace(trace, [b * MiB for b in budgets], cfg=cfg, plan=plan_name, concurrency=k)
    assert report.walker == "event loop" and plan_name in report.why
    plan = make_plan(plan_name, concurrency=k, speed=1.0)
    for row in report.rows:
        _same(row, _engine_walk(trace, cfg, plan, row.budget_bytes))


def _same(row: SweepRow, want: SweepRow) -> None:
    """Equal counts; seconds equal but for the reference's nanosecond rounding of due times."""
    got, ref = asdict(row), asdict(want)
    for name in ("wait_p50_s", "wait_max_s", "modelled_s"):
        assert got.pop(name) == pytest.approx(ref.pop(name), rel=1e-9, abs=1e-6), name
    assert got == ref


def test_release_rules_are_the_engine_plans(tmp_path: Path) -> None:
    """Order, waits and due times of every plan, for a closed-loop trace with tool times."""
    spec = tmp_path / "s.toml"
    spec.write_text(
        SPEC.format(
            seed=3,
            plan="closed-loop",
            system=1_000,
            reply=50,
            order="parallel",
            sessions="[sessions.a]\nstart_tokens = 2000\n[sessions.b]\nstart_tokens = 3000\n",
            names='"a", "b"',
            repeat="a = 3, b = 2",
            grow="a = 500, b = 900",
            start="a = 0, b = 7",
            gap="a = 4, b = 11",
        )
    )
    path = tmp_path / "t.jsonl"
    generate(load_spec(spec), path)
    trace = read_trace(path)
    entries = {e.job.id: e for e in scheduled_from_trace(trace.requests, config_for())}
    for name, k, rr in [
        ("alternate", None, False),
        ("alternate", None, True),
        ("overlap", 2, False),
        ("timed", None, False),
        ("closed-loop", None, False),
    ]:
        plan = make_plan(name, concurrency=k, speed=2.0, round_robin=rr)
        ours = Schedule(name, speed=2.0, concurrency=k, round_robin=rr)
        theirs = plan.order(trace.requests)
        mine = ours.order([entries[r.id] for r in trace.requests])
        assert [e.job.id for e in mine] == [r.id for r in theirs]
        assert ours.capacity == plan.capacity
        for i, req in enumerate(theirs):
            prev = theirs[i - 1] if i else None
            deps = ours.waits_for(entries[req.id], entries[prev.id] if prev else None)
            assert set(deps) == set(plan.waits_for(req, prev))
            for done in (0.0, 3.5, 120.25):
                assert ours.release(entries[req.id], done, 0.0) == pytest.approx(
                    plan.release_ns(req, int(done * 1e9)) / 1e9
                )


def test_a_closed_loop_trace_swept_in_file_order_was_wrong(tmp_path: Path) -> None:
    """The slow morning's shape (three conversations on their own clocks, one slot): walked in
    file order a sweep sends each conversation's turns back to back; in modelled time they
    interleave as the run sends them, and a small budget re-reads far more."""
    from replay.scenario import find_scenario

    trace = tmp_path / "morning.jsonl"
    generate(find_scenario("slow-morning"), trace)
    cfg = config_for()
    in_order = sweep_trace(trace, [24 * 1024 * MiB], cfg=cfg).rows[0]
    in_time = sweep_trace(trace, [24 * 1024 * MiB], cfg=cfg, plan="closed-loop").rows[0]
    assert in_time.switches > in_order.switches
    assert in_time.reprocessed_tokens > 1.5 * in_order.reprocessed_tokens


def test_the_sweep_says_which_walk_ran_and_why(tmp_path: Path) -> None:
    entries = [Scheduled(0.0, j) for _, j in []]
    one = sweep(entries, [MiB], plan="alternate")
    assert one.walker == "sequential" and "does not depend on modelled time" in one.why
    other = sweep(entries, [MiB], plan="closed-loop")
    assert other.walker == "event loop" and "modelled time" in other.why
    from replay.sizing import sweep_json

    assert orjson.loads(orjson.dumps(sweep_json(other)))["walker"] == "event loop"


def test_a_scenarios_trace_is_swept_as_scenario_run_replays_it(tmp_path: Path) -> None:
    """`replay size sweep` on the slow morning's trace, as a new user would run it: the
    scenario's plan, server flags and earlier day's files, so each budget's row is the arm's
    walk in modelled time (which `scenario check` judges and a wall-clock run matches within 2%)."""
    import contextlib
    import io

    from rich.console import Console

    from replay.commands.size import SweepArgs
    from replay.commands.size import sweep as sweep_command
    from replay.runs.modelled import model_arm
    from replay.scenario import find_scenario

    spec = find_scenario("slow-morning")
    trace = tmp_path / "morning.jsonl"
    generate(spec, trace)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert (
            sweep_command(
                SweepArgs(trace=trace, budgets="24G,64G", as_json=True), Console(file=io.StringIO())
            )
            == 0
        )
    rows = orjson.loads(out.getvalue())
    assert rows["walker"] == "event loop" and "closed-loop" in rows["why"]
    for row, arm in zip(rows["rows"], ("24G", "64G"), strict=True):
        walked = model_arm(spec, spec.arm(arm), trace)
        assert row["reprocessed_tokens"] == sum(r["reprocessed_tokens"] for r in walked.requests)
        assert row["restores"] == sum(1 for s in walked.server if s["event"] == "restore")
        assert row["evictions"] == sum(1 for s in walked.server if s["event"] == "evict")
