"""`replay twin RESULTS --log SERVER.log` on a ds4-format log (issue #34 item 4): a run that already
happened, its server's log read by the ds4 parsers, the model (the simulator playing ds4)
configured from the settings that log shows, the run's trace replayed on it.

Here the run is the simulator's own (no ds4 in CI), at a disk budget and context that are not the
simulator's defaults: the twin must take them from the log to agree. Measured: five conversations
taking turns, every one that comes back restored from disk on both sides: agreement 1.000 (10/10).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.support.twin_suite import five_taking_turns, write_trace

pytestmark = pytest.mark.e2e


def cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replay", *argv], capture_output=True, text=True, timeout=300, cwd=cwd
    )


def test_offline_twin_of_a_ds4_log(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "trace.jsonl", five_taking_turns)
    run = cli(
        "run",
        str(trace),
        "--target",
        "sim",
        "--sim-args",
        "-c 16384 --kv-disk-space-mb 512",
        "--history",
        "recorded",
        "--workdir",
        "work",
        "--out",
        "day.results.jsonl",
        "--quiet",
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    (log,) = (tmp_path / "work").glob("sim.*.log")
    done = cli("twin", "day.results.jsonl", "--log", str(log), "--json", "--out", "twin", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    doc = orjson.loads(done.stdout)
    flags = doc["model"]["flags"]
    assert flags[flags.index("--kv-disk-space-mb") + 1] == "512" and flags[flags.index("-c") + 1] == "16384"
    assert doc["real"]["settings"]["kv_disk_budget_mib"] == 512
    assert doc["agreement"] == 1.0 and doc["all_fields_equal"] == doc["requests"] == 10
    assert [r["id"] for r in doc["rows"] if r["real"]["restores"]] == [6, 7, 8, 9, 10]
    assert orjson.loads((tmp_path / "day.twin.json").read_bytes())["agreement"] == 1.0
