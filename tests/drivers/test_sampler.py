"""Memory samplers end with their phase: the anyio task by its task group, the child by its PID."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import anyio
import psutil

from drivers.process import ChildProcess
from drivers.sampler import memory_sampler, read_samples, sample_memory, start_sampler_child


def test_sample_counts_the_whole_tree(tmp_path: Path) -> None:
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); print('up', flush=True); time.sleep(30)"
    with ChildProcess(
        [sys.executable, "-c", code], log_path=tmp_path / "tree.log", give_up=True, stop_timeout=0.5
    ) as c:
        c.wait_for_line("up", timeout=5)
        deadline = time.monotonic() + 5
        while len(psutil.Process(c.pid).children()) < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        s = sample_memory(c.pid)
        assert s is not None
        assert s.processes == 2
        assert s.rss_bytes > psutil.Process(c.pid).memory_info().rss
        assert s.wired_bytes is None or sys.platform == "darwin"
        c.stop(timeout=0.5, give_up=True)  # SIGTERM reaches only the leader; the group goes with SIGKILL
    assert sample_memory(c.pid) is None


def test_anyio_sampler_stops_with_its_block() -> None:
    async def phase() -> tuple[int, int]:
        async with memory_sampler(psutil.Process().pid, interval_s=0.02) as samples:
            await anyio.sleep(0.2)
        n = len(samples)
        await anyio.sleep(0.1)
        return n, len(samples)

    during, after = anyio.run(phase)
    assert during >= 3
    assert after == during  # nothing sampled once the phase ended


def test_child_sampler_has_a_pid_and_ends_with_its_target(tmp_path: Path) -> None:
    target = ChildProcess([sys.executable, "-c", "import time; time.sleep(30)"], log_path=tmp_path / "t.log")
    with target:
        sampler = start_sampler_child(target.pid, tmp_path / "mem.jsonl", interval_s=0.05)
        deadline = time.monotonic() + 5
        while (not (tmp_path / "mem.jsonl").exists() or len(read_samples(tmp_path / "mem.jsonl")) < 2) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.05)
        assert sampler.running()
        assert sampler.stop().how == "terminated"  # the phase stops it by its PID
    samples = read_samples(tmp_path / "mem.jsonl")
    assert len(samples) >= 2 and all(s.pid == target.pid and s.rss_bytes > 0 for s in samples)

    target2 = ChildProcess(
        [sys.executable, "-c", "import time; time.sleep(30)"], log_path=tmp_path / "t2.log"
    )
    with target2:
        sampler2 = start_sampler_child(target2.pid, tmp_path / "mem2.jsonl", interval_s=0.05)
        time.sleep(0.2)
    assert sampler2.wait(5) == 0  # its target is gone, so it ends by itself
    sampler2.stop()
