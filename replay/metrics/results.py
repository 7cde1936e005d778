"""Results file (JSONL, `agent-replay-results/2`): written append-only, read back for reports.

Version 2 adds `backend` and `backend_source` to every request line (which of several targets
served it); a version 1 file reads as one whose requests all went to the run's one target.

Every request line is flushed as soon as it is measured, so a run cut short by Ctrl-C, a crash or
a timeout keeps every result it had; the `summary` line at the end carries mergeable histograms.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from replay.errors import TraceError
from replay.metrics.hist import Summary
from replay.metrics.record import RequestRecord, micros

FORMAT = "agent-replay-results/2"
FORMATS = ("agent-replay-results/1", FORMAT)  # what the reader takes


def _between(start: int | None, end: int | None) -> float | None:
    """Seconds from `start` to `end` to the microsecond (`micros`: ties to even), as results have
    always printed them."""
    us = None if start is None or end is None else micros(end - start)
    return None if us is None else us / 1e6


def _server_decode_tps(timings: dict[str, Any] | None) -> float | None:
    """llama-server's `timings.predicted_per_second`: tokens generated per second of its decode."""
    value = (timings or {}).get("predicted_per_second")
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return round(float(value), 3)
    return None


def request_line(rec: RequestRecord) -> dict[str, Any]:
    """A record as its `request` line; the fields up to `error` are the format's, in its order."""
    usage = rec.usage
    origin = rec.t_origin
    decode_s = _between(rec.t_first_token, rec.t_last_token)
    n = usage.output_tokens
    line: dict[str, Any] = {
        "kind": "request",
        "seq": rec.seq,
        "id": rec.request_id,
        "session": rec.session,
        "tag": rec.tag,
        "switch": list(rec.switch),
        "from_session": rec.from_session,
        "scheduled_s": _between(origin, rec.t_scheduled),
        "sent_s": _between(origin, rec.t_sent),
        "lag_s": _between(rec.t_scheduled, rec.t_sent),
        "ttft_s": _between(rec.t_sent, rec.t_first_token),
        "latency_s": _between(rec.t_sent, rec.t_end),
        "ttft_sched_s": _between(rec.t_scheduled, rec.t_first_token),
        "latency_sched_s": _between(rec.t_scheduled, rec.t_end),
        "prompt_tokens": usage.prompt_tokens,
        "cached_tokens": usage.cached_tokens,
        "cache_write_tokens": usage.cache_write_tokens,
        "reprocessed_tokens": usage.reprocessed_tokens,
        "reprocessed_source": usage.reprocessed_source,
        "output_tokens": n,
        "expected_output_tokens": rec.expected_output_tokens,
        "decode_tps": round((n - 1) / decode_s, 3) if n and n >= 2 and decode_s else None,
        "finish": rec.finish,
        "output_sha1": rec.output_sha1,
        "status": rec.status,
        "http_status": rec.http_status,
        "error": rec.error,
        # Added to the format since: the stamps before the first token.
        "connect_s": _between(rec.t_start, rec.t_connected),
        "headers_s": _between(rec.t_sent, rec.t_headers),
        "first_byte_s": _between(rec.t_sent, rec.t_first_byte),
        "reused": rec.reused,
        "client_queue_s": _between(rec.t_first_token, rec.t_first_token_read),
        # The server's own decode speed where it reports one (llama.cpp `timings`).
        "server_decode_tps": _server_decode_tps(rec.timings),
        # Version 2: which backend served it (null: the run's one target) and who said so.
        "backend": rec.backend,
        "backend_source": rec.backend_source,
    }
    if rec.x_sim is not None:
        line["modelled"] = rec.x_sim
    if rec.evidence is not None:  # what a bad_payload / stream_broken failure is about
        line["evidence"] = rec.evidence.decode("utf-8", "replace")
    line.update(rec.extra)
    return line


class ResultsWriter:
    def __init__(self, path: str | Path, header: dict[str, Any]) -> None:
        self.path = str(path)
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        # Unbuffered: every line goes to the kernel as it is written (one write call, no copy).
        self._out: IO[bytes] = open(self.path, "wb", buffering=0)  # noqa: SIM115 - closed by close()
        self.summary = Summary()
        self.backends: dict[str, Summary] = {}  # per backend, when the run had several
        self.write({"kind": "run", "format": FORMAT, **header})

    def write(self, obj: dict[str, Any]) -> None:
        data = orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE)
        done = self._out.write(data)
        while done < len(data):  # a raw write may take less than all (a signal, a full disk)
            more = self._out.write(data[done:])
            if not more:
                raise OSError(f"{self.path}: the results file takes no more bytes")
            done += more

    def request(self, rec: RequestRecord, summarise: bool = True) -> dict[str, Any]:
        """Write a record's line (into the summary too unless told not to); returns the line."""
        if summarise:
            self.summary.add(rec)
            if rec.backend is not None:
                backend = self.backends.get(rec.backend)
                if backend is None:
                    backend = self.backends[rec.backend] = Summary()
                backend.add(rec)
        line = request_line(rec)
        self.write(line)
        return line

    def close(self, extra: dict[str, Any] | None = None) -> None:
        """Write the summary line and close; safe to call once on every exit path."""
        if self._out.closed:
            return
        tail: dict[str, Any] = {"kind": "summary", "classes": self.summary.encode()}
        if self.backends:  # version 2: the same classes per backend
            tail["backends"] = {name: s.encode() for name, s in self.backends.items()}
        self.write({**tail, **(extra or {})})
        self._out.close()


