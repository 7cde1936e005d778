"""Subagents on the HTML page (trace format /2): each subagent session, and what the parent's
resume after its fan-out cost (its switch class, TTFT and re-read tokens beside its other requests)."""

from __future__ import annotations

from pathlib import Path

from replay.metrics.record import RequestRecord, Usage
from replay.metrics.results import ResultsWriter
from replay.report.fanout import fan_out_view
from replay.report.html import render_page
from replay.report.view import load_run
from replay.trace import TraceWriter
from tests.support.fan_out import REPLY, fan_out_trace


def _rec(seq: int, session: str, switch: tuple[str, ...], reread: int, ttft_ms: int = 100) -> RequestRecord:
    t = 1_000_000_000 * seq
    return RequestRecord(
        seq=seq,
        request_id=seq,
        session=session,
        switch=switch,
        t_origin=0,
        t_scheduled=t,
        t_sent=t,
        t_first_token=t + ttft_ms * 1_000_000,
        t_end=t + (ttft_ms + 100) * 1_000_000,
        usage=Usage(
            prompt_tokens=4000,
            cached_tokens=4000 - reread,
            reprocessed_tokens=reread,
            output_tokens=3,
            reprocessed_source="derived",
        ),
    )


def _results(path: Path, trace: Path) -> Path:
    writer = ResultsWriter(path, {"target": {"kind": "external"}, "trace": {"path": str(trace)}})
    for rec in (
        _rec(1, "main", ("cold",), 1000),
        _rec(2, "sa1", ("cold",), 800),
        _rec(3, "sa1", ("continue",), 40),
        _rec(4, "sa2", ("cold",), 900),
        _rec(5, "sa2", ("continue",), 60),
        _rec(6, "main", ("switch",), 3000, ttft_ms=400),  # the resume re-reads what the subagents pushed out
        _rec(7, "main", ("continue",), 50),
    ):
        writer.request(rec)
    writer.close()
    return path


def test_the_page_shows_each_subagent_and_the_parents_resume(tmp_path: Path) -> None:
    run = load_run(
        _results(tmp_path / "r.jsonl", fan_out_trace(tmp_path / "t.jsonl", wait_delay_s=0.0, goes_on=True))
    )
    view = fan_out_view(run)
    assert view is not None
    assert view.subagents == [
        ["sa1", "main #1", "2", "0", "0.100", "840", "#6"],
        ["sa2", "main #1", "2", "0", "0.100", "960", "#6"],
    ]
    assert view.resumes == [["#6", "main", "2", "switch", "0.400", "3,000"]]
    assert view.groups == [
        ["subagents", "2", "4", "0", "cold 2, continue 2", "0.100", "450"],
        ["the parent, resuming after its fan-out", "1", "1", "0", "switch 1", "0.400", "3,000"],
        ["the parent, its other requests", "1", "2", "0", "cold 1, continue 1", "0.100", "525"],
    ]
    page = render_page([run])
    assert '<section id="subagents">' in page
    assert (
        "2 of 2 subagent sessions ran (4 requests). The parent resumed 1 times after 2 subagent returns: "
        "TTFT p50 0.400 s vs 0.100 s for its other requests, re-read tokens mean 3,000 vs 525."
    ) in page
    assert (
        "<td>sa2</td><td>main #1</td>" in page and "<td>#6</td><td>main</td><td>2</td><td>switch</td>" in page
    )


def test_no_subagents_section_without_subagents_or_without_the_trace(tmp_path: Path) -> None:
    plain = tmp_path / "plain.jsonl"
    with TraceWriter(plain, source="test") as w:
        w.session("main")
        w.request("main", 0.0, [{"role": "user", "content": "x"}], {}, reply=REPLY)
    assert 'id="subagents"' not in render_page([load_run(_results(tmp_path / "a.jsonl", plain))])
    trace = fan_out_trace(tmp_path / "t.jsonl", wait_delay_s=0.0, goes_on=True)
    run = load_run(_results(tmp_path / "b.jsonl", trace))
    trace.unlink()  # the results name a trace that is gone: nothing to say about subagents
    assert fan_out_view(run) is None and 'id="subagents"' not in render_page([run])


def test_the_tables_stop_at_max_rows_and_say_how_many_more(tmp_path: Path, monkeypatch) -> None:
    import replay.report.fanout as fanout

    monkeypatch.setattr(fanout, "MAX_ROWS", 1)
    run = load_run(
        _results(tmp_path / "r.jsonl", fan_out_trace(tmp_path / "t.jsonl", wait_delay_s=0.0, goes_on=True))
    )
    view = fan_out_view(run)
    assert view is not None and len(view.subagents) == 1 and view.more_subagents == 1
    assert "... and 1 more subagent sessions." in render_page([run])
