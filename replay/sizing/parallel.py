"""Spread a disk-budget sweep over processes: this one reads and renders the trace once, and feeds
the jobs to worker processes that each run some of the budgets.

Budgets never interact, so a sweep splits by budget with nothing to merge but the rows, in the
order one process would have given them. Reading and rendering are the same for every budget, so
they are done once, here; a job crosses to the workers as the few blocks its prompt adds to its
session's previous prompt, plus its planned reply, pickled in batches. Each worker is a child
process tracked by its PID; it gets the batches through a pipe (which also holds this process back
when the workers fall behind) and reports its rows, or its one-line error, through a queue.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import pickle
import queue as queue_mod
import signal
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from replay.errors import ReplayError, Stopped
from replay.sim.model.job import Job
from replay.sim.model.render import Prompt
from replay.sim.model.reply import Reply
from replay.sim.model.seq import TokenSeq
from replay.sim.model.tokenizer import Block
from replay.sizing.jobs import jobs_from_trace, read_requests

Progress = Callable[[int, int], None]
# A worker's sweep of some budgets over the jobs it receives: `replay.sizing.sweep`'s, passed in
# (by reference, pickled) so that this module does not import the sweep that uses it.
RunBudgets = Callable[..., list[dict[str, Any]]]

# Below this size a trace sweeps faster in one process than it takes to start a second one.
PARALLEL_FROM_BYTES = 16 << 20
# Jobs per pickled batch: big enough that pickling is cheap per job, small enough to stream.
BATCH = 1000
# What a pipe to a worker may hold: two or three batches.
PIPE_BYTES = 1 << 20
# Sessions whose last prompt both sides keep, to send the next one as what it adds.
SESSIONS_KEPT = 4096


def auto_workers(path: str | Path, budgets: int) -> int:
    """For a big trace, one process per core, at most one per budget besides the reading one;
    else one. (Only the reading process holds any of the trace, so more processes need little
    more memory.)"""
    if Path(path).stat().st_size < PARALLEL_FROM_BYTES:
        return 1
    return max(1, min(budgets + 1, os.cpu_count() or 1))


def sweep_in_workers(
    path: str | Path,
    budgets: Sequence[int],
    workers: int,
    kwargs: dict[str, Any],
    run: RunBudgets,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """The rows of `sweep_trace(path, budgets, **kwargs)`, as dicts in budget order: this process
    reads and renders, `workers - 1` processes (at least one) split the budgets, each with `run`."""
    options = dict(kwargs)
    cfg, history, think = options.pop("cfg"), options.pop("history"), options.pop("think", "auto")
    ctx = mp.get_context("spawn")  # no fork: the parent may hold threads
    n = max(1, min(workers - 1, len(budgets)))
    parts = [list(range(i, len(budgets), n)) for i in range(n)]
    results = ctx.Queue()
    procs, pipes = [], []
    previous = _raise_on_sigterm()
    try:
        for index, part in enumerate(parts):
            reader, writer = ctx.Pipe(duplex=False)
            _widen(writer)
            args = (index, run, [budgets[i] for i in part], dict(options, cfg=cfg), reader, results)
            proc = ctx.Process(target=_worker, args=args, name=f"replay-sweep-worker-{index + 1}")
            proc.start()
            reader.close()  # the worker's end: with it closed here, the worker sees our exit
            procs.append(proc)
            pipes.append(writer)
        for batch in _batches(jobs_from_trace(read_requests(path, progress), cfg, history, think)):
            _send(pickle.dumps(batch, pickle.HIGHEST_PROTOCOL), pipes, procs, results)
        _send(b"", pipes, procs, results)
        rows = _collect(results, procs)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        for pipe in pipes:
            pipe.close()
        for proc in procs:
            if proc.is_alive():
                proc.terminate()  # this worker's PID only
            proc.join()
    per_budget = len(rows[0]) // len(parts[0])
    ordered: list[list[dict[str, Any]]] = [[] for _ in budgets]
    for index, part in enumerate(parts):
        for k, position in enumerate(part):
            ordered[position] = rows[index][k * per_budget : (k + 1) * per_budget]
    return [row for chunk in ordered for row in chunk]


def _widen(pipe: Any) -> None:
    """Let a pipe hold a few batches (Linux: up to 1 MiB unprivileged), so this process reads on
    while a worker is busy with the batch before; elsewhere it keeps its size."""
    try:
        import fcntl

        fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (ImportError, AttributeError, OSError):
        pass


def _send(data: bytes, pipes: list[Any], procs: list[Any], results: Any) -> None:
    for index, (pipe, proc) in enumerate(zip(pipes, procs, strict=True)):
        try:
            pipe.send_bytes(data)
        except OSError:  # its end is gone: the worker stopped, and said why if it could
            proc.join(5.0)
            while True:
                try:
                    _, payload = results.get(timeout=1.0)
                except queue_mod.Empty:
                    raise ReplayError(_died(index, proc)) from None
                if isinstance(payload, str):
                    raise ReplayError(payload) from None


def _died(index: int, proc: Any) -> str:
    return f"sweep worker {index + 1} (pid {proc.pid}) exited with code {proc.exitcode}"


def _collect(results: Any, procs: list[Any]) -> dict[int, list[dict[str, Any]]]:
    """Every worker's rows; a worker's error, or its death, is raised as one line."""
    rows: dict[int, list[dict[str, Any]]] = {}
    while len(rows) < len(procs):
        try:
            index, payload = results.get(timeout=0.2)
        except queue_mod.Empty:
            # A worker's rows are in the queue before it exits: one gone without them failed.
            dead = [i for i, p in enumerate(procs) if i not in rows and p.exitcode is not None]
            if dead:
                raise ReplayError(_died(dead[0], procs[dead[0]])) from None
        else:
            if isinstance(payload, str):
                raise ReplayError(payload)
            rows[index] = payload
    return rows


def _raise_on_sigterm() -> Any:
    """Turn SIGTERM into `Stopped` while workers run, so they are stopped too (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum: int, frame: Any) -> None:
        raise Stopped("the sweep was stopped by SIGTERM; its worker processes were stopped")

    return signal.signal(signal.SIGTERM, stop)


