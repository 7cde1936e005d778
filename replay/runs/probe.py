"""The cache probe (E1-E5) end to end against a server the drivers start, restart included.

`replay run` cannot do E5: it stands for "save the slot, restart the server, restore the slot,
resend", and the engine has no hands to restart anything. This runner replays the scenario's trace
with the same engine, cut at every request tagged `probe`: before such a request it saves the slot
(llama-server `POST /slots/N?action=save`), stops the server by its PID, starts a new one from the
same target, restores the slot into it and only then lets the engine go on. Server kinds without
slot files (ds4, the simulator) are restarted the same way, their own disk cache being their
restore path; a server the tool did not start (`external`) cannot be restarted and is refused.

Everything lands in one results file (request lines carry `label` and `server_process`, restarts
are `probe_restart` lines, counter checks `metrics` lines), and `ProbeReport` holds the numbers the
probe is about: per step, the prompt tokens the server says it re-processed (`timings.prompt_n` on
llama-server).

`replay run` of such a trace should say that the probe requests are left out: `skip_probes` does
both (a trace without them, and the sentence to print).
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
from rich.console import Console
from rich.table import Table

from drivers.launch import Served, start_target
from drivers.logs import llamacpp as llama_log
from drivers.servers.base import has_flag
from drivers.target import Target, load_target
from replay import __version__
from replay.engine.plans import Alternate
from replay.engine.run import Engine, EngineConfig
from replay.errors import DriverError, TargetError, UsageError
from replay.metrics.record import RequestRecord
from replay.metrics.results import ResultsWriter
from replay.runs.pipeline import check_reachable, file_sha256
from replay.runs.serverlog import effective_settings
from replay.runs.servermetrics import check_after, scrape_before
from replay.runs.targets import resolve_target
from replay.scenario.build import PROBE_TAG, generate, plan_requests
from replay.scenario.catalog import find_scenario
from replay.scenario.spec import parse_params
from replay.trace.model import Request, Trace
from replay.trace.reader import read_trace

SLOT_FILE = "probe-{rid}.bin"
SLOT_KINDS = ("llamacpp",)  # kinds with llama-server's slot save/restore API
SKIP_NOTICE = (
    "{n} request(s) tagged 'probe' ({ids}) left out: each stands for 'save the slot, restart the "
    "server, restore, resend', which `replay run` cannot do; `replay probe --server FILE` runs them."
)
Say = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class ProbeStep:
    """One request of the probe as the server answered it (numbers only)."""

    request_id: int
    label: str
    session: str
    tag: str
    server_process: int  # 0 for the first server, 1 after the first restart, ...
    status: str
    prompt_tokens: int | None
    cached_tokens: int | None
    reprocessed_tokens: int | None  # timings.prompt_n on llama-server
    reprocessed_source: str | None  # "server" when the server said it, "derived" = prompt - cached
    ttft_s: float | None
    latency_s: float | None
    error: str | None

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> ProbeStep:
        return cls(
            request_id=rec["id"],
            label=rec.get("label") or "",
            session=rec["session"],
            tag=rec["tag"],
            server_process=rec.get("server_process", 0),
            status=rec["status"],
            prompt_tokens=rec.get("prompt_tokens"),
            cached_tokens=rec.get("cached_tokens"),
            reprocessed_tokens=rec.get("reprocessed_tokens"),
            reprocessed_source=rec.get("reprocessed_source"),
            ttft_s=rec.get("ttft_s"),
            latency_s=rec.get("latency_s"),
            error=rec.get("error"),
        )


@dataclass(slots=True)
class Restart:
    """What happened between two server processes: the slot file and the PIDs."""

    before_request: int
    old_pid: int | None
    new_pid: int | None
    stop_s: float | None
    start_s: float | None
    save: dict[str, Any] = field(default_factory=dict)  # n_saved, n_written, save_ms (llama-server)
    restore: dict[str, Any] = field(default_factory=dict)  # n_restored, n_read, restore_ms

    def to_json(self) -> dict[str, Any]:
        return {"kind": "probe_restart", **dataclasses.asdict(self)}


@dataclass(slots=True)
class ProbeReport:
    scenario: str
    trace: Path
    results: Path
    steps: list[ProbeStep]
    restarts: list[Restart]
    logs: list[Path]  # one per server process, in order
    settings: list[dict[str, Any]]  # effective settings each server printed at startup
    log_events: list[dict[str, int]]  # llama-server log events by kind, per server process
    metrics: list[dict[str, Any]]  # `servermetrics.check_after` per server process

    def prompt_n(self) -> dict[str, int | None]:
        """Re-processed prompt tokens by step label (the probe's answer)."""
        return {s.label or f"request {s.request_id}": s.reprocessed_tokens for s in self.steps}

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "trace": str(self.trace),
            "results": str(self.results),
            "steps": [dataclasses.asdict(s) for s in self.steps],
            "restarts": [r.to_json() for r in self.restarts],
            "logs": [str(p) for p in self.logs],
            "settings": self.settings,
            "log_events": self.log_events,
            "metrics": self.metrics,
        }


