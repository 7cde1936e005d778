"""ds4 log parser: every line kind, optional flags, colour, counting, and no text leaking out."""

from __future__ import annotations

import io
import json
import re
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drivers.logs import ds4
from replay.report.logs import render, summarize_ds4
from replay.serverside.ds4 import correlate
from tests.support.ds4_logtext import RESET, YELLOW, Ds4LogWriter

P = "0521 10:00:00 ds4-server: "


def one(msg: str) -> ds4.Event:
    log = ds4.parse_lines([P + msg])
    assert len(log.events) == 1, (msg, log.stats.to_dict())
    return log.events[0]


# --- per-request lines ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("", frozenset()),
        (" TOOLS", frozenset({"TOOLS"})),
        (" RESPPROTO TOOLS", frozenset({"RESPPROTO", "TOOLS"})),
        (" RESPPROTO TOOLS THINKING DSML_START DSML_END", frozenset(ds4.FLAGS)),
    ],
)
def test_span_lines_with_and_without_flags(flags: str, expected: frozenset[str]) -> None:
    start = one(f"chat ctx=1200..15000:13800{flags} prompt start")
    assert isinstance(start, ds4.PromptStart)
    assert (start.api, start.cached, start.prompt, start.todo, start.flags) == (
        "chat",
        1200,
        15000,
        13800,
        expected,
    )

    prog = one(
        f"chat ctx=1200..15000:13800{flags} prefill chunk 4096/13800 (29.7%) chunk=512.25 t/s avg=498.10 t/s 8.22s"
    )
    assert isinstance(prog, ds4.PrefillProgress)
    assert (prog.phase, prog.done, prog.total, prog.chunk_tps, prog.avg_tps, prog.seconds) == (
        "prefill",
        4096,
        13800,
        512.25,
        498.10,
        8.22,
    )
    assert prog.flags == expected

    done = one(f"completion ctx=1200..15000:13800{flags} prompt done 27.71s")
    assert isinstance(done, ds4.PromptDone)
    assert (done.api, done.seconds, done.flags) == ("completion", 27.71, expected)

    dec = one(f"chat ctx=15000..15100:100 gen=100{flags} decoding chunk=41.00 t/s avg=40.25 t/s 2.48s")
    assert isinstance(dec, ds4.Decoding)
    assert (dec.cached, dec.prompt, dec.gen, dec.chunk_tps, dec.avg_tps, dec.seconds) == (
        15000,
        15100,
        100,
        41.0,
        40.25,
        2.48,
    )

    fin = one(f"chat ctx=1200..15000:13800 gen=312{flags} finish=tool_calls 35.02s")
    assert isinstance(fin, ds4.Finish)
    assert (fin.gen, fin.reason, fin.seconds, fin.error, fin.flags) == (
        312,
        "tool_calls",
        35.02,
        False,
        expected,
    )


def test_tool_rebuild_progress_and_finish_reasons() -> None:
    prog = one(
        "chat ctx=0..9000:9000 TOOLS tool checkpoint rebuild chunk 0/9000 (0.0%) chunk=0.00 t/s avg=0.00 t/s 0.00s"
    )
    assert isinstance(prog, ds4.PrefillProgress) and prog.phase == "tool-rebuild"
    for reason in ("stop", "length", "tool_calls"):
        fin = one(f"chat ctx=0..10:10 gen=1 finish={reason} 0.10s")
        assert isinstance(fin, ds4.Finish) and fin.reason == reason and not fin.error


def test_finish_error_keeps_flag_not_text() -> None:
    fin = one('chat ctx=10..20:10 gen=0 TOOLS finish=error error="shutdown requested: SECRET TOKENS=5" 0.50s')
    assert isinstance(fin, ds4.Finish)
    assert (fin.reason, fin.error, fin.seconds, fin.gen, fin.flags) == (
        "error",
        True,
        0.5,
        0,
        frozenset({"TOOLS"}),
    )