def append_records(path: str | Path, records: Iterable[dict[str, Any]]) -> None:
    """Append lines (e.g. `server` records from the log) to a finished results file."""
    records = list(records)
    if not records:
        return
    with open(path, "ab") as out:
        for rec in records:
            out.write(orjson.dumps({"kind": "server", **rec} if "kind" not in rec else rec) + b"\n")


@dataclass(slots=True)
class RunResults:
    path: str
    run: dict[str, Any]
    requests: list[dict[str, Any]] = field(default_factory=list)
    server: list[dict[str, Any]] = field(default_factory=list)
    restarts: list[dict[str, Any]] = field(default_factory=list)  # `probe_restart` lines (slot files)
    summary_line: dict[str, Any] | None = None
    truncated_line: int | None = None  # a last line cut short (a run killed mid-write), ignored

    @property
    def summary(self) -> Summary:
        """The file's own summary, or one rebuilt from its request lines if the run was cut short."""
        if self.summary_line is not None:
            return Summary.decode(self.summary_line["classes"])
        summary = Summary()
        for line in self.requests:
            summary.add_line(line)
        return summary

    @property
    def backends(self) -> dict[str, Summary]:
        """Per-backend classes of a run over several targets (empty for one): the summary's, or
        rebuilt from the request lines if the run was cut short."""
        if self.summary_line is not None:
            return {k: Summary.decode(v) for k, v in (self.summary_line.get("backends") or {}).items()}
        out: dict[str, Summary] = {}
        for line in self.requests:
            backend = line.get("backend")
            if isinstance(backend, str):
                out.setdefault(backend, Summary()).add_line(line)
        return out


# Fields of a `request` line the reports compute with: counts, seconds, text.
_COUNTS = ("prompt_tokens", "cached_tokens", "cache_write_tokens", "reprocessed_tokens", "output_tokens")
_SECONDS = ("ttft_s", "latency_s", "ttft_sched_s", "latency_sched_s", "decode_tps")


def _problem(obj: dict[str, Any]) -> str | None:
    """What is wrong with a `request` line for the reports, or None."""
    if type(obj.get("status")) is not str:
        return "request 'status' must be a string"
    switch = obj.get("switch", [])
    if type(switch) is not list or not all(type(s) is str for s in switch):
        return "request 'switch' must be a list of strings"
    for key in _COUNTS:
        value = obj.get(key)
        if value is not None and (type(value) is not int or not 0 <= value < 1 << 53):
            return f"request '{key}' must be a count or null"
    for key in _SECONDS:
        value = obj.get(key)
        if value is not None and (type(value) not in (int, float) or value < 0):
            return f"request '{key}' must be seconds >= 0 or null"
    return None


def _summary_problem(obj: dict[str, Any]) -> str | None:
    """What is wrong with a `summary` line's classes (counts and encoded histograms), or None.

    The numbers are checked as read, before decoding: the decoded classes hold typed fields (their
    module is compiled), which would refuse a wrong value with an error that names no field."""
    classes = obj.get("classes")
    if not isinstance(classes, dict):
        return "summary 'classes' must be an object"
    for name, raw in classes.items():
        if not isinstance(raw, dict):
            return f"summary class {name!r} must be an object"
        if type(raw.get("count")) is not int or type(raw.get("errors")) is not int:
            return f"summary class {name!r}: 'count' and 'errors' must be integers"
        sums = raw.get("sums", {})
        if not isinstance(sums, dict) or not all(type(v) is int for v in sums.values()):
            return f"summary class {name!r}: 'sums' must be integers (token counts)"
    try:
        Summary.decode(classes)
    except Exception as exc:  # whatever damage the encoded histograms hold
        return f"summary 'classes' are damaged ({type(exc).__name__})"
    backends = obj.get("backends", {})
    if not isinstance(backends, dict):
        return "summary 'backends' must be an object"
    for name, each in backends.items():
        problem = _summary_problem({"classes": each})
        if problem is not None:
            return f"summary backend {name!r}: {problem}"
    return None