def skip_probes(trace: Trace) -> tuple[Trace, str | None]:
    """The trace without its `probe` requests, and the one-line notice to print (None if none).

    Nothing in a scenario's trace depends on a probe request (a probe is not a turn: no later
    request carries its reply or waits for it); a trace where something does keeps that probe,
    since leaving it out would leave a request waiting for a reply that never comes.
    """
    needed = _depended_on(trace)
    dropped = [r.id for r in trace.requests if r.tag == PROBE_TAG and r.id not in needed]
    if not dropped:
        return trace, None
    kept = [r for r in trace.requests if r.id not in set(dropped)]
    ids = ", ".join(f"#{i}" for i in dropped[:8]) + (" ..." if len(dropped) > 8 else "")
    notice = SKIP_NOTICE.format(n=len(dropped), ids=ids)
    return dataclasses.replace(trace, requests=kept), notice


def _depended_on(trace: Trace) -> set[int]:
    out: set[int] = set()
    for r in trace.requests:
        out.update(m["$reply"] for m in r.append if "$reply" in m)
        after = (r.after or {}).get("request")
        if after is not None:
            out.add(after)
    return out


def segments(requests: list[Request]) -> list[list[Request]]:
    """Requests cut before every `probe` request: one list per server process."""
    out: list[list[Request]] = [[]]
    for r in requests:
        if r.tag == PROBE_TAG and out[-1]:
            out.append([])
        out[-1].append(r)
    return out


def run_cache_probe(
    target: Target | str | Path,
    out: str | Path,
    *,
    scenario: str = "cache-probe",
    params: dict[str, Any] | None = None,
    slot: int = 0,
    timeout_s: float = 1800.0,
    say: Say | None = None,
) -> ProbeReport:
    """Generate the scenario's trace into `out`, replay it against `target` with a restart before
    each `probe` request, and return the per-step numbers (also written to `out`)."""
    if not isinstance(target, Target):
        target = load_target(target)
    if target.kind == "external":
        raise UsageError(f"{target.where}: the probe restarts the server; an external server cannot be")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    spec = find_scenario(scenario, params)
    trace_path = out / f"{spec.name}.trace.jsonl"
    generate(spec, trace_path)
    labels = {p.rid: p.label for p in plan_requests(spec)}
    trace = read_trace(trace_path)
    target = _with_slot_dir(target, out / "slots")
    return _run(target, trace, labels, out, spec.name, slot, timeout_s, say or (lambda _m: None))


def _with_slot_dir(target: Target, slots: Path) -> Target:
    """llama-server saves slot files only under `--slot-save-path`; give it one unless the file did."""
    if target.kind not in SLOT_KINDS or has_flag(target.flags, "--slot-save-path"):
        return target
    slots.mkdir(parents=True, exist_ok=True)
    return dataclasses.replace(target, flags=(*target.flags, "--slot-save-path", str(slots.resolve())))


@dataclass(slots=True)
class _Process:
    """One server process of the probe and what was measured on it."""

    served: Served
    log_path: Path | None
    records: list[dict[str, Any]] = field(default_factory=list)


