"""Subagents that fan out (trace format /2): a request spawns subagent sessions (`after.spawn`) and a
later request of the parent waits for them (`after.waits`); every plan honours it, live or recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from replay.engine.plans import make_plan, reply_deps
from replay.engine.run import EngineConfig
from replay.runs.recording import run_trace
from replay.trace import TraceWriter, read_trace
from tests.support.fan_out import fan_out_trace
from tests.support.scripted_server import Script

USAGE = {"prompt_tokens": 100, "completion_tokens": 3}


def test_reply_deps_include_the_subagents_waited_for(tmp_path: Path) -> None:
    fan_out_trace(tmp_path / "t.jsonl")
    reqs = read_trace(tmp_path / "t.jsonl").requests
    assert reply_deps(reqs[-1]) == (1, 3, 5)
    assert reply_deps(reqs[1]) == (1,)  # a subagent's first request follows its spawner


@pytest.mark.parametrize(
    ("plan", "history"), [("timed", "live"), ("closed-loop", "recorded"), ("overlap", "live")]
)
def test_the_parent_waits_for_its_subagents(scripted_server, tmp_path: Path, plan: str, history: str) -> None:
    scripted_server.default = Script(first_token_delay_s=0.15, usage=USAGE)
    fan_out_trace(tmp_path / "t.jsonl")
    config = EngineConfig(base_url=scripted_server.url, history=history, timeout_s=5.0, run_id="t")
    kw = {"concurrency": 4} if plan == "overlap" else {}
    outcome = run_trace(
        read_trace(tmp_path / "t.jsonl"),
        make_plan(plan, **kw),
        config,
        tmp_path / "r.jsonl",
        {"kind": "scripted"},
        keep_records=True,
    )
    recs = {r["id"]: r for r in outcome.results}
    assert outcome.exit_code == 0 and len(recs) == 6
    done = {i: recs[i]["sent_s"] + recs[i]["latency_s"] for i in recs}
    for sub_first in (2, 4):  # spawned only once the spawning request's reply is in
        assert recs[sub_first]["sent_s"] >= done[1] - 0.005
    # the parent's request goes out only after both subagents' last replies (plus its delay when paced)
    assert recs[6]["sent_s"] >= max(done[3], done[5]) - 0.005
    assert (
        recs[2]["sent_s"] < done[3]
    )  # the two subagents ran side by side (fan-out), not one after the other
    assert recs[4]["sent_s"] < done[3]


def test_report_shows_subagents_and_the_parents_resume(scripted_server, tmp_path: Path) -> None:
    from io import StringIO

    from rich.console import Console

    from replay.commands.report import ReportArgs, report
    from replay.metrics.results import read_results
    from replay.report.fanout import fan_out_lines

    scripted_server.default = Script(first_token_delay_s=0.05, usage=USAGE)
    fan_out_trace(tmp_path / "t.jsonl")
    config = EngineConfig(base_url=scripted_server.url, history="live", timeout_s=5.0, run_id="t")
    run_trace(
        read_trace(tmp_path / "t.jsonl"), make_plan("timed"), config, tmp_path / "r.jsonl", {"kind": "s"}
    )
    res = read_results(tmp_path / "r.jsonl")
    lines = fan_out_lines(res.run, res.requests)
    assert lines[0].startswith("Subagents: 2 of 2 subagent sessions ran, 4 requests, TTFT p50 0.")
    assert lines[1].startswith(
        "Fan-out cost to the parent: 1 requests resumed after 2 subagent returns; switch "
    )
    assert "switch -" not in lines[1] and "vs 0." in lines[1]  # the parent's other request is the comparison
    buf = StringIO()
    assert report(ReportArgs(results=[tmp_path / "r.jsonl"]), Console(file=buf, width=300)) == 0
    assert lines[0] in buf.getvalue() and lines[1] in buf.getvalue()
    (tmp_path / "t.jsonl").unlink()  # the trace is gone: the report says nothing of subagents
    assert fan_out_lines(res.run, res.requests) == []


def test_a_trace_without_subagents_adds_no_report_lines(tmp_path: Path) -> None:
    from replay.report.fanout import read_fan_out

    with TraceWriter(tmp_path / "t.jsonl", source="test") as w:
        w.session("a")
        w.request("a", 0, [{"role": "user", "content": "x"}])
    assert read_fan_out(tmp_path / "t.jsonl") is None
