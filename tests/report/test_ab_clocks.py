"""The A/B tables say which clock each seconds figure is on, from what the runs say (issue #38 item 9):
on the simulator TTFT is measured wall-clock time and prefill the simulator's modelled time; and the
page says B's change as one would type it above the table of differences."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from rich.console import Console

from replay.metrics.results import RunResults
from replay.report.ab import ArmRun, analyze, render, stats_cells
from replay.report.ab_html import ab_markdown, load_ab, render_ab_page

DIFFS = [{"field": "flag --cache-ram", "a": "8192", "b": "65536", "detail": "--cache-ram: 8192 -> 65536"}]


def _run(index: int, arm: str, *, modelled: bool, server_log: bool = False) -> ArmRun:
    """Four requests of one session; on the simulator (`modelled`) each carries its modelled
    prefill and the header the `--time-scale` it ran at."""
    requests: list[dict[str, Any]] = []
    server: list[dict[str, Any]] = []
    slow = 2.0 if arm == "B" else 1.0
    for seq in range(1, 5):
        rec: dict[str, Any] = {
            "kind": "request",
            "seq": seq,
            "id": seq,
            "session": "s1",
            "status": "ok",
            "switch": ["switch"],
            "reprocessed_tokens": 1000 * seq,
            "ttft_s": 0.01 * seq * slow,
            "latency_s": 0.02 * seq * slow,
        }
        if modelled:
            rec["modelled"] = {"prefill_s": 3.0 * seq * slow, "total_s": 4.0 * seq * slow}
        if server_log:
            server.append({"event": "request", "request_seq": seq, "prompt_done_s": 0.5 * seq * slow})
        requests.append(rec)
    header = (
        {"target": {"kind": "sim", "time_scale": 500.0}} if modelled else {"target": {"kind": "llamacpp"}}
    )
    return ArmRun(
        index,
        arm,
        RunResults(path=f"ab-{index:02d}-{arm}.jsonl", run=header, requests=requests, server=server),
        0,
        {"dir": None, "fresh": True},
    )


def _doc(**kind: bool) -> dict[str, Any]:
    runs = [_run(i, arm, **kind) for i, arm in enumerate("ABBA", 1)]
    return analyze(runs, None, {"targets": {}, "differences": DIFFS})


def _cells(doc: dict[str, Any]) -> dict[tuple[str, str], list[str]]:
    return {(c[0], c[1]): c for c in stats_cells(doc["stats"])}


def test_on_the_simulator_ttft_is_wall_clock_and_prefill_is_modelled_in_every_rendering() -> None:
    doc = _doc(modelled=True)
    assert [r["time_scale"] for r in doc["runs"]] == [500.0] * 4
    cells = _cells(doc)
    assert cells[("switch", "prefill s per request")][2:4] == ["7.500 s (modelled)", "15.000 s (modelled)"]
    assert cells[("switch", "TTFT p50")][2].endswith(" s (wall)")
    assert cells[("switch", "re-processed tokens per request")][2].endswith(" tokens")  # not a time
    note = "the simulator ran 500x faster than the server it models"
    console = Console(record=True, width=220)
    render(doc, console, verbose=True)
    text = console.export_text()
    assert "s (modelled)" in text and "s (wall)" in text and note in text
    assert "TTFT p50 s (wall)" in text and "prefill s (modelled)" in text  # the per-class table
    page = render_ab_page(doc, Path("."))
    assert "7.500 s (modelled)" in page and " s (wall)</td>" in page and note in page
    md = ab_markdown(doc)
    assert "| 7.500 s (modelled) |" in md and " s (wall) |" in md and note in md


def test_the_prefill_clock_follows_where_the_prefill_came_from_not_the_metric_name() -> None:
    measured = _cells(_doc(modelled=False))
    assert measured[("switch", "prefill s per request")][2].endswith(" s (wall)")  # TTFT as measured
    logged = _cells(_doc(modelled=False, server_log=True))
    assert logged[("switch", "prefill s per request")][2] == "1.250 s (server log)"
    assert "simulator" not in ab_markdown(_doc(modelled=False))  # no time scale to speak of


def test_an_older_ab_json_gets_its_clocks_when_it_is_read(tmp_path: Path) -> None:
    doc = _doc(modelled=True)
    for row in doc["stats"]:
        row.pop("clock", None)
    doc["format"] = "agent-replay-ab/2"
    (tmp_path / "ab.json").write_bytes(orjson.dumps(doc))
    read, _ = load_ab(tmp_path)
    cells = _cells(read)
    assert cells[("switch", "prefill s per request")][2] == "7.500 s (modelled)"
    assert cells[("switch", "TTFT p50")][2].endswith(" s (wall)")


def test_the_page_says_the_change_as_one_would_type_it_above_the_differences() -> None:
    doc = _doc(modelled=True)
    page = render_ab_page(doc, Path("."))
    line = '<p class="note" id="change">B changes: --cache-ram 8192 -&gt; 65536</p>'
    assert line in page and page.index(line) < page.index('<div class="wrap diffs">')
    md = ab_markdown(doc)
    assert "B changes: --cache-ram 8192 -> 65536" in md
    assert md.index("B changes:") < md.index("| field | A | B |")
