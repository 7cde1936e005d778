"""Memory of a replay with very long histories, and how fast traces are read and validated.

Long agent sessions resend their whole history every turn, so a client that kept each request's
messages would hold sessions x turns x history. The trace stores each piece once (synth specs,
deltas against the parent request), and the engine should materialise a request's messages only
while it sends it. The replay runs in a worker process (`run_workers`), which reports its own
resident memory after loading the trace and its high-water mark.

Trace reading runs in a child process too (`python -m bench.memory read PATH`), so the
gigabyte of objects it builds never stays in the benchmark's own memory.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.server import RunningServer
from bench.workload import big_trace, history_trace
from replay.engine.plans import make_plan
from replay.engine.run import EngineConfig
from replay.runs.workers import run_workers
from replay.trace.reader import read_trace
from replay.trace.synth import approx_bytes

RSS_TARGET_MIB = 1024.0
READ_TARGET_MBPS = 200.0


def history_rss(
    srv: RunningServer, work: Path, sessions: int, history_tokens: int = 130_000, concurrency: int = 16
) -> dict[str, Any]:
    turns = 2
    trace = history_trace(
        work / "history.trace.jsonl", sessions=sessions, history_tokens=history_tokens, turns=turns
    )
    config = EngineConfig(base_url=srv.url, run_id="mem", timeout_s=300.0)
    srv.clear()
    t0 = time.perf_counter()
    outcome = run_workers(
        read_trace(trace),
        make_plan("overlap", concurrency=concurrency),
        config,
        work / "history.results.jsonl",
        {"kind": "refserver"},
        1,
    )
    wall = time.perf_counter() - t0
    truth = srv.truth(clear=True)
    sent = sum(row[6] for row in truth.values())
    part = outcome.parts[0]
    per_request = approx_bytes(history_tokens)
    return {
        "sessions": sessions,
        "history_tokens": history_tokens,
        "requests": outcome.requests,
        "errors": outcome.errors,
        "concurrency": concurrency,
        "trace_bytes": trace.stat().st_size,
        "request_bytes_sent": sent,  # what was materialised and sent, summed over requests
        "history_bytes_per_session": per_request,
        "rss_loaded_mib": part.rss_loaded_mib,
        "peak_rss_mib": part.peak_rss_mib,
        "wall_s": round(wall, 2),
        "cpu_s": part.cpu_s,
        "target_mib": RSS_TARGET_MIB,
        "worker_error": part.error,
    }


def read_throughput(work: Path, size_bytes: int) -> dict[str, Any]:
    """Write a trace of about `size_bytes` in a temp dir, time validate and load in a child, delete it."""
    with tempfile.TemporaryDirectory(prefix="replay-bench-trace-", dir=work) as tmp:
        path = Path(tmp) / "big.trace.jsonl"
        t0 = time.perf_counter()
        big_trace(path, size_bytes)
        gen_s = time.perf_counter() - t0
        size = path.stat().st_size
        done = subprocess.run(
            [sys.executable, "-m", "bench.memory", "read", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            return {"status": "failed", "error": done.stderr.strip()[-300:], "bytes": size}
        timing = json.loads(done.stdout)
    mb = size / 1e6
    return {
        "status": "ok",
        "bytes": size,
        "generate_s": round(gen_s, 2),
        "validate_s": timing["validate_s"],
        "validate_mb_s": round(mb / timing["validate_s"], 1),
        "load_s": timing["load_s"],
        "load_mb_s": round(mb / timing["load_s"], 1),
        "validate_mb_per_cpu_s": round(mb / max(timing["validate_cpu_s"], 1e-9), 1),
        "load_mb_per_cpu_s": round(mb / max(timing["load_cpu_s"], 1e-9), 1),
        "load_peak_rss_mib": timing["peak_rss_mib"],
        "requests": timing["requests"],
        "messages": timing["messages"],
        "distinct_messages": timing["distinct_messages"],
        "target_mb_s": READ_TARGET_MBPS,
    }


def _read_main(path: str) -> None:
    import resource

    from replay.runs.workers import peak_rss_mib
    from replay.trace.reader import read_trace, validate

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    t0, c0 = time.perf_counter(), cpu()
    counts = validate(path)
    t1, c1 = time.perf_counter(), cpu()
    trace = read_trace(path)
    t2, c2 = time.perf_counter(), cpu()
    peak = peak_rss_mib()
    # How much of the text repeats: the loader holds a repeated message once, so its memory
    # follows the distinct messages, not the file's size (after the timing: not counted in it).
    messages = [m for r in trace.requests for m in r.append if "content" in m]
    messages += [r.reply["message"] for r in trace.requests if r.reply and r.reply.get("message")]
    doc = {
        "validate_s": round(t1 - t0, 3),
        "validate_cpu_s": round(c1 - c0, 3),
        "load_s": round(t2 - t1, 3),
        "load_cpu_s": round(c2 - c1, 3),
        "requests": len(trace.requests),
        "lines": counts["lines"],
        "peak_rss_mib": round(peak, 1),
        "messages": len(messages),
        "distinct_messages": len({id(m) for m in messages}),
    }
    print(json.dumps(doc))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "read":
        _read_main(sys.argv[2])
    else:
        raise SystemExit("usage: python -m bench.memory read TRACE")
