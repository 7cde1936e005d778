"""The soak's arithmetic (growth per request, rate drift, the subject's wind-down) and its rows in
the benchmark's verdict; the soaks themselves run in `just soak`, never in the tests."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.report import markdown, soak_checks
from bench.soak import (
    GENERATION_DIGITS,
    Calibration,
    ChatLoad,
    Conversation,
    Sample,
    _lines_counter,
    _summary,
    analyse,
    conversation_messages,
    error_kind,
    parse_args,
    replay_size,
    with_start_ratio,
)
from replay.sim.model.tokenizer import count_tokens


def samples(minutes: float, rate: float, mib_per_request: float, slow_down: float = 0.0):
    out, done = [], 0.0
    for i in range(int(minutes * 60 / 5) + 1):
        t = i * 5.0
        out.append(Sample(t, round(100 + done * mib_per_request, 4), 20, int(done)))
        done += 5 * rate * (1 - slow_down * t / (minutes * 60))
    return out


def test_flat_memory_and_a_steady_rate_meet_the_replay_target():
    res = analyse("replay", samples(4, 500, 0.0), 4)
    assert res["status"] == "ok" and res["met"]
    assert res["mb_per_10k"] == 0 and abs(res["drift_pct"]) < 0.5
    assert res["warmup_s"] == 60.0 and res["window_s"] == 60.0


def test_growth_per_request_is_the_slope_after_warm_up_in_mb_per_10000():
    res = analyse("replay", samples(4, 500, 0.001), 4)  # 1 KiB-ish per request: 10 MiB per 10,000
    assert res["mb_per_10k"] == pytest.approx(10 * 1.048576, rel=1e-3)
    assert not res["met"]


def test_loading_the_trace_before_the_first_request_is_neither_growth_nor_rate():
    # 90 s of loading (RSS climbing to 3 GiB, no request done), then 30 steady minutes.
    loading = [Sample(5.0 * i, 100.0 + 35 * i, 20, 0) for i in range(19)]
    run = [Sample(s.t + 90.0, s.rss_mib + 3000.0, 20, s.requests) for s in samples(30, 900, 0.0)[1:]]
    res = analyse("replay", loading + run, 30)
    assert res["started_s"] == 90.0 and res["warmup_s"] == 150.0 and res["rss_started_mib"] == 730.0
    assert res["mb_per_10k"] == 0 and abs(res["drift_pct"]) < 0.5 and res["met"]


def test_a_slowing_rate_is_drift_and_a_stalled_tail_is_not_counted():
    slowing = analyse("record", samples(4, 100, 0.0, slow_down=0.3), 4)
    assert slowing["drift_pct"] < -10 and not slowing["met"]
    steady = samples(2, 100, 0.0)
    tail = [Sample(steady[-1].t + 5 * k, 100.0, 3, steady[-1].requests) for k in range(1, 4)]
    res = analyse("record", steady + tail, 2)
    assert abs(res["drift_pct"]) < 0.5 and res["fds_end"] == 20


def test_the_verdict_has_a_row_per_soak_and_says_which_figure_missed():
    results = {
        "soak": {
            "replay": analyse("replay", samples(4, 500, 0.001), 4),
            "sim": {"status": "failed", "reason": "not ready"},
        }
    }
    rows = {c.name.split(",")[0]: c for c in soak_checks(results)}
    assert rows["soak: replay run"].met is False and "mb_per_10k" in rows["soak: replay run"].gap
    assert rows["soak: simulator"].met is None and "not ready" in rows["soak: simulator"].measured
    assert rows["soak: replay record"].met is None
    text = markdown(results)
    assert "## Soak" in text and "| replay | 4 |" in text


def test_one_request_sessions_are_held_to_twice_the_trace_size_at_start(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(b"x" * (40 * 2**20))  # a 40 MiB trace file; the replay starts at 100 MiB
    ok = with_start_ratio(analyse("replay-1turn", samples(4, 500, 0.0), 4), trace)
    assert ok["trace_mib"] == 40.0 and ok["start_over_trace"] == 2.5 and not ok["met"]
    row = {c.name.split(",")[0]: c for c in soak_checks({"soak": {"replay-1turn": ok}})}
    gap = row["soak: replay run on one-request sessions"].gap
    assert "start_over_trace 2.50x (limit 2.0x)" in gap and "mb_per_10k" not in gap
    trace.write_bytes(b"x" * (60 * 2**20))
    assert with_start_ratio(analyse("replay-1turn", samples(4, 500, 0.0), 4), trace)["met"]


def test_minutes_and_only_are_parsed():
    args = parse_args(["--minutes", "1", "--only", "record,sim"])
    assert (args.minutes, args.only) == (1.0, ["record", "sim"])
    with pytest.raises(SystemExit):
        parse_args(["--only", "nope"])


def test_sigterm_to_the_soak_stops_the_process_it_started() -> None:
    """A soak stopped by SIGTERM (a CI timeout, a user's `kill PID`) must not orphan its subject."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.soak", "--only", "sim", "--minutes", "5", "--out", os.devnull + "-x"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        children: list[psutil.Process] = []
        while time.monotonic() < deadline and not children:
            children = psutil.Process(proc.pid).children()
            time.sleep(0.2)
        assert children, "the soak started no subject"
        time.sleep(2.0)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
        _, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, f"left running: {[c.pid for c in alive]}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_requests_are_counted_until_the_summary_line_and_its_fields_read_past_later_lines(tmp_path):
    # After its summary a replay reads its results back for the report: not the run's memory.
    out = tmp_path / "r.jsonl"
    count = _lines_counter(out)
    assert count() == 0  # no file yet
    out.write_bytes(b'{"kind":"run"}\n{"kind":"request"}\n{"kind":"requ')
    assert count() == 1
    with open(out, "ab") as handle:
        handle.write(b'est"}\n{"kind":"summary","waiting_max":7}\n{"kind":"metrics"}\n')
    assert count() is None and count() is None
    assert _summary(out)["waiting_max"] == 7 and _summary(tmp_path / "none.jsonl") == {}


def test_the_replay_trace_is_sized_from_the_calibrated_rate_with_a_margin():
    cal = Calibration(rate=2000.0, base_mib=150.0, mib_per_request=1500 / 2**20)
    requests, refused = replay_size(30, cal, available_mib=20_000.0)
    assert refused is None
    assert requests >= 30 * 60 * 2000 * 1.2  # a faster stretch must not run the trace out
    assert cal.rss_mib(requests) < 20_000 - 1024


def test_a_replay_soak_that_cannot_fit_in_memory_says_so_before_it_starts():
    cal = Calibration(rate=3000.0, base_mib=150.0, mib_per_request=2400 / 2**20)
    requests, refused = replay_size(30, cal, available_mib=8_000.0)
    assert refused is not None and refused.startswith("not started: 30 minutes at 3,000 req/s")
    assert f"{requests:,} requests" in refused and "GiB is available" in refused
    fits = float(refused.rsplit("at most ", 1)[1].split(" minutes")[0])
    assert 0 < fits < 30 and replay_size(fits * 0.99, cal, 8_000.0)[1] is None


def test_cpu_per_request_and_window_rates_show_which_process_slowed():
    # The client steady at 0.3 ms a request, the server from 0.1 to 0.2 ms: the rate falls with it.
    out, done, cpu, server = [], 0.0, 0.0, 0.0
    for i in range(49):
        t = i * 5.0
        out.append(Sample(t, 100.0, 20, int(done), round(cpu, 4), round(server, 4)))
        server_ms = 0.1 + 0.1 * t / 240
        rate = 1000 / (0.3 + server_ms)
        done += 5 * rate
        cpu += 5 * rate * 0.3e-3
        server += 5 * rate * server_ms * 1e-3
    res = analyse("replay", out, 4)
    assert res["cpu_ms_first"] == pytest.approx(0.3, rel=0.02)
    assert res["cpu_ms_last"] == pytest.approx(0.3, rel=0.02)
    assert res["server_cpu_ms_first"] < 0.15 < 0.18 < res["server_cpu_ms_last"]
    assert res["drift_pct"] < -5 and len(res["rates_per_window"]) == 3
    assert res["rates_per_window"] == sorted(res["rates_per_window"], reverse=True)


def test_a_rate_that_falls_with_the_core_s_speed_is_no_drift_at_the_core_s_speed():
    # The core slows by a fifth over the run (the fixed work takes 10 -> 12.5 ms): so does the rate.
    out, done = [], 0.0
    for i in range(49):
        t = i * 5.0
        probe = 10.0 * (1 + 0.25 * t / 240)
        out.append(Sample(t, 100.0, 20, int(done), 0.0, 0.0, probe))
        done += 5 * 2000 * 10.0 / probe
    res = analyse("replay", out, 4)
    assert res["drift_pct"] < -10 and not res["met"]
    assert abs(res["drift_at_core_speed_pct"]) < 2
    assert res["probe_ms_first"] < res["probe_ms_last"]


def shape(c: Conversation) -> list[tuple[int, int]]:
    return [(len(m["content"]), count_tokens(m["content"])) for m in conversation_messages(c)]


@given(
    index=st.integers(0, 15),
    turns=st.integers(0, 7),
    generation=st.integers(0, 10**GENERATION_DIGITS - 1),
)
def test_a_conversation_keeps_its_shape_however_often_it_restarted(
    index: int, turns: int, generation: int
) -> None:
    """The load of a long soak is the load after its warm-up: a restarted conversation's texts have
    the lengths and token counts of its first run (a token more after 1000 restarts showed up as
    +3 MiB of the simulator's RSS, issue #23)."""
    replies = [f"reply {i}" for i in range(turns)]
    first = Conversation(index, 0, list(replies))
    later = Conversation(index, generation, list(replies))
    assert shape(later) == shape(first)


def test_client_errors_are_counted_by_kind_without_their_ids() -> None:
    """The 60-minute record soak counted 27 client errors and could not say what they were."""
    request = httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions")
    refused = httpx.Response(502, request=request, content=b'{"error": {"message": "upstream\\n down"}}')
    load = ChatLoad("http://127.0.0.1:1", conversations=1, clients=1, turns=1, compact=False)
    load.failed(httpx.HTTPStatusError("bad gateway", request=request, response=refused))
    load.failed(httpx.RemoteProtocolError("Server disconnected without sending a response."))
    load.failed(httpx.RemoteProtocolError("Server disconnected without sending a response."))
    assert load.errors == 3
    assert load.error_kinds == {
        'HTTP 502: {"error": {"message": "upstream\\n down"}}': 1,
        "RemoteProtocolError: Server disconnected without sending a response.": 2,
    }
    assert error_kind(ValueError("")) == "ValueError"
