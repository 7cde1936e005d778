"""`replay twin`'s two runs: the trace on the real server, then on the simulator configured from the
settings that server showed (its startup log and `/props`), each with its log read by the same
parsers; `twin.compare` holds them side by side.

Offline, a results file and the log of its server stand for the first run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from drivers.target import Target
from replay.errors import UsageError
from replay.metrics.results import RunResults, read_results
from replay.runs.options import ReplayOptions
from replay.runs.pipeline import ReplayJob, finish, replay
from replay.runs.probe import has_slot_files, replay_restarting, with_slot_dir
from replay.runs.targets import _llama_target, open_target, resolve_target
from replay.serverside.logs import effective_settings, log_kind, server_records
from replay.trace.reader import read_trace
from replay.trace.select import PROBE_TAG, skip_probes
from replay.twin.compare import compare, ds4_model_flags, model_flags

Say = Callable[[str], None]


@dataclass(slots=True)
class Side:
    """One run of the trace: its results, its server's log, and the server records read from it."""

    results: RunResults
    log: Path | None
    server: list[dict[str, Any]]
    settings: dict[str, Any]
    props: dict[str, Any]


def _props(url: str) -> dict[str, Any]:
    try:
        r = httpx.get(f"{url}/props", timeout=10.0)
        return r.json() if r.status_code == 200 and isinstance(r.json(), dict) else {}
    except (httpx.HTTPError, ValueError):
        return {}


def run_side(target: Target, trace: Path, out: Path, work: Path, timeout: float, say: Say) -> Side:
    """Replay `trace` (history as recorded, one request at a time) on `target` into `out`. A trace
    with `probe` requests on a server that keeps slot files (llama-server, the simulator playing it)
    is replayed as the probe does: before each, the slot saved, the server restarted, the slot
    restored (E5); every server process's log joined into one."""
    full = read_trace(trace, freeze=True)
    options = ReplayOptions(history="recorded", timeout=timeout)
    if any(r.tag == PROBE_TAG for r in full.requests) and has_slot_files(target):
        work.mkdir(parents=True, exist_ok=True)
        target = with_slot_dir(target, work / "slots")
        log = out.with_suffix(".server.log")
        replay_restarting(
            target,
            full,
            {},
            out,
            log,
            work,
            options,
            say=say,
        )
        return side_from(read_results(out), log, {})
    loaded, _ = skip_probes(full)
    work.mkdir(parents=True, exist_ok=True)
    with open_target(target, work, say=say) as served:
        props = _props(served.url)
        job = ReplayJob(served=served, trace=loaded, options=options, out=out, workdir=work)
        (done,) = replay([job], say=say)
    for warning in finish(done, served.log_path):
        say(f"warning: {warning}")
    return side_from(read_results(out), served.log_path, props)


def side_from(results: RunResults, log: Path | None, props: dict[str, Any] | None = None) -> Side:
    """A side from a results file and its server's log: the records are read again from the log
    against the results' requests (a run that kept none still gets them)."""
    target = results.run.get("target") or {}
    build = target.get("build") or {}
    argv = build.get("argv") or [] if isinstance(build, dict) else []
    kind = log_kind(str(target.get("kind") or "ds4"), argv)
    kind = "llamacpp" if kind == "llamacpp" else ("ds4" if kind in ("ds4", "sim") else kind)
    if log is not None:
        kind = sniff_kind(log, kind)
    server = server_records(kind, log, results.requests) if log is not None else list(results.server)
    settings = effective_settings(kind, log) if log is not None else dict(target.get("effective") or {})
    return Side(results, log, server, settings, props or {})


def sniff_kind(log: Path, fallback: str) -> str:
    """llama-server's log or ds4's, by its lines."""
    with open(log, errors="replace") as f:
        head = f.read(200_000)
    if "slot launch_slot_" in head or " srv  " in head or "load_model:" in head:
        return "llamacpp"
    return fallback


def model_target(real: Side, model_file: str | None, requested: list[str], scratch: Path) -> Target:
    """The simulator playing llama-server with the settings the real server showed."""
    flags = model_flags(real.settings, real.props, requested, model_file)
    return _llama_target("sim:llama", "", ["--server", "llama", *flags], scratch)


def twin_live(
    target: Target, trace: Path, folder: Path, timeout: float, say: Say
) -> tuple[dict[str, Any], Path]:
    """Both runs into `folder` (real.results.jsonl, model.results.jsonl) and the twin document."""
    if target.kind != "llamacpp":
        raise UsageError(
            f"{target.where}: replay twin runs llama-server (kind = 'llamacpp'), not {target.kind!r}; "
            "for another server, run it and give its results and log: replay twin RESULTS --log SERVER.log"
        )
    say("running the trace on the real server")
    real = run_side(target, trace, folder / "real.results.jsonl", folder / "real", timeout, say)
    model = target.model
    sim = model_target(real, model, list(target.flags), folder / "model")
    say("running it on the model configured from the server's settings: " + " ".join(sim.flags))
    twin = run_side(sim, trace, folder / "model.results.jsonl", folder / "model", timeout, say)
    return _doc(real, twin, sim), folder / "real.results.jsonl"


def twin_offline(results: Path, log: Path, folder: Path, timeout: float, say: Say) -> dict[str, Any]:
    """A run that already happened, against the model configured from its server's log."""
    real = side_from(read_results(results), log)
    trace = Path(str((real.results.run.get("trace") or {}).get("path") or ""))
    if not trace.is_file():
        raise UsageError(
            f"{results}: the trace it names ({trace}) is not there; twin needs it to run the model"
        )
    target = real.results.run.get("target") or {}
    build = target.get("build") or {}
    argv = [str(a) for a in (build.get("argv") or [])] if isinstance(build, dict) else []
    kind = sniff_kind(log, "ds4")
    if kind != "llamacpp":
        sim = resolve_target("sim", None, ds4_model_flags(real.settings), folder / "model")
        say("running the trace on the ds4 model configured from the log's settings: " + " ".join(sim.flags))
        twin = run_side(sim, trace, folder / "model.results.jsonl", folder / "model", timeout, say)
        return _doc(real, twin, sim)
    # The model file: the value of the last -m (`python -m drivers...` precedes it for xllamacpp).
    model = next((argv[i + 1] for i in range(len(argv) - 2, -1, -1) if argv[i] in ("-m", "--model")), None)
    sim = model_target(real, model, argv, folder / "model")
    say("running the trace on the model configured from the log's settings: " + " ".join(sim.flags))
    twin = run_side(sim, trace, folder / "model.results.jsonl", folder / "model", timeout, say)
    return _doc(real, twin, sim)


def _doc(real: Side, model: Side, sim: Target) -> dict[str, Any]:
    doc = compare(real.results.requests, real.server, model.results.requests, model.server)
    doc["real"] = {
        "results": real.results.path,
        "log": None if real.log is None else str(real.log),
        "settings": real.settings,
        "props": {k: real.props[k] for k in ("total_slots", "build_info") if k in real.props},
    }
    doc["model"] = {
        "results": model.results.path,
        "log": None if model.log is None else str(model.log),
        "flags": list(sim.flags),
    }
    return doc
