"""`replay validate`, `import`, `export` and `anonymize`: traces in, traces out."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console


@dataclass(frozen=True, kw_only=True, slots=True)
class ValidateArgs:
    trace: Path


def validate(args: ValidateArgs, console: Console) -> int:
    """Check a trace; a bad line raises `file:line: problem` (a TraceError)."""
    from replay.trace.reader import validate as validate_trace

    counts = validate_trace(args.trace)
    missing = counts.get("unrecorded", 0)
    console.print(
        f"{args.trace}: ok ({counts['sessions']} sessions, {counts['requests']} requests, "
        f"{counts['blobs']} blobs, {counts['lines']} lines)"
        + (f"; {missing} calls passed through unrecorded (see its 'unrecorded' lines)" if missing else ""),
        highlight=False,
    )
    return 0


@dataclass(frozen=True, kw_only=True, slots=True)
class ImportArgs:
    fmt: str
    src: Path
    out: Path


def import_trace(args: ImportArgs, console: Console) -> int:
    from replay.record.importers import run_import

    console.print(run_import(args.fmt, args.src, args.out), highlight=False)
    return 0


@dataclass(frozen=True, kw_only=True, slots=True)
class ExportArgs:
    fmt: str
    src: Path
    out: Path


def export_trace(args: ExportArgs, console: Console) -> int:
    from replay.record.importers import run_export

    console.print(run_export(args.fmt, args.src, args.out), highlight=False)
    return 0


@dataclass(frozen=True, kw_only=True, slots=True)
class AnonymizeArgs:
    src: Path
    dst: Path
    key: str


def anonymize(args: AnonymizeArgs, console: Console) -> int:
    from replay.record.anonymize import run_anonymize

    console.print(run_anonymize(args.src, args.dst, args.key), highlight=False)
    return 0
