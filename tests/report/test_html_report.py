"""The HTML report and markdown summary: built from results files, self-contained, renders in Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from replay.metrics.record import RequestRecord, Usage
from replay.metrics.results import ResultsWriter, append_records, time_scale
from replay.report.html import digest, render_page, summary_markdown, write_report
from replay.report.plots import band_width
from replay.report.view import load_run
from replay.serverside.logs import records_beside

LAYOUT_PROBE = """<script>
const figs = [...document.querySelectorAll("figure.plot")];
const problems = [];
figs.forEach((f, i) => {
  const box = f.getBoundingClientRect(), svg = f.querySelector("svg").getBoundingClientRect();
  if (svg.width > box.width + 1 || svg.height > box.height + 1) problems.push("figure " + i + " overflows");
  figs.slice(i + 1).forEach((g, k) => {
    const o = g.getBoundingClientRect();
    if (box.left < o.right && o.left < box.right && box.top < o.bottom && o.top < box.bottom)
      problems.push("figures " + i + " and " + (i + k + 1) + " overlap");
  });
});
const out = document.createElement("pre"); out.id = "layout";
out.textContent = "figures " + figs.length + "; problems: " + (problems.join(", ") || "none");
document.body.appendChild(out);
</script>"""
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)


def _request(
    seq: int,
    session: str,
    switch: list[str],
    sent: float,
    prompt: int,
    cached: int,
    modelled: dict[str, Any] | None,
) -> RequestRecord:
    """Sent at `sent` s after the run's start, 1 ms late: TTFT 0.2 s, 100 tokens at 1000/s, 0.3 s in all."""
    t_sent = round(sent * 1e9)
    return RequestRecord(
        seq=seq,
        request_id=seq,
        session=session,
        tag="turn",
        switch=tuple(switch),
        t_scheduled=t_sent - 1_000_000,
        t_sent=t_sent,
        t_first_token=t_sent + 200_000_000,
        t_last_token=t_sent + 299_000_000,
        t_end=t_sent + 300_000_000,
        usage=Usage(
            prompt_tokens=prompt,
            cached_tokens=cached,
            reprocessed_tokens=prompt - cached,
            reprocessed_source="server",
            output_tokens=100,
        ),
        finish="stop",
        x_sim=modelled,
    )


def _modelled(queue: float, restore: float, prefill: float, decode: float, source: str) -> dict[str, Any]:
    return {
        "queue_s": queue,
        "restore_s": restore,
        "evict_save_s": 0.5,
        "prefill_s": prefill,
        "decode_s": decode,
        "total_s": queue + restore + 0.5 + prefill + decode,
        "cache_source": source,
        "slot": 0,
    }


def make_results(path: Path, arm: str, reread: bool, modelled: bool = True, budget_mib: int = 4096) -> Path:
    """A small two-session run: cold, cold, then four switches that either restore or re-read."""
    header = {
        "trace": {"path": "t.jsonl", "sha256": "0", "source": "scenario:switching"},
        "target": {
            "kind": "sim",
            "arm": arm,
            "time_scale": 1000.0,
            "effective": {"kv_disk_budget_mib": budget_mib},
        },
        "plan": {"plan": "alternate"},
    }
    writer = ResultsWriter(path, header)
    sent = 0.0
    rows = [("a", ["cold"], 70_000, 0), ("b", ["cold"], 80_000, 10_240)]
    for k in range(4):
        sid = "ab"[k % 2]
        prompt = 80_000 + 10_000 * k
        rows.append((sid, ["switch"], prompt, 0 if reread else prompt - 10_000))
    for seq, (sid, switch, prompt, cached) in enumerate(rows, 1):
        new = prompt - cached
        m = (
            _modelled(0.0, 0.0 if not cached else 1.0, new / 510, 2.5, "disk" if cached else "none")
            if modelled
            else None
        )
        writer.request(_request(seq, sid, switch, sent, prompt, cached, m))
        sent += (m["total_s"] if m else 200.0) / 1000 + 0.01
    writer.close({"outcome": "done"})
    records: list[dict[str, Any]] = [
        {"request_seq": 1, "event": "request", "line": 1, "prompt_done_s": 0.15},
        {
            "request_seq": 1,
            "event": "store",
            "line": 2,
            "reason": "continued",
            "tokens": 10_240,
            "mib": 345.0,
        },
        {"request_seq": 2, "event": "live_miss", "line": 3},
        {"request_seq": 2, "event": "store", "line": 4, "reason": "evict", "tokens": 70_150, "mib": 2360.0},
        {"request_seq": 2, "event": "restore", "line": 5, "tokens": 10_240},
        {
            "request_seq": 3,
            "event": "store",
            "line": 6,
            "reason": "continued",
            "tokens": 20_480,
            "mib": 690.0,
        },
        {"request_seq": 3, "event": "evict", "line": 7, "tokens": 10_240, "hits": 1, "mib": 345.0},
        {"request_seq": 4, "event": "evict", "line": 8, "tokens": 70_150, "hits": 0, "mib": 2360.0},
        {
            "request_seq": None,
            "event": "store",
            "line": 9,
            "reason": "shutdown",
            "tokens": 110_150,
            "mib": 3700.0,
        },
    ]
    append_records(path, records)
    return path


