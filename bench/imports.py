"""Importers of the public corpora on big inputs: peak memory (RSS) and speed.

`python -m bench --only imports [--imports-mb 2048]` runs it as a section of `just bench` (100 MB a
kind by default, 20 in a quick run; the 2 GB figure with `--imports-mb 2048`), and
`python -m bench.imports [--mb 2048] [--kinds weka,otel,swe-agent,tracelab] [--work DIR]` alone. It
generates, for each kind, an input of about that many MB in its real shape (WEKA `traces.jsonl` with
subagents; an OTLP JSON document as one `.json` file, so the ijson path is the one measured; a
folder of Mini-SWE-agent trajectories; TraceLab rows of sessions running side by side), imports it in a child process (`replay import`'s own code, so the
child's peak RSS is the importer's), and prints one JSON object per kind: input MB, output MB,
seconds, MB/s, MB per CPU-second (what a loaded host changes least) and peak RSS MiB. Each import
includes `replay import`'s validation of what it wrote. The inputs are deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

KINDS = ("weka", "otel", "swe-agent", "tracelab")
RSS_TARGET_MIB = 512.0  # bounded: far below the input, whatever its size


def gen_weka(path: Path, size: int, seed: int = 1) -> int:
    """WEKA traces, one a line: 30 turns whose hash ids grow, one subagent of 6 turns each."""
    rng = random.Random(seed)
    written = 0
    n = 0
    next_id = 1
    with open(path, "wb") as out:
        while written < size:
            n += 1
            ids: list[int] = []
            reqs: list[dict[str, Any]] = []
            t = 0.0
            for k in range(30):
                grow = rng.randint(4, 40)
                ids = ids + list(range(next_id, next_id + grow))
                next_id += grow
                length = len(ids) * 64 - rng.randint(0, 63)
                reqs.append(
                    {
                        "t": t,
                        "type": "s",
                        "model": "claude-opus",
                        "in": length,
                        "out": rng.randint(20, 800),
                        "hash_ids": ids,
                        "api_time": rng.uniform(1, 20),
                    }
                )
                t += rng.uniform(2, 60)
                if k == 10:
                    sub_ids = ids[:8]
                    subs = []
                    for j in range(6):
                        sub_ids = sub_ids + list(range(next_id, next_id + 10))
                        next_id += 10
                        subs.append(
                            {
                                "t": t + j * 5,
                                "type": "n",
                                "model": "claude-haiku",
                                "in": len(sub_ids) * 64,
                                "out": 50,
                                "hash_ids": sub_ids,
                                "api_time": 3.0,
                            }
                        )
                    reqs.append(
                        {
                            "t": t,
                            "type": "subagent",
                            "agent_id": f"a{n}",
                            "subagent_type": "Explore",
                            "duration_ms": 40_000,
                            "requests": subs,
                        }
                    )
            line = orjson.dumps(
                {"id": f"trace-{n}", "models": ["claude-opus"], "block_size": 64, "requests": reqs}
            )
            out.write(line + b"\n")
            written += len(line) + 1
    return written


def _words(rng: random.Random, n: int) -> str:
    return " ".join(
        rng.choice(("the", "file", "parser", "returns", "value", "test", "error", "fix")) for _ in range(n)
    )


def gen_otel(path: Path, size: int, seed: int = 2) -> int:
    """One OTLP JSON document: conversations of 20 chat spans, each carrying its whole history."""
    rng = random.Random(seed)
    written = 0
    t0 = 1_790_000_000 * 10**9
    with open(path, "wb") as out:
        out.write(
            b'{"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "agent"}}]}, "scopeSpans": [{"spans": ['
        )
        first = True
        c = 0
        while written < size:
            c += 1
            history: list[dict[str, Any]] = [
                {"role": "user", "parts": [{"type": "text", "content": _words(rng, 60)}]}
            ]
            for k in range(20):
                start = t0 + (c * 7 + k * 30) * 10**9
                reply = {"role": "assistant", "parts": [{"type": "text", "content": _words(rng, 40)}]}
                attrs = [
                    {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
                    {"key": "gen_ai.conversation.id", "value": {"stringValue": f"c{c}"}},
                    {"key": "gen_ai.request.model", "value": {"stringValue": "m"}},
                    {
                        "key": "gen_ai.input.messages",
                        "value": {"stringValue": orjson.dumps(history).decode()},
                    },
                    {
                        "key": "gen_ai.output.messages",
                        "value": {"stringValue": orjson.dumps([reply]).decode()},
                    },
                    {"key": "gen_ai.usage.output_tokens", "value": {"intValue": "40"}},
                ]
                span = {
                    "traceId": f"t{c}",
                    "spanId": f"s{c}-{k}",
                    "name": "chat m",
                    "startTimeUnixNano": str(start),
                    "endTimeUnixNano": str(start + 5 * 10**9),
                    "attributes": attrs,
                }
                chunk = (b"" if first else b",") + orjson.dumps(span)
                first = False
                out.write(chunk)
                written += len(chunk)
                history = [
                    *history,
                    reply,
                    {"role": "user", "parts": [{"type": "text", "content": _words(rng, 30)}]},
                ]
        out.write(b"]}]}]}\n")
    return written + 200


def gen_swe(folder: Path, size: int, seed: int = 3) -> int:
    """A folder of Mini-SWE-agent 1.1 trajectories, 40 steps each."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    written = 0
    n = 0
    while written < size:
        n += 1
        t = 1_790_000_000.0 + n * 11
        msgs: list[dict[str, Any]] = [
            {"role": "system", "content": _words(rng, 200)},
            {"role": "user", "content": _words(rng, 300)},
        ]
        for k in range(40):
            t += rng.uniform(1, 30)
            call = {
                "id": f"c{k}",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"command": "ls"}'},
            }
            msgs.append(
                {
                    "role": "assistant",
                    "content": _words(rng, 30),
                    "tool_calls": [call],
                    "extra": {
                        "response": {
                            "created": int(t),
                            "usage": {"prompt_tokens": 1000 + 100 * k, "completion_tokens": 30},
                        },
                        "timestamp": t + 2,
                    },
                }
            )
            t += 2
            msgs.append({"role": "tool", "tool_call_id": f"c{k}", "content": _words(rng, 150)})
        data = orjson.dumps({"messages": msgs, "trajectory_format": "mini-swe-agent-1.1", "info": {}})
        (folder / f"run-{n:06d}.traj.json").write_bytes(data)
        written += len(data)
    return written


