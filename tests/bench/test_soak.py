"""The soak's arithmetic (growth per request, rate drift, the subject's wind-down) and its rows in
the benchmark's verdict; the soaks themselves run in `just soak`, never in the tests."""

from __future__ import annotations

import httpx
import pytest

from bench.report import markdown, soak_checks
from bench.soak import ChatLoad, Sample, _lines_counter, _summary, analyse, error_kind, parse_args


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