@pytest.mark.parametrize(
    ("msg", "cause"),
    [
        ("chat ctx=0..9000:9000 TOOLS stream closed during prefill", "closed-during-prefill"),
        ("chat ctx=0..9000:9000 final stream failed", "final-stream-failed"),
        ("chat ctx=0..9000:9000 prefill failed after stream closed: broken pipe", "prefill-failed"),
        ("chat ctx=0..9000:9000 anthropic stream start failed", "stream-start-failed"),
    ],
)
def test_request_aborts(msg: str, cause: str) -> None:
    ev = one(msg)
    assert isinstance(ev, ds4.RequestAbort) and ev.cause == cause and ev.prompt == 9000


def test_tool_calls_carry_count_only() -> None:
    for raw in ("raw_dsml=1", "raw_tool_text=1"):
        ev = one(f"tool calls ctx=0..9000:9000 RESPPROTO n=3 {raw} ids=[call_a,call_b] names=[read,write]")
        assert isinstance(ev, ds4.ToolCalls)
        assert (ev.n, ev.raw, ev.resp, ev.prompt) == (3, 1, True, 9000)
        assert "read" not in json.dumps(ev.to_dict())


def test_prefill_cancelled() -> None:
    ev = one("prefill cancelled ctx=0..9000:9000 reason=client-gone")
    assert isinstance(ev, ds4.PrefillCancelled) and ev.reason == "client-gone" and ev.todo == 9000


# --- cache lines ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("msg", "vision", "resp"),
    [
        ("live kv cache miss live=90000 prompt=92000 common=14336 reason=token-mismatch", None, False),
        (
            "live kv cache miss RESPPROTO live=90000 prompt=92000 common=14336 reason=token-mismatch",
            None,
            True,
        ),
        ("live kv cache miss live=90000 prompt=92000 common=14336 vision=0 reason=token-mismatch", 0, False),
        (
            "live kv cache miss RESPPROTO live=90000 prompt=92000 common=14336 vision=2 reason=token-mismatch",
            2,
            True,
        ),
    ],
)
def test_live_miss_optional_fields(msg: str, vision: int | None, resp: bool) -> None:
    ev = one(msg)
    assert isinstance(ev, ds4.LiveMiss)
    assert (ev.live, ev.prompt, ev.common, ev.vision, ev.reason, ev.resp) == (
        90000,
        92000,
        14336,
        vision,
        "token-mismatch",
        resp,
    )


def test_store_hit_evict_skip_lines() -> None:
    st_ = one(
        "kv cache stored tokens=10240 trimmed=771 reason=cold key=token-text size=157.05 MiB save=88.4 ms"
    )
    assert isinstance(st_, ds4.Store)
    assert (st_.reason, st_.tokens, st_.trimmed, st_.key, st_.mib, st_.ms) == (
        "cold",
        10240,
        771,
        "token-text",
        157.05,
        88.4,
    )

    hit = one(
        "kv cache hit text tokens=20480 text=81234 quant=2 key=thinking-visible load=1210.5 ms file=/kv/a.kv"
    )
    assert isinstance(hit, ds4.DiskHit)
    assert (hit.tokens, hit.text_bytes, hit.quant, hit.key, hit.load_ms, hit.consumed, hit.resp) == (
        20480,
        81234,
        2,
        "thinking-visible",
        1210.5,
        False,
        False,
    )
    hit2 = one(
        "kv cache hit text RESPPROTO tokens=40960 text=9 quant=4 key=token-text load=3.0 ms consumed file=/kv/b.kv"
    )
    assert isinstance(hit2, ds4.DiskHit) and hit2.consumed and hit2.resp and hit2.quant == 4

    ev = one("kv cache evicted reason=disk-cache-full tokens=4096 hits=0 size=76.70 MiB file=/kv/c.kv")
    assert isinstance(ev, ds4.Eviction) and (ev.reason, ev.tokens, ev.hits, ev.mib) == (
        "disk-cache-full",
        4096,
        0,
        76.7,
    )

    sk = one("kv cache skipped tokens=600 reason=too-large because rendered text exceeds 4 MiB")
    assert isinstance(sk, ds4.StoreSkipped) and sk.tokens == 600 and sk.reason == "too-large"
    sk2 = one("kv cache skipped tokens=600 because live checkpoint is at 512")
    assert isinstance(sk2, ds4.StoreSkipped) and sk2.reason is None


