"""`replay demo`: both arms on the simulator, the comparison printed, the report written, in time."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
from rich.console import Console

from replay.commands.demo import DemoArgs, demo
from replay.metrics.results import read_results

pytestmark = pytest.mark.e2e


def test_demo_compares_4g_with_64g_and_writes_the_report(tmp_path: Path) -> None:
    buf = io.StringIO()
    started = time.monotonic()
    code = demo(DemoArgs(out=tmp_path / "demo"), Console(file=buf, width=140))
    elapsed = time.monotonic() - started
    out = buf.getvalue()
    assert code == 0, out
    assert elapsed < 60, f"demo took {elapsed:.1f} s"
    page = tmp_path / "demo" / "report" / "index.html"
    assert page.exists() and f"HTML report: {page.resolve()}" in out.replace("\n", "")
    assert (tmp_path / "demo" / "report" / "summary.md").exists()
    assert "re-processed tokens per switch" in out and "64G" in out
    low = read_results(tmp_path / "demo" / "switching-4G.results.jsonl")
    high = read_results(tmp_path / "demo" / "switching-64G.results.jsonl")
    switches = [[r for r in res.requests if "switch" in r["switch"]] for res in (low, high)]
    assert min(r["reprocessed_tokens"] for r in switches[0]) > 70_000
    assert max(r["reprocessed_tokens"] for r in switches[1]) < 10_100
    assert any(s["event"] == "evict" for s in low.server) and not any(
        s["event"] == "evict" for s in high.server
    )
