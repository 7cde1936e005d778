"""The cache probe's llama arms: the simulator playing llama-server, restarted through its slot
files for E5, and the report-002 rows evaluated on what it answered."""

from __future__ import annotations

from pathlib import Path

import pytest

from replay.metrics.results import read_results
from replay.runs.scenario import run_arms
from replay.scenario import find_scenario
from replay.scenario.build import plan_requests
from replay.scenario.check import ArmView, evaluate

pytestmark = pytest.mark.e2e


def test_a_llama_arm_restarts_for_e5_and_its_rows_read_its_results(tmp_path: Path) -> None:
    spec = find_scenario("cache-probe", {"document": 2_000})
    (arm,) = run_arms(spec, tmp_path, ["llama-32k"], time_scale=10_000.0)
    assert arm.outcome.exit_code == 0
    res = read_results(arm.results)
    assert len(res.restarts) == 1 and res.restarts[0]["save"]["n_saved"] > 2_000
    armed = spec.with_params(spec.arm("llama-32k").params)
    labels = {p.rid: p.label for p in plan_requests(armed)}
    view = ArmView(res, 0, labels)
    by_step = {labels[r["id"]].split()[0]: r for r in view.requests}
    assert by_step["E1"]["reprocessed_tokens"] == 4
    assert by_step["E2"]["reprocessed_tokens"] == 516
    assert by_step["E3"]["cached_tokens"] == 0
    assert by_step["E5"]["cached_tokens"] == 0  # b11063's slot file holds no checkpoint
    rows = {(e.step, e.metric): e for e in spec.expects if e.arm == "llama-32k"}
    for key in (
        ("first read", "checkpoint_depth_min"),
        ("first read", "checkpoint_depth_max"),
        ("E4 then back", "reprocessed_tokens"),
    ):
        assert evaluate(spec.name, rows[key], view).holds, key
    assert evaluate(spec.name, rows[(None, "cache_reuse_in_effect")], view).holds


def test_resend_latest_sends_the_prompt_the_session_sent_last(tmp_path: Path) -> None:
    from replay.scenario.build import generate
    from replay.trace.materialize import materialize, recorded_reply
    from replay.trace.reader import read_trace

    for latest, like in ((False, "first read"), (True, "E3")):
        spec = find_scenario("cache-probe", {"document": 300, "back_to_latest": latest})
        path = tmp_path / f"{latest}.jsonl"
        generate(spec, path)
        trace = read_trace(path)
        labels = {p.rid: p.label for p in plan_requests(spec)}
        reply_for = recorded_reply(trace.by_id())
        sent = {
            labels[r.id].split()[0] if labels[r.id].startswith("E") else labels[r.id]: materialize(
                r, reply_for
            )
            for r in trace.requests
        }
        back = next(materialize(r, reply_for) for r in trace.requests if labels[r.id] == "E4 then back")
        assert back == sent[like], latest
    skipped = find_scenario("cache-probe", {"document": 300, "edit_and_restart": False})
    assert [p.label.split()[0] for p in plan_requests(skipped)] == ["first", "E1", "E2", "E4", "E4"]
