"""What the probe runner and the metrics check decide without a server: where the restarts go, what
`replay run` leaves out, and when counters and usage disagree (no llama.cpp needed)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

import replay.serverside.metrics as mc
from drivers.launch import Served
from drivers.scrape import parse_exposition
from drivers.target import Target
from replay.commands.probe import ProbeArgs, probe
from replay.errors import UsageError
from replay.runs.probe import run_cache_probe, segments
from replay.scenario import find_scenario, generate
from replay.trace.reader import read_trace
from replay.trace.select import skip_probes
from replay.trace.writer import TraceWriter


@pytest.fixture(scope="module")
def probe_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("probe") / "cache-probe.trace.jsonl"
    generate(find_scenario("cache-probe", {"document": 500}), path)
    return path


def test_restart_goes_before_e5_only(probe_trace: Path) -> None:
    trace = read_trace(probe_trace)
    assert [[r.id for r in part] for part in segments(trace.requests)] == [[1, 2, 3, 4, 5, 6], [7]]


def test_replay_run_leaves_e5_out_and_says_so(probe_trace: Path) -> None:
    trace = read_trace(probe_trace)
    kept, notice = skip_probes(trace)
    assert [r.id for r in kept.requests] == [1, 2, 3, 4, 5, 6]
    assert notice is not None and "#7" in notice and "replay probe --server" in notice
    assert len(trace.requests) == 7  # the trace read from disk is left as it was
    again, none = skip_probes(kept)
    assert again is kept and none is None


def test_a_probe_something_depends_on_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    user = {"role": "user", "content": "one two three"}
    reply = {"message": {"role": "assistant", "content": "four"}, "finish": "stop", "output_tokens": 1}
    with TraceWriter(path, source="test") as w:
        w.session("s")
        w.request("s", 0.0, [user], reply=reply, tag="probe")
        w.request("s", 1.0, [user, reply["message"], {"role": "user", "content": "five"}], tag="turn")
    trace = read_trace(path)
    assert trace.requests[1].append[0] == {"$reply": 1}
    kept, notice = skip_probes(trace)
    assert [r.id for r in kept.requests] == [1, 2] and notice is None


def test_an_external_server_cannot_be_probed(tmp_path: Path) -> None:
    target = Target(kind="external", name="x", url="http://127.0.0.1:9")
    with pytest.raises(UsageError, match="cannot be"):
        run_cache_probe(target, tmp_path)


METRICS = """# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total {prompt}
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total {cached}
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total {out}
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 0
"""


def served(kind: str = "llamacpp") -> Served:
    target = Target(kind=kind, name="t")
    build = {"metrics_path": "/metrics" if kind == "llamacpp" else None}
    return Served("http://127.0.0.1:1", 1, build, None, target, None)


def records(*usage: tuple[int, int, int]) -> list[dict[str, Any]]:
    return [
        {"kind": "request", "status": "ok", "prompt_tokens": p, "cached_tokens": c, "output_tokens": o}
        for p, c, o in usage
    ]


@pytest.fixture
def counters(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, int]]:
    """Scrapes answer these counter values in turn."""
    values: list[dict[str, int]] = []
    monkeypatch.setattr(mc, "scrape_sync", lambda url: parse_exposition(METRICS.format(**values.pop(0))))
    return values


def test_counters_agree_with_usage(counters: list[dict[str, int]]) -> None:
    counters += [{"prompt": 10, "cached": 0, "out": 4}, {"prompt": 10 + 1514 + 1, "cached": 1513, "out": 20}]
    before = mc.scrape_before(served())
    got = mc.check_after(served(), before, records((1514, 0, 8), (1514, 1513, 8)))
    assert got["ok"] is True and got["disagreements"] == []
    assert {c["what"]: c["difference"] for c in got["checks"]} == {"prompt": 0, "cached": 0, "output": 0}
    assert got["counters"]["llamacpp:prompt_tokens_total"] == 1515


def test_a_request_the_client_never_saw_is_a_disagreement(counters: list[dict[str, int]]) -> None:
    counters += [{"prompt": 0, "cached": 0, "out": 0}, {"prompt": 3028, "cached": 0, "out": 16}]
    before = mc.scrape_before(served())
    got = mc.check_after(served(), before, records((1514, 0, 8)))
    assert got["ok"] is False
    assert got["disagreements"][0].startswith("prompt tokens: server counter llamacpp:prompt_tokens_total")


def test_a_restart_during_the_run_is_reported(counters: list[dict[str, int]]) -> None:
    counters += [{"prompt": 5000, "cached": 100, "out": 50}, {"prompt": 1514, "cached": 0, "out": 8}]
    before = mc.scrape_before(served())
    got = mc.check_after(served(), before, records((1514, 0, 8)))
    assert got["ok"] is False and any("restarted" in d for d in got["disagreements"])


def test_nothing_to_compare_is_skipped_not_failed(counters: list[dict[str, int]]) -> None:
    assert mc.scrape_before(served("sim")) is None
    assert mc.check_after(served("sim"), None, [])["skipped"] == "kind 'sim' has no usage counters to compare"
    got = mc.check_after(served(), None, records((1, 0, 1)))
    assert got["ok"] is None and "did not answer before the run" in got["skipped"]


@pytest.mark.e2e
def test_probe_command_on_the_simulator(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Kinds without slot files restart too: the simulator's disk checkpoints are its restore path."""
    console = Console(file=io.StringIO(), width=160)
    args = ProbeArgs(target="sim", params=["document=2000"], out=tmp_path, as_json=True)
    code = probe(args, console)
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    (restart,) = doc["restarts"]
    assert restart["old_pid"] != restart["new_pid"] and restart["save"] == restart["restore"] == {}
    steps = doc["steps"]
    assert [s["server_process"] for s in steps] == [0] * 6 + [1]
    assert steps[-1]["label"].startswith("E5") and steps[-1]["cached_tokens"] > 0  # from the disk
    assert [m["skipped"] for m in doc["metrics"]] == ["kind 'sim' has no usage counters to compare"] * 2
