"""Correlating ds4 log events with the requests of a run, in send order and by span."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from drivers.logs import ds4
from drivers.logs.ds4_requests import assemble
from replay.serverside.ds4 import LOOKAHEAD, correlate, match_requests
from tests.support.ds4_logtext import Ds4LogWriter


def _req(seq: int, prompt: int | None, cached: int | None, status: str = "ok") -> dict[str, object]:
    return {"seq": seq, "prompt_tokens": prompt, "cached_tokens": cached, "status": status}


def _by(records: list[dict[str, object]], seq: int | None) -> dict[str, list[dict[str, object]]]:
    out: dict[str, list[dict[str, object]]] = {}
    for r in records:
        if r["request_seq"] == seq:
            out.setdefault(str(r["event"]), []).append(r)
    return out


def test_single_session_in_order() -> None:
    w = Ds4LogWriter()
    w.startup()
    w.request(0, 12000, 60, cold_store=10240)  # seq 1
    w.request(12060, 12500, 60)  # seq 2: live continuation
    w.request(0, 3000, 10)  # someone else's request, not in the run
    w.live_miss(3010, 13000, 11154)  # seq 3: back to the first conversation
    w.store(3010, "evict")
    w.evict(4096, hits=0)
    w.hit(12288)
    w.request(12288, 13000, 60)
    w.shutdown(persist=[13060])
    log = ds4.parse_lines(w.lines)
    run = [_req(1, 12000, 0), _req(2, 12500, 12060), _req(3, 13000, 12288)]
    recs = correlate(run, log.events)

    assert [r["line"] for r in recs] == sorted(r["line"] for r in recs)
    assert all(r["kind"] == "server" for r in recs)
    one = _by(recs, 1)
    assert one["request"][0]["prefill"] == 12000 and one["request"][0]["finish"] == "tool_calls"
    assert [s["reason"] for s in one["store"]] == ["cold"]
    assert set(_by(recs, 2)) == {"request"}
    three = _by(recs, 3)
    assert three["live_miss"][0]["common"] == 11154
    assert three["restore"][0]["tokens"] == 12288
    assert three["restore"][0]["coverage"] == 12288 / 13000
    assert [s["reason"] for s in three["store"]] == ["evict"]
    assert three["evict"][0]["hits"] == 0
    orphans = _by(recs, None)
    assert orphans["request"][0]["prompt"] == 3000  # the stranger's request stays unattributed
    assert [s["reason"] for s in orphans["store"]] == ["shutdown"]


def _batched_log() -> Ds4LogWriter:
    """Two slots: the server starts the second-sent request first and their lines interleave."""
    w = Ds4LogWriter()
    w.startup(sessions=2)
    p = w.server
    p("chat ctx=0..13000:13000 TOOLS prompt start")  # seq 2 (sent second)
    p("chat ctx=0..12000:12000 prompt start")  # seq 1
    p("chat ctx=0..13000:13000 TOOLS prefill chunk 0/13000 (0.0%) chunk=0.00 t/s avg=0.00 t/s 0.00s")
    p("chat ctx=0..12000:12000 prefill chunk 0/12000 (0.0%) chunk=0.00 t/s avg=0.00 t/s 0.00s")
    p("chat ctx=0..12000:12000 prefill chunk 10240/12000 (85.3%) chunk=500.00 t/s avg=500.00 t/s 20.48s")
    w.store(10240, "cold", trimmed=1760)  # seq 1's cut: (12000 - 32) // 2048 * 2048
    p(
        "chat ctx=0..13000:13000 TOOLS prefill chunk 12288/13000 (94.5%) chunk=500.00 t/s avg=500.00 t/s 24.58s"
    )
    w.store(12288, "cold", trimmed=712)  # seq 2's cut
    p("chat ctx=0..12000:12000 prompt done 24.00s")
    p("chat ctx=0..13000:13000 TOOLS prompt done 26.00s")
    p("chat ctx=12000..12050:50 gen=50 decoding chunk=20.00 t/s avg=20.00 t/s 2.50s")
    p("chat ctx=13000..13050:50 gen=50 TOOLS decoding chunk=22.00 t/s avg=22.00 t/s 2.27s")
    p("chat ctx=0..12000:12000 gen=50 finish=stop 26.50s")
    p("chat ctx=0..13000:13000 gen=50 TOOLS finish=tool_calls 28.27s")
    # seq 3 (session of seq 2) misses and restores; seq 4 (session of seq 1) starts in between
    w.live_miss(12050, 14000, 11154)
    w.store(12050, "evict")
    w.evict(4096, hits=0)
    w.hit(12288)
    p("chat ctx=12050..12500:450 prompt start")  # seq 4
    p("chat ctx=12288..14000:1712 TOOLS prompt start")  # seq 3
    p("chat ctx=12050..12500:450 gen=10 finish=stop 1.00s")
    p("chat ctx=12288..14000:1712 gen=10 TOOLS finish=stop 4.00s")
    # seq 5 got an error back (no usage); the server logged it anyway
    p("chat ctx=0..3000:3000 prompt start")
    p('chat ctx=0..3000:3000 gen=0 finish=error error="client went away" 1.00s')
    return w


def test_batched_mode_by_span_not_line_order() -> None:
    log = ds4.parse_lines(_batched_log().lines)
    assert log.stats.warnings == []
    run = [
        _req(1, 12000, 0),
        _req(2, 13000, 0),
        _req(3, 14000, 12288),
        _req(4, 12500, 12050),
        _req(5, None, None, "error"),
    ]
    recs = correlate(run, log.events)
    assert [s["tokens"] for s in _by(recs, 1)["store"]] == [10240]
    assert [s["tokens"] for s in _by(recs, 2)["store"]] == [12288]
    assert _by(recs, 1)["request"][0]["decode_tps"] == 20.0
    assert _by(recs, 2)["request"][0]["decode_tps"] == 22.0
    three = _by(recs, 3)
    assert three["restore"][0]["tokens"] == 12288 and three["live_miss"][0]["prompt"] == 14000
    assert [e["tokens"] for e in three["evict"]] == [4096]
    assert set(_by(recs, 4)) == {"request"}
    five = _by(recs, 5)["request"][0]
    assert five["error"] is True and five["finish"] == "error"
    assert _by(recs, None) == {}


def test_match_requests_lookahead_is_bounded() -> None:
    log = ds4.parse_lines(_batched_log().lines)
    asm = assemble(log.events)
    mapping = match_requests([_req(1, 12000, 0), _req(2, 13000, 0)], asm.requests)
    assert mapping == {0: 2, 1: 1}
    # a run request far beyond the lookahead window is not matched out of send order
    many = [_req(i, 100 + i, 0) for i in range(1, 40)] + [_req(40, 12000, 0)]
    assert match_requests(many, asm.requests) == {}
    assert match_requests(many[-10:], asm.requests) == {1: 40}


def _match_by_scanning(requests, log_requests):
    """The matching rule as first written (every unmatched request scanned from the first, each
    log request): the reference the linear one must agree with."""
    num = lambda r, k: r.get(k) if isinstance(r.get(k), int) else None  # noqa: E731
    pending = sorted(requests, key=lambda r: r["seq"])
    used: set[int] = set()
    out: dict[int, int] = {}
    for lr in log_requests:
        window = [r for r in pending if r["seq"] not in used][:LOOKAHEAD]
        pick = next((r for r in window if num(r, "prompt_tokens") == lr.prompt and num(r, "cached_tokens") == lr.cached), None)  # fmt: skip
        if pick is None:
            pick = next((r for r in window if num(r, "prompt_tokens") == lr.prompt and num(r, "cached_tokens") is None), None)  # fmt: skip
        if pick is None and window and num(window[0], "prompt_tokens") is None:
            pick = window[0]
        if pick is not None:
            used.add(pick["seq"])
            out[lr.index] = pick["seq"]
    return out


@pytest.mark.parametrize("seed", range(6))
def test_match_requests_agrees_with_scanning_every_unmatched_request(seed: int) -> None:
    # Requests finished out of send order, some started by the server in another order, some
    # without usage (errors), some the log never saw, and log requests from another client.
    rng = random.Random(seed)
    n = 600
    spans = [(rng.choice([1000, 2000, 3000]), rng.choice([0, 500])) for _ in range(n)]
    requests = []
    for seq, (prompt, cached) in enumerate(spans, 1):
        kind = rng.random()
        if kind < 0.05:
            requests.append(_req(seq, None, None, "http_error"))
        elif kind < 0.1:
            requests.append(_req(seq, prompt, None))
        else:
            requests.append(_req(seq, prompt, cached))
    order = list(range(n))
    for i in range(0, n - 4, 3):  # started a few places out of send order
        j = i + rng.randrange(4)
        order[i], order[j] = order[j], order[i]
    log_requests = []
    for i in order:
        if rng.random() < 0.05:
            continue  # never reached the server's log
        prompt, cached = spans[i]
        log_requests.append(SimpleNamespace(index=len(log_requests), prompt=prompt, cached=cached))
        if rng.random() < 0.03:  # another client's request
            log_requests.append(SimpleNamespace(index=len(log_requests), prompt=77, cached=0))
    rng.shuffle(requests)  # kept in the order they finished
    want = _match_by_scanning(requests, log_requests)
    assert match_requests(requests, log_requests) == want
    assert match_requests(iter(requests), log_requests) == want  # read once, as a stream
    assert len(want) > n // 2
