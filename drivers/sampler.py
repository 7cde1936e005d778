"""Memory samplers that end with their phase.

The field report this tool comes from lost half an hour to a memory sampler that outlived its
phase and a driver that waited on "all background jobs". Here a sampler is either an anyio task
inside the phase's own task group (``memory_sampler``), cancelled when the phase's ``async with``
ends, or a child process with a PID (``start_sampler_child``) that the phase stops by that PID;
the child also exits on its own when the process it watches, or its parent, is gone.

RSS is summed over the watched PID and its descendants (servers fork workers). Wired memory is
the macOS figure that Metal model weights show up in; elsewhere it is None.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import anyio
import orjson
import psutil

from drivers.process import ChildProcess


@dataclass(frozen=True, slots=True)
class MemorySample:
    t_ns: int  # perf_counter_ns: the same monotonic clock as the engine's records
    pid: int
    rss_bytes: int  # the PID and all its descendants
    processes: int
    wired_bytes: int | None  # macOS only


def _wired_bytes() -> int | None:
    return getattr(psutil.virtual_memory(), "wired", None)


def sample_memory(pid: int) -> MemorySample | None:
    """One sample of ``pid``'s process tree; None once ``pid`` is gone."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return None
    rss = 0
    alive = 0
    for proc in procs:
        try:
            rss += proc.memory_info().rss
            alive += 1
        except psutil.NoSuchProcess:
            if proc is root:
                return None
        except psutil.AccessDenied:
            continue
    return MemorySample(time.perf_counter_ns(), pid, rss, alive, _wired_bytes())


@asynccontextmanager
async def memory_sampler(pid: int, interval_s: float = 1.0) -> AsyncIterator[list[MemorySample]]:
    """Sample ``pid`` every ``interval_s`` while the block runs; the list fills as it goes.

    The sampling task lives in a task group owned by this context manager, so it cannot outlive
    the block: leaving it (normally, by exception or cancellation) cancels the task.
    """
    samples: list[MemorySample] = []

    async def loop() -> None:
        while True:
            sample = await anyio.to_thread.run_sync(sample_memory, pid)
            if sample is None:
                return
            samples.append(sample)
            await anyio.sleep(interval_s)

    async with anyio.create_task_group() as tg:
        tg.start_soon(loop)
        try:
            yield samples
        finally:
            tg.cancel_scope.cancel()


def start_sampler_child(pid: int, out_path: Path, *, interval_s: float = 1.0) -> ChildProcess:
    """Start a sampler child writing JSONL samples of ``pid`` to ``out_path``; stop it by its PID."""
    argv = [sys.executable, "-m", "drivers.sampler", str(pid), str(out_path), "--interval", str(interval_s)]
    child = ChildProcess(
        argv,
        log_path=Path(f"{out_path}.log"),
        stop_timeout=2.0,
        give_up=True,
        name=f"sampler[{pid}]",
    )
    return child.start()


def read_samples(path: Path) -> list[MemorySample]:
    """Samples a sampler child wrote (a half-written last line, from a kill, is dropped)."""
    samples = []
    with open(path, "rb") as f:
        for line in f:
            try:
                samples.append(MemorySample(**orjson.loads(line)))
            except (orjson.JSONDecodeError, TypeError):
                break
    return samples


def _child_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m drivers.sampler", description=__doc__)
    parser.add_argument("pid", type=int)
    parser.add_argument("out", type=Path)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args(argv)
    stop = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    parent = os.getppid()
    with open(args.out, "ab") as out:
        while not stop and os.getppid() == parent:
            sample = sample_memory(args.pid)
            if sample is None:
                break
            out.write(orjson.dumps(asdict(sample)) + b"\n")
            out.flush()
            deadline = time.monotonic() + args.interval
            while not stop and time.monotonic() < deadline:
                time.sleep(min(0.05, args.interval))
    return 0


if __name__ == "__main__":
    sys.exit(_child_main())
