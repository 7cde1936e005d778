"""`replay twin`: the cache model checked request by request against a real server."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import orjson
from rich.console import Console

from drivers.target import load_target
from replay.commands import print_json
from replay.errors import UsageError
from replay.outputs import output_folder, write_text
from replay.runs.twin import twin_live, twin_offline
from replay.twin.compare import render, twin_path

RUNS = Path("replay-twin")  # where the twin makes run-N without --out


@dataclass(frozen=True, kw_only=True, slots=True)
class TwinArgs:
    source: Path  # a trace (with --server) or a results file (with --log)
    server: Path | None = None
    log: Path | None = None
    out: Path | None = None
    min_agreement: float | None = None
    timeout: float = 600.0
    as_json: bool = False
    force: bool = False


def twin(args: TwinArgs, console: Console) -> int:
    """Run (or read) both sides, print the rows and the agreement; 1 below --min-agreement."""
    if (args.server is None) == (args.log is None):
        raise UsageError(
            "give --server SERVER.toml (run the trace live) or --log SERVER.log (a results file)"
        )
    if args.min_agreement is not None and not 0.0 <= args.min_agreement <= 1.0:
        raise UsageError(f"--min-agreement must be within 0..1, not {args.min_agreement}")
    if not args.source.is_file():
        raise UsageError(f"{args.source}: no such file")
    progress = Console(stderr=True) if args.as_json else console

    def say(m: str) -> None:
        progress.print(m, highlight=False, soft_wrap=True)

    if args.server is not None:
        target = load_target(args.server)
        with output_folder(args.out, RUNS, force=args.force) as folder:
            doc, results = twin_live(target, args.source, folder, args.timeout, say)
    else:
        assert args.log is not None
        if not args.log.is_file():
            raise UsageError(f"{args.log}: no such file")
        with output_folder(args.out, RUNS, force=args.force) as folder:
            doc = twin_offline(args.source, args.log, folder, args.timeout, say)
        results = args.source
    path = twin_path(results)
    write_text(path, orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
    if args.as_json:
        print_json(doc)
    else:
        for line in render(doc):
            console.print(line, highlight=False, soft_wrap=True, markup=False)
        console.print(f"twin written to {path}", highlight=False)
    if args.min_agreement is not None and doc["agreement"] < args.min_agreement:
        say(f"agreement {doc['agreement']:.3f} is below --min-agreement {args.min_agreement}")
        return 1
    return 0