@pytest.mark.parametrize(
    ("msg", "cause"),
    [
        ("kv cache store failed (evict): No space left on device save=3.0 ms", "store-failed"),
        ("kv cache failed to create /kv/x.tmp.12: Permission denied", "create-failed"),
        ("kv cache load failed RESPPROTO /kv/x.kv: bad magic load=1.0 ms", "load-failed"),
        ("kv cache discarded reason=prefill-failed file=/kv/x.kv", "discarded"),
        ("kv cache replaced incompatible file /kv/x.kv", "replaced-incompatible"),
    ],
)
def test_disk_errors(msg: str, cause: str) -> None:
    ev = one(msg)
    assert isinstance(ev, ds4.DiskError) and ev.cause == cause


def test_continuations() -> None:
    r = one("responses live continuation RESPPROTO match=tool-output-ids ids=2 cached=5000 prompt=5200")
    assert isinstance(r, ds4.Continuation) and (r.via, r.match, r.ids, r.cached, r.prompt) == (
        "responses",
        "tool-output-ids",
        2,
        5000,
        5200,
    )
    a = one("anthropic live continuation match=tool-output-ids ids=1 cached=700 prompt=800")
    assert isinstance(a, ds4.Continuation) and a.via == "anthropic"
    t = one("thinking live continuation match=visible-prefix cached=900 prompt=1000")
    assert isinstance(t, ds4.Continuation) and (t.via, t.ids, t.cached) == ("thinking", None, 900)


# --- process lines -------------------------------------------------------------------------------


def test_startup_and_shutdown_lines() -> None:
    cfg = one(
        "KV disk cache /Users/me/kv (budget=131072 MiB, cross-quant=reject, min=512, cold_max=0, "
        "continued=0, trim=32, align=2048, hit_half_life=21600s)"
    )
    assert isinstance(cfg, ds4.DiskCacheConfig)
    assert (
        cfg.budget_mib,
        cfg.cross_quant,
        cfg.min_tokens,
        cfg.cold_max,
        cfg.continued,
        cfg.trim,
        cfg.align,
        cfg.hit_half_life_s,
    ) == (131072, "reject", 512, 0, 0, 32, 2048, 21600)

    buf = one(
        "context buffers 5432.10 MiB (ctx=163840, backend=metal, prefill_chunk=1024, raw_kv_rows=128, compressed_kv_rows=40960)"
    )
    assert isinstance(buf, ds4.ContextBuffers)
    assert (buf.mib, buf.ctx, buf.backend, buf.prefill_chunk) == (5432.10, 163840, "metal", 1024)

    bm = one(
        "batched mode enabled resident_sessions=2 prefill_quantum=2048 mixed_prefill_quantum=128 decode_coalesce_us=2000"
    )
    assert isinstance(bm, ds4.BatchedMode) and (bm.resident_sessions, bm.mixed_prefill_quantum) == (2, 128)

    rs = one("2 resident sessions request at least 96.5 GiB of context buffers")
    assert isinstance(rs, ds4.ResidentSessions) and (rs.sessions, rs.gib) == (2, 96.5)

    li = one("listening on http://127.0.0.1:8123")
    assert isinstance(li, ds4.Listening) and li.port == 8123
    lf = one("failed to listen on 127.0.0.1:8123: Address already in use")
    assert isinstance(lf, ds4.ListenFailed) and lf.port == 8123

    assert isinstance(one("shutdown requested, draining requests"), ds4.ShutdownRequested)
    a = one("persisting current KV cache before shutdown tokens=5000")
    assert isinstance(a, ds4.ShutdownPersist) and (a.slot, a.tokens) == (None, 5000)
    b = one("persisting resident KV cache before shutdown slot=1 tokens=7000")
    assert isinstance(b, ds4.ShutdownPersist) and (b.slot, b.tokens) == (1, 7000)
    db = one("decode batch count=2 elapsed=24.5 ms status=ok")
    assert isinstance(db, ds4.DecodeBatch) and (db.count, db.ms, db.ok) == (2, 24.5, True)


# --- colour, counting, vocabulary --------------------------------------------------------------


