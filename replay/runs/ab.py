"""`replay ab`: the same trace against two builds in blocks of A B B A, each run on a fresh cache.

Each arm run starts its own server from the arm's target TOML in a work directory of its own, so
a disk KV cache (ds4 and the simulator: ``kv_disk_dir = "auto"``, an explicit path, or a
``--kv-disk-dir`` flag, all redirected into that directory) starts empty and one run's
checkpoints can never serve the next run. ``--reuse-cache`` gives each arm one work directory
for all its runs instead (and leaves explicit paths alone): the warm-cache comparison.

Runs alternate in both orders because the page cache warms run after run (seed figures section
3); the report (``replay.report.ab``) therefore compares each A run with the B run next to it and
leads with a verdict from B/A intervals over those pairs (``replay.report.ab_stats``). Before
anything starts the arms are checked (``ab_arms``: every difference listed, identical arms
refused) and git refs are built (``ab_refs``). A fresh cache directory is removed after its run
unless ``keep_cache``: ds4 checkpoints run to GiBs and every arm run has its own. ``ab.json`` and
the report (``report/index.html``, ``report/summary.md``) are written even when the A/B stops
early.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from drivers.guard import Guard, load_guard_config
from drivers.launch import plan_target, start_target
from drivers.process import ChildProcess
from drivers.target import Target, load_target
from replay.engine.defaults import AB_HISTORY
from replay.errors import UsageError
from replay.metrics.results import read_results
from replay.outputs import check_folder, write_text
from replay.report.ab import ArmRun, analyze
from replay.report.ab_html import write_ab_report
from replay.report.ab_stats import CONFIDENCE
from replay.runs.ab_arms import check_arms
from replay.runs.ab_refs import resolve_refs
from replay.runs.options import ReplayOptions
from replay.runs.pipeline import EXIT_FAILED, EXIT_OK, EXIT_SIGNAL, ReplayJob, finish, replay
from replay.trace.model import Trace
from replay.trace.reader import read_trace

SUMMARY_FILE = "ab.json"
_KV_FLAG = "--kv-disk-dir"


def arm_order(repeat: int) -> list[str]:
    """`repeat` blocks of A B B A (adjacent pairs A B, B A, ...): drift hits both arms alike, and
    even one block gives two pairs in both orders."""
    if repeat < 1:
        raise UsageError("--repeat must be at least 1 (one block is A B B A)")
    return ["A", "B", "B", "A"] * repeat


@dataclass(frozen=True, slots=True)
class ArmPlan:
    index: int  # 1-based position in the run order
    arm: str
    results: Path
    workdir: Path
    fresh: bool  # its own work directory (and so its own cache), removed-able after the run

    @property
    def name(self) -> str:
        return self.results.stem


def plan_runs(out_dir: Path, repeat: int, reuse_cache: bool) -> list[ArmPlan]:
    """Results file and work directory of every arm run, in run order."""
    plans = []
    for i, arm in enumerate(arm_order(repeat), 1):
        name = f"ab-{i:02d}-{arm}"
        workdir = out_dir / "work" / (f"arm-{arm}" if reuse_cache else name)
        plans.append(ArmPlan(i, arm, out_dir / f"{name}.jsonl", workdir, fresh=not reuse_cache))
    return plans


def cache_target(target: Target, workdir: Path, fresh: bool) -> Target:
    """The target with its disk KV directory inside `workdir` when the run must start cold.

    ``kv_disk_dir = "auto"`` is already per work directory; an explicit path or a ``--kv-disk-dir``
    flag would let every run share one cache, so a fresh run gets ``workdir/kv`` instead.
    """
    if not fresh or target.kv_disk_dir == "auto":
        return target
    if target.kv_disk_dir is not None:
        return replace(target, kv_disk_dir=str(workdir / "kv"))
    found = _kv_flag(target.flags)
    if found is None:
        return target
    flags = list(target.flags)
    i, joined = found
    if joined:
        flags[i] = f"{_KV_FLAG}={workdir / 'kv'}"
    else:
        flags[i + 1] = str(workdir / "kv")
    return replace(target, flags=tuple(flags))


def _kv_flag(flags: tuple[str, ...]) -> tuple[int, bool] | None:
    """Index of a ``--kv-disk-dir`` flag with a value, and whether it is ``--kv-disk-dir=DIR``."""
    for i, flag in enumerate(flags):
        if flag == _KV_FLAG and i + 1 < len(flags):
            return i, False
        if flag.startswith(_KV_FLAG + "="):
            return i, True
    return None


def _kv_dir(target: Target, workdir: Path) -> Path | None:
    """Where the target will keep its disk KV (as the launcher will compute it), if anywhere."""
    if target.kind == "external":
        return None
    kv = plan_target(target, workdir).launch.notes.get("kv_disk_dir")
    found = _kv_flag(target.flags)
    if kv is None and found is not None:
        i, joined = found
        kv = target.flags[i].split("=", 1)[1] if joined else target.flags[i + 1]
    return None if kv is None else Path(kv)


def _dir_usage(path: Path | None) -> tuple[int, int]:
    if path is None or not path.is_dir():
        return 0, 0
    files = [p for p in path.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def run_arm(
    loaded: Trace,
    target: Target,
    plan: ArmPlan,
    options: ReplayOptions,
    total: int,
    adopt: Callable[[ChildProcess], None] | None = None,
    keep_cache: bool = False,
    say: Callable[[str], None] = print,
) -> ArmRun:
    """Start the arm's server, replay the trace into the arm run's results file, stop the server."""
    plan.workdir.mkdir(parents=True, exist_ok=not plan.fresh)
    target = cache_target(target, plan.workdir, plan.fresh)
    kv = _kv_dir(target, plan.workdir)
    # A new server process starts with empty memory caches; only a disk cache can carry over.
    fresh = kv is None or not kv.exists() or not any(kv.iterdir())
    header = {"ab": {"arm": plan.arm, "run": plan.index, "of": total, "cache_fresh": fresh}}
    with start_target(target, plan.workdir, adopt=adopt) as served:
        job = ReplayJob(
            served=served,
            trace=loaded,
            options=options,
            out=plan.results,
            workdir=plan.workdir,
            header=header,
        )
        (done,) = replay([job], say=say)
    for warning in finish(done, served.log_path):
        say(f"[bold yellow]warning:[/bold yellow] {plan.name}: {warning}")
    files, size = _dir_usage(kv)
    removed = False
    if kv is not None and plan.fresh and not keep_cache and kv.is_dir() and kv.is_relative_to(plan.workdir):
        shutil.rmtree(kv)
        removed = True
    cache = {
        "dir": None if kv is None else str(kv),
        "fresh": fresh,
        "files": files,
        "bytes": size,
        "removed": removed,
    }
    return ArmRun(plan.index, plan.arm, read_results(plan.results), done.exit_code, cache)


@dataclass(slots=True)
class AbOutcome:
    doc: dict[str, Any]
    summary_path: Path
    exit_code: int


def run_ab(
    trace: Path,
    a: Path,
    b: Path,
    repeat: int = 2,
    out_dir: Path | None = None,
    options: ReplayOptions | None = None,
    reuse_cache: bool = False,
    keep_cache: bool = False,
    service: Path | None = None,
    say: Callable[[str], None] | None = None,
    allow_identical: bool = False,
    confidence: float = CONFIDENCE,
    refs: dict[str, str] | None = None,
) -> AbOutcome:
    """Run every arm run in order and write `ab.json` and the report; stops early (and says so) on
    Ctrl-C/SIGTERM."""
    say = say or (lambda _msg: None)
    if not 0.5 <= confidence < 1:
        raise UsageError("--confidence must be in [0.5, 1), e.g. 0.95")
    out_dir = out_dir or Path(f"ab-{uuid.uuid4().hex[:8]}")
    check_folder(out_dir, option="--out-dir")  # new or empty: give a new --out-dir for each A/B
    targets = {"A": load_target(a), "B": load_target(b)}
    plans = plan_runs(out_dir, repeat, reuse_cache)
    loaded = read_trace(trace)  # validated fully before any server starts
    targets = resolve_refs(targets, refs or {}, say=say)
    arms = check_arms(targets, out_dir / "work" / "plan", allow_identical)
    for w in arms["warnings"]:
        say(f"[bold yellow]warning:[/bold yellow] {w}")
    options = options or ReplayOptions(history=AB_HISTORY)
    temp0 = {r.id for r in loaded.requests if not r.params.get("temperature")}
    header = {
        "trace": str(trace),
        "targets": {
            arm: {"name": t.name, "file": str(t.path), "kind": t.kind, "flags": list(t.flags)}
            for arm, t in targets.items()
        },
        "identity": arms["identity"],
        "differences": arms["differences"],
        "warnings": arms["warnings"],
        "repeat": repeat,
        "reuse_cache": reuse_cache,
        "plan": options.make_plan().describe(),
        "history": options.history,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    summary_path = out_dir / SUMMARY_FILE
    runs: list[ArmRun] = []
    run_times: list[dict[str, Any]] = []
    code = EXIT_OK
    try:
        with ExitStack() as stack:
            adopt = None
            if service is not None:
                adopt = stack.enter_context(Guard(load_guard_config(service), say=say)).adopt
            for plan in plans:
                t = targets[plan.arm]
                say(f"{plan.name}: {t.name} ({t.kind}), run {plan.index} of {len(plans)}")
                started = datetime.now(UTC).isoformat(timespec="seconds")
                run = run_arm(
                    loaded, t, plan, options, len(plans), adopt=adopt, keep_cache=keep_cache, say=say
                )
                runs.append(run)
                ended = datetime.now(UTC).isoformat(timespec="seconds")
                run_times.append({"index": plan.index, "arm": plan.arm, "started": started, "ended": ended})
                summary = run.results.summary_line or {}
                say(
                    f"{plan.name}: {summary.get('requests', 0)} requests, {summary.get('errors', 0)} failed, "
                    f"outcome {summary.get('outcome', 'cut short')}"
                )
                if run.exit_code in EXIT_SIGNAL.values():
                    code = run.exit_code
                    break
                if run.exit_code != EXIT_OK:
                    code = EXIT_FAILED
    finally:
        doc = analyze(
            runs,
            temp0,
            {**header, "complete": len(runs) == len(plans), "out_dir": str(out_dir)},
            confidence=confidence,
        )
        doc["run_times"] = run_times
        write_text(summary_path, orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
        write_ab_report(doc, out_dir / "report")
    return AbOutcome(doc, summary_path, code)
