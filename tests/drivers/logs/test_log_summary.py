"""`replay logs summary`: figures on a synthetic multi-window ds4 log whose answers are known."""

from __future__ import annotations

import datetime as dt
import io
import json
import statistics
from pathlib import Path

import pytest
from rich.console import Console

from drivers.logs import ds4
from replay.errors import UsageError
from replay.report.logs import Ds4Window, LogSummary, detect_kind, render, summarize, summarize_ds4
from tests.support.ds4_logtext import Ds4LogWriter

DECODE = {  # request -> (depth B, decode tok/s)
    "r1": (12000, 40.0),
    "r2": (60000, 30.0),
    "r3": (12000, 44.0),
    "r4": (59100, 32.0),
    "r5": (70000, 34.0),
}


def _scenario() -> tuple[Ds4LogWriter, list[tuple[dt.datetime, dt.datetime]]]:
    """Two runs with the same settings (a restart), then a run with cold and continued saves off."""
    w = Ds4LogWriter()
    spans = []
    # run 1
    t0 = w.now
    w.startup(cold_max=30000, continued=10000)
    w.request(0, 12000, 100, flags="TOOLS", decode_tps=40.0, cold_store=10240, tool_calls=1)  # r1: full
    w.request(12100, 60000, 100, flags="TOOLS", decode_tps=30.0)  # r2: live continuation
    w.live_miss(60100, 12000, 11154)
    w.evict(4096, hits=0)
    w.evict(8192, hits=0)
    w.store(60100, "evict")
    w.evict(20480, hits=3)
    w.hit(10240)
    w.request(10240, 12000, 100, decode_tps=44.0)  # r3: restore, coverage 10240/12000
    w.shutdown(persist=[12100])
    spans.append((t0, w.now))
    # run 2: restart, same settings; restores a checkpoint written before the restart
    w.advance(600)
    t0 = w.now
    w.startup(cold_max=30000, continued=10000)
    w.hit(59000)
    w.request(59000, 59100, 100, decode_tps=32.0)  # r4: restore, coverage 59000/59100
    w.request(0, 70000, 100, decode_tps=34.0, finish="stop")  # r5: full
    spans.append((t0, w.now - dt.timedelta(seconds=1)))
    # run 3: settings change -> new window
    w.advance(600)
    t0 = w.now
    w.startup(cold_max=0, continued=0)
    w.request(0, 5000, 50, decode_tps=50.0)
    w.request(5050, 6000, 50, decode_tps=50.0, finish="length")
    w.request(6050, 6100, 0, finish="error", error="client went away")
    spans.append((t0, w.now - dt.timedelta(seconds=1)))
    return w, spans


Fixture = tuple[list[Ds4Window], Ds4Window, list[tuple[dt.datetime, dt.datetime]]]


@pytest.fixture(scope="module")
def summary() -> Fixture:
    w, spans = _scenario()
    log = ds4.parse_lines(w.lines)
    assert log.stats.warnings == [] and log.stats.unrecognised == 0
    windows, total = summarize_ds4(log.events)
    return windows, total, spans


def test_windows_split_on_settings_change_not_on_restart(summary: Fixture) -> None:
    windows, total, _ = summary
    assert [w.runs for w in windows] == [2, 1]
    assert windows[0].settings["kv_cache_cold_max_tokens"] == 30000
    assert windows[1].settings["kv_cache_cold_max_tokens"] == 0
    assert total.runs == 3 and total.requests == 8


def test_requests_finish_reasons_and_errors(summary: Fixture) -> None:
    w1, w2 = summary[0]
    assert w1.requests == 5 and w1.finish_reasons == {"stop": 1, "tool_calls": 4}
    assert w2.finish_reasons == {"error": 1, "length": 1, "tool_calls": 1}
    assert (w2.finish_errors, w2.error_lines, w1.error_lines) == (1, 1, 0)