def read_results(path: str | Path) -> RunResults:
    """Read a results file; damage is a `TraceError` naming file:line, except a last line cut short
    by a run killed mid-write, which is kept as `truncated_line` for the report to mention."""
    path = str(path)
    run: dict[str, Any] | None = None
    out: RunResults | None = None
    try:
        handle = open(path, "rb")  # noqa: SIM115
    except OSError as exc:
        raise TraceError(path, 0, f"cannot open: {exc.strerror}") from None
    with handle:
        for n, raw in enumerate(handle, 1):
            if not raw.strip():
                continue
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                # A run killed mid-write can leave one partial last line; anything else is damage.
                if handle.read(1) or raw.endswith(b"\n"):
                    raise TraceError(path, n, "bad JSON in results file") from None
                if out is not None:
                    out.truncated_line = n
                break
            if type(obj) is not dict:
                raise TraceError(path, n, "each line of a results file must be a JSON object")
            kind = obj.get("kind")
            if n == 1:
                if kind != "run" or obj.get("format") not in FORMATS:
                    raise TraceError(path, n, f"not a results file (expected a '{FORMAT}' run header)")
                run = obj
                out = RunResults(path=path, run=run)
            elif out is None:
                raise TraceError(path, n, f"not a results file (expected a '{FORMAT}' run header)")
            elif kind == "request":
                problem = _problem(obj)
                if problem is not None:
                    raise TraceError(path, n, problem)
                out.requests.append(obj)
            elif kind == "server":
                out.server.append(obj)
            elif kind == "probe_restart":
                out.restarts.append(obj)
            elif kind == "summary":
                problem = _summary_problem(obj)
                if problem is not None:
                    raise TraceError(path, n, problem)
                out.summary_line = obj
    if out is None:
        raise TraceError(path, 0, "empty results file")
    _routed_by_router(out)
    return out


def _routed_by_router(res: RunResults) -> None:
    """A router's own word on where it sent each request (`server` records of event `routed`,
    read from its log after the run) fills the request lines that name no backend, with
    `backend_source` "router": the line was written before the router's log could be read."""
    routed = {s.get("request_seq"): s.get("backend") for s in res.server if s.get("event") == "routed"}
    if not routed:
        return
    for rec in res.requests:
        url = routed.get(rec.get("seq"))
        if url is not None and rec.get("backend") is None:
            rec["backend"] = url
            rec["backend_source"] = "router"


_SUMMARY_START = b'{"kind":"summary"'  # how `ResultsWriter.close` starts the line (orjson, no spaces)


def read_summary_line(
    path: str | Path, block: int = 1 << 20, within: int | None = None
) -> dict[str, Any] | None:
    """The last `summary` line of a results file, read from its end (None: the file has none).

    How a run ended is in that one line: reading back a multi-million-line file for it costs
    gigabytes of memory just after the run. `within`: look only in the file's last `within`
    bytes, for a file that may still be written (it has no summary yet: finding that out would
    read all of it)."""
    try:
        handle = open(path, "rb")  # noqa: SIM115
    except OSError as exc:
        raise TraceError(str(path), 0, f"cannot open: {exc.strerror}") from None
    with handle:
        pos = handle.seek(0, 2)
        stop = 0 if within is None else max(0, pos - within)
        carry = b""  # the start of a line the last block cut (read before it)
        while pos > stop:
            step = min(block, pos - stop)
            pos -= step
            handle.seek(pos)
            lines = (handle.read(step) + carry).split(b"\n")
            carry = lines.pop(0) if pos else b""
            for raw in reversed(lines):
                if raw.startswith(_SUMMARY_START):
                    try:
                        obj = orjson.loads(raw)
                    except orjson.JSONDecodeError:
                        continue  # cut short by a kill mid-write
                    if type(obj) is dict:
                        return obj
    return None


def merged_summary(results: Iterable[RunResults]) -> Summary:
    total = Summary()
    for res in results:
        total.merge(res.summary)
    return total


def time_scale(run_header: dict[str, Any]) -> float | None:
    """The simulator's `--time-scale` from the run header (a field, or the server's argv)."""
    target = run_header.get("target") or {}
    if isinstance(target.get("time_scale"), int | float):
        return float(target["time_scale"])
    for argv in _string_lists(target):
        for i, arg in enumerate(argv[:-1]):
            if arg == "--time-scale":
                try:
                    return float(argv[i + 1])
                except ValueError:
                    return None
    return None


def _string_lists(node: Any) -> Iterable[list[str]]:
    if isinstance(node, list):
        if node and all(isinstance(x, str) for x in node):
            yield node
        for item in node:
            yield from _string_lists(item)
    elif isinstance(node, dict):
        for value in node.values():
            yield from _string_lists(value)
