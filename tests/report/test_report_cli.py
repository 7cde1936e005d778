"""`replay report` in the terminal and as JSON: runs side by side unless pooled on request, and the
causes of failed requests shown where the user looks."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from replay.metrics.results import FORMAT
from replay.report.failures import cause, failure_groups, failure_lines

HTML_501 = (
    'request 4deed101-{id} POST /v1/chat/completions: HTTP 501: <!DOCTYPE HTML> <html lang="en"> <head> '
    '<meta charset="utf-8"> <title>Error response</title> </head> <body> <h1>Error response</h1> '
    "<p>Error code: 501</p> <p>Message: Unsupported method ('POST').</p> </body> </html>"
)


def _results(path: Path, arm: str, lines: list[dict]) -> Path:
    header = {"kind": "run", "format": FORMAT, "target": {"kind": "sim", "arm": arm}, "trace": {}}
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in [header, *lines]))
    return path


def _ok(seq: int, switch: str, ttft: float, reprocessed: int) -> dict:
    return {
        "kind": "request",
        "seq": seq,
        "id": seq,
        "session": "main",
        "switch": [switch],
        "status": "ok",
        "ttft_s": ttft,
        "latency_s": ttft + 0.1,
        "prompt_tokens": 100_000,
        "cached_tokens": 100_000 - reprocessed,
        "reprocessed_tokens": reprocessed,
        "output_tokens": 10,
    }


def _failed(seq: int, session: str, error: str, status: str = "http_error") -> dict:
    return {
        "kind": "request",
        "seq": seq,
        "id": seq,
        "session": session,
        "switch": ["cold"],
        "status": status,
        "error": error,
    }


def _cli(*args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "replay", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "160"},
    )
    assert done.returncode == code, done.stderr
    return done


@pytest.fixture
def two_budgets(tmp_path: Path) -> list[Path]:
    """A 4G run whose switches re-read 100K tokens and a 64G run whose switches re-read 10K."""
    small = _results(tmp_path / "small.jsonl", "4G", [_ok(i, "switch", 2.0, 100_000) for i in range(1, 5)])
    big = _results(tmp_path / "big.jsonl", "64G", [_ok(i, "switch", 0.2, 10_000) for i in range(1, 5)])
    return [small, big]


def test_two_results_files_are_shown_side_by_side_not_pooled(two_budgets: list[Path]) -> None:
    text = _cli("report", *map(str, two_budgets)).stdout
    assert "merged" not in text
    rows = [line for line in text.splitlines() if "4G" in line or "64G" in line]
    assert any("100,000" in r and "4G" in r for r in rows), text
    assert any("10,000" in r and "64G" in r for r in rows), text
    assert "55,000" not in text  # the pooled mean of the two


def test_report_json_gives_each_run_its_own_classes(two_budgets: list[Path]) -> None:
    doc = orjson.loads(_cli("report", "--json", *map(str, two_budgets)).stdout)
    assert "classes" not in doc  # nothing pooled unless asked
    assert [run["label"] for run in doc["runs"]] == ["4G", "64G"]
    assert [run["classes"]["switch"]["mean_reprocessed"] for run in doc["runs"]] == [100_000, 10_000]


def test_merge_pools_the_files_on_request(two_budgets: list[Path]) -> None:
    assert "2 files merged" in _cli("report", "--merge", *map(str, two_budgets)).stdout
    doc = orjson.loads(_cli("report", "--json", "--merge", *map(str, two_budgets)).stdout)
    assert doc["classes"]["switch"]["count"] == 8
    assert doc["classes"]["switch"]["mean_reprocessed"] == 55_000


def test_an_html_error_page_reads_as_its_text_without_the_request_it_hit() -> None:
    assert cause(HTML_501.format(id=7)) == (
        "HTTP 501: Error response Error code: 501 Message: Unsupported method ('POST')."
    )
    assert cause("request 12 (main) cancelled in flight") == "cancelled in flight"
    assert cause(None) == "(no error text)"
    assert cause("x" * 500).endswith("...") and len(cause("x" * 500)) == 160


def test_failures_are_counted_by_status_and_cause_with_the_first_requests() -> None:
    lines = [_failed(i, "main" if i % 2 else "cron", HTML_501.format(id=i)) for i in range(1, 8)]
    lines += [
        _failed(8, "main", "request t-8 POST /v1/chat/completions: no complete response after 5s", "timeout")
    ]
    lines.append(_ok(9, "switch", 0.1, 10))
    groups = failure_groups(lines)
    assert [(g.status, g.count) for g in groups] == [("http_error", 7), ("timeout", 1)]
    assert [e["id"] for e in groups[0].examples] == [1, 2, 3]
    text = "\n".join(failure_lines(groups, total=9))
    assert text.startswith("8 of 9 requests failed:")
    assert "Unsupported method ('POST')" in text and "request 1 (main), request 2 (cron)" in text


class _NoPost(http.server.BaseHTTPRequestHandler):
    """What `python -m http.server` answers a POST with: 501 and an HTML page."""

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def no_post_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NoPost)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.e2e
def test_a_run_where_every_request_fails_says_why_in_the_terminal(
    no_post_server: str, tmp_path: Path
) -> None:
    out = tmp_path / "r.jsonl"
    done = _cli("run", "traces/sample.jsonl", "--target", no_post_server, "--out", str(out), code=1)
    assert "9 of 9 requests failed" in done.stdout
    assert (
        "9 http_error: HTTP 501: Error response Error code: 501 Message: Unsupported method ('POST')"
        in done.stdout
    )
    doc = orjson.loads(_cli("report", "--json", str(out)).stdout)
    (failures,) = doc["runs"][0]["failures"]
    assert failures["count"] == 9 and failures["status"] == "http_error"


def test_at_80_columns_no_figure_is_cut(tmp_path: Path) -> None:
    """rich cuts a cell it cannot fit (`101,3…`): the side-by-side table must fit 80 columns whole."""
    from rich.console import Console

    from replay.metrics.results import read_results
    from replay.report.table import runs_table

    classes = ("switch", "compaction", "concurrent")
    lines = [_ok(i, classes[i % 3], 1234.5, 91_599) for i in range(1, 10)]
    runs = [
        (label, read_results(_results(tmp_path / f"{label}.jsonl", label, lines)).summary, 1000.0)
        for label in ("24G-20480", "64G")
    ]
    console = Console(width=80, record=True)
    console.print(runs_table(runs))
    text = console.export_text()
    assert "…" not in text and "91,599" in text and "24G-20480" in text
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80


def test_report_json_carries_what_the_page_shows(tmp_path: Path) -> None:
    """Issue #38: the JSON lacked the page's modelled times and restore/eviction figures, and nothing
    said which walker (the simulator or the in-process walk of `size sweep`) produced a figure."""
    from tests.report.test_html_report import make_results

    small = make_results(tmp_path / "4G.jsonl", "4G", reread=True, budget_mib=4096)
    doc = orjson.loads(_cli("report", "--json", str(small)).stdout)
    run = doc["runs"][0]
    assert run["clock"] == "modelled" and run["time_scale"] == 1000.0
    assert run["figures_from"].startswith("the simulator (`replay sim serve`")
    assert "size sweep" in run["figures_from"]
    digest = run["digest"]
    assert (
        digest["restores"],
        digest["live_misses"],
        digest["evictions"],
        digest["evictions_zero_hits"],
    ) == (
        1,
        1,
        2,
        1,
    )
    # Modelled seconds, not the client's: a 80K re-read at 510 tok/s is minutes, not the 0.2 s measured.
    modelled = run["classes_on_clock"]["switch"]
    assert modelled["ttft_p50_s"] > 100 and run["classes"]["switch"]["ttft_p50_s"] < 1
    assert modelled["ttft_p99_s"] >= modelled["ttft_p50_s"]
    assert run["disk"]["budget_mib"] == 4096 and run["disk"]["peak_mib"] > 0
    # The one table of units the terminal and the page format by (`replay.report.units`).
    assert doc["units"]["ttft_p50_s"] == "seconds" and doc["units"]["mean_reprocessed"] == "tokens"
    assert doc["verdict"].startswith("the switch pathology appeared") and "Action: " in doc["verdict"]
    assert doc["action"].startswith("find the disk budget") and doc["verdict"].endswith(doc["action"])
    page = tmp_path / "page"
    _cli("report", str(small), "--html", str(page))
    assert 'id="walker"' in (page / "index.html").read_text()
