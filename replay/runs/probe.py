"""The cache probe (E1-E5) end to end against a server the drivers start, restart included.

`replay run` cannot do E5: it stands for "save the slot, restart the server, restore the slot,
resend", and the engine has no hands to restart anything. The probe replays the scenario's trace
through the one pipeline (`replay.runs.pipeline.replay`) with a restart hook, cut at every request
tagged `probe`: before such a request it saves the slot
(llama-server `POST /slots/N?action=save`), stops the server by its PID, starts a new one from the
same target, restores the slot into it and only then lets the engine go on. Server kinds without
slot files (ds4, the simulator) are restarted the same way, their own disk cache being their
restore path; a server the tool did not start (`external`) cannot be restarted and is refused.

Everything lands in one results file (request lines carry `label` and `server_process`, restarts
are `probe_restart` lines, counter checks `metrics` lines), and `ProbeReport` holds the numbers the
probe is about: per step, the prompt tokens the server says it re-processed (`timings.prompt_n` on
llama-server).

`replay run` of such a trace leaves the probe requests out and says so
(`replay.trace.select.skip_probes`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.table import Table

from drivers.launch import Served, start_target
from drivers.logs import llamacpp as llama_log
from drivers.servers.base import has_flag
from drivers.target import Target, load_target
from replay.errors import DriverError, TargetError, UsageError
from replay.metrics.record import RequestRecord
from replay.runs.options import ReplayOptions
from replay.runs.pipeline import Hooks, Replayed, ReplayJob, finish, replay
from replay.runs.pipeline import segments as cut
from replay.scenario.build import generate, plan_requests
from replay.scenario.catalog import find_scenario
from replay.serverside.logs import effective_settings, log_kind
from replay.trace.model import Request, Trace
from replay.trace.reader import read_trace
from replay.trace.select import PROBE_TAG

SLOT_FILE = "probe-{rid}.bin"
SLOT_KINDS = ("llamacpp",)  # kinds with llama-server's slot save/restore API


def has_slot_files(target: Target) -> bool:
    """llama-server, or the simulator playing it (`--server llama`): slots saved and restored by API."""
    return log_kind(target.kind, target.flags) in SLOT_KINDS


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
    slot: int | None = None  # the llama-server slot saved and restored (the one holding the document)
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
    metrics: list[dict[str, Any]]  # `serverside.metrics.check_after` per server process

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


def is_probe(request: Request) -> bool:
    return request.tag == PROBE_TAG


def segments(requests: list[Request]) -> list[list[Request]]:
    """Requests cut before every `probe` request: one list per server process."""
    return cut(requests, is_probe)


def run_cache_probe(
    target: Target | str | Path,
    out: str | Path,
    *,
    scenario: str = "cache-probe",
    params: dict[str, Any] | None = None,
    slot: int | None = None,
    options: ReplayOptions | None = None,
    say: Say | None = None,
) -> ProbeReport:
    """Generate the scenario's trace into `out`, replay it against `target` with a restart before
    each `probe` request, and return the per-step numbers (also written to `out`). The schedule is
    the options' (alternate, one request at a time, unless they say otherwise)."""
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
    target = with_slot_dir(target, out / "slots")
    options = options or ReplayOptions()
    return _run(target, trace, labels, out, spec.name, slot, options, say or (lambda _m: None))


def with_slot_dir(target: Target, slots: Path) -> Target:
    """llama-server saves slot files only under `--slot-save-path`; give it one unless the file did."""
    if not has_slot_files(target) or has_flag(target.flags, "--slot-save-path") or target.kv_disk_dir:
        return target
    slots.mkdir(parents=True, exist_ok=True)
    return dataclasses.replace(target, flags=(*target.flags, "--slot-save-path", str(slots.resolve())))


@dataclass(slots=True)
class _Probed:
    done: Replayed
    restarts: list[Restart]
    logs: list[Path | None]  # one per server process, in order


