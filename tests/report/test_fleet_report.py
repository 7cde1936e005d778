"""A run over several backends: the report's replicas, moves and what they re-read."""

from __future__ import annotations

from pathlib import Path

from replay.metrics.record import RequestRecord, Usage
from replay.metrics.results import ResultsWriter, read_results
from replay.report import fleet
from replay.report.html import render_page
from replay.report.view import load_run

A, B = "http://127.0.0.1:9001", "http://127.0.0.1:9002"


def _rec(seq: int, session: str, backend: str, switch: tuple[str, ...], reread: int) -> RequestRecord:
    t = 1_000_000_000 * seq
    return RequestRecord(
        seq=seq,
        request_id=seq,
        session=session,
        switch=switch,
        t_origin=0,
        t_scheduled=t,
        t_sent=t,
        t_first_token=t + 100_000_000,
        t_end=t + 200_000_000,
        usage=Usage(
            prompt_tokens=1000 * seq,
            cached_tokens=1000 * seq - reread,
            reprocessed_tokens=reread,
            output_tokens=4,
            reprocessed_source="derived",
        ),  # fmt: skip
        backend=backend,
        backend_source="client",
    )


def _results(path: Path) -> Path:
    writer = ResultsWriter(path, {"target": {"kind": "external", "backends": [A, B]}})
    for rec in (
        _rec(1, "main", A, ("cold",), 1000),
        _rec(2, "cron", B, ("cold",), 2000),
        _rec(3, "main", A, ("switch",), 100),  # stayed: only its new tokens
        _rec(4, "main", B, ("continue",), 4000),  # moved: the whole conversation again
        _rec(5, "cron", B, ("switch",), 50),  # stayed
    ):
        writer.request(rec)
    writer.close()
    return path


def test_moves_count_requests_that_left_their_sessions_replica_and_what_they_reread(tmp_path: Path) -> None:
    run = load_run(_results(tmp_path / "r.jsonl"))
    assert fleet.backends(run) == [A, B]
    m = fleet.moves(run)
    assert ([r.id for r in m.moved], [r.id for r in m.stayed]) == ([4], [3, 5])
    assert (m.sessions_moved, m.sessions, m.stay_share) == (1, 2, 2 / 3)
    assert (m.reread_per_move, m.reread_per_stay, m.reread_moved) == (4000, 75, 4000)
    rows = fleet.replica_rows(run)
    assert [row[:4] for row in rows] == [
        [A, "2", "cold 1, switch 1", "0"],
        [B, "3", "cold 1, continue 1, switch 1", "0"],
    ]


def test_the_summary_keeps_histograms_per_backend_and_switch_class(tmp_path: Path) -> None:
    res = read_results(_results(tmp_path / "r.jsonl"))
    per = res.backends
    assert set(per) == {A, B}
    assert (per[A].classes["all"].count, per[B].classes["all"].count) == (2, 3)
    assert per[B].classes["continue"].count == 1 and "continue" not in per[A].classes
    assert per[B].classes["all"].percentile("reprocessed", 100) >= 4000
    # Rebuilt from the request lines when the run was cut short before its summary.
    lines = (tmp_path / "r.jsonl").read_bytes().splitlines()
    (tmp_path / "cut.jsonl").write_bytes(b"\n".join(lines[:-1]) + b"\n")
    cut = read_results(tmp_path / "cut.jsonl").backends
    assert {k: v.classes["all"].count for k, v in cut.items()} == {A: 2, B: 3}


def test_the_page_shows_a_timeline_per_replica_and_the_moves(tmp_path: Path) -> None:
    page = render_page([load_run(_results(tmp_path / "r.jsonl"))])
    assert '<section id="replicas">' in page
    assert page.count('data-plot="replica-timeline"') == 2
    assert "2 of 3 continuing requests (66.7%) stayed on their replica; 1 moved" in page
    assert "Re-read tokens per move: 4,000" in page


def test_a_run_of_one_target_has_no_replicas_section(tmp_path: Path) -> None:
    writer = ResultsWriter(tmp_path / "r.jsonl", {"target": {}})
    rec = _rec(1, "main", A, ("cold",), 10)
    rec.backend = rec.backend_source = None
    writer.request(rec)
    writer.close()
    assert 'id="replicas"' not in render_page([load_run(tmp_path / "r.jsonl")])
    assert read_results(tmp_path / "r.jsonl").backends == {}
