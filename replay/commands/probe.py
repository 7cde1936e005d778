"""`replay probe`: the E1-E5 cache probe on a real server (or the simulator), restarts included."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from replay.commands import print_json
from replay.errors import UsageError
from replay.outputs import output_folder
from replay.runs.options import ReplayOptions
from replay.runs.probe import probe_table, run_cache_probe
from replay.runs.targets import resolve_target
from replay.scenario.spec import parse_params

RUNS = Path("replay-probe")  # where the probe makes run-N without --out


@dataclass(frozen=True, kw_only=True, slots=True)
class ProbeArgs:
    server: Path | None = None  # target TOML of the server to probe
    target: str | None = None  # 'sim' to probe the simulator instead
    sim_args: str = ""
    scenario: str = "cache-probe"
    params: list[str] = field(default_factory=list)
    out: Path | None = None  # default: a new replay-probe/run-N
    force: bool = False  # write into an --out folder that is not empty
    slot: int | None = None  # default: the slot holding the document (GET /slots, else the log)
    options: ReplayOptions = ReplayOptions()  # its schedule stays alternate, its history live
    as_json: bool = False


def probe(args: ProbeArgs, console: Console) -> int:
    """Run, print the per-step table (or JSON); 1 if a step failed. The simulator's disk-KV
    directory lives under `out`, so it outlives the restart like a real server's would."""
    args.options.check()  # before any server starts
    if args.slot is not None and args.slot < 0:
        raise UsageError(f"--slot must be a slot number (0 or more), not {args.slot}")
    # With --json, stdout holds the JSON document alone: progress goes to stderr.
    progress = Console(stderr=True) if args.as_json else console
    with output_folder(args.out, RUNS, force=args.force) as out:
        resolved = resolve_target(args.target, args.server, shlex.split(args.sim_args), out / "sim")
        report = run_cache_probe(
            resolved,
            out,
            scenario=args.scenario,
            params=parse_params(args.params),
            slot=args.slot,
            options=args.options,
            say=lambda m: progress.print(m, highlight=False),
        )
    if args.as_json:
        print_json(report.to_dict())
    else:
        console.print(probe_table(report))
        for m in report.metrics:
            for problem in m.get("disagreements") or ():
                console.print(f"[yellow]metrics:[/yellow] {problem}", highlight=False)
        console.print(
            f"results in {report.results}; server logs {', '.join(map(str, report.logs))}", highlight=False
        )
    return 0 if all(s.status == "ok" for s in report.steps) else 1