def _replay_with_restarts(
    target: Target,
    trace: Trace,
    labels: dict[int, str],
    results: Path,
    workdir: Path,
    slot: int | None,
    options: ReplayOptions,
    say: Say,
    header: dict[str, Any] | None = None,
) -> _Probed:
    """The trace through the one replay pipeline, with a restart hook before each probe."""
    restarts: list[Restart] = []
    logs: list[Path | None] = []
    measured: list[RequestRecord] = []  # this server process's records, for the progress line

    def annotate(rec: RequestRecord) -> None:
        rec.extra["label"] = labels.get(rec.request_id, "")
        measured.append(rec)

    with ExitStack() as server:  # closed and refilled at every restart
        served = server.enter_context(start_target(target, workdir))
        logs.append(served.log_path)

        by_id = trace.by_id()

        def restart(old: Served, rid: int) -> tuple[Served, dict[str, Any]]:
            say(_progress_line(measured))
            chosen = slot
            if chosen is None and has_slot_files(target):
                chosen = find_slot(old.url, by_id[rid].session, measured, old.log_path)
            measured.clear()
            done, new, logs[-1] = _restart(server, old, target, workdir, rid, chosen, say)
            logs.append(new.log_path)
            restarts.append(done)
            return new, done.to_json()

        job = ReplayJob(
            served=served,
            trace=trace,
            options=options,
            out=results,
            workdir=workdir,
            header=header or {},
        )
        hooks = Hooks(
            restart_before=is_probe,
            restart=restart,
            annotate=annotate,
            plan={"probe": "restart before each 'probe' request"},
        )
        (done,) = replay([job], hooks=hooks, say=say)
        say(_progress_line(measured))
    return _Probed(done, restarts, logs)


def _run(
    target: Target,
    trace: Trace,
    labels: dict[int, str],
    out: Path,
    name: str,
    slot: int | None,
    options: ReplayOptions,
    say: Say,
) -> ProbeReport:
    """The probe: the replay with restarts, its counters and memory, and the per-step numbers."""
    results = out / f"{name}.results.jsonl"
    probed = _replay_with_restarts(target, trace, labels, results, out / "work", slot, options, say)
    done, restarts, logs = probed.done, probed.restarts, probed.logs
    finish(done, None)  # the counters and memory of every server process
    kept = [p for p in logs if p is not None]
    return ProbeReport(
        scenario=name,
        trace=Path(trace.path),
        results=results,
        steps=[ProbeStep.from_record(r) for r in done.records],
        restarts=restarts,
        logs=kept,
        settings=[effective_settings(log_kind(target.kind, target.flags), p) for p in logs],
        log_events=[_log_events(log_kind(target.kind, target.flags), p) for p in logs],
        metrics=done.metrics,
    )


def replay_restarting(
    target: Target,
    trace: Trace,
    labels: dict[int, str],
    results: Path,
    log: Path,
    workdir: Path,
    options: ReplayOptions,
    header: dict[str, Any] | None = None,
    say: Say | None = None,
) -> Replayed:
    """A scenario arm whose trace has `probe` requests, on a server that keeps slot files: every
    server process's log is joined into `log` (llama.cpp's clock restarts at each; the parser
    carries on), and the run's `server` records are read from it."""
    probed = _replay_with_restarts(
        target,
        trace,
        labels,
        results,
        workdir,
        None,
        options,
        say or (lambda _m: None),
        header,
    )
    with open(log, "wb") as joined:
        for part in probed.logs:
            if part is not None and Path(part).exists():
                joined.write(Path(part).read_bytes())
    finish(probed.done, log)
    return probed.done


def _restart(
    stack: ExitStack,
    served: Served,
    target: Target,
    workdir: Path,
    rid: int,
    slot: int | None,
    say: Say,
) -> tuple[Restart, Served, Path | None]:
    """Save the slot, stop the server by its PID, start a new one, restore the slot into it;
    returns what happened, the new server and where the old one's log was set aside."""
    if served.process is None:
        raise DriverError(f"{target.where}: the server was not started by the tool; cannot restart it")
    filename = SLOT_FILE.format(rid=rid)
    uses_slots = has_slot_files(target) and slot is not None
    save = _slot_action(served.url, slot, "save", filename) if uses_slots and slot is not None else {}
    stopped = served.process.stop()
    stack.close()  # leaves start_target's block; the process is already stopped
    old_log = _set_aside(served.log_path, rid)
    new = stack.enter_context(start_target(target, workdir))
    restore = _slot_action(new.url, slot, "restore", filename) if uses_slots and slot is not None else {}
    restart = Restart(
        before_request=rid,
        old_pid=served.pid,
        new_pid=new.pid,
        stop_s=round(stopped.seconds, 3),
        start_s=new.build.get("ready_seconds"),
        slot=slot if uses_slots else None,
        save=save,
        restore=restore,
    )
    tokens = f", slot {slot}: saved {save.get('n_saved')}, restored {restore.get('n_restored')} tokens"
    say(
        f"restarted the server before request {rid}: pid {served.pid} -> {new.pid}"
        + (tokens if uses_slots else "")
    )
    return restart, new, old_log


