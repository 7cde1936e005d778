"""THE replay pipeline: every replay (run, ab, scenario arms, probe, demo) goes through `replay()`.

Against servers that are already up, it checks they answer, writes the target header (the
settings each server printed at startup, and a warning for every requested cache setting it does
not show in effect), samples each server's memory, watches its Prometheus counters, and replays
each trace into its results file: in this process, spread over worker processes, or in segments
with the server restarted between them (the probe's hook). The lines that only exist once a
server has stopped (its log's `server` records) are appended by `finish()`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from rich.console import Console

from replay.engine.run import Engine, EngineConfig
from replay.errors import TargetError, UsageError
from replay.metrics.record import RequestRecord
from replay.metrics.results import append_records, read_summary_line
from replay.metrics.switch import SwitchTracker
from replay.runs.barrier import late_notice, wait_until
from replay.runs.options import ReplayOptions
from replay.runs.recording import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_SIGNAL,
    KEPT_FIELDS,
    Recording,
    ResultsRecords,
    RunOutcome,
    close_all,
    file_sha256,
    run_engines,
    run_recordings,
    run_trace,
)
from replay.runs.workers import run_workers
from replay.serverside.logs import (
    DS4_FORMAT_KINDS,
    effective_settings,
    log_kind,
    log_warnings,
    server_records,
    setting_warnings,
)
from replay.serverside.metrics import metrics_url, server_memory, watch_counters
from replay.serverside.routerlog import routed_records
from replay.trace.model import Request, Trace

if TYPE_CHECKING:
    from drivers.launch import Served

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_SIGNAL",
    "Hooks",
    "ReplayJob",
    "Replayed",
    "RunOutcome",
    "check_reachable",
    "file_sha256",
    "finish",
    "replay",
    "run_trace",
    "segments",
]

Say = Callable[[str], None]


def check_reachable(base_url: str, timeout_s: float = 5.0) -> None:
    """Fail before the run starts if nothing answers at the target URL (any HTTP answer will do)."""
    try:
        httpx.get(base_url.rstrip("/") + "/v1/models", timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise TargetError(f"target {base_url} is unreachable: {type(exc).__name__}: {exc}") from None


@dataclass(slots=True, kw_only=True)
class ReplayJob:
    """One trace against one ready server into one results file."""

    served: Served
    trace: Trace
    options: ReplayOptions
    out: Path
    workdir: Path  # where the memory sampler keeps its samples
    header: dict[str, Any] = field(default_factory=dict)  # added to the target header
    workers: int = 1  # processes to spread the sessions over
    shard: tuple[int, int] = (1, 1)  # the shard `trace` already is (workers split it further)
    # Several targets: every backend the client routes over (`served` is the first of them).
    fleet: tuple[Served, ...] = ()

    @property
    def kind(self) -> str:
        return self.served.target.kind

    @property
    def servers(self) -> tuple[Served, ...]:
        """Every server the job sends to: its fleet, or the one it has."""
        return self.fleet if len(self.fleet) > 1 else (self.served,)

    @property
    def backends(self) -> tuple[str, ...]:
        return tuple(s.url for s in self.fleet) if len(self.fleet) > 1 else ()

    def engine_config(self) -> EngineConfig:
        return self.options.engine_config(self.served.url, self.backends)


Restart = Callable[["Served", int], tuple["Served", dict[str, Any]]]


@dataclass(slots=True, kw_only=True)
class Hooks:
    """What a replay that is more than "send the trace" adds (the probe's restarts, its labels).

    `restart_before(request)` cuts the run before such a request (unless it comes first);
    `restart(served, request_id)` stops the server, starts a new one and returns it with the
    results line that says what happened. The sessions' live histories carry over.
    """

    restart_before: Callable[[Request], bool] | None = None
    restart: Restart | None = None
    annotate: Callable[[RequestRecord], None] | None = None  # e.g. fields in `extra` for its line
    plan: dict[str, Any] = field(default_factory=dict)  # added to the header's plan


@dataclass(slots=True)
class Replayed:
    """What one replay did, and the lines to append once its server has stopped."""

    out: Path
    outcome: RunOutcome
    records: list[dict[str, Any]]
    metrics: list[dict[str, Any]]  # one `metrics` line per server process
    memory: list[dict[str, Any]]  # one `memory` line per server process the tool started
    processes: list[Served]  # every server process, in order (more than one after restarts)
    backends: list[Served] = field(default_factory=list)  # a fleet's servers, side by side

    @property
    def exit_code(self) -> int:
        return self.outcome.exit_code

    @property
    def requests(self) -> int:
        return self.outcome.requests

    @property
    def errors(self) -> int:
        return self.outcome.errors


def target_header(job: ReplayJob, say: Say) -> dict[str, Any]:
    """The run header's `target`: what answered, the settings its log shows in force, and a
    warning (printed too) for every requested cache setting it does not show."""
    served, kind = job.served, job.kind
    argv = served.build.get("argv") or []
    settings = effective_settings(log_kind(kind, argv), served.log_path)
    warnings = setting_warnings(log_kind(kind, argv), argv, settings)
    for line in warnings:
        say(f"[yellow]warning:[/yellow] {line}")
    target = {
        "kind": kind,
        "url": served.url,
        "build": served.build,
        "effective": settings,
        "warnings": warnings,
    }
    if job.backends:
        target["backends"] = list(job.backends)
        target["routing"] = job.options.routing
    if job.options.session_header is not None or job.options.session_field is not None:
        target["affinity"] = {"header": job.options.session_header, "field": job.options.session_field}
    target.update(job.header)
    return target


def replay(
    jobs: Sequence[ReplayJob],
    *,
    hooks: Hooks | None = None,
    say: Say = print,
    console: Console | None = None,
) -> list[Replayed]:
    """Replay every job at once (one event loop), each against its own ready server.

    Several jobs run side by side (a scenario's arms, under the first job's `max_duration`);
    workers and restarts apply to a run of one.
    The server's log is read for `server` records only after it stops (its shutdown lines come
    last): call `finish()` for each result once its server is gone.
    """
    hooks = hooks or Hooks()
    for job in jobs:
        job.options.check()
    if len(jobs) != 1 and (hooks.restart is not None or any(j.workers > 1 for j in jobs)):
        raise UsageError("workers and restarts apply to a replay of one trace")
    for job in jobs:
        for url in job.backends or (job.served.url,):
            check_reachable(url)
    targets = [target_header(job, say) for job in jobs]
    start_at = jobs[0].options.start_at
    if start_at is not None and (late := late_notice(start_at)) is not None:
        say(f"[yellow]warning:[/yellow] {late}")
    if hooks.restart is not None:
        return [_segmented(jobs[0], targets[0], hooks, say)]
    with ExitStack() as stack:
        # Every backend's memory and counters, each on its own (a fleet: one line per replica).
        memory = [[stack.enter_context(server_memory(s, j.workdir)) for s in j.servers] for j in jobs]
        counters = [[stack.enter_context(watch_counters(s)) for s in j.servers] for j in jobs]
        if jobs[0].workers > 1:
            outcomes = [_spread(jobs[0], targets[0])]
        else:
            start = wait_until(start_at) if start_at is not None else None
            recordings = [
                Recording(
                    j.trace,
                    j.options.make_plan(),
                    j.engine_config(),
                    j.out,
                    t,
                    keep_records=reads_records(j.served),
                    plan_header=hooks.plan,
                    annotate=hooks.annotate,
                    keep_fields=KEPT_FIELDS,
                    start=start,
                )
                for j, t in zip(jobs, targets, strict=True)
            ]
            outcomes = run_recordings(recordings, jobs[0].options.max_duration, console)
    # Left in reverse order: the counters' last scrape, then the samplers (filling `memory`).
    done = []
    for job, outcome, counted, lines in zip(jobs, outcomes, counters, memory, strict=True):
        if not job.backends:
            metrics = [counted[0](outcome.results)]
        else:  # each backend's counters against the requests it served
            metrics = [
                {**count([r for r in outcome.results if r.get("backend") == s.url]), "backend": s.url}
                for count, s in zip(counted, job.servers, strict=True)
            ]
        for line in metrics:
            _warn_disagreements(line, say)
        memory_lines = [
            {**line, "backend": s.url} if job.backends else line
            for each, s in zip(lines, job.servers, strict=True)
            for line in each
        ]
        done.append(
            Replayed(
                job.out,
                outcome,
                outcome.results,
                metrics,
                memory_lines,
                [job.served],
                backends=list(job.servers) if job.backends else [],
            )
        )
    return done


def reads_records(served: Served) -> bool:
    """Whether anything reads the run's records afterwards: the usage check against the server's
    counters, or the correlation with its log (the simulator's and ds4's). Otherwise none are kept,
    and a replay's memory does not grow with its length."""
    return served.target.kind in DS4_FORMAT_KINDS or metrics_url(served) is not None