def gen_tracelab(path: Path, size: int, seed: int = 4) -> int:
    """TraceLab rows: sessions of 60 rounds whose prompts grow, 40 sessions running side by side
    (the rows in time order, as the corpus interleaves its developers' sessions)."""
    rng = random.Random(seed)
    written = 0
    base = 1_790_000_000.0
    with open(path, "wb") as out:
        wave = 0
        while written < size:
            wave += 1
            live = []
            for k in range(40):
                live.append(
                    {
                        "id": f"claude:{wave:05d}-{k:02d}",
                        "at": base + wave * 3600 + k * 13.0,
                        "size": 20_000,
                        "n": 0,
                    }
                )
            while live and written < size:
                s = min(live, key=lambda x: x["at"])
                at, n = s["at"], s["n"]
                out_tokens = rng.randint(20, 1500)

                def stamp(dt: float, at: float = at) -> str:
                    return datetime.fromtimestamp(at + dt, UTC).isoformat(timespec="milliseconds")

                events = [
                    {"event_type": "tool_result", "timestamp": stamp(0), "source": "user.content.tool_result",
                     "tool_call_id": f"toolu_{n}", "result_chars": rng.randint(50, 9000), "is_error": False},
                    {"event_type": "reasoning", "timestamp": stamp(1.5), "source": "assistant.content.thinking",
                     "content_chars": 0},
                    {"event_type": "tool_call", "timestamp": stamp(3.0), "source": "assistant.content.tool_use",
                     "tool_call_id": f"toolu_{n + 1}", "tool_name": "Bash", "tool_index": 0},
                ]  # fmt: skip
                row = {
                    "provider": "claude",
                    "project": f"project_{wave:04d}",
                    "session_id": s["id"],
                    "round_index": n,
                    "round_id": f"msg_{wave}_{n}",
                    "model": "claude-opus-4-8",
                    "input_tokens_total": s["size"],
                    "prefix_tokens": max(0, s["size"] - rng.randint(100, 3000)),
                    "newly_append_tokens": rng.randint(100, 3000),
                    "claude_cache_creation_input_tokens": rng.randint(0, 3000),
                    "output_tokens": out_tokens,
                    "reasoning_output_tokens": None,
                    "timing_events": events,
                    "tools": [{"tool_index": 0, "tool_name": "Bash", "tool_call_id": f"toolu_{n + 1}",
                               "input_chars": 120, "result_chars": 800, "tool_wall_latency_ms": 900}],
                    "first_input_event_type": "tool_result",
                    "store": ".claude",
                }  # fmt: skip
                line = orjson.dumps(row) + b"\n"
                out.write(line)
                written += len(line)
                s["size"] += out_tokens + rng.randint(50, 4000)
                s["at"] += 3.0 + rng.uniform(1, 90)
                s["n"] += 1
                if s["n"] == 60:
                    live.remove(s)
    return written