def find_slot(url: str, session: str, records: list[RequestRecord], log_path: Path | None = None) -> int:
    """The llama-server slot that holds `session`'s document: from `GET /slots`, else from the log.

    What a slot holds is its last prompt and the reply generated on it (`n_prompt_tokens` in
    `/slots`, `stop processing: n_tokens` in the log: prompt + output - 1 on current builds). The slot
    that matches the session's last request is the one; when several match, the one that ran the
    latest task, if that request was the last one sent. Anything else is refused: saving another
    slot would report a restore that restored nothing of the document.
    """
    fix = "pass --slot N"
    slots, source = _slots_from_api(url)
    if slots is None:
        slots = _slots_from_log(log_path)
        if not slots:
            raise TargetError(
                f"cannot tell which slot holds the document: {source}, and the server log names no "
                f"slot: {fix}"
            )
        source = "the server log"
    if len(slots) == 1:
        return slots[0][0]
    mine = [rec for rec in records if rec.session == session and rec.ok]
    last = mine[-1] if mine else None
    prompt, output = (last.usage.prompt_tokens, last.usage.output_tokens) if last else (None, None)
    if type(prompt) is not int:
        raise TargetError(
            f"cannot tell which of {len(slots)} slots holds session {session!r}'s document: its last "
            f"request reported no prompt tokens: {fix}"
        )
    held = prompt + (output if type(output) is int else 0)
    matches = [s for s in slots if s[2] is not None and prompt - 1 <= s[2] <= held]
    if len(matches) == 1:
        return matches[0][0]
    if len(matches) > 1 and records and records[-1] is last:
        return max(matches, key=lambda s: s[1])[0]
    shown = ", ".join(f"slot {i}: {n} tokens" for i, _t, n in slots)
    raise TargetError(
        f"cannot tell which slot holds session {session!r}'s document ({prompt} prompt + {output} reply "
        f"tokens; {source}: {shown}): {fix}"
    )


Slot = tuple[int, int, int | None]  # id, last task, tokens held


def _slots_from_api(url: str) -> tuple[list[Slot] | None, str]:
    """The slots `GET /slots` lists, or None and why not (the endpoint can be switched off)."""
    where = f"GET {url}/slots"
    try:
        r = httpx.get(f"{url}/slots", timeout=30.0)
    except httpx.HTTPError as e:
        return None, f"{where}: {type(e).__name__}"
    if r.status_code != 200:
        return None, f"{where} answered HTTP {r.status_code}"
    try:
        listed = r.json()
    except ValueError:
        return None, f"{where} answered no JSON"
    slots = [
        (
            s["id"],
            s["id_task"] if type(s.get("id_task")) is int else -1,
            s["n_prompt_tokens"] if type(s.get("n_prompt_tokens")) is int else None,
        )
        for s in (listed if type(listed) is list else ())
        if type(s) is dict and type(s.get("id")) is int
    ]
    return (slots or None), (where if slots else f"{where}: no slots in the answer")


def _slots_from_log(log_path: Path | None) -> list[Slot]:
    """Each slot's last release (`stop processing: n_tokens = N`) in the server's log."""
    if log_path is None or not Path(log_path).exists():
        return []
    last: dict[int, Slot] = {}
    for ev in llama_log.parse_files([log_path]).events:
        if isinstance(ev, llama_log.Release) and ev.slot is not None and ev.slot >= 0:
            last[ev.slot] = (ev.slot, ev.task if ev.task is not None else -1, ev.n_tokens)
    return [last[k] for k in sorted(last)]


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


def _log_events(kind: str, log_path: Path | None) -> dict[str, int]:
    if kind != "llamacpp" or log_path is None or not Path(log_path).exists():
        return {}
    return dict(sorted(llama_log.parse_files([log_path]).stats.by_kind.items()))


def _progress_line(records: list[RequestRecord]) -> str:
    shown = ", ".join(f"#{r.request_id} {r.usage.reprocessed_tokens}" for r in records)
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
