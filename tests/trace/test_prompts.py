"""A trace's prompts against a model's context, checked before anything runs: the estimate stays
close to what the simulator renders, and every verb that would meet the overflow later says so now,
naming the flag or the parameter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from replay.scenario.build import generate
from replay.scenario.catalog import find_scenario
from replay.sim.model.config import config_for
from replay.sizing.jobs import jobs_from_trace
from replay.trace.prompts import overflow, prompt_sizes, trace_overflow
from replay.trace.reader import read_trace

CTX = 262_144  # the default preset's context


@pytest.fixture(scope="module")
def long_switching(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`switching` with 20 rounds: its sessions grow past 262K from request 38 on."""
    path = tmp_path_factory.mktemp("ctx") / "switching.jsonl"
    generate(find_scenario("switching", {"turns": 20}), path)
    return path


def test_the_estimate_is_within_one_percent_of_the_simulators_rendering(long_switching: Path) -> None:
    trace = read_trace(long_switching)
    cfg = config_for("qwen38-q2", disk=True, ctx=10**9)
    rendered = [job.prompt_tokens for _, job in jobs_from_trace(trace.requests, cfg)]
    estimated = [tokens for _, tokens in prompt_sizes(trace.requests)]
    for est, exact in zip(estimated, rendered, strict=True):
        assert abs(est - exact) <= 0.01 * exact, (est, exact)


def test_overflow_names_the_first_request_past_the_context_and_counts_the_rest(long_switching: Path) -> None:
    found = trace_overflow(long_switching, CTX)
    assert found is not None
    assert (found.first.id, found.first.session, found.count, found.total) == (38, "b", 5, 42)
    assert found.suggested_ctx() > found.largest_tokens
    assert trace_overflow(long_switching, found.suggested_ctx()) is None
    assert overflow(prompt_sizes(read_trace(long_switching).requests), 10**9) is None


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replay", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_validate_warns_past_the_default_context_and_fails_past_a_given_one(long_switching: Path) -> None:
    done = _cli("validate", str(long_switching))
    assert done.returncode == 0 and ": ok (" in done.stdout
    assert "5 of 42 requests do not fit the 262,144-token context of the default model" in done.stderr
    assert "request 38 (session b)" in done.stderr and "--ctx" in done.stderr
    done = _cli("validate", str(long_switching), "--ctx", "1M")
    assert done.returncode == 0 and not done.stderr
    done = _cli("validate", str(long_switching), "--ctx", "200K")
    assert done.returncode == 2 and "do not fit --ctx 200000" in done.stderr
    assert f"{long_switching}:" in done.stderr  # file:line of the first request past it


def test_size_sweep_refuses_before_sweeping_and_names_the_flag(long_switching: Path) -> None:
    done = _cli("size", "sweep", str(long_switching), "--budgets", "4G")
    assert done.returncode == 2
    assert "do not fit the 262,144-token context of preset qwen38-q2" in done.stderr
    assert "give --ctx " in done.stderr and "budget" not in done.stdout
    done = _cli("size", "sweep", str(long_switching), "--budgets", "4G", "--ctx", "400K", "--json")
    assert done.returncode == 0, done.stderr


def test_scenario_generate_warns_and_names_the_parameter_given(tmp_path: Path) -> None:
    done = _cli("scenario", "generate", "switching", "--param", "turns=20", "-o", str(tmp_path / "t.jsonl"))
    assert done.returncode == 0 and (tmp_path / "t.jsonl").exists()
    assert "do not fit the 262,144-token context of the scenario simulator" in done.stderr
    assert "You set turns=20: lower it" in done.stderr
    done = _cli("scenario", "generate", "switching", "-o", str(tmp_path / "u.jsonl"))
    assert done.returncode == 0 and not done.stderr