def _run(
    target: Target,
    trace: Trace,
    labels: dict[int, str],
    out: Path,
    name: str,
    slot: int,
    timeout_s: float,
    say: Say,
) -> ProbeReport:
    results = out / f"{name}.results.jsonl"
    workdir = out / "work"
    parts = segments(trace.requests)
    by_id = trace.by_id()
    sessions: dict[str, Any] | None = None
    processes: list[_Process] = []
    restarts: list[Restart] = []
    metrics: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    with ExitStack() as stack:
        server = stack.enter_context(ExitStack())  # closed and refilled at every restart
        served = server.enter_context(_server(target, workdir))
        header = {
            "tool": {"name": "agent-replay", "version": __version__},
            "trace": {"path": trace.path, "sha256": file_sha256(trace.path), "source": trace.header.source},
            "target": _target_header(served),
            "plan": {"plan": "alternate", "probe": "restart before each 'probe' request"},
            "history": "live",
            "think": "off",
        }
        writer = ResultsWriter(results, header)

        def close(exc_type: type[BaseException] | None, *_exc: object) -> None:
            outcome = "done" if exc_type is None else exc_type.__name__
            errors = sum(1 for r in steps if r["status"] != "ok")
            extra = {"outcome": outcome, "requests": len(steps), "errors": errors, "restarts": len(restarts)}
            writer.close(extra)

        stack.push(close)
        for index, part in enumerate(parts):
            if index:
                restart, served = _restart(server, processes[-1], target, workdir, part[0].id, slot, say)
                restarts.append(restart)
                writer.write(restart.to_json())
            proc = _Process(served, served.log_path)
            processes.append(proc)

            def sink(rec: RequestRecord, proc: _Process = proc, index: int = index) -> None:
                rec.seq = len(steps) + 1  # one sequence over every server process
                rec.extra["label"] = labels.get(rec.request_id, "")
                rec.extra["server_process"] = index
                line = writer.request(rec)
                steps.append(line)
                proc.records.append(line)

            before = scrape_before(served)
            sessions = _replay(trace, part, by_id, served, sessions, sink, timeout_s)
            checked = check_after(served, before, proc.records)
            checked["server_process"] = index
            metrics.append(checked)
            writer.write(checked)
            say(_progress_line(proc.records))
    logs = [p.log_path for p in processes if p.log_path is not None]
    return ProbeReport(
        scenario=name,
        trace=Path(trace.path),
        results=results,
        steps=[ProbeStep.from_record(r) for r in steps],
        restarts=restarts,
        logs=logs,
        settings=[effective_settings(target.kind, p.log_path) for p in processes],
        log_events=[_log_events(target.kind, p.log_path) for p in processes],
        metrics=metrics,
    )


@contextmanager
def _server(target: Target, workdir: Path) -> Iterator[Served]:
    with start_target(target, workdir) as served:
        check_reachable(served.url)
        yield served


def _replay(
    trace: Trace,
    part: list[Request],
    by_id: dict[int, Request],
    served: Served,
    sessions: dict[str, Any] | None,
    sink: Callable[[RequestRecord], None],
    timeout_s: float,
) -> dict[str, Any]:
    """One segment through the engine; the sessions' live replies carry over to the next one."""
    config = EngineConfig(base_url=served.url, timeout_s=timeout_s, run_id=uuid.uuid4().hex[:8])
    if sessions is not None:
        part = _detach(part, sessions, by_id)
    engine = Engine(dataclasses.replace(trace, requests=part), Alternate(), config, sink)
    engine.by_id = by_id  # replies of earlier segments are looked up by id
    if sessions is not None:
        engine.sessions = sessions
    anyio.run(engine.run)
    return engine.sessions


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
        out.append(
            r
            if (append == r.append and after is r.after)
            else dataclasses.replace(r, append=append, after=after)
        )
    return out


def _restart(
    stack: ExitStack,
    old: _Process,
    target: Target,
    workdir: Path,
    rid: int,
    slot: int,
    say: Say,
) -> tuple[Restart, Served]:
    """Save the slot, stop the server by its PID, start a new one, restore the slot into it."""
    served = old.served
    if served.process is None:
        raise DriverError(f"{target.where}: the server was not started by the tool; cannot restart it")
    filename = SLOT_FILE.format(rid=rid)
    uses_slots = target.kind in SLOT_KINDS
    save = _slot_action(served.url, slot, "save", filename) if uses_slots else {}
    stopped = served.process.stop()
    stack.close()  # leaves start_target's block; the process is already stopped
    old.log_path = _set_aside(old.log_path, rid)
    new = stack.enter_context(_server(target, workdir))
    restore = _slot_action(new.url, slot, "restore", filename) if uses_slots else {}
    restart = Restart(
        before_request=rid,
        old_pid=served.pid,
        new_pid=new.pid,
        stop_s=round(stopped.seconds, 3),
        start_s=new.build.get("ready_seconds"),
        save=save,
        restore=restore,
    )
    tokens = f", slot {slot}: saved {save.get('n_saved')}, restored {restore.get('n_restored')} tokens"
    say(
        f"restarted the server before request {rid}: pid {served.pid} -> {new.pid}"
        + (tokens if uses_slots else "")
    )
    return restart, new


