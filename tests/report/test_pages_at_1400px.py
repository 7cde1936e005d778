"""The three reports a new user opens (the demo, slow-morning, an A/B) at 1400 px in headless
Chromium: nothing wider than the window, no figure over another, no two tick labels of an axis
touching, every legend's text at 10 px or more; and a screenshot of each."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from replay.metrics.results import read_results
from replay.report.ab import ArmRun, analyze
from replay.report.ab_html import write_ab_report
from replay.report.html import write_report
from replay.runs.scenario import run_arms
from replay.scenario import find_scenario
from replay.serverside.logs import records_beside
from tests.report.test_html_report import CHROMIUM

WIDTH = 1400
MIN_LEGEND_PX = 10.0
# Written into a copy of the page (the page itself stays script-free): every problem, one a line.
PROBE = """<script>
const problems = [];
const W = window.innerWidth;
if (document.documentElement.scrollWidth > W) problems.push("page " + document.documentElement.scrollWidth + " px wide");
document.querySelectorAll("table, p, pre, figure").forEach((e) => {
  if (e.getBoundingClientRect().right > W + 1) problems.push(e.tagName + " wider than the window");
});
const figs = [...document.querySelectorAll("figure.plot")];
figs.forEach((f, i) => {
  const box = f.getBoundingClientRect(), svg = f.querySelector("svg").getBoundingClientRect();
  if (svg.width > box.width + 1 || svg.height > box.height + 1) problems.push("figure " + i + " overflows");
  figs.slice(i + 1).forEach((g, k) => {
    const o = g.getBoundingClientRect();
    if (box.left < o.right && o.left < box.right && box.top < o.bottom && o.top < box.bottom)
      problems.push("figures " + i + " and " + (i + k + 1) + " overlap");
  });
  f.querySelectorAll('g[id^="matplotlib.axis"]').forEach((axis) => {
    // Level labels touch when their boxes come within 2 px; tilted ones (parallel strips) when
    // their anchors are closer across the tilt than the text is tall.
    const labels = [...axis.querySelectorAll('g[id^="xtick_"] text, g[id^="ytick_"] text')].map((t) => {
      const m = t.getScreenCTM();
      return { s: t.lastChild.textContent.trim(), r: t.getBoundingClientRect(), m: m,
               px: Math.hypot(m.a, m.b) * parseFloat(getComputedStyle(t).fontSize) };
    }).filter((l) => l.s && l.r.width > 0);
    labels.forEach((l, j) => labels.slice(j + 1).forEach((o) => {
      const tilt = Math.atan2(l.m.b, l.m.a);
      const gap = l.px / 2;  // half an em between two labels, or they read as one
      const touch = Math.abs(tilt) > 0.01
        ? Math.hypot(o.m.e - l.m.e, o.m.f - l.m.f) * Math.abs(Math.sin(tilt)) < l.px
        : l.r.left < o.r.right + gap && o.r.left < l.r.right + gap && l.r.top < o.r.bottom && o.r.top < l.r.bottom;
      if (touch) problems.push("figure " + i + ": tick labels '" + l.s + "' and '" + o.s + "' touch");
    }));
  });
  f.querySelectorAll('g[id^="legend_"] text').forEach((t) => {
    const m = t.getScreenCTM();
    const px = Math.hypot(m.a, m.b) * parseFloat(getComputedStyle(t).fontSize);
    if (px < MIN_PX) problems.push("figure " + i + ": legend '" + t.lastChild.textContent.trim() + "' at " + px.toFixed(1) + " px");
  });
});
const out = document.createElement("pre"); out.id = "probe";
out.textContent = "figures " + figs.length + "; problems: " + (problems.join(" | ") || "none");
document.body.appendChild(out);
</script>""".replace("MIN_PX", str(MIN_LEGEND_PX))

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's `chromium` (/usr/bin/chromium) for the headless render check"
)


def _chromium(profile: Path, *args: str) -> str:
    return subprocess.run(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={profile}",
            f"--window-size={WIDTH},2400",
            "--hide-scrollbars",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout


def check_page(page: Path, tmp: Path) -> str:
    """The probe's findings on `page` at 1400 px, after a screenshot of it."""
    shot = tmp / f"{page.parent.name}.png"
    _chromium(tmp / "profile", f"--screenshot={shot}", page.resolve().as_uri())
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000, page  # a page with figures
    probe = page.with_name("probe.html")
    probe.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    dom = _chromium(tmp / "profile", "--virtual-time-budget=5000", "--dump-dom", probe.resolve().as_uri())
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.DOTALL)
    assert found is not None, dom[-500:]
    return found.group(1)


