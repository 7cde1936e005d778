"""`replay k8s render`: the manifests of a sharded run, printed for `kubectl apply -f -`."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from replay import __version__
from replay.errors import UsageError
from replay.outputs import check_file, write_text
from replay.runs.k8s import ShardedRun, collect_commands, manifests, to_yaml, warnings


@dataclass(frozen=True, kw_only=True)
class RenderOptions:
    trace: Path
    shards: int
    target: str
    name: str = "agent-replay"
    image: str = f"agent-replay:{__version__}"
    workers: int = 1
    namespace: str | None = None
    start_at: str | None = None  # ISO 8601; default: now + start_in
    start_in: float = 120.0  # seconds from now, time for the pods to be scheduled and pull the image
    trace_claim: str | None = None
    results_claim: str | None = None
    storage_class: str | None = None
    fail_on_errors: bool = False
    run_args: tuple[str, ...] = ()
    out: Path | None = None
    force: bool = False  # replace an existing --out (once the manifests are complete)


def render(options: RenderOptions, console: Console) -> int:
    """Print (or write) the manifests; tell on stderr how to apply them and collect the results."""
    if options.out is not None:
        check_file(options.out, option="--out", force=options.force, inputs=[options.trace])
    start_at = options.start_at or _in_seconds(options.start_in)
    run = ShardedRun(
        name=options.name,
        trace=options.trace,
        shards=options.shards,
        target=options.target,
        start_at=start_at,
        image=options.image,
        workers=options.workers,
        namespace=options.namespace,
        trace_claim=options.trace_claim,
        results_claim=options.results_claim,
        storage_class=options.storage_class,
        fail_on_errors=options.fail_on_errors,
        run_args=options.run_args,
    )
    text = to_yaml(manifests(run))
    for line in warnings(run):
        console.print(f"[yellow]warning:[/yellow] {line}", highlight=False, soft_wrap=True)
    if options.out is None:
        print(text, end="")
    else:
        write_text(options.out, text)
    where = str(options.out) if options.out else "-"
    console.print(
        f"{options.shards} shards start together at {start_at}. Apply with: kubectl apply -f {where}",
        highlight=False,
    )
    console.print(
        "Then wait for the Job, collect and merge, and remove every object applied:\n  "
        + "\n  ".join(collect_commands(run)),
        highlight=False,
        markup=False,  # the wait's jsonpath filter is in square brackets
        soft_wrap=True,
    )
    return 0


def _in_seconds(seconds: float) -> str:
    if seconds < 0:
        raise UsageError("--start-in must not be negative")
    moment = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)
    return moment.replace(microsecond=0).isoformat().replace("+00:00", "Z")