def _one(kind: str, src: str, out: str) -> None:
    """In the child: import, then report our own peak RSS."""
    import resource

    from replay.importers.base import ImportOptions
    from replay.importers.registry import run_import

    def cpu() -> float:
        use = resource.getrusage(resource.RUSAGE_SELF)
        return use.ru_utime + use.ru_stime

    t0, c0 = time.perf_counter(), cpu()
    line = run_import(kind, Path(src), Path(out), ImportOptions(progress=False))
    wall, spent = time.perf_counter() - t0, cpu() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(
        json.dumps(
            {"wall_s": round(wall, 1), "cpu_s": round(spent, 1), "peak_rss_mib": round(peak, 1), "line": line}
        )
    )


def measure(kind: str, size: int, work: Path) -> dict[str, Any]:
    src = (
        work
        / {"weka": "traces.jsonl", "otel": "otlp.json", "swe-agent": "runs", "tracelab": "rows.jsonl"}[kind]
    )
    out = work / f"{kind}.trace.jsonl"
    t0 = time.perf_counter()
    made = {"weka": gen_weka, "otel": gen_otel, "swe-agent": gen_swe, "tracelab": gen_tracelab}[kind](
        src, size
    )
    gen_s = time.perf_counter() - t0
    try:
        res = subprocess.run(
            [sys.executable, "-m", "bench.imports", "--one", kind, str(src), str(out)],
            capture_output=True,
            text=True,
            check=False,
        )
        if res.returncode != 0:
            return {"kind": kind, "status": "failed", "error": res.stderr.strip().splitlines()[-1:]}
        got = json.loads(res.stdout.strip().splitlines()[-1])
        out_mb = out.stat().st_size / 1e6
    finally:
        if src.is_dir():
            shutil.rmtree(src, ignore_errors=True)
        else:
            src.unlink(missing_ok=True)
        out.unlink(missing_ok=True)
    return {
        "kind": kind,
        "input_mb": round(made / 1e6, 1),
        "output_mb": round(out_mb, 1),
        "generate_s": round(gen_s, 1),
        "import_s": got["wall_s"],
        "import_cpu_s": got["cpu_s"],
        "mb_per_s": round(made / 1e6 / got["wall_s"], 1) if got["wall_s"] else None,
        "mb_per_cpu_s": round(made / 1e6 / got["cpu_s"], 1) if got["cpu_s"] else None,
        "peak_rss_mib": got["peak_rss_mib"],
        "bounded": got["peak_rss_mib"] <= RSS_TARGET_MIB,
        "result": got["line"].split(" (")[0].split(": ", 1)[-1],
    }


def section(mb: float, work: Path, kinds: tuple[str, ...] = KINDS, log: Any = None) -> dict[str, Any]:
    """`just bench`'s imports section: each kind at `mb` MB, one after another (a failed kind is
    reported as such, the others still measured)."""
    found = []
    for kind in kinds:
        got = measure(kind, int(mb * 1e6), work)
        if log is not None:
            log(
                f"  {kind}: {got.get('input_mb')} MB in {got.get('import_s')} s ({got.get('mb_per_s')} MB/s, "
                f"{got.get('mb_per_cpu_s')} MB per CPU-s), peak RSS {got.get('peak_rss_mib')} MiB"
                if got.get("status") != "failed"
                else f"  {kind}: failed {got.get('error')}"
            )
        found.append(got)
    return {"mb": mb, "rss_target_mib": RSS_TARGET_MIB, "kinds": found}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.imports", description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=2048.0, help="input size per kind, MB (default 2048)")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument(
        "--work", type=Path, default=None, help="where inputs are generated (default: a temp dir)"
    )
    ap.add_argument("--one", nargs=3, metavar=("KIND", "SRC", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        _one(*args.one)
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-imports-", dir=args.work) as tmp:
        for kind in args.kinds.split(","):
            print(json.dumps(measure(kind, int(args.mb * 1e6), Path(tmp))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
