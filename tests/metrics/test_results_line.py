"""A request line keeps every field `agent-replay-results/1` wrote, in order, with the same values.

Readers of old results files (reports, merges, users' own scripts) rely on these names and on the
rounding of every figure. New fields may be added to the format; none may vanish or change.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from replay.errors import TraceError
from replay.metrics.record import RequestRecord, Usage, micros, span_ns
from replay.metrics.results import ResultsWriter, _between, read_results

# The three lines as `agent-replay-results/1` wrote them before the request record became one type.
OK_LINE = (
    b'{"kind":"request","seq":3,"id":7,"session":"main","tag":"turn","switch":["switch","concurrent"],'
    b'"from_session":"cron","scheduled_s":1.0,"sent_s":1.25,"lag_s":0.25,"ttft_s":2.500401,'
    b'"latency_s":3.85,"ttft_sched_s":2.750401,"latency_sched_s":4.1,"prompt_tokens":12000,'
    b'"cached_tokens":10240,"cache_write_tokens":1760,"reprocessed_tokens":1760,'
    b'"reprocessed_source":"server","output_tokens":64,"expected_output_tokens":64,"decode_tps":50.416,'
    b'"finish":"stop","output_sha1":"ff23f95da93f37be14decc4150c5ee038b7ab8c3","status":"ok","http_status":200,"error":null,'
    b'"modelled":{"prefill_s":1.5},"label":"x","server_process":0}'
)
ERROR_LINE = (
    b'{"kind":"request","seq":4,"id":8,"session":"cron","tag":"cron","switch":["cold"],"from_session":null,'
    b'"scheduled_s":2.0,"sent_s":2.000001,"lag_s":1e-6,"ttft_s":null,"latency_s":0.000899,'
    b'"ttft_sched_s":null,"latency_sched_s":0.0009,"prompt_tokens":null,"cached_tokens":null,'
    b'"cache_write_tokens":null,"reprocessed_tokens":null,"reprocessed_source":null,"output_tokens":null,'
    b'"expected_output_tokens":16,"decode_tps":null,"finish":null,"output_sha1":null,'
    b'"status":"http_error","http_status":500,'
    b'"error":"request run-8 POST /v1/chat/completions: HTTP 500: boom"}'
)
CANCELLED_LINE = (
    b'{"kind":"request","seq":5,"id":9,"session":"cron","tag":"cron","switch":["continue"],'
    b'"from_session":"cron","scheduled_s":3.0,"sent_s":null,"lag_s":null,"ttft_s":null,"latency_s":null,'
    b'"ttft_sched_s":null,"latency_sched_s":null,"prompt_tokens":null,"cached_tokens":null,'
    b'"cache_write_tokens":null,"reprocessed_tokens":null,"reprocessed_source":null,"output_tokens":null,'
    b'"expected_output_tokens":16,"decode_tps":null,"finish":null,"output_sha1":null,"status":"cancelled",'
    b'"http_status":null,"error":"request 9 (cron) cancelled in flight"}'
)
SUMMARY_ALL = {
    "count": 2,
    "errors": 1,
    "sums": {"prompt_tokens": 12000, "cached_tokens": 10240, "reprocessed_tokens": 1760, "output_tokens": 64},
    "hist": {
        "ttft_us": "HISTFAAAACV4nJNpmSzMwMDAwgABzFCaEYiZmne9YbD/ABFoP8zIBABpHgX2",
        "latency_us": "HISTFAAAACV4nJNpmSzMwMDAwgABzFCaEYiZmne9YbD/ABFYe5aRCQBp1AYm",
        "reprocessed": "HISTFAAAACF4nJNpmSzMwMDAzAABMJoRTM6Y1mD/ASKwX5oJAFpWBQc=",
    },
}
# Fields added to request lines since; anything else new would be a silent format change.
ADDED = {"connect_s", "headers_s", "first_byte_s", "reused", "client_queue_s", "server_decode_tps"}
ADDED_IN_2 = {"backend", "backend_source"}  # `agent-replay-results/2`: which of several targets
ORIGIN = 1_000_000_000_000  # the run started at this monotonic time


def _ok() -> RequestRecord:
    return RequestRecord(
        seq=3,
        request_id=7,
        session="main",
        tag="turn",
        switch=("switch", "concurrent"),
        from_session="cron",
        t_origin=ORIGIN,
        t_scheduled=ORIGIN + 1_000_000_000,
        t_start=ORIGIN + 1_249_000_000,
        t_connected=ORIGIN + 1_250_000_000,
        t_sent=ORIGIN + 1_250_000_123,
        t_headers=ORIGIN + 1_300_000_000,
        t_first_byte=ORIGIN + 1_300_000_000,
        t_first_token=ORIGIN + 3_750_400_999,
        t_last_token=ORIGIN + 5_000_000_000,
        t_end=ORIGIN + 5_100_000_001,
        status="ok",
        http_status=200,
        finish="stop",
        usage=Usage(
            prompt_tokens=12000,
            cached_tokens=10240,
            cache_write_tokens=1760,
            reprocessed_tokens=1760,
            reprocessed_source="server",
            output_tokens=64,
        ),
        expected_output_tokens=64,
        message={"role": "assistant", "content": "hello"},
        x_sim={"prefill_s": 1.5},
        extra={"label": "x", "server_process": 0},
    )


def _error() -> RequestRecord:
    return RequestRecord(
        seq=4,
        request_id=8,
        session="cron",
        tag="cron",
        switch=("cold",),
        from_session=None,
        t_origin=ORIGIN,
        t_scheduled=ORIGIN + 2_000_000_000,
        t_sent=ORIGIN + 2_000_000_501,
        t_end=ORIGIN + 2_000_900_000,
        status="http_error",
        http_status=500,
        error="request run-8 POST /v1/chat/completions: HTTP 500: boom",
        expected_output_tokens=16,
    )


def _cancelled() -> RequestRecord:
    return RequestRecord(
        seq=5,
        request_id=9,
        session="cron",
        tag="cron",
        switch=("continue",),
        from_session="cron",
        t_origin=ORIGIN,
        t_scheduled=ORIGIN + 3_000_000_000,
        expected_output_tokens=16,
        status="cancelled",
        error="request 9 (cron) cancelled in flight",
    )


def _write(path: Path) -> list[bytes]:
    writer = ResultsWriter(path, {"target": {}})
    writer.request(_ok())
    writer.request(_error())
    writer.request(_cancelled(), summarise=False)
    writer.close()
    return path.read_bytes().splitlines()


def _assert_keeps(line: bytes, pinned: bytes) -> None:
    got, want = orjson.loads(line), orjson.loads(pinned)
    assert [k for k in got if k in want] == list(want), "a field vanished or moved"
    assert {k: got[k] for k in want} == want
    assert set(got) - set(want) <= ADDED | ADDED_IN_2
    # Byte for byte, once the added fields are left out.
    assert orjson.dumps({k: got[k] for k in want}) == pinned


def test_request_lines_keep_every_field_and_value(tmp_path: Path) -> None:
    run, ok, error, cancelled, summary = _write(tmp_path / "r.jsonl")
    assert orjson.loads(run) == {"kind": "run", "format": "agent-replay-results/2", "target": {}}
    _assert_keeps(ok, OK_LINE)
    _assert_keeps(error, ERROR_LINE)
    _assert_keeps(cancelled, CANCELLED_LINE)
    assert orjson.loads(ok)["connect_s"] == 0.001 and orjson.loads(ok)["headers_s"] == 0.05
    classes = orjson.loads(summary)["classes"]
    assert list(classes) == ["all", "switch", "concurrent", "cold"]
    assert classes["all"] == SUMMARY_ALL


def test_the_summary_line_is_read_from_the_end_whatever_follows_it_and_wherever_blocks_cut(tmp_path: Path):
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from replay.metrics.results import append_records, read_results, read_summary_line

    path = tmp_path / "r.jsonl"
    writer = ResultsWriter(path, {"target": {}})
    for seq in range(40):
        writer.write({"kind": "request", "seq": seq, "status": "ok", "note": "x" * (seq % 7)})
    writer.close({"outcome": "max-duration", "requests": 40})
    append_records(path, [{"line": i} for i in range(5)])  # server lines come after the summary
    whole = read_results(path).summary_line

    @settings(max_examples=40, deadline=None)
    @given(st.integers(min_value=1, max_value=400))
    def same_for_any_block(block: int) -> None:
        assert read_summary_line(path, block=block) == whole

    same_for_any_block()
    assert whole is not None and whole["outcome"] == "max-duration"
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b'{"kind":"run"}\n{"kind":"request"}\n{"kind":"summ')  # killed before its summary
    assert read_summary_line(cut) is None and read_summary_line(cut, block=3) is None


@given(
    start=st.none() | st.integers(min_value=-(10**15), max_value=10**15),
    end=st.none() | st.integers(min_value=-(10**15), max_value=10**15),
)
def test_a_span_is_printed_as_its_whole_microseconds_ties_to_even(start: int | None, end: int | None) -> None:
    us = micros(span_ns(start, end))
    assert _between(start, end) == (None if us is None else us / 1e6)


def test_the_servers_own_decode_speed_is_kept_where_it_reports_one() -> None:
    """llama-server's `timings.predicted_per_second` (the A/B's decode figure) becomes
    `server_decode_tps`; a server without timings leaves it null."""
    from replay.metrics.results import request_line

    rec = _ok()
    assert request_line(rec)["server_decode_tps"] is None
    rec.timings = {"predicted_n": 64, "predicted_ms": 640.0, "predicted_per_second": 100.00049}
    assert request_line(rec)["server_decode_tps"] == 100.0


def test_version_2_says_which_backend_served_each_request_and_version_1_still_reads(tmp_path: Path) -> None:
    rec = _ok()
    rec.backend, rec.backend_source = "http://127.0.0.1:9001", "client"
    writer = ResultsWriter(tmp_path / "r.jsonl", {"target": {}})
    writer.request(rec)
    writer.request(_error())
    writer.close()
    run, routed, single, _summary = (tmp_path / "r.jsonl").read_bytes().splitlines()
    assert orjson.loads(run)["format"] == "agent-replay-results/2"
    got = orjson.loads(routed)
    assert (got["backend"], got["backend_source"]) == ("http://127.0.0.1:9001", "client")
    keys = list(got)  # added after every field of version 1, before a caller's own fields
    assert keys.index("backend") == keys.index("server_decode_tps") + 1 < keys.index("label")
    assert (orjson.loads(single)["backend"], orjson.loads(single)["backend_source"]) == (None, None)
    old = tmp_path / "old.jsonl"
    old.write_bytes(b'{"kind":"run","format":"agent-replay-results/1","target":{}}\n' + OK_LINE + b"\n")
    res = read_results(old)
    assert res.requests[0]["session"] == "main" and "backend" not in res.requests[0]
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"kind":"run","format":"agent-replay-results/3","target":{}}\n')
    with pytest.raises(TraceError, match="not a results file"):
        read_results(bad)
