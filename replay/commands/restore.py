"""`replay restore`: finish giving the daily service back after a crashed run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console


@dataclass(frozen=True, kw_only=True, slots=True)
class RestoreArgs:
    journal: Path | None = None  # default: the tool's state directory
    dry_run: bool = False


def restore(args: RestoreArgs, console: Console) -> int:
    from drivers.guard import restore_from_journal

    done = restore_from_journal(args.journal, dry_run=args.dry_run, say=console.print)
    return 0 if done.ok else 1