def finish(done: Replayed, log_path: Path | None) -> list[str]:
    """Append the lines that follow the summary: counters, memory, and the server log's records
    (read from `log_path`: the stopped server's log, or the stretch of it this replay wrote).
    Returns what the caller must say about them (cache lines of the log not recognised)."""
    last = done.processes[-1]
    kind = log_kind(last.target.kind, last.build.get("argv") or [])
    if done.backends:  # each replica's own log, with the requests it served
        server = [
            {**record, "backend": s.url}
            for s in done.backends
            for record in server_records(
                log_kind(s.target.kind, s.build.get("argv") or []),
                s.log_path,
                [r for r in done.records if r.get("backend") == s.url],
            )
        ]
    else:
        server = server_records(kind, log_path, done.records)
    if last.target.kind == "sglang-router":  # where it sent each request, in its own words
        # (by the request's trace id: the results file read back a line at a time)
        server += routed_records(last.log_path, ResultsRecords(done.out))
    append_records(done.out, [*done.metrics, *done.memory, *server])
    return log_warnings(server)


def _warn_disagreements(metrics: dict[str, Any], say: Say) -> None:
    for line in metrics.get("disagreements") or ():
        say(f"[yellow]warning:[/yellow] server counters disagree with usage: {line}")


def _spread(job: ReplayJob, target: dict[str, Any]) -> RunOutcome:
    """The job's sessions over `job.workers` processes (their parts merge exactly)."""
    config = job.engine_config()
    spread = run_workers(
        job.trace,
        job.options.make_plan(),
        config,
        job.out,
        target,
        job.workers,
        job.options.max_duration,
        job.shard,
        start_at=job.options.start_at,
    )
    line = read_summary_line(job.out) or {}
    # A worker that died wrote no part (or no summary): the run did not finish, whatever the others did.
    lost = any(part.outcome == "failed" for part in spread.parts)
    outcome = spread.interrupted or ("failed" if lost else str(line.get("outcome", "cut-short")))
    return RunOutcome(
        out=str(job.out),
        outcome=outcome,
        requests=spread.requests,
        errors=spread.errors,
        cancelled=int(line.get("cancelled") or 0),
        duration_s=float(line.get("duration_s") or 0.0),
        lag_p50_s=line.get("lag_p50_s"),
        lag_p99_s=line.get("lag_p99_s"),
        exit_code=spread.exit_code,
        results=ResultsRecords(job.out),  # read back when read, a line at a time
        warnings=list(line.get("warnings") or ()),
    )


