"""Spread a disk-budget sweep over processes: each takes some of the budgets and reads the trace itself.

Budgets never interact, so a sweep splits by budget with nothing to merge but the rows, in the
order one process would have given them. Each worker is a child process tracked by its PID; it
reports progress through a shared counter and its rows (or its one-line error) through a queue.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil

from replay.errors import ReplayError, Stopped

Progress = Callable[[int, int], None]

# Below this size a trace sweeps faster in one process than it takes to start a second one.
PARALLEL_FROM_BYTES = 16 << 20
# Each process holds the whole trace: measured at about 8 bytes of memory per byte of trace file
# (2.5 GB for a 311 MB trace of 1M requests); the margin covers the budgets' checkpoints.
MEMORY_PER_TRACE_BYTE = 10


def auto_workers(path: str | Path, budgets: int) -> int:
    """One process per core for a big trace, at most one per budget and no more than the free
    memory holds; else one."""
    size = Path(path).stat().st_size
    if size < PARALLEL_FROM_BYTES:
        return 1
    fits = psutil.virtual_memory().available // (size * MEMORY_PER_TRACE_BYTE)
    return max(1, min(budgets, os.cpu_count() or 1, fits))


def sweep_in_workers(
    path: str | Path,
    budgets: Sequence[int],
    workers: int,
    kwargs: dict[str, Any],
    progress: Progress | None = None,
) -> list[Any]:
    """The rows of `size.sweep_trace(path, budgets, **kwargs)`, computed by `workers` processes."""
    from replay.size import SweepRow

    ctx = mp.get_context("spawn")  # no fork: the parent may hold threads
    parts = [list(range(i, len(budgets), workers)) for i in range(workers)]
    parts = [p for p in parts if p]
    results = ctx.Queue()
    counters = [(ctx.Value("q", 0, lock=False), ctx.Value("q", 0, lock=False)) for _ in parts]
    procs = []
    for index, (part, (done, total)) in enumerate(zip(parts, counters, strict=True)):
        args = (index, str(path), [budgets[i] for i in part], kwargs, results, done, total)
        proc = ctx.Process(target=_worker, args=args, name=f"replay-sweep-{index + 1}")
        proc.start()
        procs.append(proc)
    rows: dict[int, list[dict[str, Any]]] = {}
    previous = _raise_on_sigterm()
    try:
        while len(rows) < len(procs):
            try:
                index, payload = results.get(timeout=0.2)
            except queue_mod.Empty:
                dead = [p for i, p in enumerate(procs) if i not in rows and p.exitcode not in (None, 0)]
                if dead:
                    raise ReplayError(
                        f"sweep worker {dead[0].name} (pid {dead[0].pid}) exited with code {dead[0].exitcode}"
                    ) from None
            else:
                if isinstance(payload, str):
                    raise ReplayError(payload)
                rows[index] = payload
            if progress is not None:
                progress(min(d.value for d, _ in counters), max(t.value for _, t in counters))
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        for proc in procs:
            if proc.is_alive():
                proc.terminate()  # this worker's PID only
            proc.join()
    per_budget = len(rows[0]) // len(parts[0])
    ordered: list[list[dict[str, Any]]] = [[] for _ in budgets]
    for index, part in enumerate(parts):
        for k, position in enumerate(part):
            ordered[position] = rows[index][k * per_budget : (k + 1) * per_budget]
    return [SweepRow(**row) for chunk in ordered for row in chunk]


def _raise_on_sigterm() -> Any:
    """Turn SIGTERM into `Stopped` while workers run, so they are stopped too (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum: int, frame: Any) -> None:
        raise Stopped("the sweep was stopped by SIGTERM; its worker processes were stopped")

    return signal.signal(signal.SIGTERM, stop)


def _worker(
    index: int,
    path: str,
    budgets: list[int],
    kwargs: dict[str, Any],
    results: Any,
    done: Any,
    total: Any,
) -> None:
    from replay.size import sweep_trace

    parent = mp.parent_process()

    def report(n: int, of: int) -> None:
        total.value = of
        done.value = n
        if parent is not None and not parent.is_alive():
            os._exit(1)  # nobody is left to read the rows: stop now, with nothing to clean up

    try:
        found = sweep_trace(path, budgets, workers=1, progress=report, **kwargs)
    except ReplayError as exc:
        results.put((index, str(exc)))
    except BaseException as exc:  # reported to the parent, never a silent worker death
        results.put((index, f"sweep worker {index + 1}: {type(exc).__name__}: {exc}"))
    else:
        results.put((index, [asdict(row) for row in found.rows]))