@pytest.fixture(scope="module")
def slow_morning(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out = tmp_path_factory.mktemp("slow-morning")
    runs = run_arms(find_scenario("slow-morning"), out, time_scale=1000.0)  # 24G, 64G, 24G-20480
    return [Path(r.results) for r in runs]


def test_the_demo_report_reads_at_1400_px(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    subprocess.run(
        [sys.executable, "-m", "replay", "demo", "--out", str(out)],
        capture_output=True,
        timeout=300,
        check=True,
    )
    page = next(out.rglob("index.html"))
    assert check_page(page, tmp_path).endswith("problems: none")


def test_the_slow_morning_report_reads_at_1400_px(slow_morning: list[Path], tmp_path: Path) -> None:
    written = write_report(slow_morning, tmp_path / "report", server_log=records_beside)
    result = check_page(written.html, tmp_path)
    assert result == "figures 5; problems: none", result


def test_all_five_switch_classes_label_apart(slow_morning: list[Path], tmp_path: Path) -> None:
    """Issue #38: "compaction" and "concurrent" touched under the box plots. The scenario's arms
    as a wall-clock morning can run them: with main continuing itself now and then, all five
    classes side by side (here every third switch of the first arm relabelled `continue`)."""
    first = slow_morning[0]
    lines = first.read_bytes().split(b"\n")
    for i, line in enumerate(lines):
        if b'"kind":"request"' in line.replace(b" ", b"") and b'"switch"]' in line and i % 3 == 0:
            rec = orjson.loads(line)
            rec["switch"] = ["continue"]
            lines[i] = orjson.dumps(rec)
    relabelled = tmp_path / first.name
    relabelled.write_bytes(b"\n".join(lines))
    log = first.with_suffix(".server.log")
    if log.exists():
        (tmp_path / log.name).write_bytes(log.read_bytes())
    written = write_report([relabelled, *slow_morning[1:]], tmp_path / "report", server_log=records_beside)
    assert "continue" in written.html.read_text()
    result = check_page(written.html, tmp_path)
    assert result == "figures 5; problems: none", result


def test_the_ab_report_reads_at_1400_px(slow_morning: list[Path], tmp_path: Path) -> None:
    """An A/B of the 24G and 64G runs (one run pair): its timelines are half-width thumbnails."""
    a, b = (read_results(p) for p in slow_morning[:2])
    for res in (a, b):
        if not res.server:
            res.server = records_beside(res)
    runs = [ArmRun(1, "A", a, 0, {"fresh": True}), ArmRun(2, "B", b, 0, {"fresh": True})]
    header = {
        "targets": {"A": {"name": "24G", "file": "a.toml"}, "B": {"name": "64G", "file": "b.toml"}},
        "differences": [{"field": "flag --kv-disk-space-mb", "a": "24576", "b": "65536"}],
    }
    page = write_ab_report(analyze(runs, None, header), tmp_path / "ab", tmp_path)
    assert page.read_text().count('data-plot="timeline"') == 2
    assert "Action: " in page.read_text() and "**Action:** " in page.with_name("summary.md").read_text()
    result = check_page(page, tmp_path)
    assert result == "figures 2; problems: none", result
