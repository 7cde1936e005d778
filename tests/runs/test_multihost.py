"""A sharded run on several hosts, started the way a Kubernetes Indexed Job starts it.

The hosts are network namespaces this test creates (`tests/support/netns.py`): the simulator in one, a shard in
each of the others with `JOB_COMPLETION_INDEX`, `--shard auto/N` and one `--start-at` instant.
Merged, the shards replay exactly the requests one process replays from the whole trace, their
histograms add up, and they began within 100 ms of each other.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from replay.metrics.results import read_results
from replay.trace import TraceWriter
from tests.support.netns import Host, cannot_create_namespaces, hosts

SHARDS = 3
WHY_NOT = cannot_create_namespaces()
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(WHY_NOT is not None, reason=f"no network namespaces: {WHY_NOT}"),
]


def _trace(path: Path, sessions: int = 9, turns: int = 3) -> Path:
    with TraceWriter(path, source="test") as w:
        for s in range(sessions):
            sid = f"s{s}"
            w.session(sid)
            msgs = [{"role": "user", "content": {"synth": {"tokens": 500 + 300 * s, "seed": s}}}]
            for t in range(turns):
                reply = {"role": "assistant", "content": f"r{s}.{t}"}
                w.request(sid, 0.0, list(msgs), params={"max_tokens": 8}, reply={"message": reply})
                msgs += [reply, {"role": "user", "content": {"synth": {"tokens": 200, "seed": 100 * s + t}}}]
    return path


def _wait_for_line(log: Path, text: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        time.sleep(0.05)
    raise AssertionError(
        f"{log}: no {text!r} within {timeout_s} s:\n{log.read_text(errors='replace')[-2000:]}"
    )


def _replay(host: Host, log: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return host.start([sys.executable, "-m", "replay", "run", *args, "--quiet"], log, env)


def test_shards_on_three_hosts_start_together_and_merge_into_the_whole_run(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "trace.jsonl")
    with hosts(1 + SHARDS) as (server, *clients):
        sim_log = tmp_path / "sim.log"
        server.start(
            [
                sys.executable,
                "-m",
                "replay.sim",
                "--host",
                server.address,
                "--port",
                "8000",
                "--time-scale",
                "1000",
            ],
            sim_log,
        )
        _wait_for_line(sim_log, "listening on")
        url = f"http://{server.address}:8000"
        plan = ("--plan", "overlap", "--concurrency", "3")

        whole = _replay(
            clients[0],
            tmp_path / "whole.log",
            str(trace),
            "--target",
            url,
            "--out",
            str(tmp_path / "whole.jsonl"),
            *plan,
        )
        assert whole.wait(timeout=180) == 0, (tmp_path / "whole.log").read_text()

        start_at = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=8)).isoformat()
        shards = [
            _replay(
                host,
                tmp_path / f"shard-{i}.log",
                str(trace),
                "--target",
                url,
                "--shard",
                f"auto/{SHARDS}",
                "--start-at",
                start_at,
                "--out",
                str(tmp_path / f"shard-{i}.jsonl"),
                *plan,
                env={"JOB_COMPLETION_INDEX": str(i)},
            )
            for i, host in enumerate(clients)
        ]
        for i, proc in enumerate(shards):
            assert proc.wait(timeout=180) == 0, (tmp_path / f"shard-{i}.log").read_text()

    parts = [read_results(tmp_path / f"shard-{i}.jsonl") for i in range(SHARDS)]
    one = read_results(tmp_path / "whole.jsonl")
    ids = sorted(r["id"] for p in parts for r in p.requests)
    assert ids == sorted(r["id"] for r in one.requests)  # every request once, none twice
    assert all(p.requests for p in parts)  # balanced by work: no shard is empty
    assert {p.run["start"]["planned"] for p in parts} == {
        dt.datetime.fromisoformat(start_at).isoformat(timespec="microseconds")
    }

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "replay",
            "report",
            "--json",
            "--merge",
            *(str(tmp_path / f"shard-{i}.jsonl") for i in range(SHARDS)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    merged = orjson.loads(done.stdout)
    whole_all = one.summary.classes["all"]
    assert merged["classes"]["all"]["count"] == whole_all.count == len(ids)
    assert merged["classes"]["cold"]["count"] == one.summary.classes["cold"].count == 9  # one per session
    assert merged["start_spread_s"] < 0.1, merged["start_spread_s"]