@pytest.fixture
def two_arms(tmp_path: Path) -> list[Path]:
    return [
        make_results(tmp_path / "low.jsonl", "4G", reread=True),
        make_results(tmp_path / "high.jsonl", "64G", reread=False),
    ]


def test_run_view_phases_and_disk(two_arms: list[Path]) -> None:
    run = load_run(two_arms[0])
    assert run.label == "4G" and run.clock == "modelled" and run.budget_mib == 4096
    assert run.sessions == ["a", "b"]
    first, second = run.requests[:2]
    assert first.start == 0.0 and first.prefill == pytest.approx(70_000 / 510)
    assert second.start == pytest.approx(first.end, abs=1e-6)  # client overhead cut from the idle gap
    assert [p.event for p in run.disk] == ["store", "store", "restore", "store", "evict", "evict", "store"]
    assert run.disk[-1].t == pytest.approx(max(r.end for r in run.requests))  # the shutdown save goes last
    assert run.disk[1].used_mib == pytest.approx(345.0 + 2360.0)
    assert all(run.disk[i].t <= run.disk[i + 1].t for i in range(len(run.disk) - 1))


def test_digest_numbers(two_arms: list[Path]) -> None:
    low, high = (digest(load_run(p)) for p in two_arms)
    assert low["switches"] == high["switches"] == 4
    assert low["reprocessed_per_switch_mean"] == 95_000 and high["reprocessed_per_switch_mean"] == 10_000
    assert low["wait_per_switch_mean_s"] > 5 * high["wait_per_switch_mean_s"]
    assert low["evictions"] == 2 and low["evictions_zero_hits"] == 1 and low["restores"] == 1
    assert low["stores"] == {"continued": 2, "evict": 1, "shutdown": 1}


def test_measured_runs_use_the_server_log_for_prefill(tmp_path: Path) -> None:
    run = load_run(make_results(tmp_path / "m.jsonl", "real", reread=True, modelled=False))
    assert run.clock == "measured"
    first = run.requests[0]
    assert first.prefill == pytest.approx(0.15) and first.queue == pytest.approx(0.05)  # ttft - prompt done
    assert first.decode == pytest.approx(0.1)
    assert run.requests[1].prefill == pytest.approx(0.2)  # no server line: all of TTFT


def test_time_scale_from_the_servers_argv() -> None:
    header = {"target": {"build": {"argv": ["python", "-m", "replay.sim", "--time-scale", "250"]}}}
    assert time_scale(header) == 250.0
    assert time_scale({"target": {"kind": "external"}}) is None


def test_band_width_gives_a_few_round_bands() -> None:
    assert band_width(250_000) == 50_000
    assert band_width(131_072) == 20_000
    assert band_width(30_000) == 4096


def test_page_is_self_contained_and_has_every_section(two_arms: list[Path], tmp_path: Path) -> None:
    written = write_report(two_arms, tmp_path / "out", title="switching: 4G vs 64G")
    page = written.html.read_text()
    assert page.startswith("<!doctype html>")
    assert page.count('data-plot="timeline"') == 2
    for plot in ("classes", "depth"):
        assert f'data-plot="{plot}"' in page
    assert page.count("<svg") == 4
    for section in ("digest", "timeline", "classes", "depth"):
        assert f'<section id="{section}">' in page
    # Nothing is fetched: no external scripts, stylesheets, images or fonts.
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', page)
    assert "@import" not in page and "url(http" not in page
    assert "<script" not in page
    md = written.markdown.read_text()
    assert md.startswith("## switching: 4G vs 64G")
    assert "| re-processed tokens per switch, mean / max | 95,000 / 110,000 | 10,000 / 10,000 |" in md
    assert "### 64G: requests by switch class" in md and "| switch | 4 |" in md


def test_markdown_with_one_run_and_a_page_without_server_records(tmp_path: Path) -> None:
    path = tmp_path / "bare.jsonl"
    writer = ResultsWriter(path, {"target": {"kind": "external"}})
    writer.request(_request(1, "a", ["cold"], 0.0, 1000, 0, None))
    writer.close()
    run = load_run(path)
    assert run.disk == [] and run.label == "bare"
    page = render_page([run])
    assert "disk KV (GiB)" not in page  # no server log read: the timeline has no empty disk strip
    assert "Times are measured wall-clock seconds" in page
    assert "| requests (errors) | 1 (0) |" in summary_markdown([run])


@pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's `chromium` (/usr/bin/chromium) for the headless render check"
)
def test_renders_in_headless_chromium(two_arms: list[Path], tmp_path: Path) -> None:
    written = write_report(two_arms, tmp_path / "out")
    profile = tmp_path / "profile"
    base = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        f"--user-data-dir={profile}",
    ]
    url = written.html.resolve().as_uri()
    dom = subprocess.run(
        [*base, "--dump-dom", url], capture_output=True, text=True, timeout=90, check=True
    ).stdout
    assert dom.count("<svg") == 4, dom[:500]
    assert dom.count('data-plot="timeline"') == 2
    assert "What the switches cost" in dom
    assert 'id="glossary"' in dom and "<th title=" in dom
    # Layout: a copy of the page with a measuring script (the page itself stays script-free) writes
    # every figure whose drawing overflows its box, or that overlaps another, into the DOM.
    probe = written.html.with_name("probe.html")
    probe.write_text(written.html.read_text().replace("</body>", LAYOUT_PROBE + "</body>"))
    checked = subprocess.run(
        [
            *base,
            "--window-size=1280,2400",
            "--virtual-time-budget=5000",
            "--dump-dom",
            probe.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=True,
    ).stdout
    found = re.search(r'<pre id="layout">(.*?)</pre>', checked, re.DOTALL)
    assert found is not None, checked[-500:]
    assert found.group(1) == "figures 4; problems: none", found.group(1)
    shot = tmp_path / "page.png"
    subprocess.run(
        [*base, f"--screenshot={shot}", "--window-size=1280,2400", url],
        capture_output=True,
        timeout=90,
        check=True,
    )
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000  # a page with figures, not a blank one


def test_disk_events_from_the_log_beside_the_results(tmp_path: Path) -> None:
    """Results without `server` records: the ds4-format log next to them is parsed instead."""
    path = tmp_path / "r.jsonl"
    writer = ResultsWriter(path, {"target": {"kind": "sim", "time_scale": 1000.0}})
    m = _modelled(0.0, 0.0, 20.0, 2.0, "none")
    writer.request(_request(1, "a", ["cold"], 0.0, 12_000, 0, m))
    writer.close()
    stamp = "1129 17:04:53 ds4-server: "
    lines = [
        "chat ctx=0..12000:12000 TOOLS prompt start",
        "kv cache stored tokens=10240 trimmed=0 reason=continued key=token-text size=345.00 MiB save=241.2 ms",
        "kv cache evicted reason=disk-cache-full tokens=2048 hits=0 size=69.00 MiB file=/x/y.kv",
        "chat ctx=0..12000:12000 TOOLS prompt done 20.000s",
        "chat ctx=0..12000:12000 gen=100 TOOLS finish=stop 22.000s",
    ]
    path.with_suffix(".server.log").write_text("".join(stamp + line + "\n" for line in lines))
    assert load_run(path).disk == []  # a report that is not told how to read logs reads none
    run = load_run(path, records_beside)
    assert [(p.event, p.tokens) for p in run.disk] == [("store", 10_240), ("evict", 2048)]
    assert run.disk[-1].used_mib == pytest.approx(345.0 - 69.0)
    assert digest(run)["evictions_zero_hits"] == 1


def test_the_disk_strip_starts_with_an_earlier_days_files(tmp_path: Path) -> None:
    """Issue #38: slow-morning's 24G strip sat at 15-17 GiB under its 24 GiB line while evictions
    fired all along: the previous day's 8.6 GB on disk at the start was left out of the line."""
    plain = load_run(make_results(tmp_path / "plain.jsonl", "4G", reread=True))
    path = make_results(tmp_path / "day2.jsonl", "4G", reread=True)
    lines = path.read_bytes().split(b"\n")
    header = orjson.loads(lines[0])
    header["target"]["disk_at_start_mib"] = 8192.0
    path.write_bytes(b"\n".join([orjson.dumps(header), *lines[1:]]))
    day2 = load_run(path)
    assert [round(b.used_mib - a.used_mib) for a, b in zip(plain.disk, day2.disk, strict=True)] == [
        8192
    ] * len(plain.disk)
    # An eviction of a file the run did not store still lowers the line (it no longer stops at 0).
    assert min(p.used_mib for p in day2.disk) > 8192 - 2360


def test_a_scenario_walk_records_what_its_leftovers_take(tmp_path: Path) -> None:
    from replay.runs.modelled import model_arm
    from replay.scenario import find_scenario
    from replay.scenario.build import generate

    spec = find_scenario("slow-morning")
    arm = spec.arm("24G")
    trace = tmp_path / "t.jsonl"
    generate(spec.with_params(arm.params), trace)
    res = model_arm(spec.with_params(arm.params), arm, trace)
    at_start = res.run["target"]["disk_at_start_mib"]
    assert 8.0 * 1024 < at_start < 8.7 * 1024  # "8.6 GB of the previous day's checkpoints"
