"""Results file (JSONL, `agent-replay-results/1`): written append-only, read back for reports.

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

FORMAT = "agent-replay-results/1"


class ResultsWriter:
    def __init__(self, path: str | Path, header: dict[str, Any]) -> None:
        self.path = str(path)
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._out: IO[bytes] = open(self.path, "wb")  # noqa: SIM115 - closed by close()
        self.summary = Summary()
        self.write({"kind": "run", "format": FORMAT, **header})

    def write(self, obj: dict[str, Any]) -> None:
        self._out.write(orjson.dumps(obj) + b"\n")
        self._out.flush()

    def request(self, rec: dict[str, Any]) -> None:
        self.summary.add(rec)
        self.write(rec)

    def close(self, extra: dict[str, Any] | None = None) -> None:
        """Write the summary line and close; safe to call once on every exit path."""
        if self._out.closed:
            return
        self.write({"kind": "summary", "classes": self.summary.encode(), **(extra or {})})
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
    summary_line: dict[str, Any] | None = None

    @property
    def summary(self) -> Summary:
        """The file's own summary, or one rebuilt from its request lines if the run was cut short."""
        if self.summary_line is not None:
            return Summary.decode(self.summary_line["classes"])
        summary = Summary()
        for rec in self.requests:
            summary.add(rec)
        return summary


def read_results(path: str | Path) -> RunResults:
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
                if handle.read(1):
                    raise TraceError(path, n, "bad JSON in results file") from None
                break
            kind = obj.get("kind")
            if n == 1:
                if kind != "run" or obj.get("format") != FORMAT:
                    raise TraceError(path, n, f"not a results file (expected a '{FORMAT}' run header)")
                run = obj
                out = RunResults(path=path, run=run)
            elif kind == "request":
                out.requests.append(obj)
            elif kind == "server":
                out.server.append(obj)
            elif kind == "summary":
                out.summary_line = obj
    if out is None:
        raise TraceError(path, 0, "empty results file")
    return out


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
