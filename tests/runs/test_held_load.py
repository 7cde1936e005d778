"""Honest load: the summary says how many requests the server really held, and names the cause
when it is fewer than asked (a client that cannot keep up, or a trace with too little ready)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replay.engine.plans import make_plan
from replay.engine.run import EngineConfig
from replay.errors import UsageError
from replay.metrics.held import HeldLoad, LagTrend, LoadFacts, LoopDelay
from replay.metrics.results import read_results
from replay.runs.recording import Recording, run_recordings
from replay.runs.workers import split_concurrency
from replay.trace import TraceWriter, read_trace
from tests.support.scripted_server import Script

spans = st.lists(
    st.tuples(st.integers(0, 1000), st.integers(0, 200)).map(lambda p: (p[0], p[0] + p[1])),
    min_size=1,
    max_size=60,
)


@given(spans)
def test_max_held_is_the_most_spans_covering_one_send(items):
    held = HeldLoad()
    for s, e in reversed(items):  # arrival order does not matter
        held.add(s, e)
    # Half-open spans [sent, end): a reply ending as another request is sent frees its place.
    brute = max(sum(1 for s2, e2 in items if s2 <= s < e2) for s, _ in items)
    assert held.max() == brute


@given(
    st.lists(
        st.tuples(st.integers(0, 1000), st.integers(0, 30), st.integers(0, 200), st.integers(0, 50)),
        min_size=1,
        max_size=60,
    )
)
def test_max_held_swept_as_requests_finish_keeps_only_stamps_around_those_in_flight(items):
    # A request is opened at `token`, sent `d` later, at the server for `span`, and added `late`
    # after its end (a busy loop): the engine's order of events.
    reqs = [(t, t + d, t + d + span, t + d + span + late) for t, d, span, late in items]
    events = sorted(
        [(t, 0, i) for i, (t, _, _, _) in enumerate(reqs)] + [(a, 1, i) for i, (*_, a) in enumerate(reqs)]
    )
    held, tokens = HeldLoad(), {}
    for now, kind, i in events:
        if kind == 0:
            tokens[i] = held.open(now)
        else:
            _, s, e, _ = reqs[i]
            held.add(s, e, tokens.pop(i))
            in_flight = len(tokens)
            # Kept: the open tokens, and of the finished spans that end after the oldest open one
            # started, their two stamps, token, and mark as closed.
            oldest = min((reqs[j][0] for j in tokens), default=None)
            overlapping = sum(
                1 for _, s2, e2, a2 in reqs if a2 <= now and oldest is not None and e2 >= oldest
            )
            assert held.pending <= in_flight + 4 * overlapping
    brute = max(sum(1 for _, s2, e2, _ in reqs if s2 <= s < e2) for _, s, _, _ in reqs)
    assert held.max() == brute
    assert held.pending == 0  # nothing in flight: everything swept


@given(spans)
def test_mean_held_is_the_spans_total_over_the_load_window(items):
    held = HeldLoad()
    for s, e in items:
        held.add(s, e)
    window = max(e for _, e in items) - min(s for s, _ in items)
    total = sum(e - s for s, e in items)
    assert held.mean() == (total / window if window else None)


def test_spans_without_both_stamps_are_left_out():
    held = HeldLoad()
    held.add(None, 10)
    held.add(5, None)
    held.add(10, 5)
    assert (held.count, held.mean(), held.max()) == (0, None, 0)


def test_loop_delay_counts_only_lateness():
    delay = LoopDelay()
    assert delay.mean_ms() is None
    for late in (-50_000, 1_000_000, 3_000_000):  # a timer a little early counts as on time
        delay.add(late)
    assert (delay.mean_ms(), delay.max_ns) == (pytest.approx(4 / 3), 3_000_000)


def _trend(lags: list[float]) -> tuple[float, float] | None:
    trend = LagTrend(len(lags))
    for lag in lags:
        trend.add(lag)
    return trend.growth()


def test_lag_growth_compares_the_first_and_last_quarter():
    assert _trend([0.001] * 7) is None
    head, tail = _trend([0.001] * 4 + [0.002] * 8 + [0.5] * 4)
    assert head == pytest.approx(0.001, rel=1e-3) and tail == pytest.approx(0.5, rel=1e-3)


def _facts(**kw):
    base = dict(
        plan="overlap", asked=64, cap=64, held_mean=16.0, held_max=30, loop_delay_ms=0.5, client_cpu=0.99
    )
    return LoadFacts(**{**base, **kw})


def test_a_saturated_client_is_named_with_its_core_and_the_fix():
    (line,) = _facts().warnings()
    assert line == "client-bound: asked 64 in flight, held 16 (max 30), one core at 99%: add --workers"


def test_a_client_that_is_held_up_but_not_busy_is_still_client_bound():
    (line,) = _facts(client_cpu=0.2, loop_delay_ms=12.0).warnings()
    assert line.startswith(
        "client-bound: asked 64 in flight, held 16 (max 30), its event loop ran 12.0 ms late"
    )


def test_first_tokens_waiting_in_the_client_are_named_even_when_the_load_was_held():
    facts = _facts(held_mean=64.0, client_cpu=0.97, client_queue_p50_ms=6.0, client_queue_p99_ms=25.0)
    (line,) = facts.warnings()
    assert line.startswith("client-bound: first tokens waited 6.0 ms (median; p99 25.0 ms) in the client")
    assert line.endswith(
        "one core at 97% (TTFT is the kernel's stamp and stays exact; what follows it runs late): add --workers"
    )
    assert facts.fields()["client_queue_p99_ms"] == 25.0
    # A few late wake-ups (a busy host) are in the figures, not a warning.
    assert _facts(held_mean=64.0, client_queue_p50_ms=0.1, client_queue_p99_ms=30.0).warnings() == []
    (idle,) = _facts(held_mean=64.0, client_cpu=0.3, client_queue_p50_ms=9.0).warnings()
    assert idle.endswith("a slow results sink, or a busy host)")
    # A shortfall already names the client: one warning, not two.
    (short,) = _facts(client_queue_p50_ms=9.0, client_queue_p99_ms=25.0).warnings()
    assert short.startswith("client-bound: asked 64 in flight, held 16")


def test_too_few_ready_requests_is_the_traces_doing():
    (line,) = _facts(client_cpu=0.2).warnings()
    assert line.startswith("trace-bound: asked 64 in flight, held 16")


def test_held_within_ten_percent_is_not_reported():
    assert _facts(held_mean=58.0).warnings() == []
    assert _facts(asked=None).warnings() == []  # nothing asked: nothing fell short


def test_a_timed_plan_whose_lag_grows_is_reported_with_its_cause():
    timed = dict(plan="timed", asked=None, cap=None, lag_start_s=0.001, lag_end_s=0.250)
    (busy,) = _facts(**timed).warnings()
    assert busy.startswith("client-bound: schedule lag grew from 1.0 ms to 250.0 ms")
    assert busy.endswith("add --workers")
    (capped,) = _facts(**{**timed, "cap": 8, "held_max": 8, "client_cpu": 0.3}).warnings()
    assert capped.startswith("cap-bound:") and "--concurrency 8" in capped
    assert _facts(**{**timed, "lag_end_s": 0.005}).warnings() == []
    # Lag in an overlap plan is time spent waiting for a place: not a schedule falling behind.
    assert _facts(plan="overlap", held_mean=60.0, lag_start_s=0.0, lag_end_s=1.0).warnings() == []


@pytest.mark.parametrize("total,workers", [(64, 2), (7, 3), (5, 5), (200, 7)])
def test_concurrency_is_the_total_split_between_workers(total, workers):
    shares = [p.concurrency for p in split_concurrency(make_plan("overlap", concurrency=total), workers)]
    assert sum(shares) == total
    assert max(shares) - min(shares) <= 1


def test_concurrency_below_the_worker_count_is_refused():
    with pytest.raises(UsageError, match="--concurrency 2 is the total"):
        split_concurrency(make_plan("overlap", concurrency=2), 3)
    assert split_concurrency(make_plan("alternate"), 3) == [make_plan("alternate")] * 3
    uncapped = make_plan("timed")
    assert split_concurrency(uncapped, 2) == [uncapped, uncapped]


def _independent(path: Path, sessions: int) -> Path:
    with TraceWriter(path, source="test") as w:
        for s in range(sessions):
            w.session(f"s{s}")
            w.request(f"s{s}", 0.0, [{"role": "user", "content": f"hi {s}"}], {"max_tokens": 3})
    return path


def _chained(path: Path, sessions: int, turns: int) -> Path:
    with TraceWriter(path, source="test") as w:
        for s in range(sessions):
            w.session(f"s{s}")
            msgs = [{"role": "user", "content": f"hi {s}"}]
            for t in range(turns):
                reply = {"role": "assistant", "content": f"r{t}"}
                w.request(f"s{s}", 0.0, list(msgs), {"max_tokens": 3}, reply={"message": reply})
                msgs += [reply, {"role": "user", "content": f"more {t}"}]
    return path


def _run(server, trace: Path, out: Path, concurrency: int, annotate=None):
    config = EngineConfig(base_url=server.url, timeout_s=10.0, run_id="held")
    rec = Recording(
        read_trace(trace),
        make_plan("overlap", concurrency=concurrency),
        config,
        out,
        {"kind": "scripted"},
        keep_records=False,
        annotate=annotate,
    )
    (outcome,) = run_recordings([rec], None)
    return outcome, read_results(out).summary_line


@pytest.mark.timing
def test_a_slow_results_sink_shows_as_a_client_that_held_less_than_asked(scripted_server, tmp_path):
    scripted_server.default = Script(tokens=3)

    def slow_sink(_rec):  # blocks the event loop, as a saturated client's own work does
        time.sleep(0.02)

    outcome, line = _run(
        scripted_server, _independent(tmp_path / "t.jsonl", 40), tmp_path / "r.jsonl", 8, slow_sink
    )
    assert outcome.requests == 40
    assert line["in_flight_asked"] == 8
    assert line["in_flight_mean"] < 0.9 * 8
    assert 1 <= line["in_flight_max"] <= 8
    assert line["loop_delay_ms"] >= 5.0
    assert line["client_queue_p99_ms"] >= 5.0  # first tokens waited while the sink held the loop
    assert line["client_cpu"] >= 0.0
    assert line["warnings"] == outcome.warnings
    assert outcome.warnings[0].startswith("client-bound: asked 8 in flight, held ")


@pytest.mark.timing
def test_a_trace_with_too_few_sessions_is_trace_bound_not_client_bound(scripted_server, tmp_path):
    scripted_server.default = Script(first_token_delay_s=0.02, tokens=3)
    outcome, line = _run(scripted_server, _chained(tmp_path / "t.jsonl", 2, 6), tmp_path / "r.jsonl", 16)
    assert outcome.requests == 12
    assert line["in_flight_max"] <= 2
    assert len(outcome.warnings) == 1
    assert outcome.warnings[0].startswith("trace-bound: asked 16 in flight, held ")


@pytest.mark.timing
def test_a_run_that_holds_what_it_asked_has_no_warning(scripted_server, tmp_path):
    scripted_server.default = Script(first_token_delay_s=0.2, tokens=3)
    outcome, line = _run(scripted_server, _independent(tmp_path / "t.jsonl", 8), tmp_path / "r.jsonl", 4)
    assert outcome.requests == 8
    assert line["in_flight_max"] == 4
    assert line["in_flight_mean"] >= 3.6
    assert "warnings" not in line and outcome.warnings == []


def test_workers_share_the_total_concurrency_and_the_merged_file_says_so(scripted_server, tmp_path):
    from replay.runs.workers import run_workers

    scripted_server.default = Script(first_token_delay_s=0.1, tokens=3)
    config = EngineConfig(base_url=scripted_server.url, timeout_s=10.0, run_id="w")
    out = tmp_path / "r.jsonl"
    trace = read_trace(_independent(tmp_path / "t.jsonl", 24))
    spread = run_workers(trace, make_plan("overlap", concurrency=4), config, out, {"kind": "scripted"}, 2)
    assert spread.requests == 24
    merged = read_results(out)
    assert merged.run["plan"]["concurrency"] == 4  # the total, not one worker's share
    parts = [read_results(p.out) for p in spread.parts]
    assert sorted(p.run["plan"]["concurrency"] for p in parts) == [2, 2]
    assert merged.summary_line["in_flight_asked"] == 4
    assert merged.summary_line["in_flight_max"] <= 4
    assert len(merged.summary_line["client_cpu"]) == 2
    assert 0 <= merged.summary_line["client_queue_p50_ms"] <= merged.summary_line["client_queue_p99_ms"]


def test_loop_choice_defaults_to_asyncio_and_refuses_what_it_cannot_run(monkeypatch):
    from replay.engine.run import loop_options

    assert loop_options("auto") == {"use_uvloop": False}
    assert loop_options("asyncio") == {"use_uvloop": False}
    with pytest.raises(UsageError, match="--loop must be one of"):
        loop_options("trio")
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if not installed
    with pytest.raises(UsageError, match="uvloop is not installed"):
        loop_options("uvloop")
