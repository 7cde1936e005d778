"""Where SGLang's router sent each request, read from its debug log (sglang-router 0.3.2's shape)."""

from __future__ import annotations

from pathlib import Path

from replay.metrics.results import ResultsWriter, append_records, read_results
from replay.serverside.routerlog import routed_records

ESC = "\x1b[2m"
SPAN = '{ESC}2026-12-04 14:58:30{ESC} DEBUG http_request{{method=POST uri=/v1/chat/completions module="smg" request_id="{rid}"}}: smg::observability::events: src/observability/events.rs:58: Sending request url={url}'


def _line(rid: str, url: str) -> str:
    return SPAN.format(ESC=ESC, rid=rid, url=url)


def test_each_request_gets_the_worker_of_its_last_sending_line(tmp_path: Path) -> None:
    log = tmp_path / "router.log"
    log.write_text(
        "\n".join(
            [
                "INFO started",
                _line("ab12cd34-1", "http://127.0.0.1:9001"),
                _line("ab12cd34-2", "http://127.0.0.1:9002"),
                _line("ab12cd34-2", "http://127.0.0.1:9001/"),  # a retry: the last one served it
                _line("other-77", "http://127.0.0.1:9002"),  # not a request of this run
                'DEBUG request_id="ab12cd34-3" finished processing request',
            ]
        )
        + "\n"
    )
    requests = [{"id": 1, "seq": 1}, {"id": 2, "seq": 2}, {"id": 3, "seq": 3}]
    got = routed_records(log, requests)
    assert [(r["request_seq"], r["backend"]) for r in got] == [
        (1, "http://127.0.0.1:9001"),
        (2, "http://127.0.0.1:9001"),
    ]
    assert all(r["event"] == "routed" and r["source"] == "router" for r in got)


def test_a_trace_request_replayed_twice_is_not_guessed(tmp_path: Path) -> None:
    log = tmp_path / "router.log"
    log.write_text(_line("r-1", "http://a:1") + "\n" + _line("r-1", "http://b:1") + "\n")
    assert routed_records(log, [{"id": 1, "seq": 1}, {"id": 1, "seq": 2}]) == []
    assert routed_records(tmp_path / "missing.log", [{"id": 1, "seq": 1}]) == []


def test_the_reader_fills_the_lines_the_router_named_and_says_so(tmp_path: Path) -> None:
    from replay.metrics.record import RequestRecord

    out = tmp_path / "r.jsonl"
    writer = ResultsWriter(out, {"target": {"kind": "sglang-router"}})
    for seq in (1, 2):
        writer.request(RequestRecord(seq=seq, request_id=seq, session="s", tag="turn", switch=("cold",)))
    writer.close()
    append_records(out, [{"event": "routed", "request_seq": 2, "backend": "http://w:2", "source": "router"}])
    res = read_results(out)
    assert [(r["backend"], r["backend_source"]) for r in res.requests] == [
        (None, None),
        ("http://w:2", "router"),
    ]
