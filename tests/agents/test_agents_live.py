"""Real agents, headless, against the simulator through the recorder (`just agents`).

For each agent: a two-prompt task (the second continues the first session) in which the simulator
answers requests that offer tools with calls of the agent's read-only tools (every request, at
most two rounds before a text answer), so the agent's real tool loop runs and ends. Then:
- every model call was recorded (the calls that were not are probes, each named in the trace's
  `unrecorded` lines), and nothing left 127.0.0.1: a proxy that refuses everything was asked for
  no host but the few an agent asks for with every switch off (`Agent.unswitchable`);
- the agent ran its tools: a recorded reply called one, and a later request answers that call;
- the trace validates, and replays on the simulator with every request ok;
- where an importer for the agent's own files exists, they import as the same requests, with the
  same roles and tool calls; for the agents in `SIZED`, each imported request, rendered as the
  simulator renders it, is within 2% of the prompt tokens the recorder saw, in the same order.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from replay.engine.plans import make_plan
from replay.engine.run import EngineConfig
from replay.importers.registry import IMPORTERS
from replay.metrics.results import read_results
from replay.record.serve import RecordingServer
from replay.runs.pipeline import run_trace
from replay.runs.targets import open_target, resolve_target
from replay.sim.model.render import render
from replay.trace import materialize, read_trace, recorded_reply, validate
from replay.trace.model import Trace
from tests.support.agentkit import AGENTS, MODEL, Agent, Run, installed, refusing_proxy

pytestmark = [pytest.mark.e2e, pytest.mark.agents]
# Agents whose importer rebuilds each request at the size the agent sent (issue 36).
SIZED = {"hermes", "claude-code", "codex", "opencode"}
REQUIRED = {n.strip() for n in os.environ.get("REPLAY_REQUIRE_AGENTS", "").replace(",", " ").split() if n}


def need(agent: Agent) -> None:
    if installed(agent):
        return
    if agent.name in REQUIRED:
        pytest.fail(
            f"{agent.name} is required (REPLAY_REQUIRE_AGENTS) but not installed at {agent.bin_path()}"
        )
    pytest.skip(f"{agent.name} is not installed: `just agents {agent.name}` installs it")


def simulator_args(agent: Agent) -> list[str]:
    return [
        "--time-scale", "1000",
        "--model", MODEL,
        "--tool-call-rate", "1",
        "--tool-call-max", "2",
        "--seed", "7",
        "--tool-names", ",".join(agent.tools),
    ]  # fmt: skip


def shapes(trace: Trace) -> list[tuple[Any, ...]]:
    """Each request as roles and tool calls (no system messages, no text, no ids), in a stable order:
    what an agent's own files and the wire must agree on."""
    reply = recorded_reply(trace.by_id())
    out = []
    for req in trace.requests:
        msgs: list[tuple[Any, ...]] = []
        for m in materialize(req, reply):
            role = m.get("role")
            if role in ("system", "developer"):
                continue
            calls = tuple(
                (c["name"], orjson.loads(c["arguments"] or "{}")) for c in m.get("tool_calls") or ()
            )
            entry = (role, tuple(sorted(str(c) for c in calls)))
            if msgs and role == "user" and msgs[-1] == entry:
                continue  # one user turn split over several text blocks
            msgs.append(entry)
        out.append(tuple(msgs))
    return sorted(out, key=lambda s: (len(s), str(s)))


def prompt_sizes(trace: Trace, recorded: bool) -> list[tuple[tuple[str, ...], int]]:
    """Each request in send order: its roles, and its prompt tokens (as the recorder saw them, or as
    the simulator renders the request: an import's own usage figures would prove nothing)."""
    reply = recorded_reply(trace.by_id())
    out = []
    for req in sorted(trace.requests, key=lambda r: (r.t, r.id)):
        msgs = materialize(req, reply)
        size = (req.usage or {})["prompt_tokens"] if recorded else len(render(msgs, req.params.get("tools")))
        out.append((tuple(str(m.get("role")) for m in msgs), int(size)))
    return out


@pytest.fixture
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="agents-live-") as tmp:
        yield Path(tmp)


@pytest.mark.parametrize("name", list(AGENTS))
def test_agent_recorded_replayed_and_imported(name: str, workdir: Path) -> None:
    agent = AGENTS[name]
    need(agent)
    t0 = time.monotonic()
    trace_path, log_path = workdir / "trace.jsonl", workdir / "calls.jsonl"
    target = resolve_target("sim", None, simulator_args(agent), workdir)
    with open_target(target, workdir / "sim") as served, refusing_proxy() as proxy:
        with RecordingServer(served.url, trace_path, log=log_path) as rec:
            run = Run(agent, workdir / "agent", rec.url, proxy.url)
            run.prepare()
            for turn in (0, 1):
                done = run.run(turn)
                assert done.returncode == 0, (
                    f"{name} prompt {turn} exited {done.returncode}:\n{done.stderr[-3000:]}"
                )
        strays = [h for h in proxy.hosts() if h not in agent.unswitchable]
        assert strays == [], f"{name} tried to reach {strays} (refused): a switch is missing"

        # Every model call recorded; what was not is a probe, and the trace names it.
        calls = [orjson.loads(line) for line in log_path.read_text().splitlines()]
        model_calls = [c for c in calls if c["method"] == "POST"]
        assert model_calls and all(c["recorded"] for c in model_calls), model_calls
        assert {c["path"] for c in model_calls} <= set(agent.routes)
        counts = validate(trace_path)
        assert counts["requests"] == len(model_calls)
        assert counts["unrecorded"] == len(calls) - len(model_calls)
        trace = read_trace(trace_path)
        assert {s.api for s in trace.sessions.values()} == {agent.api}
        assert all(r.reply["status"] == "ok" for r in trace.requests)

        # The tool loop ran: a reply called a tool, a later request carries the agent's result.
        called = {
            c["id"]
            for r in trace.requests
            for c in ((r.reply or {}).get("message") or {}).get("tool_calls") or ()
        }
        answered = {
            m.get("tool_call_id") for r in trace.requests for m in r.messages() if m.get("role") == "tool"
        }
        assert called & answered, f"{name}: no tool call was answered"

        # Replayed on the simulator: every request ok.
        config = EngineConfig(base_url=served.url, timeout_s=120.0, run_id="replay")
        outcome = run_trace(trace, make_plan("alternate"), config, workdir / "results.jsonl", {"kind": "sim"})
        rows = read_results(workdir / "results.jsonl").requests
        assert outcome.exit_code == 0 and len(rows) == len(trace.requests)
        assert all(r["status"] == "ok" for r in rows)

    # The agent's own files, where an importer reads them, say the same.
    if name in IMPORTERS and run.own_files() is not None:
        imported_path = workdir / "imported.jsonl"
        IMPORTERS[name](run.own_files(), imported_path)
        imported = read_trace(imported_path)
        assert shapes(imported) == shapes(trace)
        if name in SIZED:
            got, want = prompt_sizes(imported, False), prompt_sizes(trace, True)
            assert [roles for roles, _ in got] == [roles for roles, _ in want]
            off = [(g, w) for (_, g), (_, w) in zip(got, want, strict=True) if abs(g - w) > 0.02 * w]
            assert not off, f"{name}: imported prompt tokens off by more than 2% (imported, recorded): {off}"
            print(f"{name}: prompt tokens imported {[g for _, g in got]}, recorded {[w for _, w in want]}")
    print(
        f"{name}: {len(trace.requests)} requests, {len(calls) - len(model_calls)} probes, {time.monotonic() - t0:.1f} s"
    )
