"""`replay validate`, `import`, `export` and `anonymize`: traces in, traces out."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from replay.errors import TraceError, UsageError


@dataclass(frozen=True, kw_only=True, slots=True)
class ValidateArgs:
    trace: Path
    ctx: str | None = None  # the server's context in tokens: a prompt past it is an error


def validate(args: ValidateArgs, console: Console) -> int:
    """Check a trace; a bad line raises `file:line: problem` (a TraceError). Then its prompts
    against a context: `--ctx`, where a prompt past it fails the check, else the default model's,
    where it is a warning (the trace is well formed; a server with a larger context takes it)."""
    from replay.sim.model.config import DEFAULT_PRESET, PRESETS, parse_tokens
    from replay.trace.prompts import trace_overflow
    from replay.trace.reader import validate as validate_trace

    ctx = parse_tokens(args.ctx) if args.ctx is not None else None
    if ctx is not None and ctx < 1:
        raise UsageError("--ctx must be at least 1 token")
    counts = validate_trace(args.trace)
    found = trace_overflow(args.trace, ctx or PRESETS[DEFAULT_PRESET].ctx)
    if found is not None and ctx is not None:
        raise TraceError(
            str(args.trace),
            found.first.line,
            f"{found.describe(f'--ctx {ctx}')}; --ctx {found.suggested_ctx()} holds them all",
        )
    missing = counts.get("unrecorded", 0)
    console.print(
        f"{args.trace}: ok ({counts['sessions']} sessions, {counts['requests']} requests, "
        f"{counts['blobs']} blobs, {counts['lines']} lines)"
        + (f"; {missing} calls passed through unrecorded (see its 'unrecorded' lines)" if missing else ""),
        highlight=False,
    )
    if found is not None:
        default = f"the {found.ctx:,}-token context of the default model ({DEFAULT_PRESET}, the simulator's)"
        Console(stderr=True).print(
            f"[yellow]warning:[/yellow] {args.trace}: {found.describe(default)}. Check it against your "
            f"server's context with `--ctx N`; --ctx {found.suggested_ctx()} holds them all (the "
            "simulator takes it in `--sim-args`, `replay size sweep` as `--ctx`)",
            highlight=False,
            soft_wrap=True,
        )
    return 0


@dataclass(frozen=True, kw_only=True, slots=True)
class ImportArgs:
    fmt: str | None
    src: Path | None
    out: Path | None
    since: str | None = None  # ISO 8601 (local time unless it has an offset) or epoch seconds
    until: str | None = None
    sessions: tuple[str, ...] = ()
    shared_system: bool = False
    gap_cap: float | None = None  # public corpora: cap think/tool gaps (seconds)
    list_formats: bool = False
    force: bool = False  # replace an existing OUT (once the new trace is complete)


def import_trace(args: ImportArgs, console: Console) -> int:
    """`--list`: the formats and where agents keep their files; else import with the filters."""
    from replay.errors import UsageError
    from replay.importers.base import ImportOptions, parse_when
    from replay.importers.registry import list_formats, run_import
    from replay.outputs import check_file

    if args.list_formats:
        console.print(list_formats(), highlight=False)
        return 0
    if args.fmt is None or args.src is None or args.out is None:
        raise UsageError("replay import needs FORMAT SRC OUT (or --list)")
    check_file(args.out, option="OUT", force=args.force, inputs=[args.src])
    options = ImportOptions(
        since=parse_when(args.since),
        until=parse_when(args.until),
        sessions=args.sessions,
        shared_system=args.shared_system,
        gap_cap=args.gap_cap,
    )
    if args.gap_cap is not None and not args.gap_cap >= 0:
        raise UsageError(f"--gap-cap must be 0 or more seconds, not {args.gap_cap:g}")
    console.print(run_import(args.fmt, args.src, args.out, options), highlight=False)
    return 0


@dataclass(frozen=True, kw_only=True, slots=True)
class ExportArgs:
    fmt: str
    src: Path
    out: Path
    force: bool = False  # replace an existing OUT (once the new file is complete)


def export_trace(args: ExportArgs, console: Console) -> int:
    from replay.importers.registry import run_export
    from replay.outputs import check_file

    check_file(args.out, option="OUT", force=args.force, inputs=[args.src])
    console.print(run_export(args.fmt, args.src, args.out), highlight=False)
    return 0


@dataclass(frozen=True, kw_only=True, slots=True)
class AnonymizeArgs:
    src: Path
    dst: Path
    key: str
    force: bool = False  # replace an existing DST (once the new trace is complete)


def anonymize(args: AnonymizeArgs, console: Console) -> int:
    from replay.outputs import check_file
    from replay.record.anonymize import run_anonymize

    check_file(args.dst, option="DST", force=args.force, inputs=[args.src])
    console.print(run_anonymize(args.src, args.dst, args.key), highlight=False)
    return 0