def segments(requests: list[Request], cut_before: Callable[[Request], bool]) -> list[list[Request]]:
    """Requests cut before every request `cut_before` picks: one list per server process."""
    out: list[list[Request]] = [[]]
    for r in requests:
        if cut_before(r) and out[-1]:
            out.append([])
        out[-1].append(r)
    return out


def _segmented(job: ReplayJob, target: dict[str, Any], hooks: Hooks, say: Say) -> Replayed:
    """One trace in segments, the server restarted between them by `hooks.restart`; one results
    file, one sequence over every server process, one `metrics` and `memory` line per process."""
    assert hooks.restart is not None and hooks.restart_before is not None
    trace, plan = job.trace, job.options.make_plan()
    by_id = trace.by_id()
    served = job.served
    processes: list[Served] = []
    metrics: list[dict[str, Any]] = []
    memory: list[dict[str, Any]] = []
    restarts = 0
    index = 0
    records: list[dict[str, Any]] = []  # every line written, over every server process
    sent = 0

    def annotate(rec: RequestRecord) -> None:
        nonlocal sent
        sent += 1
        rec.seq = sent  # one sequence over every server process
        if hooks.annotate is not None:
            hooks.annotate(rec)
        rec.extra["server_process"] = index

    config = job.options.engine_config(served.url)
    recording = Recording(
        dataclasses.replace(trace, requests=[]),  # each segment's engine brings its requests
        plan,
        config,
        job.out,
        target,
        keep_records=False,
        plan_header=hooks.plan,
        annotate=annotate,
        observe=records.append,
    )
    outcome = "done"
    sessions: dict[str, Any] | None = None
    # One classification across server processes: a request is classed by its own session (E5
    # goes on with the document it restores), not as the first request a new engine sees.
    tracker = SwitchTracker()
    try:
        for index, part in enumerate(segments(trace.requests, hooks.restart_before)):  # noqa: B007
            if index:
                served, line = hooks.restart(served, part[0].id)
                restarts += 1
                recording.writer.write(line)
                check_reachable(served.url)
            processes.append(served)
            first = len(records)
            if sessions is not None:
                part = _detach(part, sessions, by_id)
            engine = Engine(
                dataclasses.replace(trace, requests=part),
                plan,
                job.options.engine_config(served.url),
                recording.sink,
                by_id=by_id,  # replies of earlier segments are looked up by id
                tracker=tracker,
                sessions=sessions,
                release_replies=False,  # the next segment's `_detach` reads them
            )
            recording.take(engine)
            with server_memory(served, job.workdir) as lines, watch_counters(served) as counters:
                outcome = run_engines([recording], job.options.max_duration)
            checked = counters(records[first:])
            checked["server_process"] = index
            _warn_disagreements(checked, say)
            metrics.append(checked)
            memory.extend(lines)
            sessions = engine.sessions
            if outcome != "done":
                break
    except BaseException as exc:
        outcome = type(exc).__name__
        raise
    finally:
        (closed,) = close_all([recording], outcome, {"restarts": restarts})
    closed.results = records
    return Replayed(job.out, closed, records, metrics, memory, processes)


def _detach(part: list[Request], sessions: dict[str, Any], by_id: dict[int, Request]) -> list[Request]:
    """The segment's requests without waits on requests a previous server process answered.

    A new engine only knows its own requests done: a recorded `after` pointing back is dropped, and
    a `$reply` marker pointing back becomes the reply that was actually spliced in (the live one),
    which is what the engine would have sent anyway.
    """
    own = {r.id for r in part}
    out = []
    for r in part:
        append = tuple(
            sessions[r.session].reply_for(by_id[m["$reply"]])
            if "$reply" in m and m["$reply"] not in own
            else m
            for m in r.append
        )
        after = r.after if (r.after or {}).get("request") in own else None
        out.append(r if (append == r.append and after is r.after) else r.replaced(append=append, after=after))
    return out
