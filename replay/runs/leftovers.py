"""An earlier day's checkpoint files, written into a scenario's disk-KV directory before the
simulator starts, as ds4 finds them on a real machine in the morning.

The simulator loads them like any file it left itself, so they take budget, rank by their hits
and can be restored: nothing about them is scripted beyond their header fields.
"""

from __future__ import annotations

import datetime as _dt
import time
from pathlib import Path

from replay.scenario.spec import Scenario
from replay.sim.model.config import GiB, MiB, SimConfig
from replay.sim.model.disk import Checkpoint
from replay.sim.model.seq import TokenSeq
from replay.sim.server.files import CheckpointFiles
from replay.sim.server.options import parse
from replay.trace.reader import read_trace


def clock_epoch(clock: str | None) -> float:
    """Epoch of modelled second 0: the report's clock, or now."""
    if clock is None:
        return time.time()
    when = _dt.datetime.fromisoformat(clock)
    return (when if when.tzinfo is not None else when.astimezone()).timestamp()


def system_prefix(spec: Scenario, trace_path: Path, cfg: SimConfig) -> TokenSeq:
    """The shared system turn as the simulator renders it: the chat-anchor cut of the first
    request of a session that shares the system prompt (what a cold save of it stores)."""
    from replay.sizing import jobs_from_trace

    shared = {sid for sid, s in spec.sessions.items() if s.system == "shared"}
    first = next(
        (r for r in read_trace(trace_path).requests if r.session in shared and r.parent is None), None
    )
    if first is None:
        raise ValueError(f"{spec.path}: a system-prefix leftover needs a session with system = 'shared'")
    _, job = next(jobs_from_trace([first], cfg))
    anchor = job.prompt.anchor or 0
    return job.prompt.seq.prefix(anchor)


def _other_files(gib: float, file_tokens: int, cfg: SimConfig) -> int:
    return max(1, round(gib * GiB / cfg.file_bytes(file_tokens)))


def leftover_count(spec: Scenario, flags: list[str] | None = None) -> int:
    """How many files `write_leftovers` writes for an arm with these simulator flags."""
    if not spec.leftovers:
        return 0
    cfg, _ = parse([*(flags or []), "--kv-disk-dir", "unused"])
    return sum(
        1 if row.what == "system-prefix" else _other_files(row.gib, row.file_tokens, cfg)
        for row in spec.leftovers
    )


def leftover_checkpoints(spec: Scenario, trace_path: Path, cfg: SimConfig) -> list[Checkpoint]:
    out: list[Checkpoint] = []
    for n, row in enumerate(spec.leftovers):
        t = -row.age_h * 3600.0
        if row.what == "system-prefix":
            seq = system_prefix(spec, trace_path, cfg)
            out.append(Checkpoint(seq, "cold", "token-text", cfg.file_bytes(len(seq)), t, t, row.hits))
            continue
        size = cfg.file_bytes(row.file_tokens)
        for i in range(_other_files(row.gib, row.file_tokens, cfg)):
            seq = TokenSeq(((f"<earlier-day-{n}-{i}>",), ("~",) * (row.file_tokens - 1)))
            out.append(Checkpoint(seq, "evict", "token-text", size, t, t, row.hits))
    return out


def write_leftovers(
    spec: Scenario, trace_path: Path, kv_dir: Path, flags: list[str] | None = None, clock: str | None = None
) -> list[Checkpoint]:
    """Write the spec's `[[leftovers]]` into `kv_dir` (sizes by the arm's simulator flags, ages
    from `clock`, the simulator's `--clock`, else now); returns the files written."""
    if not spec.leftovers:
        return []
    cfg, _ = parse([*(flags or []), "--kv-disk-dir", str(kv_dir)])
    files = CheckpointFiles(kv_dir, clock_epoch(clock))
    cps = leftover_checkpoints(spec, trace_path, cfg)
    for cp in cps:
        files.write(cp)
    return cps


def disk_mib(files: list[Checkpoint]) -> float:
    """What the files take of the disk budget, in MiB (their modelled sizes): the level the
    report's disk strip starts from."""
    return round(sum(cp.size for cp in files) / MiB, 1)
