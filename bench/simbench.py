"""Simulator timings: the slow-morning scenario end to end, and a disk-budget sweep over a big trace.

Both run in child processes with a deadline, so a slow simulator shows up as a missed target
with its time, never as a benchmark that hangs.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from replay.trace.writer import TraceWriter

GiB = 2**30


def sweep_trace_file(path: Path, requests: int, turns: int = 10) -> Path:
    """`requests` requests in sessions of `turns` short turns, one session after another (histories
    stay small: the sweep's cost is per request, not per token). Each session's first request is a
    live miss that saves the previous session; nothing is ever restored."""
    params = {"max_tokens": 16}
    with TraceWriter(path, source="scenario:bench-sweep", created="2026-01-01T00:00:00+00:00") as w:
        n = 0
        s = 0
        while n < requests:
            sid = f"s{s}"
            w.session(sid)
            msgs: list[dict[str, Any]] = [
                {"role": "system", "content": {"synth": {"tokens": 400, "seed": 1}}}
            ]
            for turn in range(turns):
                if n >= requests:
                    break
                msgs.append(
                    {"role": "user", "content": {"synth": {"tokens": 40, "seed": (s * turns + turn) % 997}}}
                )
                reply = {"role": "assistant", "content": f"ok {s}.{turn}"}
                w.request(
                    sid,
                    float(n) * 0.01,
                    list(msgs),
                    params=params,
                    reply={"message": reply, "output_tokens": 16},
                )
                msgs.append(reply)
                n += 1
            s += 1
    return path


def _child(argv: list[str], timeout_s: float, work: Path) -> dict[str, Any]:
    """Run one measurement as a child in its own session; past the deadline its whole group goes
    (a sweep's worker processes with it)."""
    from drivers.process import ChildProcess

    out, err = work / f"simbench-{argv[0]}.out", work / f"simbench-{argv[0]}.err"
    child = ChildProcess(
        [sys.executable, "-m", "bench.simbench", *argv],
        log_path=out,
        stderr_path=err,
        name=f"simbench-{argv[0]}",
        give_up=True,
    )
    t0 = time.perf_counter()
    child.start()
    try:
        code = child.wait(timeout_s)
    finally:
        if child.running():
            child.stop(timeout=5.0, give_up=True)
    if code is None:
        return {"status": "timeout", "reason": f"not finished after {timeout_s:g} s", "wall_s": None}
    wall = round(time.perf_counter() - t0, 2)
    if code != 0:
        lines = err.read_text(errors="replace").strip().splitlines() or ["?"]
        return {"status": "failed", "reason": lines[-1][:300], "wall_s": wall}
    return {"status": "ok", "wall_s": wall, **json.loads(out.read_text().strip().splitlines()[-1])}


def slow_morning(work: Path, timeout_s: float) -> dict[str, Any]:
    return _child(["slow-morning", str(work / "slow-morning")], timeout_s, work)


def sweep(work: Path, requests: int, budgets: int, timeout_s: float) -> dict[str, Any]:
    path = work / "sweep.trace.jsonl"
    t0 = time.perf_counter()
    sweep_trace_file(path, requests)
    gen_s = round(time.perf_counter() - t0, 2)
    out = _child(["sweep", str(path), str(budgets)], timeout_s, work)
    out.update(requests=requests, budgets=budgets, generate_s=gen_s, trace_bytes=path.stat().st_size)
    if out.get("wall_s") is not None:
        # Linear in requests for a slice (the real 1M in a full run).
        out["estimate_1m_s"] = round(out["wall_s"] * 1_000_000 / requests, 1)
    out.setdefault(
        "detail",
        f"{requests:,} requests x {budgets} budgets in {out.get('workers', '?')} process(es), "
        f"modules {out.get('modules', '?')} (replay/_compiled.py), "
        f"peak RSS {out.get('peak_rss_mib', '?')} MiB in the sweep process"
        + (
            f", at most {out['workers_peak_rss_at_most_mib']} MiB in each worker"
            if out.get("workers_peak_rss_at_most_mib")
            else ""
        )
        + f"; trace generated in {gen_s} s",
    )
    path.unlink(missing_ok=True)
    return out


def _slow_morning_main(out_dir: str) -> None:
    import resource

    from replay.runs.scenario import run_arms
    from replay.scenario.catalog import find_scenario

    spec = find_scenario("slow-morning")
    runs = run_arms(spec, out_dir)
    requests = sum(r.outcome.requests for r in runs)
    errors = sum(r.outcome.errors for r in runs)
    # The arms run at once in modelled time, so the longest arm's replay bounds the wall time from
    # below whatever the simulator's speed; the CPU is what the simulator and client really cost.
    scale = spec.run.time_scale
    longest = max((r.outcome.duration_s for r in runs), default=0.0)
    cpu = sum(
        u.ru_utime + u.ru_stime
        for u in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )
    print(
        json.dumps(
            {
                "arms": len(runs),
                "requests": requests,
                "errors": errors,
                "time_scale": scale,
                "longest_arm_s": round(longest, 2),
                "cpu_s": round(cpu, 2),
                "detail": (
                    f"{len(runs)} arms at once, {requests} requests, {errors} errors; at {scale:g}x modelled"
                    f" time the longest arm's replay takes {longest:.1f} s ({longest * scale / 60:.0f}"
                    f" modelled minutes); CPU {cpu:.1f} s"
                ),
            }
        )
    )


def _sweep_main(path: str, budgets: int) -> None:
    """What `replay size sweep TRACE --budgets 4G,8G,...` does, with the same default processes."""
    import resource

    import replay
    from replay.runs.workers import peak_rss_mib
    from replay.sizing.parallel import auto_workers
    from replay.sizing.sweep import sweep_trace

    sizes = [(i + 1) * 4 * GiB for i in range(budgets)]
    workers = auto_workers(path, len(sizes))
    report = sweep_trace(path, sizes, workers=workers)
    # A worker's own high-water mark is gone with it; its ru_maxrss counts the parent's size at
    # spawn too (exec keeps the old map's peak there), so it is only a bound.
    workers_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(
        json.dumps(
            {
                "rows": len(report.rows),
                "workers": workers,
                "modules": replay.COMPILED,
                "peak_rss_mib": round(peak_rss_mib()),
                "workers_peak_rss_at_most_mib": round(workers_kib / 1024) if workers > 1 else None,
            }
        )
    )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "slow-morning":
        _slow_morning_main(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "sweep":
        _sweep_main(sys.argv[2], int(sys.argv[3]))
    else:
        raise SystemExit("usage: python -m bench.simbench slow-morning OUT | sweep TRACE BUDGETS")