# --- the jobs, across processes ------------------------------------------------------------------

# A job as it crosses: (send time, id, session, how many blocks of the session's previous prompt
# it starts with (all of them, or none), the blocks it adds, anchor, has tools, then the reply's
# fields in `Reply`'s order).
Sent = tuple[Any, ...]


def _batches(jobs: Iterable[tuple[float, Job]]) -> Iterator[list[Sent]]:
    """The jobs in batches, every prompt as what it adds to its session's previous one."""
    last: OrderedDict[str | None, tuple[Block, ...]] = OrderedDict()
    batch: list[Sent] = []
    for t, job in jobs:
        prompt, reply = job.prompt, job.reply
        blocks = prompt.seq.blocks
        previous = last.pop(job.session, None)
        kept = len(previous) if previous is not None and blocks[: len(previous)] == previous else 0
        _keep(last, job.session, blocks)
        batch.append(
            (
                t,
                job.id,
                job.session,
                kept,
                blocks[kept:],
                prompt.anchor,
                prompt.has_tools,
                reply.content,
                reply.reasoning,
                reply.tool_calls,
                reply.finish,
                reply.hidden_blocks,
                reply.visible_blocks,
            )
        )
        if len(batch) == BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def _received(conn: Any) -> Iterator[tuple[float, Job]]:
    """The jobs `_batches` sent, rebuilt: each prompt on its session's previous one."""
    last: OrderedDict[str | None, TokenSeq] = OrderedDict()
    while data := conn.recv_bytes():
        for t, job_id, session, kept, added, anchor, tools, *reply in pickle.loads(data):
            previous = last.pop(session, None)
            if kept and (previous is None or len(previous.blocks) != kept):
                raise ReplayError(f"sweep worker: job {job_id} does not follow its session's last prompt")
            seq = previous.extend(*added) if previous is not None and kept else TokenSeq(added)
            _keep(last, session, seq)
            yield t, Job(job_id, Prompt(seq, anchor, tools), Reply(*reply), session)


def _keep(last: OrderedDict[Any, Any], session: str | None, value: Any) -> None:
    """Both sides keep the same sessions (the same operations in the same order)."""
    last[session] = value
    if len(last) > SESSIONS_KEPT:
        last.popitem(last=False)


def _worker(
    index: int, run: RunBudgets, budgets: list[int], kwargs: dict[str, Any], conn: Any, results: Any
) -> None:
    gc.disable()  # as `sweep_trace` does for the reading process
    try:
        found = run(_received(conn), budgets, **kwargs)
    except EOFError:
        os._exit(1)  # the reading process is gone: nobody is left to read the rows
    except ReplayError as exc:
        results.put((index, str(exc)))
    except BaseException as exc:  # reported to the parent, never a silent worker death
        results.put((index, f"sweep worker {index + 1}: {type(exc).__name__}: {exc}"))
    else:
        results.put((index, found))