def _set_aside(log_path: Path | None, rid: int) -> Path | None:
    """Rename a stopped server's log, so a restart on the same port (same log name) starts its own."""
    if log_path is None or not log_path.exists():
        return log_path
    kept = log_path.with_name(f"{log_path.stem}.before-{rid}{log_path.suffix}")
    log_path.rename(kept)
    return kept


def _slot_action(url: str, slot: int, action: str, filename: str) -> dict[str, Any]:
    """llama-server's slot file API; its numbers (never the file name it echoes) come back."""
    where = f"POST {url}/slots/{slot}?action={action}"
    try:
        r = httpx.post(
            f"{url}/slots/{slot}", params={"action": action}, json={"filename": filename}, timeout=600.0
        )
    except httpx.HTTPError as e:
        raise TargetError(f"{where}: {type(e).__name__}") from e
    if r.status_code != 200:
        hint = " (does the server have --slot-save-path?)" if r.status_code in (400, 501) else ""
        raise TargetError(f"{where} answered HTTP {r.status_code}{hint}")
    body = r.json()
    out = {k: v for k, v in body.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    for k, v in (body.get("timings") or {}).items():
        if isinstance(v, int | float):
            out[k] = v
    return out


def _target_header(served: Served) -> dict[str, Any]:
    return {
        "kind": served.target.kind,
        "url": served.url,
        "build": served.build,
        "effective": effective_settings(served.target.kind, served.log_path),
    }


def _log_events(kind: str, log_path: Path | None) -> dict[str, int]:
    if kind != "llamacpp" or log_path is None or not Path(log_path).exists():
        return {}
    return dict(sorted(llama_log.parse_files([log_path]).stats.by_kind.items()))


def _progress_line(records: list[dict[str, Any]]) -> str:
    shown = ", ".join(f"#{r['id']} {r.get('reprocessed_tokens')}" for r in records)
    return f"re-processed tokens per request: {shown}"


def probe_table(report: ProbeReport) -> Table:
    """Per step: prompt, cached and re-processed tokens, TTFT; restarts marked."""
    table = Table(title=f"{report.scenario}: prompt tokens the server re-processed per step")
    for col, justify in (
        ("#", "right"),
        ("step", "left"),
        ("server", "right"),
        ("prompt", "right"),
        ("cached", "right"),
        ("re-processed", "right"),
        ("TTFT s", "right"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for s in report.steps:
        reproc = "-" if s.reprocessed_tokens is None else f"{s.reprocessed_tokens:,}"
        if s.reprocessed_source == "derived":
            reproc += " (derived)"
        table.add_row(
            str(s.request_id),
            s.label if s.status == "ok" else f"{s.label} [{s.status}]",
            str(s.server_process),
            _n(s.prompt_tokens),
            _n(s.cached_tokens),
            reproc,
            "-" if s.ttft_s is None else f"{s.ttft_s:.3f}",
        )
    return table


def _n(v: int | None) -> str:
    return "-" if v is None else f"{v:,}"


def probe_command(
    server: Path | None,
    out: Path,
    console: Console,
    *,
    target: str | None = None,
    sim_args: str = "",
    scenario: str = "cache-probe",
    params: list[str] | None = None,
    slot: int = 0,
    timeout_s: float = 1800.0,
    as_json: bool = False,
) -> int:
    """`replay probe --server FILE` (or `--target sim`): run, print the per-step table (or JSON);
    1 if a step failed. The simulator's disk-KV directory lives under `out`, so it outlives the
    restart like a real server's would."""
    resolved = resolve_target(target, server, shlex.split(sim_args), Path(out) / "sim")
    report = run_cache_probe(
        resolved,
        out,
        scenario=scenario,
        params=parse_params(params or []),
        slot=slot,
        timeout_s=timeout_s,
        say=lambda m: console.print(m, highlight=False),
    )
    if as_json:
        sys.stdout.write(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        console.print(probe_table(report))
        for m in report.metrics:
            for problem in m.get("disagreements") or ():
                console.print(f"[yellow]metrics:[/yellow] {problem}", highlight=False)
        console.print(
            f"results in {report.results}; server logs {', '.join(map(str, report.logs))}", highlight=False
        )
    return 0 if all(s.status == "ok" for s in report.steps) else 1
