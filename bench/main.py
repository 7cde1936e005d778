"""`python -m bench`: run the client benchmark sections and write results plus a markdown verdict.

Sections: server (wrk ceiling), accuracy, rate, peers, memory, trace, imports (the public corpora's
importers: peak RSS and MB/s, `--imports-mb` a kind), sim, soak (`--soak-minutes` per process;
`just soak` runs it alone). `--quick` runs a subset in under 3 minutes (no peers, no
server ceiling and no soak, one rate point per worker count, smaller sizes; every load point still
10 s or 10,000 requests, so a change can be checked before it lands); `--only NAME[,NAME]` runs
just those. Each section
writes `OUT/NAME.json`; `OUT/README.md` is rebuilt from every section file present, so a partial
run keeps the figures of earlier ones (marked as such).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import orjson

from bench import imports, memory, ours, peers, simbench, soak, wrk
from bench.floor import floor_point
from bench.refserver import Pacing
from bench.report import markdown
from bench.server import refserver

SECTIONS = ("server", "accuracy", "rate", "peers", "memory", "trace", "imports", "sim", "soak")
# The server's own ceiling does not move with the client: a quick run keeps the last full figure.
QUICK_SECTIONS = ("accuracy", "rate", "memory", "trace", "imports", "sim")
IMPORTS_MB = 100.0  # a kind, in a full run: the 2 GB figure is `--imports-mb 2048` (minutes a kind)
IMPORTS_QUICK_MB = 20.0
QUICK_POINT_S = 10.0  # a point shorter than this (or than 10,000 requests) is noise, not a check
_NEEDS_SERVER = {"server", "accuracy", "rate", "peers", "memory"}
_T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="<3-minute subset: no peers or wrk ceiling, 10 s points"
    )
    ap.add_argument(
        "--only",
        action="append",
        default=[],
        help=f"run only these sections ({', '.join(SECTIONS)}); repeat or comma-separate",
    )
    ap.add_argument("--out", type=Path, default=Path("bench/results"), help="results directory")
    ap.add_argument("--cache", type=Path, default=Path("bench/.peers"), help="where peer venvs are installed")
    ap.add_argument(
        "--no-realtime", action="store_true", help="do not run the reference server under chrt -f 50"
    )
    ap.add_argument(
        "--duration", type=float, default=None, help="seconds per load point (default 5, quick 10)"
    )
    ap.add_argument(
        "--soak-minutes", type=float, default=None, help="minutes per soaked process (default 10, quick 1)"
    )
    ap.add_argument(
        "--imports-mb",
        type=float,
        default=None,
        help=f"input MB per importer kind (default {IMPORTS_MB:g}, quick {IMPORTS_QUICK_MB:g}; 2048 for the 2 GB figure)",
    )
    ap.add_argument(
        "--rebuild", action="store_true", help="measure nothing: rebuild README.md from the JSON files"
    )
    args = ap.parse_args(argv)
    only = [name.strip() for item in args.only for name in item.split(",") if name.strip()]
    unknown = [n for n in only if n not in SECTIONS]
    if unknown:
        ap.error(f"unknown section(s) {', '.join(unknown)}; known: {', '.join(SECTIONS)}")
    args.sections = (
        [s for s in SECTIONS if s in only] if only else list(QUICK_SECTIONS if args.quick else SECTIONS)
    )
    if args.rebuild:
        args.sections = []
    args.duration = args.duration or (QUICK_POINT_S if args.quick else 5.0)
    args.soak_minutes = args.soak_minutes or (1.0 if args.quick else 10.0)
    args.imports_mb = args.imports_mb or (IMPORTS_QUICK_MB if args.quick else IMPORTS_MB)
    args.out, args.cache = args.out.resolve(), args.cache.resolve()  # peers run in other directories
    return args


def run_section(
    name: str, args: argparse.Namespace, srv: Any, work: Path, results: dict[str, Any]
) -> dict[str, Any]:
    quick = args.quick
    if name == "server":
        return wrk.ceiling(srv, work, args.duration, log)
    if name == "accuracy":
        points = ours.accuracy(srv, work, quick)
        for p in points:
            log(f"  {p.label}: {p.requests} requests, error p50/p99 {p.error.p50_ms} / {p.error.p99_ms} ms")
        return {"points": [p.to_json() for p in points]}
    if name == "rate":
        out: dict[str, Any] = {}
        for workers in (1, 2):
            r = ours.max_rate(srv, work, workers, quick, args.duration)
            log(
                f"  {workers} worker(s): max {r['max_rate']} req/s, within 5 ms p99: {r['max_rate_within_budget']}"
            )
            out[f"w{workers}"] = r
        floor = [floor_point(srv, 128, 10_000)] if quick else [floor_point(srv, c, 3000) for c in (32, 128)]
        for p in floor:
            log(f"  python floor c={p.concurrency}: {p.rate} req/s, {p.cpu_ms_per_request} ms CPU/request")
        out["floor"] = [p.to_json() for p in floor]
        return out
    if name == "peers":
        ladder = [1, 50] if quick else [1, 10, 50, 100, 200]
        found = []
        for peer in (peers.AIPERF, peers.GUIDELLM, peers.INFERENCE_PERF):
            res = peers.run_peer(peer, srv, args.cache, work / peer, ladder, args.duration, log)
            best = res.best
            log(f"  {peer}: {res.status} {res.reason} max {best.rate if best else None} req/s")
            found.append(res.to_json())
        verdict = peers.vllm_verdict(args.cache, log, allow_slow_check=not quick)
        return {
            "ladder": ladder,
            "duration_s": args.duration,
            "peers": found,
            "vllm": {**verdict, "version": peers.VERSIONS[peers.VLLM]},
        }
    if name == "memory":
        sessions = 100 if quick else 1000
        return memory.history_rss(srv, work, sessions)
    if name == "trace":
        size = 100_000_000 if quick else 1_000_000_000
        return memory.read_throughput(work, size)
    if name == "imports":
        return imports.section(args.imports_mb, work, log=log)
    if name == "sim":
        # At 20x (its spec's time scale since its closed loop keeps the walk's order) the morning
        # takes about 3.5 min on this 2-core host, 20 s at the 200x it ran at before.
        morning = simbench.slow_morning(work, timeout_s=420 if quick else 600)
        log(f"  slow-morning: {morning.get('status')} {morning.get('wall_s')} s")
        # The real 1M requests in a full run; a quick run measures a slice and extrapolates.
        requests = 20_000 if quick else 1_000_000
        swept = simbench.sweep(work, requests, 20, timeout_s=120 if quick else 1200)
        log(f"  sweep: {swept.get('status')} {swept.get('wall_s')} s")
        return {"slow_morning": morning, "sweep": swept}
    if name == "soak":
        return soak.run(args.soak_minutes, list(soak.SOAKS), work)
    raise ValueError(name)


def load_previous(out: Path, skip: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    results: dict[str, Any] = {}
    when: dict[str, str] = {}
    for name in SECTIONS:
        path = out / f"{name}.json"
        if name in skip or not path.exists():
            continue
        doc = orjson.loads(path.read_bytes())
        results[name] = doc.get("data", doc)
        when[name] = doc.get("measured", "earlier")
    return results, when


def rebuild(out: Path) -> int:
    """README.md again from the section files, keeping the last run's own description."""
    results, _ = load_previous(out, [])
    latest = out / "latest.json"
    results["meta"] = orjson.loads(latest.read_bytes()).get("meta", {}) if latest.exists() else {}
    text = markdown(results)
    (out / "README.md").write_text(text)
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rebuild:
        return rebuild(args.out)
    soak.exit_on_sigterm()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / ".keep").touch()
    started = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    results, earlier = load_previous(args.out, args.sections)
    meta: dict[str, Any] = {
        "started": started,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "quick": args.quick,
        "sections": args.sections,
        "load_start": round(os.getloadavg()[0], 2),
    }
    log(f"sections: {', '.join(args.sections)} ({'quick' if args.quick else 'full'}); results in {args.out}")
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="replay-bench-")))
        srv = None
        if _NEEDS_SERVER & set(args.sections):
            srv = stack.enter_context(
                refserver(Pacing(first_token_ms=20.0, tokens=64), realtime=not args.no_realtime)
            )
            log(f"reference server at {srv.url} (pid {srv.pid}; {srv.note}; {srv.loop} loop)")
            meta["server"] = {"note": srv.note, "loop": srv.loop, "realtime": srv.realtime}
        for name in args.sections:
            log(f"section {name} ...")
            t0 = time.perf_counter()
            try:
                data = run_section(name, args, srv, work, results)
            except Exception as exc:  # one broken section must not lose the others' figures
                log(f"  section {name} failed: {type(exc).__name__}: {exc}")
                data = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
            took = round(time.perf_counter() - t0, 1)
            log(f"section {name} done in {took} s")
            results[name] = data
            doc = {"section": name, "measured": started, "seconds": took, "quick": args.quick, "data": data}
            (args.out / f"{name}.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    meta["load_end"] = round(os.getloadavg()[0], 2)
    meta["duration_s"] = round(time.perf_counter() - _T0, 1)
    meta["earlier_sections"] = earlier
    results["meta"] = meta
    (args.out / "latest.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    text = markdown(results)
    (args.out / "README.md").write_text(text)
    print(text)
    log(f"done in {meta['duration_s']} s; {args.out / 'README.md'}")
    return 0