def test_continuation_rate_and_full_prefills_per_hour(summary: Fixture) -> None:
    (w1, w2), _, spans = summary
    assert w1.continuation_rate == pytest.approx(3 / 5)
    assert w2.continuation_rate == pytest.approx(2 / 3)
    assert w1.full_prefills == 2
    hours = sum((b - a).total_seconds() for a, b in spans[:2]) / 3600
    assert w1.hours == pytest.approx(hours, abs=3 / 3600)
    assert w1.full_prefills_per_hour == pytest.approx(2 / w1.hours)


def test_restores_coverage_across_a_restart(summary: Fixture) -> None:
    w1, w2 = summary[0]
    assert w1.restores == 2 and w2.restores == 0
    cov = w1.restore_coverage
    assert cov["values"] == [round(10240 / 12000, 4), round(59000 / 59100, 4)]
    assert cov["buckets"]["75-90%"] == 1 and cov["buckets"]["99-100%"] == 1
    assert w1.restored_tokens == 10240 + 59000
    prefilled = 12000 + (60000 - 12100) + (12000 - 10240) + 100 + 70000
    assert w1.restore_saved_pct == pytest.approx(100 * 69240 / (69240 + prefilled))


def test_stores_and_zero_hit_evictions(summary: Fixture) -> None:
    w1, w2 = summary[0]
    assert {k: int(v["count"]) for k, v in w1.stores.items()} == {"cold": 1, "evict": 1, "shutdown": 1}
    assert w1.stores["cold"]["tokens"] == 10240
    assert (w1.evictions, w1.evictions_zero_hit) == (3, 2)
    assert w1.live_misses == 1 and w1.live_miss_reasons == {"token-mismatch": 1}
    assert w2.stores == {} and w2.evictions == 0


def test_depth_band_medians_and_time_weighted_decode(summary: Fixture) -> None:
    w1 = summary[0][0]
    bands = {b["band"]: b for b in w1.decode_bands}
    assert set(bands) == {"0-50K", "50-100K"}
    assert bands["0-50K"]["median_tps"] == pytest.approx(statistics.median([40.0, 44.0]))
    assert bands["50-100K"]["median_tps"] == pytest.approx(32.0)
    assert bands["50-100K"]["requests"] == 3
    secs = {k: 100 / tps for k, (_, tps) in DECODE.items()}
    weighted = sum(DECODE[k][1] * s for k, s in secs.items()) / sum(secs.values())
    assert w1.decode_tps_time_weighted == pytest.approx(weighted, rel=1e-3)
    assert w1.depth_max == 70000 and w1.depth_median == 59100


def test_summarize_files_json_and_render(tmp_path: Path) -> None:
    w, _ = _scenario()
    half = len(w.lines) // 2
    a, b = tmp_path / "ds4.log.1", tmp_path / "ds4.log"
    a.write_text("\n".join(w.lines[:half]) + "\n")
    b.write_text("\n".join(w.lines[half:]) + "\n")
    s = summarize([a, b])
    assert s.kind == "ds4" and len(s.windows) == 2 and s.total.requests == 8
    d = json.loads(json.dumps(s.to_dict()))
    assert d["windows"][0]["continuation_rate"] == pytest.approx(0.6)
    assert d["parse"]["warnings"] == []
    console = Console(record=True, width=160, file=io.StringIO())
    console.print(render(s))
    text = console.export_text()
    assert "window 1" in text and "window 2" in text and "all windows" in text
    assert "continuation rate" in text and "50-100K" in text


def test_render_shows_parse_warnings() -> None:
    log = ds4.parse_lines(["0521 10:00:00 ds4-server: xkv cache stored tokens=1 reason=cold"])
    windows, total = summarize_ds4(log.events)
    console = Console(record=True, width=160, file=io.StringIO())
    console.print(render(LogSummary("ds4", [], log.stats, windows, total)))
    assert "warning: store: 1 line(s)" in console.export_text()


def test_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        summarize([])
    with pytest.raises(UsageError):
        summarize([tmp_path / "missing.log"])
    junk = tmp_path / "junk.log"
    junk.write_text("hello\nworld\n")
    with pytest.raises(UsageError):
        detect_kind([junk])
    with pytest.raises(UsageError):
        summarize([junk], kind="vllm")
