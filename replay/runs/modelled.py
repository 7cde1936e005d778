"""A scenario arm walked in modelled time: the arm's trace sent as its plan sends it, to the
cache model in process (`replay.sizing.timeline`), with the arm's simulator flags and the files
an earlier day left on disk. No HTTP and no wall clock: the same figures every run, whatever the
machine's load, which is what `replay scenario check` judges the field figures by.

The results it returns have the shape `replay run` writes (request records with their modelled
seconds, `server` records of the cache events), so the check reads both the same way; how far a
wall-clock run on the simulator strays from this walk is what the check prints as its spread.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from replay.metrics.results import RunResults
from replay.runs.leftovers import disk_mib, leftover_checkpoints
from replay.scenario.spec import Arm, Scenario
from replay.sim.model import events as ev
from replay.sim.model.config import SimConfig
from replay.sim.server.options import parse
from replay.sizing.jobs import read_requests, scheduled_from_trace
from replay.sizing.timeline import Schedule, Sent, Timeline


def walkable(arm: Arm) -> bool:
    """Whether the in-process walk models this arm: it walks ds4's model. An arm on the
    simulator playing llama-server (`--server llama`) is judged on its run instead: its figures
    come from the server's log and slot files, its probe restarts the server between requests,
    and it serves one request at a time, so no order depends on the machine's load."""
    if arm.fleet is not None:  # several servers (and a router): judged on its run
        return False
    sim = list(arm.sim)
    return not any(
        flag == "--server" and i + 1 < len(sim) and sim[i + 1] == "llama" or flag == "--server=llama"
        for i, flag in enumerate(sim)
    )


def arm_config(arm: Arm) -> SimConfig:
    """The cache model `replay sim serve` runs for this arm's flags (disk KV on)."""
    cfg, _ = parse([*arm.sim, "--kv-disk-dir", "unused"])
    return cfg


def model_arm(spec: Scenario, arm: Arm, trace_path: Path) -> RunResults:
    """The arm's trace walked in modelled time; `spec` already carries the arm's params."""
    cfg = arm_config(arm)
    entries = list(scheduled_from_trace(read_requests(trace_path), cfg, think=spec.run.think))
    # Trace time and modelled time are the same seconds (a scenario replays at speed = scale).
    schedule = Schedule(spec.run.plan, concurrency=spec.run.concurrency, round_robin=spec.run.round_robin)
    origin = min((e.t for e in entries), default=0.0)
    leftovers = leftover_checkpoints(spec, trace_path, cfg)
    timeline = Timeline(entries, cfg, schedule, leftovers, origin)
    res = _results(timeline, origin, str(trace_path), {"scenario": spec.name, "arm": arm.name})
    if leftovers:
        res.run["target"]["disk_at_start_mib"] = disk_mib(leftovers)
    return res


def _results(timeline: Timeline, origin: float, path: str, header: dict[str, Any]) -> RunResults:
    requests: list[dict[str, Any]] = []
    server: list[dict[str, Any]] = []
    seq_of: dict[int, int] = {}
    sent: dict[int, Sent] = {}
    for happened in timeline:
        if isinstance(happened, Sent):
            seq_of[happened.entry.job.id] = len(seq_of) + 1
            sent[happened.entry.job.id] = happened
            continue
        record = _server_record(happened, seq_of)
        if record is not None:
            record["line"] = len(server) + 1
            server.append(record)
        if isinstance(happened, ev.Finished):
            requests.append(_request_record(happened, sent[happened.job_id], seq_of, origin))
    run = {
        "plan": {"plan": "modelled", "speed": 1.0},
        "target": {"kind": "model", "time_scale": 1.0},
        **header,
    }
    return RunResults(path=path, run=run, requests=requests, server=server)


def _request_record(done: ev.Finished, sent: Sent, seq_of: dict[int, int], origin: float) -> dict[str, Any]:
    r, entry = done.result, sent.entry
    return {
        "kind": "request",
        "seq": seq_of[done.job_id],
        "id": done.job_id,
        "session": entry.job.session,
        "tag": entry.tag,
        "switch": list(sent.switch.flags),
        "from_session": sent.switch.from_session,
        "sent_s": sent.t + origin,  # trace seconds, as a run's sent_s times its speed
        "status": "ok" if r.error is None else "server_error",
        "prompt_tokens": r.prompt_tokens,
        "cached_tokens": r.cached_tokens,
        "reprocessed_tokens": r.reprocessed_tokens,
        "output_tokens": r.completion_tokens,
        "finish": r.finish,
        "modelled": r.x_sim(),
    }


def _server_record(e: ev.Event, seq_of: dict[int, int]) -> dict[str, Any] | None:
    """The `server` record the log correlation would make of this event (numbers only)."""
    match e:
        case ev.DiskHit():
            return {
                "event": "restore",
                "request_seq": seq_of.get(e.job_id),
                "tokens": e.checkpoint.tokens,
                "consumed": e.consumed,
            }
        case ev.Stored():
            seq = seq_of.get(e.job_id) if e.job_id is not None else None
            return {
                "event": "store",
                "request_seq": seq,
                "reason": e.reason,
                "tokens": e.checkpoint.tokens,
                "mib": e.checkpoint.size / 2**20,
            }
        case ev.Evicted():
            seq = seq_of.get(e.job_id) if e.job_id is not None else None
            return {
                "event": "evict",
                "request_seq": seq,
                "tokens": e.checkpoint.tokens,
                "hits": e.checkpoint.hits,
            }
        case ev.LiveMiss():
            return {
                "event": "live_miss",
                "request_seq": seq_of.get(e.job_id),
                "live": e.live,
                "prompt": e.prompt,
                "common": e.common,
                "reason": e.reason,
            }
    return None
