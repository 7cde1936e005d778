"""`just soak` / `python -m bench.soak`: the three long-running processes, each soaked for minutes.

- replay: `replay run` (overlap, c=64, live history, 10-turn sessions) against the fast reference
  server; requests counted from the results file as it grows.
- replay-1turn: the same against one-request sessions (the ShareGPT shape): what a replay keeps per
  finished session, and its start RSS against the trace file's size.
- record: `replay record` in front of the reference server, 50 streaming clients carrying a pool of
  conversations (100,000 per hour of soak) that grow, compact (the summary carries the last reply)
  and resume.
- sim: `replay sim serve` with a fixed active set of conversations, each restarted after a few
  turns; its warm-up lasts until the tokenizer's bounded text cache reports itself full.

Every 5 s the subject process's RSS (its process tree), open fds, requests done and CPU seconds
(its own and the upstream server's: on one core they share it) are sampled, with a fixed piece of
work timed (`core_probe`) to tell a core that slowed from a subject that did.
After a warm-up (a quarter of the run, at most a minute, from its first request: loading the trace
is not part of it) the report gives MB per 10,000 requests (the least-squares slope of RSS over
requests), the memory growth and the rate drift (last window against the first, both `window_s`
long) against the issue's targets. The machine may be shared: rates are compared within one run
only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil

from bench.refserver import Pacing
from bench.server import refserver
from drivers.process import ChildProcess
from replay.trace.writer import TraceWriter

SOAKS = ("replay", "replay-1turn", "record", "sim")
CODE: Path | None = None  # where the soaked processes import `replay` from (another checkout)
SAMPLE_S = 5.0
_LISTENING = r"listening on (http://\S+)"

# The soak targets. MB per 10,000 requests after warm-up, and rate drift in percent.
TARGETS: dict[str, dict[str, float]] = {
    "replay": {"mb_per_10k": 0.2, "drift_pct": 5.0},  # <= 2 MB per 100,000 requests
    # One-request sessions: flat after warm-up, and RSS at the first request at most twice
    # the trace file's size.
    "replay-1turn": {"mb_per_10k": 0.2, "drift_pct": 5.0, "start_over_trace": 2.0},
    "record": {"growth_pct": 10.0, "drift_pct": 10.0},  # flat rate and memory within 10%
    "sim": {"mb_per_10k": 0.2, "growth_pct": 10.0},  # a fixed active set: flat memory
}


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass(slots=True)
class Sample:
    t: float  # seconds since the subject started
    rss_mib: float
    fds: int
    requests: int
    cpu_s: float = 0.0  # CPU seconds (user + system) the subject's process tree has used
    server_cpu_s: float = 0.0  # and the upstream server's, when there is one (it shares the core)
    probe_ms: float = 0.0  # CPU milliseconds a fixed piece of work took here (`core_probe`)


def core_probe() -> float:
    """CPU milliseconds (this thread's) a fixed piece of work takes: how fast the core runs now.

    On a shared machine (a VM's vCPU whose host core has a busy sibling, a neighbour's load) the
    same work may cost a fifth more CPU time from one minute to the next; a rate that falls with it
    is the machine's, not the subject's. A few ms of interpreter work in a few KB of memory, so
    it fits a scheduler slice and measures the core, not what the subject left in the caches."""
    t0 = time.thread_time()
    acc = 0
    for i in range(60_000):
        acc = (acc + i * i) % 1_000_003
    return (time.thread_time() - t0) * 1000


@dataclass
class Sampler:
    """Samples a process tree every `every_s` seconds in a thread, with `count()` for requests."""

    pid: int
    count: Callable[[], int | None]  # requests done; None: the run is over, take no more samples
    every_s: float = SAMPLE_S
    server_pid: int | None = None  # the upstream server: its CPU is sampled too
    samples: list[Sample] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> list[Sample]:
        self._stop.set()
        self._thread.join()
        return self.samples

    def _run(self) -> None:
        while True:
            sample = self.take()
            if sample is not None:
                self.samples.append(sample)
            if self._stop.wait(self.every_s):
                return

    def take(self) -> Sample | None:
        requests = self.count()
        if requests is None:
            return None
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
            rss = fds = 0
            cpu = 0.0
            for p in procs:
                try:
                    rss += p.memory_info().rss
                    fds += p.num_fds()
                    times = p.cpu_times()
                    cpu += times.user + times.system
                except psutil.Error:
                    continue
        except psutil.Error:
            return None
        server = 0.0
        if self.server_pid is not None:
            with contextlib.suppress(psutil.Error):
                times = psutil.Process(self.server_pid).cpu_times()
                server = times.user + times.system
        t = round(time.monotonic() - self._t0, 2)
        probe = round(core_probe(), 3)
        return Sample(t, round(rss / 2**20, 2), fds, requests, round(cpu, 2), round(server, 2), probe)


def analyse(name: str, samples: list[Sample], minutes: float, warm_requests: int = 0) -> dict[str, Any]:
    """MB per 10,000 requests, growth and rate drift after warm-up, against the targets.

    Warm-up is a quarter of the run (at most a minute), or longer, until `warm_requests` are done
    (the recorder's first pass over its conversations: every new session is working state)."""
    out: dict[str, Any] = {
        "minutes": minutes,
        "samples": [
            [s.t, s.rss_mib, s.fds, s.requests, s.cpu_s, s.server_cpu_s, s.probe_ms] for s in samples
        ],
        "targets": TARGETS[name],
    }
    samples = list(samples)
    while len(samples) > 2 and samples[-1].requests == samples[-2].requests:
        samples.pop()  # the subject winding down (writing its summary), not running
    if len(samples) < 4:
        return {**out, "status": "failed", "reason": f"only {len(samples)} samples"}
    end = samples[-1].t
    # The run starts after the last sample with no request done: before it the subject loads (a
    # 30-minute replay reads its 1.6M-request trace for a minute or more), which is neither
    # growth per request nor a rate.
    started = max((s.t for s in samples if s.requests == 0), default=samples[0].t)
    warm = started + min(60.0, (end - started) / 4)
    reached = next((s.t for s in samples if s.requests >= warm_requests), None)
    if reached is None or reached > end - 4 * SAMPLE_S or warm > end - 4 * SAMPLE_S:
        return {**out, "status": "failed", "reason": f"warm-up ({warm_requests} requests) not over in time"}
    warm = max(warm, reached)
    window = max(2 * SAMPLE_S, min(60.0, (end - warm) / 3))
    after = [s for s in samples if s.t >= warm]
    first = _rate(after, after[0].t, after[0].t + window)
    last = _rate(after, end - window, end)
    x = [s.requests for s in after]
    y = [s.rss_mib for s in after]
    slope = _slope(x, y)  # MiB per request
    # Where RSS rose by a quarter MiB or more between two samples: growth per request is a steady
    # climb; a high-water mark (a new peak of requests waiting, `waiting_max`) is a few steps.
    steps = [
        [b.requests, round(b.rss_mib - a.rss_mib, 2)]
        for a, b in zip(after, after[1:], strict=False)
        if b.rss_mib - a.rss_mib >= 0.25
    ]
    done = after[-1].requests - after[0].requests
    out.update(
        status="ok",
        requests=samples[-1].requests,
        started_s=round(started, 1),
        rss_started_mib=next(s.rss_mib for s in samples if s.t >= started),
        warmup_s=round(warm, 1),
        window_s=round(window, 1),
        rss_warm_mib=after[0].rss_mib,
        rss_end_mib=after[-1].rss_mib,
        rss_peak_mib=max(s.rss_mib for s in samples),
        growth_pct=round((after[-1].rss_mib / after[0].rss_mib - 1) * 100, 2) if after[0].rss_mib else None,
        mb_per_10k=round(slope * 10_000 * 1.048576, 3) if slope is not None and done > 0 else None,
        rss_steps=steps,
        rss_between_steps_mib=round((after[-1].rss_mib - after[0].rss_mib) - sum(d for _, d in steps), 2),
        fds_warm=after[0].fds,
        fds_end=after[-1].fds,
        rate_first=round(first, 1) if first is not None else None,
        rate_last=round(last, 1) if last is not None else None,
        drift_pct=round((last / first - 1) * 100, 2) if first and last is not None else None,
        rates_per_window=_window_rates(after, window),
        # CPU milliseconds a request, of the subject and of the upstream server, in the first and
        # the last window: on a shared core, which of the two slowed down.
        cpu_ms_first=_cpu_ms(after, after[0].t, after[0].t + window, "cpu_s"),
        cpu_ms_last=_cpu_ms(after, end - window, end, "cpu_s"),
        server_cpu_ms_first=_cpu_ms(after, after[0].t, after[0].t + window, "server_cpu_s"),
        server_cpu_ms_last=_cpu_ms(after, end - window, end, "server_cpu_s"),
        probe_ms_first=_median_probe(after, after[0].t, after[0].t + window),
        probe_ms_last=_median_probe(after, end - window, end),
    )
    # The drift with the core's speed taken out: the rate times the fixed work's CPU time (a core
    # running 20% slower makes both the rate 20% lower and the probe 20% longer).
    p0, p1 = out["probe_ms_first"], out["probe_ms_last"]
    out["drift_at_core_speed_pct"] = (
        round((last * p1 / (first * p0) - 1) * 100, 2) if first and last is not None and p0 and p1 else None
    )
    out["met"] = all(
        out.get(key) is not None and abs(out[key]) <= limit for key, limit in TARGETS[name].items()
    )
    return out


def with_start_ratio(res: dict[str, Any], trace: Path) -> dict[str, Any]:
    """`start_over_trace`: RSS when the first request was done over the trace file's size; the
    targets are checked again with it."""
    if res.get("status") != "ok":
        return res
    res["trace_mib"] = round(trace.stat().st_size / 2**20, 1)
    res["start_over_trace"] = (
        round(res["rss_started_mib"] / res["trace_mib"], 2) if res["trace_mib"] else None
    )
    limits = res.get("targets") or {}
    res["met"] = all(res.get(k) is not None and abs(res[k]) <= v for k, v in limits.items())
    return res


def _rate(samples: list[Sample], t0: float, t1: float) -> float | None:
    inside = [s for s in samples if t0 - 1e-6 <= s.t <= t1 + 1e-6]
    if len(inside) < 2 or inside[-1].t <= inside[0].t:
        return None
    return (inside[-1].requests - inside[0].requests) / (inside[-1].t - inside[0].t)


def _window_rates(samples: list[Sample], window: float) -> list[float]:
    """The rate in each whole `window` after warm-up, in order: a trend, or noise around a level."""
    rates = []
    t = samples[0].t
    while t + window <= samples[-1].t + 1e-6:
        rate = _rate(samples, t, t + window)
        if rate is not None:
            rates.append(round(rate, 1))
        t += window
    return rates


def _median_probe(samples: list[Sample], t0: float, t1: float) -> float | None:
    probes = sorted(s.probe_ms for s in samples if t0 - 1e-6 <= s.t <= t1 + 1e-6 and s.probe_ms > 0)
    if not probes:
        return None
    return round(probes[len(probes) // 2], 3)  # the median: one probe preempted is not the core


def _cpu_ms(samples: list[Sample], t0: float, t1: float, which: str) -> float | None:
    inside = [s for s in samples if t0 - 1e-6 <= s.t <= t1 + 1e-6]
    if len(inside) < 2 or inside[-1].requests <= inside[0].requests:
        return None
    used = getattr(inside[-1], which) - getattr(inside[0], which)
    if used <= 0:
        return None
    return round(used * 1000 / (inside[-1].requests - inside[0].requests), 4)


def _slope(x: list[int], y: list[float]) -> float | None:
    n = len(x)
    if n < 2:
        return None
    mx, my = sum(x) / n, sum(y) / n
    var = sum((a - mx) ** 2 for a in x)
    if not var:
        return None
    return sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / var


# --- replay -------------------------------------------------------------------------------------


def soak_trace(path: Path, requests: int, turns: int = 10, seeds: int = 256) -> Path:
    """Sessions of `turns` turns, each resending its live history (`$reply` markers): what keeps
    replies, done stamps and per-request state alive in a replay that forgets nothing. With
    `turns=1`, one-request sessions (the ShareGPT shape): what it keeps per finished session.

    User turns draw from `seeds` synthetic texts: with a distinct text per request the soak would
    measure `synth_text`'s cache filling up to its 64 MiB bound (~470 bytes a request at first), not
    what the replay itself keeps."""
    params = {"max_tokens": 16, "stream": True}
    system = {"role": "system", "content": {"synth": {"tokens": 200, "seed": 7}}}
    with TraceWriter(path, source="scenario:bench-soak", created="2026-01-01T00:00:00+00:00") as w:
        for s in range(max(1, requests // turns)):
            sid = f"soak{s}"
            w.session(sid)
            msgs: list[dict[str, Any]] = [system]
            for turn in range(turns):
                msgs.append(
                    {"role": "user", "content": {"synth": {"tokens": 40, "seed": (s * 16 + turn) % seeds}}}
                )
                reply_msg = {"role": "assistant", "content": f"done {s}.{turn}"}
                reply = {"message": reply_msg, "finish": "length", "output_tokens": 16}
                w.request(sid, float(s), list(msgs), params=params, reply=reply)
                msgs.append(reply_msg)
            w.forget(sid)  # else the writer holds every session's last messages: ~1 KB a request
    return path


def _summary(results: Path) -> dict[str, Any]:
    """The results file's `summary` line (lines such as `metrics` may follow it), or {}."""
    try:
        with open(results, "rb") as handle:
            handle.seek(max(0, results.stat().st_size - (1 << 20)))
            tail = handle.read().splitlines()
    except OSError:
        return {}
    for raw in reversed(tail):
        if raw.startswith(b'{"kind":"summary"'):
            with contextlib.suppress(orjson.JSONDecodeError):
                return dict(orjson.loads(raw))
    return {}


def _lines_counter(path: Path) -> Callable[[], int | None]:
    """Lines appended to `path` so far (minus the run header), read incrementally; None once the
    `summary` line is there: the run is over, and what the process does next (reading the results
    back for its report) is not the run's memory."""
    state = {"offset": 0, "lines": 0, "ended": False}

    def count() -> int | None:
        if state["ended"]:
            return None
        try:
            with open(path, "rb") as handle:
                handle.seek(state["offset"])
                chunk = handle.read()
        except FileNotFoundError:
            return 0
        cut = chunk.rfind(b"\n") + 1
        if b'\n{"kind":"summary"' in b"\n" + chunk[:cut]:
            state["ended"] = True
            return None
        state["offset"] += cut
        state["lines"] += chunk.count(b"\n", 0, cut)
        return max(0, state["lines"] - 1)

    return count


@dataclass(slots=True)
class Calibration:
    """What a replay of the soak's trace does on this machine, from two short runs: its rate, and
    the RSS it holds for a loaded trace (fixed part and per request)."""

    rate: float  # requests per second
    base_mib: float  # RSS of a replay with an empty trace (interpreter, engine, client)
    mib_per_request: float  # RSS a loaded request costs (its trace objects and the engine's setup)

    def rss_mib(self, requests: int) -> float:
        return self.base_mib + self.mib_per_request * requests


CALIBRATION_REQUESTS = (20_000, 200_000)
CALIBRATION_S = 15.0
TRACE_MARGIN = 2.0  # the trace holds this many times what the calibrated rate needs (a shared core
# may run a third faster later than while calibrating)
MEMORY_RESERVE_MIB = 1024.0  # left to the rest of the machine (the soak, its server, the shell)


def _replay_argv(trace: Path, url: str, seconds: float, out: Path) -> list[str]:
    return [
        sys.executable, "-m", "replay", "run", str(trace), "--target", url, "--plan", "overlap",
        "--concurrency", "64", "--max-duration", str(seconds), "--out", str(out), "--quiet",
    ]  # fmt: skip


def _replay_once(
    work: Path, name: str, trace: Path, url: str, seconds: float, every_s: float
) -> list[Sample]:
    out = work / f"{name}.results.jsonl"
    with ChildProcess(
        _replay_argv(trace, url, seconds, out),
        log_path=work / f"{name}.log",
        name=name,
        stop_timeout=30.0,
        cwd=CODE,
    ) as child:
        sampler = Sampler(child.pid, _lines_counter(out), every_s=every_s).start()
        child.wait(seconds + 300)
        return sampler.stop()


def calibrate(work: Path, url: str, turns: int = 10) -> Calibration:
    """Two short replays of the soak's trace (a small and a larger one) against `url`: the rate of
    the larger once it runs, and RSS against trace size (peak RSS, the trace loaded, of each)."""
    peaks: list[float] = []
    rate = 0.0
    for n in CALIBRATION_REQUESTS:
        trace = soak_trace(work / f"calibrate-{n}.trace.jsonl", n, turns=turns)
        samples = _replay_once(work, f"calibrate-{n}", trace, url, CALIBRATION_S, every_s=0.5)
        trace.unlink()
        peaks.append(max((s.rss_mib for s in samples), default=0.0))
        running = [s for s in samples if s.requests > 0]
        if len(running) >= 4:  # from the second sample with requests done: the start-up is not the rate
            rate = (running[-1].requests - running[1].requests) / (running[-1].t - running[1].t)
    (n1, n2), (p1, p2) = CALIBRATION_REQUESTS, peaks
    per_request = max(0.0, (p2 - p1) / (n2 - n1))
    if not rate > 0 or not p1 > 0:
        raise RuntimeError(f"calibration failed: rate {rate:.0f} req/s, RSS peaks {peaks} MiB")
    return Calibration(
        rate=round(rate, 1), base_mib=round(p1 - per_request * n1, 1), mib_per_request=per_request
    )


def replay_size(minutes: float, cal: Calibration, available_mib: float) -> tuple[int, str | None]:
    """The trace's requests for `minutes` at the calibrated rate (with a margin, so a faster stretch
    does not exhaust it), and why it cannot run here (None: it fits in memory)."""
    requests = int(minutes * 60 * cal.rate * TRACE_MARGIN) + 20_000
    need = cal.rss_mib(requests)
    room = available_mib - MEMORY_RESERVE_MIB
    if need <= room:
        return requests, None
    fits = max(0.0, (room - cal.base_mib) / cal.mib_per_request / TRACE_MARGIN / cal.rate / 60)
    return requests, (
        f"not started: {minutes:g} minutes at {cal.rate:,.0f} req/s need a trace of {requests:,} requests, "
        f"~{need / 1024:.1f} GiB in the replay ({cal.mib_per_request * 2**20:,.0f} bytes a request), and "
        f"{available_mib / 1024:.1f} GiB is available (keeping {MEMORY_RESERVE_MIB / 1024:.0f} GiB free): "
        f"at most {fits:.1f} minutes fit"
    )


def soak_replay(
    work: Path,
    minutes: float,
    url: str,
    server_pid: int | None = None,
    rate: float | None = None,
    turns: int = 10,
) -> dict[str, Any]:
    """`replay run` for `minutes` on a trace of `turns`-turn sessions sized from a calibrated rate
    (or `rate`), after checking that the loaded trace fits in the memory available."""
    name = "replay" if turns != 1 else "replay-1turn"
    if rate is None:
        cal = calibrate(work, url, turns)
        log(
            f"replay: calibrated {cal.rate:,.0f} req/s, RSS {cal.base_mib:.0f} MiB + "
            f"{cal.mib_per_request * 2**20:,.0f} bytes a loaded request"
        )
    else:  # asked for: the memory is still checked, against the last stop's measured figures
        cal = Calibration(rate=rate, base_mib=150.0, mib_per_request=2400 / 2**20)
    available = psutil.virtual_memory().available / 2**20
    requests, refused = replay_size(minutes, cal, available)
    calibration = {
        "rate": cal.rate,
        "base_mib": cal.base_mib,
        "bytes_per_request": round(cal.mib_per_request * 2**20),
    }
    if refused is not None:
        log(f"replay: {refused}")
        return {"status": "failed", "reason": refused, "calibration": calibration, "trace_requests": requests}
    t0 = time.monotonic()
    trace = soak_trace(work / f"soak-{name}.trace.jsonl", requests, turns=turns)
    log(
        f"replay: trace of {requests:,} requests written in {time.monotonic() - t0:.1f} s "
        f"(expected RSS {cal.rss_mib(requests) / 1024:.1f} GiB, {available / 1024:.1f} GiB available)"
    )
    out = work / f"soak-{name}.results.jsonl"
    with ChildProcess(
        _replay_argv(trace, url, minutes * 60, out),
        log_path=work / f"soak-{name}.log",
        name="replay-run",
        stop_timeout=30.0,
        cwd=CODE,
    ) as child:
        sampler = Sampler(child.pid, _lines_counter(out), server_pid=server_pid).start()
        child.wait(minutes * 60 + 900)  # + loading the trace (~3 min for 6M requests), writing, reading back
        samples = sampler.stop()
    res = analyse(name, samples, minutes)
    if name == "replay-1turn":
        res = with_start_ratio(res, trace)
    summary = _summary(out)
    res["waiting_max"] = summary.get("waiting_max")  # see `rss_steps`
    res["outcome"] = summary.get("outcome")
    res["trace_requests"] = requests
    res["calibration"] = calibration
    res["exhausted"] = bool(res.get("requests", 0) >= requests - 1) or summary.get("outcome") == "done"
    return res


# --- record and sim: conversations over HTTP ----------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(slots=True)
class Conversation:
    index: int
    generation: int = 0
    replies: list[str] = field(default_factory=list)
    summary: str | None = None
    busy: bool = False


SYSTEM = "You are a coding agent. " * 80  # ~2 KB, shared: the prompt every conversation starts with


GENERATION_DIGITS = 7  # 10 million restarts: 960 million requests of 16 conversations


def conversation_messages(c: Conversation) -> list[dict[str, str]]:
    """The conversation as an agent resends it: its start (or its compaction summary) and every
    reply so far with the user turn that followed it.

    Its restart count is written at a fixed width, so the texts keep their length and their token
    count all run long: a soak's load is the same at its end as after warm-up. Written plainly, 999
    -> 1000 restarts (~96,000 requests of the sim's 16 conversations) made every later text a token
    longer; until the simulator's text cache had turned over, old and new sizes lived side by side
    in more of Python's allocator arenas, and RSS stayed 3 MiB higher (the simulator's soak).
    """
    tag = f"{c.index}.{c.generation:0{GENERATION_DIGITS}d}"
    first = (
        f"Summary of earlier work:\n{c.summary}\nContinue."
        if c.summary is not None
        else f"conversation {tag}: fix the failing test"
    )
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": first}]
    for i, reply in enumerate(c.replies):
        msgs.append({"role": "assistant", "content": reply})
        msgs.append({"role": "user", "content": f"tool result {i} of {tag}"})
    return msgs


async def _ask(client: httpx.AsyncClient, url: str, messages: list[dict[str, str]]) -> str:
    body = {"model": "ref", "messages": messages, "stream": True, "max_tokens": 16}
    text: list[str] = []
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as resp:
        if resp.status_code >= 400:
            await resp.aread()  # for the error's kind (`error_kind`)
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = orjson.loads(line[6:])
            for choice in obj.get("choices") or ():
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    text.append(piece)
    return "".join(text)


def error_kind(exc: Exception) -> str:
    """A client error as the soak reports it: the HTTP status and the body's first characters
    for a refused request, else the exception's type and message (no ids: they would make every
    error a kind of its own)."""
    if isinstance(exc, httpx.HTTPStatusError):
        body = ""
        with contextlib.suppress(httpx.ResponseNotRead, UnicodeDecodeError):
            body = " ".join(exc.response.text.split())[:120]
        return f"HTTP {exc.response.status_code}: {body}".rstrip(": ")
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:120]}".rstrip(": ")


def log_problems(path: Path, limit: int = 20) -> list[str]:
    """The subject's log lines that report an error or a traceback (the first `limit`)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    marks = ("error", "Error", "ERROR", "Traceback", "WARNING")
    return [line[:300] for line in lines if any(m in line for m in marks)][:limit]


@dataclass
class ChatLoad:
    """`clients` streaming clients working through `conversations` in turn: each turn resends the
    history; after `turns` turns a conversation compacts (the recorder) or restarts (the sim)."""

    url: str
    conversations: int
    clients: int
    turns: int
    compact: bool
    done: int = 0
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)  # what each error was, counted

    def failed(self, exc: Exception) -> None:
        self.errors += 1
        kind = error_kind(exc)
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1

    async def run(self, seconds: float) -> None:
        pool = [Conversation(i) for i in range(self.conversations)]
        cursor = 0
        deadline = time.monotonic() + seconds

        def pick() -> Conversation | None:
            nonlocal cursor
            for _ in range(len(pool)):
                c = pool[cursor]
                cursor = (cursor + 1) % len(pool)
                if not c.busy:
                    return c
            return None

        async def client_loop(client: httpx.AsyncClient) -> None:
            while time.monotonic() < deadline:
                c = pick()
                if c is None:
                    await asyncio.sleep(0.01)
                    continue
                c.busy = True
                try:
                    reply = await _ask(client, self.url, conversation_messages(c))
                except (httpx.HTTPError, ValueError) as exc:
                    self.failed(exc)
                    await asyncio.sleep(0.05)
                    continue
                finally:
                    c.busy = False
                self.done += 1
                c.replies.append(reply)
                if len(c.replies) >= self.turns:
                    c.summary = reply if self.compact else None
                    c.generation += 1
                    c.replies = []

        limits = httpx.Limits(max_connections=self.clients, max_keepalive_connections=self.clients)
        async with httpx.AsyncClient(timeout=60.0, limits=limits) as client:
            await asyncio.gather(*(client_loop(client) for _ in range(self.clients)))


def _drive(
    child: ChildProcess, load: ChatLoad, minutes: float, count: Callable[[], int] | None = None
) -> list[Sample]:
    sampler = Sampler(child.pid, count or (lambda: load.done)).start()
    try:
        asyncio.run(load.run(minutes * 60))
    finally:
        samples = sampler.stop()
    return samples


def soak_record(work: Path, minutes: float, url: str, conversations: int | None = None) -> dict[str, Any]:
    n = conversations or max(1000, round(100_000 * minutes / 60))
    argv = [
        sys.executable, "-m", "replay", "record", "--upstream", url,
        "--out", str(work / "soak-record.trace.jsonl"), "--listen", f"127.0.0.1:{free_port()}",
    ]  # fmt: skip
    with ChildProcess(
        argv, log_path=work / "soak-record.log", name="replay-record", stop_timeout=30.0, cwd=CODE
    ) as child:
        proxy = child.wait_for_line(_LISTENING, timeout=60.0).group(1)
        load = ChatLoad(proxy, conversations=n, clients=50, turns=8, compact=True)
        samples = _drive(child, load, minutes)
    res = analyse("record", samples, minutes, warm_requests=n)
    res.update(
        conversations=n,
        errors=load.errors,
        error_kinds=load.error_kinds,
        log_problems=log_problems(work / "soak-record.log"),
    )
    return res


def soak_sim(work: Path, minutes: float, active: int = 16) -> dict[str, Any]:
    # Its ds4 log lines go to soak-sim.log, after the listening line.
    argv = [sys.executable, "-m", "replay", "sim", "serve", "--port", "0", "--time-scale", "200"]
    with ChildProcess(
        argv, log_path=work / "soak-sim.log", name="replay-sim", stop_timeout=30.0, cwd=CODE
    ) as child:
        base = child.wait_for_line(_LISTENING, timeout=60.0).group(1)
        load = ChatLoad(base, conversations=active, clients=active, turns=6, compact=False)
        settled_at = _BoundReached(base, load)
        samples = _drive(child, load, minutes, settled_at.count)
    # Warm-up lasts until the tokenizer's text cache (bounded in texts and characters, read from the
    # server's /stats) is settled: full, and its table at its lasting size (see
    # replay.sim.model.tokenizer.cache_fill); before that its growth is the bound filling, not a leak.
    res = analyse("sim", samples, minutes, warm_requests=settled_at.requests or 1 << 62)
    res.update(
        active_sessions=active,
        errors=load.errors,
        error_kinds=load.error_kinds,
        cache_settled_at=settled_at.requests,
    )
    return res


@dataclass
class _BoundReached:
    """Requests done when the simulator's tokenizer cache first reported itself settled (a
    simulator from before that report: full)."""

    base: str
    load: ChatLoad
    requests: int | None = None

    def count(self) -> int:
        done = self.load.done
        if self.requests is None:
            with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                fill = httpx.get(self.base + "/stats", timeout=5.0).json()["x_sim"]["tokenizer_cache"]
                full = fill["texts"] >= fill["max_texts"] or fill["chars"] >= fill["max_chars"] * 0.99
                if fill.get("settled", full):
                    self.requests = done
        return done


def run(minutes: float, only: list[str], work: Path, conversations: int | None = None) -> dict[str, Any]:
    """Every soak asked for, one after the other; one that fails keeps the others' figures."""
    results: dict[str, Any] = {}
    needs_upstream = {"replay", "replay-1turn", "record"} & set(only)
    # The soak never reads the server's per-request stamps (`/truth`): it keeps none.
    upstream = refserver(Pacing(first_token_ms=1.0, tokens=16), realtime=False, truth_cap=0)
    with upstream if needs_upstream else contextlib.nullcontext() as srv:
        for name in only:
            log(f"{name}: soaking for {minutes} min")
            try:
                if name == "replay":
                    res = soak_replay(work, minutes, srv.url, srv.pid)
                elif name == "replay-1turn":
                    res = soak_replay(work, minutes, srv.url, srv.pid, turns=1)
                elif name == "record":
                    res = soak_record(work, minutes, srv.url, conversations)
                else:
                    res = soak_sim(work, minutes)
            except Exception as exc:  # noqa: BLE001 - a broken soak must not lose the others
                if _TERMINATED.is_set():  # the unwinding replaced our SystemExit on its way out
                    raise SystemExit(143) from exc
                res = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
            log(f"{name}: {summary_line(name, res)}")
            results[name] = res
    return results


def summary_line(name: str, res: dict[str, Any]) -> str:
    if res.get("status") != "ok":
        return f"failed: {res.get('reason')}"
    return (
        f"{res['requests']} requests; RSS {res['rss_warm_mib']} -> {res['rss_end_mib']} MiB after "
        f"{res['warmup_s']} s warm-up ({res['mb_per_10k']} MB per 10,000 requests, {res['growth_pct']}%); "
        f"{len(res['rss_steps'])} steps of >= 0.25 MiB ({_steps(res['rss_steps'])}), "
        f"{res['rss_between_steps_mib']} MiB between them"
        + (f", waiting peak {res['waiting_max']}" if res.get("waiting_max") is not None else "")
        + f"; fds {res['fds_warm']} -> {res['fds_end']}; rate {res['rate_first']} -> {res['rate_last']} req/s "
        f"({res['drift_pct']}%; per window {_rates(res.get('rates_per_window'))}); "
        f"CPU ms a request: subject {res.get('cpu_ms_first')} -> {res.get('cpu_ms_last')}, "
        f"server {res.get('server_cpu_ms_first')} -> {res.get('server_cpu_ms_last')}; "
        f"core probe {res.get('probe_ms_first')} -> {res.get('probe_ms_last')} ms "
        f"(drift at the core's speed {res.get('drift_at_core_speed_pct')}%); "
        f"targets {'met' if res['met'] else 'MISSED'}"
        + (f"; {res['errors']} client errors {res.get('error_kinds')}" if res.get("errors") else "")
    )


def _rates(rates: list[float] | None) -> str:
    return ", ".join(f"{r:.0f}" for r in rates or [])


def _steps(steps: list[list[Any]]) -> str:
    return ", ".join(f"+{mib} at {n}" for n, mib in steps[:8]) + (" ..." if len(steps) > 8 else "")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="minutes per soak (default 10)")
    ap.add_argument("--only", default=",".join(SOAKS), help=f"comma-separated: {', '.join(SOAKS)}")
    ap.add_argument("--out", type=Path, default=Path("bench/results"), help="results directory")
    ap.add_argument(
        "--code", type=Path, default=None, help="soak the `replay` of this checkout (e.g. a before/after)"
    )
    ap.add_argument(
        "--conversations",
        type=int,
        default=None,
        help="the record soak's pool of conversations (default 100,000 per hour, at least 1,000)",
    )
    ap.add_argument("--label", default="", help="stored with the figures (e.g. 'before')")
    args = ap.parse_args(argv)
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in args.only if s not in SOAKS]
    if unknown:
        ap.error(f"unknown soak(s) {', '.join(unknown)}; known: {', '.join(SOAKS)}")
    return args


_TERMINATED = threading.Event()


def exit_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so every `ChildProcess` block stops its child by PID on the way
    out instead of leaving it running without a parent."""

    def stop(*_: object) -> None:
        _TERMINATED.set()
        sys.exit(143)

    signal.signal(signal.SIGTERM, stop)


def main(argv: list[str] | None = None) -> int:
    global CODE
    args = parse_args(argv)
    exit_on_sigterm()
    CODE = args.code.resolve() if args.code else None
    with tempfile.TemporaryDirectory(prefix="replay-soak-") as tmp:
        results = run(args.minutes, args.only, Path(tmp), args.conversations)
    for res in results.values():
        res["label"] = args.label
        res["code"] = str(CODE) if CODE else "this checkout"
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "soak.json"
    previous = orjson.loads(path.read_bytes()).get("data", {}) if path.exists() else {}
    data = {**previous, **results}
    doc = {
        "section": "soak",
        "measured": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "load": round(os.getloadavg()[0], 2),
        "data": data,
    }
    path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    for name, res in results.items():
        print(f"{name}: {summary_line(name, res)}")
    print(f"written to {path}; `python -m bench --rebuild` puts it in README.md")
    return 0 if all(r.get("met") for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
