"""The collector pod of a sharded run: it waits for the shards' summaries on the shared volume
(bounded), keeps the volume for `kubectl cp` a while, then exits, saying why at each step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

from replay.metrics.results import read_summary_line
from replay.runs.k8s_collect import LOST, collect, ended_shards, set_aside_lost_attempts

START = 1_800_000_000.0  # a wall-clock instant (2027-01-15)


def _results(folder: Path, name: str, outcome: str | None) -> Path:
    """A shard's results file: a header and a request, and its summary if the run has ended."""
    path = folder / name
    lines = [
        {"kind": "run", "format": "agent-replay-results/1"},
        {"kind": "request", "id": 1, "status": "ok"},
    ]
    if outcome is not None:
        lines.append({"kind": "summary", "outcome": outcome, "requests": 1, "errors": 0})
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    return path


class Clock:
    """Wall time that moves only when the collector sleeps; `on_sleep` runs before each move."""

    def __init__(self, on_sleep=None) -> None:
        self.now = START
        self.slept: list[float] = []
        self.on_sleep = on_sleep

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        if self.on_sleep is not None:
            self.on_sleep(len(self.slept))
        self.slept.append(seconds)
        self.now += seconds


def test_it_waits_for_every_shard_then_keeps_the_volume_and_exits(tmp_path: Path) -> None:
    _results(tmp_path, "shard-0.morning-0-a1b2c.results.jsonl", "done")
    _results(tmp_path, "shard-1.morning-1-d3e4f.results.jsonl", None)  # still running

    def shard_1_ends(polls: int) -> None:
        if polls == 2:
            _results(tmp_path, "shard-1.morning-1-d3e4f.results.jsonl", "max-duration")

    clock, said = Clock(shard_1_ends), []
    collect(tmp_path, 2, START + 48 * 3600, 86400, said.append, clock.time, clock.sleep)
    assert clock.slept == [30.0, 30.0, 30.0, 86400]  # three polls until shard 2 ended, then a day
    assert said[0].startswith(f"waiting for the results of 2 shard(s) in {tmp_path}")
    assert said[1] == "shard 1/2 ended (done): 1 of 2"
    assert said[2] == "shard 2/2 ended (max-duration): 2 of 2"
    assert said[3].startswith("all 2 shard(s) ended; ") and "stays open for kubectl cp until" in said[3]
    assert said[4] == "kept the results as long as asked: exiting"


def test_a_pod_lost_to_a_drain_is_not_an_ended_shard_but_its_second_attempt_is(tmp_path: Path) -> None:
    _results(tmp_path, "shard-0.morning-0-a1b2c.results.jsonl", "SIGTERM")  # drained, started again
    assert ended_shards(tmp_path, 1) == {}
    _results(tmp_path, "shard-0.morning-0-zz9y8.results.jsonl", "done")
    assert ended_shards(tmp_path, 1) == {0: "done"}


def test_a_lost_attempt_of_a_shard_that_ended_later_is_set_aside_out_of_the_report_glob(
    tmp_path: Path,
) -> None:
    lost = _results(tmp_path, "shard-0.morning-0-a1b2c.results.jsonl", "SIGTERM")  # drained
    _results(tmp_path, "shard-0.morning-0-zz9y8.results.jsonl", "done")  # its second attempt
    only = _results(tmp_path, "shard-1.morning-1-q7w6e.results.jsonl", "SIGTERM")  # never ended
    clock, said = Clock(), []
    collect(tmp_path, 2, START, 0, said.append, clock.time, clock.sleep)
    assert sorted(p.name for p in tmp_path.glob("*.results.jsonl")) == [
        "shard-0.morning-0-zz9y8.results.jsonl",
        only.name,  # all there is of shard 2: kept where the report reads it
    ]
    assert (tmp_path / LOST / lost.name).is_file()  # kept, not deleted
    assert any(line.startswith("moved 1 lost attempt(s)") for line in said)
    assert set_aside_lost_attempts(tmp_path, 2) == []  # nothing more to move


def test_worker_parts_other_files_and_indexes_past_the_last_are_not_shards(tmp_path: Path) -> None:
    _results(tmp_path, "shard-0.morning-0-a1b2c.results.part1of2.jsonl", "done")
    _results(tmp_path, "shard-2.morning-2-a1b2c.results.jsonl", "done")  # a Job of 2 has no index 2
    _results(tmp_path, "notes.results.jsonl", "done")
    (tmp_path / "shard-1.morning-1-a1b2c.results.jsonl").mkdir()
    assert ended_shards(tmp_path, 2) == {}


def test_waiting_is_bounded_and_says_which_shards_never_ended(tmp_path: Path) -> None:
    _results(tmp_path, "shard-1.morning-1-d3e4f.results.jsonl", "done")
    clock, said = Clock(), []
    collect(tmp_path, 3, START + 100.0, 3600.0, said.append, clock.time, clock.sleep)
    assert clock.slept == [30.0, 30.0, 30.0, 10.0, 3600.0]
    assert clock.now == START + 100.0 + 3600.0
    assert "stopped waiting at 2027-01-15T08:01:40Z: shard(s) 1/3, 3/3 wrote no summary" in said[-2]


def test_a_file_still_written_is_read_only_at_its_end(tmp_path: Path) -> None:
    """A summary further from the end than `within` is not looked for: a running shard's file
    (no summary yet) would otherwise be read whole at every poll."""
    path = _results(tmp_path, "shard-0.m-0-a.results.jsonl", "done")
    with path.open("ab") as f:
        for i in range(2000):
            f.write(orjson.dumps({"kind": "server", "i": i}) + b"\n")
    size = path.stat().st_size
    assert read_summary_line(path)["outcome"] == "done"
    assert read_summary_line(path, within=size) is not None
    assert read_summary_line(path, within=size // 2) is None
    assert read_summary_line(path, block=100, within=size - 60) is not None


def test_it_runs_as_the_collector_pod_runs_it(tmp_path: Path) -> None:
    _results(tmp_path, "shard-0.morning-0-a1b2c.results.jsonl", "done")
    argv = [sys.executable, "-m", "replay.runs.k8s_collect", str(tmp_path), "--shards", "1"]
    done = subprocess.run(
        [*argv, "--wait-until", "2026-12-03T16:30:00Z", "--keep", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "all 1 shard(s) ended" in done.stdout and done.stdout.rstrip().endswith("exiting")
    bad = subprocess.run([*argv, "--wait-until", "tomorrow", "--keep", "0"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--wait-until must be an ISO 8601 time" in bad.stderr