def _writer_log(colour: bool) -> Ds4LogWriter:
    w = Ds4LogWriter(colour=colour)
    w.startup(sessions=2)
    w.request(0, 12000, 120, flags="TOOLS", tool_calls=1, cold_store=10240)
    w.live_miss(12120, 13000, 11154, resp=True, vision="0")
    w.store(12120, "evict")
    w.evict(4096, hits=0)
    w.hit(10240, consumed=True)
    w.request(10240, 13000, 60, finish="stop", end_flags="THINKING")
    w.shutdown(persist=[13060])
    return w


def test_tty_colour_gives_the_same_events() -> None:
    plain = ds4.parse_lines(_writer_log(False).lines)
    coloured_lines = _writer_log(True).lines
    assert any(YELLOW in line and RESET in line for line in coloured_lines)
    coloured = ds4.parse_lines(coloured_lines)
    assert [e.to_dict() for e in coloured.events] == [e.to_dict() for e in plain.events]
    assert coloured.stats.warnings == [] and coloured.stats.unrecognised == 0


def test_unrecognised_and_engine_lines_are_counted() -> None:
    lines = [
        P + "chat ctx=0..10:10 prompt start",
        "ds4: metal kernels compiled in 1.2 s",
        "",
        P + "something new the parser never saw",
        "Traceback (most recent call last):",
        P + "tool checkpoint canonicalized ctx=0..10:10",
    ]
    log = ds4.parse_lines(lines)
    s = log.stats
    assert (s.lines, s.blank, s.recognised, s.known_ignored, s.unrecognised) == (6, 1, 1, 2, 2)


def test_unknown_vocabulary_becomes_other_and_is_counted() -> None:
    log = ds4.parse_lines(
        [
            P + "live kv cache miss live=1 prompt=2 common=0 reason=brand-new-reason",
            P + "chat ctx=0..10:10 NEWFLAG prompt start",
        ]
    )
    miss, start = log.events
    assert isinstance(miss, ds4.LiveMiss) and miss.reason == "other"
    assert isinstance(start, ds4.PromptStart) and start.flags == frozenset()
    assert log.stats.unknown_values == 2 and log.stats.warnings


def test_count_check_passes_with_flags_between_fields() -> None:
    log = ds4.parse_lines(_writer_log(False).lines)
    assert all(c.ok for c in log.stats.checks)
    assert {c.kind: c.lines for c in log.stats.checks}["finish"] == 2


def test_count_check_catches_a_regex_that_misses_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """The field-report bug: gen and finish concatenated, so a TOOLS flag between them matched 0."""
    monkeypatch.setattr(ds4, "_FINISH_REASON", re.compile(r"gen=\d+ finish=(\S+)"))
    log = ds4.parse_lines(
        [
            P + "chat ctx=0..10:10 gen=5 finish=stop 1.00s",
            P + "chat ctx=0..10:10 gen=5 TOOLS finish=tool_calls 1.00s",
        ]
    )
    assert log.stats.by_kind["finish"] == 1
    assert any(w.startswith("finish: 2 line(s)") and "but 1 finish event" in w for w in log.stats.warnings)


def test_count_check_flags_zero_events_from_nonzero_lines() -> None:
    log = ds4.parse_lines([P + "kv cache stored tokens=abc reason=cold"] * 3)
    check = next(c for c in log.stats.checks if c.kind == "store")
    # The line still parses as a store (fields are optional), so counts agree...
    assert check.ok and log.stats.by_kind["store"] == 3
    # ...while a store line that is not a store line by our grammar does not:
    log2 = ds4.parse_lines([P + "xkv cache stored tokens=1 reason=cold"])
    assert not next(c for c in log2.stats.checks if c.kind == "store").ok


# --- timestamps ----------------------------------------------------------------------------------


def test_seconds_of_year_and_leap_day() -> None:
    assert ds4.seconds_of_year(1, 1, 0, 0, 0) == 0
    assert ds4.seconds_of_year(1, 2, 1, 2, 3) == 86400 + 3723
    assert ds4.seconds_of_year(2, 29, 0, 0, 0) == 59 * 86400
    assert ds4.seconds_of_year(3, 1, 0, 0, 0, year=2023) == 59 * 86400


