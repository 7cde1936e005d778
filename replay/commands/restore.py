"""`replay restore`: finish giving the daily service back after a crashed run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from replay.errors import UsageError


@dataclass(frozen=True, kw_only=True, slots=True)
class RestoreArgs:
    journal: Path | None = None  # default: the tool's state directory
    dry_run: bool = False
    service: Path | None = None  # the run's service TOML: its journal sits in its own state_dir


def restore(args: RestoreArgs, console: Console) -> int:
    from drivers.guard import load_guard_config, restore_from_journal

    journal = args.journal
    if args.service is not None:
        if journal is not None:
            raise UsageError("give --journal or --service, not both")
        journal = load_guard_config(args.service).journal_path  # its own state_dir, if it names one
    done = restore_from_journal(journal, dry_run=args.dry_run, say=console.print)
    return 0 if done.ok else 1
