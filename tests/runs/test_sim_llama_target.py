"""`--target sim:llama`: a run and the cache probe against the simulator playing llama-server, read
back as a llama-server run (its log's settings and server records, its slot files on a restart)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from replay.metrics.results import read_results
from replay.runs.probe import run_cache_probe
from replay.runs.targets import resolve_target
from replay.testing.gguf_model import make_model
from replay.trace import TraceWriter
from replay.trace.synth import synth_text

pytestmark = pytest.mark.e2e


def _trace(path: Path) -> Path:
    """Two conversations taking turns on one slot: the second's turn sends the first's prompt to
    the host cache, the first's next turn brings it back."""
    with TraceWriter(path, source="test") as w:
        for s in ("a", "b"):
            w.session(s)
        a1 = [{"role": "user", "content": synth_text(800, 1)}]
        b1 = [{"role": "user", "content": synth_text(800, 2)}]
        w.request("a", 0.0, a1, {"max_tokens": 4})
        w.request("b", 0.1, b1, {"max_tokens": 4})
        w.request(
            "a",
            0.2,
            [*a1, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}],
            {"max_tokens": 4},
        )
    return path


def test_a_run_on_sim_llama_reads_its_log_as_llama_servers(tmp_path: Path) -> None:
    model = make_model(tmp_path / "tiny.gguf")
    out = tmp_path / "run.jsonl"
    sim_args = f"-m {model} -np 1 -lv 4 --time-scale 1000"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "replay",
            "run",
            str(_trace(tmp_path / "t.jsonl")),
            "--target",
            "sim:llama",
            "--sim-args",
            sim_args,
            "--out",
            str(out),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    res = read_results(out)
    effective = res.run["target"]["effective"]
    assert (effective["n_parallel"], effective["build"], effective["cache_ram_mib"]) == (1, 11549, 8192)
    records = {r["seq"]: r for r in res.requests}
    served = [s for s in res.server if s["event"] == "request"]
    assert len(served) == 3 and all(s["request_seq"] in records for s in served)
    for s in served:
        assert s["cached"] == records[s["request_seq"]]["cached_tokens"]
    restores = [s for s in res.server if s["event"] == "restore" and s.get("source") == "host_cache"]
    assert len(restores) == 1  # the third request's prompt came back from host memory
    assert records[max(records)]["cached_tokens"] > 800


def test_the_probe_restarts_sim_llama_through_its_slot_files(tmp_path: Path) -> None:
    model = make_model(tmp_path / "tiny-gemma2.gguf", arch="gemma2", swa=256)
    target = resolve_target(
        "sim:llama",
        None,
        ["-m", str(model), "-np", "1", "-lv", "4", "--time-scale", "10000"],
        tmp_path / "sim",
    )
    report = run_cache_probe(target, tmp_path / "probe", params={"document": 500})
    (restart,) = report.restarts
    assert restart.slot == 0 and restart.save["n_saved"] == restart.restore["n_restored"] > 500
    last = report.steps[-1]
    assert (
        last.label.startswith("E5") and last.cached_tokens and last.cached_tokens > 0
    )  # b11549 keeps checkpoints
    assert report.settings[0]["build"] == 11549 and report.log_events[1].get("slot_file_checkpoints") == 1