def test_december_to_january_wrap() -> None:
    log = ds4.parse_lines(
        [
            "1231 23:59:50 ds4-server: chat ctx=0..10:10 prompt start",
            "0101 00:00:10 ds4-server: chat ctx=0..10:10 gen=1 finish=stop 20.00s",
            "0101 00:01:10 ds4-server: chat ctx=0..10:10 prompt start",
        ]
    )
    a, b, c = (e.t for e in log.events)
    assert a is not None and b is not None and c is not None
    assert b - a == 20 and c - b == 60


def test_wrap_with_explicit_year_and_clock_step_back() -> None:
    log = ds4.parse_lines(
        [
            "1231 23:59:59 ds4-server: shutdown requested, draining requests",
            "0101 00:00:01 ds4-server: shutdown requested, draining requests",
            "0101 00:00:00 ds4-server: shutdown requested, draining requests",  # a small step back stays
        ],
        year=2023,
    )
    a, b, c = (e.t for e in log.events)
    assert (b - a, c - b) == (2, -1)  # type: ignore[operator]


# --- nothing from the log but numbers and closed names -------------------------------------------


SECRET = "Zanzibarquokka"


def _secret_log(secret: str) -> list[str]:
    w = Ds4LogWriter()
    w.startup(disk_dir=f"/Users/{secret}/kv cache (budget=1 MiB)")
    w.server(f"tracing session to /tmp/{secret}.trace")
    w.request(0, 12000, 60, flags="TOOLS", tool_calls=2, cold_store=10240)
    w.server(
        f"tool calls ctx=0..12000:12000 n=2 raw_dsml=0 ids=[call_{secret}] names=[{secret}_tool, {secret.upper()}]"
    )
    w.live_miss(12060, 13000, 11154)
    w.store(12060, "evict")
    w.evict(4096, path=f"/Users/{secret}/kv/tokens=77 hits=9.kv")
    w.hit(10240, path=f"/Users/{secret}/{secret.upper()} TOOLS/x.kv")
    w.request(10240, 13000, 10, finish="error", error=f"{secret} {secret.upper()} gen=99 failed")
    w.server(f"kv cache load failed /Users/{secret}/y.kv: {secret} load=2.0 ms")
    w.server(f"kv cache skipped tokens=600 reason=too-large because {secret} exceeds budget")
    w.server(f"chat ctx=0..9000:9000 prefill failed after stream closed: {secret.upper()} {secret}")
    w.server(f"failed to listen on {secret}.local:8000: {secret}")
    w.server(f"listening on http://{secret}:8000")
    w.server(f"{secret} completely unknown line {secret.upper()}")
    w.lines.append(f"ds4: engine says {secret}")
    return w.lines


def _everything_out(lines: list[str]) -> str:
    from rich.console import Console

    log = ds4.parse_lines(lines)
    windows, total = summarize_ds4(log.events)
    console = Console(record=True, width=200, file=io.StringIO())
    from replay.report.logs import LogSummary

    console.print(render(LogSummary("ds4", [], log.stats, windows, total)))
    records = correlate([{"seq": 1, "prompt_tokens": 12000, "cached_tokens": 0, "status": "ok"}], log.events)
    parts = [
        json.dumps([e.to_dict() for e in log.events]),
        json.dumps(log.stats.to_dict()),
        json.dumps([w.to_dict() for w in windows] + [total.to_dict()], default=str),
        json.dumps(records),
        console.export_text(),
        repr(log.events),
    ]
    return "\n".join(parts)


def test_secret_words_never_leave_the_parser() -> None:
    lines = _secret_log(SECRET)
    assert sum(SECRET in line for line in lines) >= 10
    out = _everything_out(lines)
    assert SECRET.lower() not in out.lower()
    # and the lines still parsed into what they are
    log = ds4.parse_lines(lines)
    kinds = log.stats.by_kind
    assert kinds["disk_hit"] == 1 and kinds["eviction"] == 1 and kinds["disk_error"] == 1
    assert kinds["listen_failed"] == 1 and kinds["request_abort"] == 1 and kinds["tool_calls"] == 2


@settings(max_examples=25, deadline=None)
@given(st.text(alphabet=string.ascii_letters, min_size=14, max_size=24))
def test_no_random_word_leaves_the_parser(secret: str) -> None:
    out = _everything_out(_secret_log(secret))
    assert secret.lower() not in out.lower()
