"""`replay record`: the recording proxy in the foreground."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console


@dataclass(frozen=True, kw_only=True, slots=True)
class RecordArgs:
    upstream: str
    out: Path
    listen: str = "127.0.0.1:8001"
    anonymize: bool = False
    key: str | None = None
    log: Path | None = None  # a line per call: method, path, status, bytes, recorded
    keep_rejected: bool = False
    max_body: str = "64MiB"
    header_timeout: float = 30.0
    body_timeout: float = 120.0
    keep_alive_timeout: float = 5.0
    max_connections: int = 1024
    force: bool = False  # replace an existing trace (once the socket is listening)


def record(args: RecordArgs, console: Console) -> int:
    """Check the trace and log paths, listen, then open the trace: a port in use, or any bad
    option, leaves an existing file as it was (`replay.outputs`)."""
    from replay.errors import UsageError
    from replay.outputs import check_file
    from replay.record.serve import record as run_record
    from replay.serving.guard import Limits
    from replay.sim.server.options import parse_bytes

    check_file(args.out, option="--out", force=args.force)
    if args.log is not None:
        if args.log.resolve() == args.out.resolve():
            raise UsageError("--log and --out name the same file")
        check_file(args.log, option="--log", append=True)

    limits = Limits(
        max_body_bytes=parse_bytes(args.max_body),
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        keep_alive_s=args.keep_alive_timeout,
        max_connections=args.max_connections,
    )
    try:
        limits.check()
    except ValueError as exc:
        raise UsageError(f"--{exc}") from None
    return run_record(
        args.upstream,
        args.listen,
        args.out,
        anonymize=args.anonymize,
        key=args.key,
        console=console,
        limits=limits,
        keep_rejected=args.keep_rejected,
        log=args.log,
    )
