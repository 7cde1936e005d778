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


def record(args: RecordArgs, console: Console) -> int:
    from replay.record.serve import record as run_record

    return run_record(
        args.upstream,
        args.listen,
        args.out,
        anonymize=args.anonymize,
        key=args.key,
        console=console,
        log=args.log,
    )
