"""`replay run`: a trace against a server, into a results file, then the report."""

from __future__ import annotations

import dataclasses
import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from drivers.target import Target
from replay.commands.report import ReportArgs, report
from replay.engine.routing import DEFAULT_ROUTING
from replay.errors import UsageError
from replay.metrics.results import read_summary_line
from replay.outputs import check_file
from replay.runs.barrier import parse_instant
from replay.runs.options import ReplayOptions
from replay.runs.pipeline import EXIT_FAILED, EXIT_OK, ReplayJob, finish, replay
from replay.runs.recording import stop_on_signals
from replay.runs.targets import dry_run as dry_run_target
from replay.runs.targets import open_targets, resolve_targets
from replay.runs.workers import cap_workers
from replay.trace.reader import read_trace
from replay.trace.select import parse_shard, select_shard, skip_probes


@dataclass(frozen=True, kw_only=True, slots=True)
class RunArgs:
    trace: Path
    options: ReplayOptions = ReplayOptions()  # what the run asks of the engine
    target: str | None = None
    server: Path | None = None
    service: Path | None = None
    workdir: Path | None = None
    dry_run: bool = False
    out: Path = Path("results.jsonl")
    sim_args: str = ""
    workers: int = 1
    routing: str | None = None  # over several targets: sticky | round-robin | least (None: the
    # target file's, else sticky)
    session_header: str | None = None  # send each session's affinity value in this header
    session_field: str | None = None  # ... and in this body field
    shard: str | None = None
    start_at: str | None = None  # ISO 8601 instant: every shard's schedule begins then
    quiet: bool = False  # no progress display and no report
    force: bool = False  # replace an existing results file (once the target answers)
    fail_on_errors: bool = True  # exit 1 when requests failed; False: a finished run exits 0


def unrecorded_notice(lines: list[dict[str, object]]) -> str:
    """What the recording missed: the replay cannot send calls that were never recorded."""
    total = sum(int(str(line.get("count", 0))) for line in lines)
    where = ", ".join(f"{line.get('method')} {line.get('path')} x{line.get('count')}" for line in lines[:6])
    more = f" and {len(lines) - 6} more" if len(lines) > 6 else ""
    return f"note: the recording passed {total} calls through unrecorded, not replayed: {where}{more}"


# How a run that went to its end (or to the --max-duration the user set) ended, as opposed to one
# that was interrupted or lost a worker.
FINISHED = ("done", "max-duration")


def run(args: RunArgs, console: Console) -> int:
    """Replay a trace; returns the exit code (0 ok, 1 requests failed, 130/143/129 interrupted).
    A signal before or after the replay loop stops the servers the run started (`stop_on_signals`)."""
    with stop_on_signals():
        return _run(args, console)


def _run(args: RunArgs, console: Console) -> int:
    """Replay a trace; returns the exit code (0 ok, 1 requests failed, 130/143/129 interrupted).

    With `fail_on_errors` off, a run that finished exits 0 even when requests failed: they are
    in its results. A Kubernetes Job reads a shard's exit code as "this shard failed", and a
    few refused requests under load are a measurement, not a failed shard."""
    check_file(args.out, option="--out", force=args.force, inputs=[args.trace])  # before anything starts
    shown = None if args.quiet else console
    args.options.check()
    start_at = parse_instant(args.start_at) if args.start_at is not None else None
    options = dataclasses.replace(args.options, start_at=start_at)
    if args.workers < 1:
        raise UsageError("--workers must be at least 1")
    loaded = read_trace(args.trace, freeze=True)  # validates fully before anything is sent
    missing = loaded.unrecorded
    shard = parse_shard(args.shard) if args.shard is not None else (1, 1)
    if args.shard is not None:
        loaded = select_shard(loaded, *shard)
    say = (shown or Console(stderr=True)).print
    if missing:
        say(unrecorded_notice(missing))
    with tempfile.TemporaryDirectory(prefix="replay-scratch-") as scratch:
        targets = resolve_targets(args.target, args.server, shlex.split(args.sim_args), Path(scratch))
        options = with_routing(options, args, targets[0])
        options.check()  # the routing the target file gives too
        if args.dry_run:
            for tgt in targets:
                dry_run_target(tgt, args.workdir or Path(scratch), args.service, say)
            return 0
        loaded, notice = skip_probes(loaded)  # E5-style steps need `replay probe` to restart the server
        if notice:
            say(notice)
        workers, capped = cap_workers(args.workers, len({r.session for r in loaded.requests}))
        if capped:
            say(capped)
        # The server's log must outlive the server: its records are read after it stops.
        work = args.workdir or Path(scratch) / "work"
        with open_targets(targets, work, args.service, say=say) as fleet:
            served = fleet[0]
            job = ReplayJob(
                served=served,
                fleet=tuple(fleet),
                trace=loaded,
                options=options,
                out=args.out,
                workdir=work,
                header={"shard": args.shard} if args.shard else {},
                workers=workers,
                shard=shard,
            )
            (done,) = replay([job], say=say, console=shown)
            for line in done.outcome.warnings:  # the load fell short of what was asked
                say(f"[yellow]warning:[/yellow] {line}")
        for warning in finish(done, served.log_path):
            say(f"[yellow]warning:[/yellow] {warning}")
    line = run_ending(args.out, len(loaded.requests))
    code = done.exit_code
    lenient = code == EXIT_FAILED and not args.fail_on_errors and done.outcome.outcome in FINISHED
    if lenient:
        code = EXIT_OK
    if shown is not None:
        report(ReportArgs(results=[args.out]), shown)
        shown.print(line, highlight=False, soft_wrap=True)
        shown.print(
            f"HTML report and summary: replay report {args.out} --html {Path(args.out).with_suffix('')}-report",
            highlight=False,
        )
    elif lenient or not line.startswith("run complete"):  # even --quiet says why a run stopped
        # early, and what failed when the exit code does not say it
        Console(stderr=True).print(line, highlight=False, soft_wrap=True)
    return code


def with_routing(options: ReplayOptions, args: RunArgs, target: Target) -> ReplayOptions:
    """The run's routing and session affinity: the options' where given, else the target file's."""
    return dataclasses.replace(
        options,
        routing=args.routing or target.routing or DEFAULT_ROUTING,
        session_header=args.session_header or target.session_header,
        session_field=args.session_field or target.session_field,
    )


_ENDINGS = {
    "done": "run complete",
    "max-duration": "stopped by --max-duration",
    "SIGINT": "interrupted (Ctrl-C)",
    "SIGTERM": "stopped by SIGTERM",
    "SIGHUP": "stopped by SIGHUP",
}


def run_ending(out: Path, total: int) -> str:
    """How a run ended, in one line from its results file's summary: what finished, what was cut
    off in flight, what was never sent, and where the results are."""
    line = read_summary_line(out) or {}
    outcome = str(line.get("outcome", "unknown"))
    finished, failed = int(line.get("requests") or 0), int(line.get("errors") or 0)
    cancelled = int(line.get("cancelled") or 0)
    unsent = max(total - finished - cancelled, 0)
    return (
        f"{_ENDINGS.get(outcome, outcome)}: {finished:,} of {total:,} requests finished ({failed:,} failed), "
        f"{cancelled:,} cancelled in flight, {unsent:,} not sent; results in {out}"
    )
