"""`replay probe`: the E1-E5 cache probe on a real server (or the simulator), restarts included."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from replay.commands import print_json
from replay.runs.probe import probe_table, run_cache_probe
from replay.runs.targets import resolve_target
from replay.scenario.spec import parse_params


@dataclass(frozen=True, kw_only=True, slots=True)
class ProbeArgs:
    server: Path | None = None  # target TOML of the server to probe
    target: str | None = None  # 'sim' to probe the simulator instead
    sim_args: str = ""
    scenario: str = "cache-probe"
    params: list[str] = field(default_factory=list)
    out: Path = Path("replay-probe")
    slot: int = 0
    timeout: float = 1800.0
    as_json: bool = False


def probe(args: ProbeArgs, console: Console) -> int:
    """Run, print the per-step table (or JSON); 1 if a step failed. The simulator's disk-KV
    directory lives under `out`, so it outlives the restart like a real server's would."""
    resolved = resolve_target(args.target, args.server, shlex.split(args.sim_args), Path(args.out) / "sim")
    report = run_cache_probe(
        resolved,
        args.out,
        scenario=args.scenario,
        params=parse_params(args.params),
        slot=args.slot,
        timeout_s=args.timeout,
        say=lambda m: console.print(m, highlight=False),
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
