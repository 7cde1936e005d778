"""Scenario arms over a fleet: several simulators, SGLang's router in front (or the client's own
routing), started by PID and stopped on every way out; `fleet-affinity`'s rows on the real router."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import psutil
import pytest

from replay.commands.scenario import check_scenario
from replay.errors import TraceError
from replay.runs import scenario as runs_scenario
from replay.scenario import find_scenario, load_spec

SPEC = """
[scenario]
name = "tiny-fleet"
title = "t"

[[arms]]
name = "fleet"
sim = ["--server", "llama"]
fleet = { replicas = 2, router = "cache_aware" }

[sessions.a]
system = "none"
tools = false
reply = "text"

[[steps]]
sessions = "a"
"""


def _router_or_skip() -> None:
    """SGLang's router comes with the [fleet] extra; CI sets REPLAY_REQUIRE_FLEET=1 so that it runs."""
    if importlib.util.find_spec("sglang_router") is None:
        if os.environ.get("REPLAY_REQUIRE_FLEET") == "1":
            pytest.fail("REPLAY_REQUIRE_FLEET=1 but sglang-router is not installed (pip install '.[fleet]')")
        pytest.skip("sglang-router is not installed (the [fleet] extra)")


def test_a_fleet_arm_reads_its_router_policy_or_the_clients_routing(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(SPEC)
    arm = load_spec(path).arm("fleet")
    assert arm.fleet is not None and (arm.fleet.replicas, arm.fleet.router, arm.fleet.routing) == (
        2,
        "cache_aware",
        None,
    )
    path.write_text(SPEC.replace('router = "cache_aware"', 'routing = "sticky"'))
    arm = load_spec(path).arm("fleet")
    assert arm.fleet is not None and (arm.fleet.router, arm.fleet.routing) == (None, "sticky")


@pytest.mark.parametrize(
    ("fleet", "problem"),
    [
        ('{ replicas = 2, router = "power_of_two" }', "must be one of cache_aware, round_robin"),
        ('{ replicas = 2, routing = "random" }', "must be one of sticky, round-robin, least"),
        ('{ replicas = 2, router = "cache_aware", routing = "sticky" }', "router = 'POLICY'"),
        ("{ replicas = 2 }", "router = 'POLICY'"),
        ('{ replicas = 1, routing = "sticky" }', "must be at least 2"),
        ('{ replicas = 2, routing = "sticky", ports = 3 }', "unknown key"),
    ],
)
def test_a_bad_fleet_is_refused_with_its_file_and_line(tmp_path: Path, fleet: str, problem: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(SPEC.replace('{ replicas = 2, router = "cache_aware" }', fleet))
    with pytest.raises(TraceError) as err:
        load_spec(path)
    assert err.value.line == 9 and problem in err.value.problem, str(err.value)


def _gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.e2e
def test_a_router_arm_that_fails_mid_run_still_stops_the_router_and_every_replica_by_pid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _router_or_skip()
    seen: list[int] = []

    def failing_replay(jobs: list[Any], say: Any = None) -> Any:
        served = jobs[0].served
        seen.extend([served.pid, *(w["pid"] for w in served.build["workers"])])
        assert all(psutil.pid_exists(pid) for pid in seen)
        raise RuntimeError("the replay broke")

    monkeypatch.setattr(runs_scenario, "replay", failing_replay)
    spec = find_scenario("fleet-affinity", {"rounds": 1})
    with pytest.raises(RuntimeError, match="the replay broke"):
        runs_scenario.run_arms(spec, tmp_path, ["router-cache-aware"])
    assert len(seen) == 3 and all(_gone(pid) for pid in seen), seen


@pytest.mark.e2e
def test_fleet_affinity_rows_hold_on_the_real_router(tmp_path: Path) -> None:
    """The router's promises, on sglang-router itself in front of two simulated llama-servers:
    cache-aware keeps every continuing request on its replica, round robin moves them and each
    move re-reads what the router model predicts; every line names its replica, as the router
    said in its log."""
    _router_or_skip()
    spec = find_scenario("fleet-affinity", {"rounds": 2})
    verdicts = check_scenario(spec, tmp_path)
    assert [v for v in verdicts if v.failed] == []
    assert len(verdicts) == len(spec.expects) == 9
    from replay.metrics.results import read_results

    lines = read_results(tmp_path / "fleet-affinity-router-round-robin.results.jsonl").requests
    assert {line["backend_source"] for line in lines} == {"router"} and len(lines) == 9
    assert len({line["backend"] for line in lines}) == 2


def test_checking_every_scenario_passes_over_a_router_scenario_when_the_router_is_not_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    from replay.commands.scenario import needs_router

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "sglang_router" else real(name, *a)
    )
    assert "not installed" in (needs_router(find_scenario("fleet-affinity")) or "")
    assert needs_router(find_scenario("batched-routing")) is None
    monkeypatch.setattr(importlib.util, "find_spec", real)
    if real("sglang_router") is not None:
        assert needs_router(find_scenario("fleet-affinity")) is None
