"""The `replay` command line: parses options into each verb's options object (`replay.commands`)
and calls the verb; holds no logic."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar, cast

import typer
from rich.console import Console

from replay.engine.defaults import AB_HISTORY, SCENARIO_TIMEOUT_S
from replay.errors import ReplayError
from replay.runs.options import ReplayOptions

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Record LLM agent traffic and replay many conversations against an inference server.",
)
# Output to a file or a pipe gets room for the wide tables (a sweep has 13 columns) instead of
# rich's 80-column default; a terminal, or COLUMNS, sets the width as usual.
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 200)
err = Console(stderr=True)
Verb = TypeVar("Verb", bound=Callable[..., Any])
# Every command that writes a user's file refuses to replace one without it (`replay.outputs`).
Verbose = Annotated[
    bool, typer.Option("--verbose", "-v", help="Add the modelling notes and every detail table.")
]
Force = Annotated[
    bool,
    typer.Option(
        "--force", help="Replace an existing output file, or write into a folder that is not empty."
    ),
]


@app.command()
def validate(
    trace: Annotated[Path, typer.Argument(help="Trace file (JSONL).")],
    ctx: Annotated[
        str | None,
        typer.Option(
            metavar="TOKENS",
            help="The server's context, e.g. 131072: a prompt past it fails the check "
            "(default: warn past the default model's 262,144).",
        ),
    ] = None,
) -> None:
    """Check a trace; report `file:line: problem` for the first bad line."""
    from replay.commands.trace import ValidateArgs, validate

    raise typer.Exit(validate(ValidateArgs(trace=trace, ctx=ctx), console))


# `replay run --help` in panels: what to replay against, how to schedule it, what to send, how to
# spread the client, where the results go.
SERVER, SCHEDULE, REQUESTS, CLIENT, OUTPUT = "Server", "Schedule", "Requests", "Client", "Output"

# The options of a replay, each declared once; `ReplayOptions` has a field of each name and gives
# its default. `replay_options` adds them to a verb (run, ab, probe, scenario run).
PlanOption = Annotated[
    str, typer.Option(help="alternate | overlap | timed | closed-loop", rich_help_panel=SCHEDULE)
]
ConcurrencyOption = Annotated[
    int | None,
    typer.Option(help="In flight: overlap's, timed's cap; all workers' total.", rich_help_panel=SCHEDULE),
]
SpeedOption = Annotated[
    float, typer.Option(help="Time scale of timed and closed-loop.", rich_help_panel=SCHEDULE)
]
RoundRobinOption = Annotated[
    bool, typer.Option(help="alternate: sessions take turns.", rich_help_panel=SCHEDULE)
]
ApiOption = Annotated[
    str | None,
    typer.Option(
        help="openai | anthropic | openai-responses (default: the session's).", rich_help_panel=REQUESTS
    ),
]
ModelOption = Annotated[
    str | None, typer.Option(help="Model name to send (default: the session's).", rich_help_panel=REQUESTS)
]
HistoryOption = Annotated[
    str, typer.Option(help="live: splice the replies; recorded: resend.", rich_help_panel=REQUESTS)
]
ThinkOption = Annotated[
    str, typer.Option(help="off | on | auto (no thinking switch).", rich_help_panel=REQUESTS)
]
TimeoutOption = Annotated[float, typer.Option(help="Per request, seconds.", rich_help_panel=REQUESTS)]
MaxDurationOption = Annotated[
    float | None, typer.Option(help="Stop the run after this many seconds.", rich_help_panel=SCHEDULE)
]
LoopOption = Annotated[
    str, typer.Option(help="auto (asyncio) | asyncio | uvloop (faster).", rich_help_panel=CLIENT)
]
ConnectionsOption = Annotated[
    str, typer.Option(help="auto (as the server) | reuse | fresh (one a request).", rich_help_panel=CLIENT)
]
# A verb's `options` parameter's default, never used: `replay_options` puts the options in its place.
REPLAY_DEFAULTS = ReplayOptions()
REPLAY_OPTIONS: dict[str, Any] = {
    "plan": PlanOption,
    "concurrency": ConcurrencyOption,
    "speed": SpeedOption,
    "round_robin": RoundRobinOption,
    "api": ApiOption,
    "model": ModelOption,
    "history": HistoryOption,
    "think": ThinkOption,
    "timeout": TimeoutOption,
    "max_duration": MaxDurationOption,
    "loop": LoopOption,
    "connections": ConnectionsOption,
}

# The ones every replaying verb takes: how the client sends, whatever the schedule. A verb whose
# schedule is its own (the probe's restarts, a scenario's spec) takes these alone.
CLIENT_OPTIONS = ("api", "model", "timeout", "max_duration", "loop", "connections")


def replay_options(*names: str, **defaults: Any) -> Callable[[Verb], Verb]:
    """Give a verb the replay options `names` (all of them when none is named) in place of its
    `options: ReplayOptions` parameter: each as `REPLAY_OPTIONS` declares it, with `ReplayOptions`'
    default unless `defaults` gives the verb's own. The verb receives them as one `ReplayOptions`."""
    chosen = names or tuple(REPLAY_OPTIONS)
    field_defaults = {f.name: f.default for f in dataclasses.fields(ReplayOptions)}

    def wrap(verb: Verb) -> Verb:
        signature = inspect.signature(verb, eval_str=True)
        added = [
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                annotation=REPLAY_OPTIONS[name],
                default=defaults.get(name, field_defaults[name]),
            )
            for name in chosen
        ]
        params: list[inspect.Parameter] = []
        for param in signature.parameters.values():
            if param.name == "options":
                params += added
            else:
                params.append(param.replace(kind=inspect.Parameter.KEYWORD_ONLY))

        @functools.wraps(verb)
        def parsed(**given: Any) -> Any:
            options = ReplayOptions(**{name: given.pop(name) for name in chosen})
            return verb(options=options, **given)

        parsed.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        parsed.__annotations__ = {p.name: p.annotation for p in params}
        return cast(Verb, parsed)

    return wrap


@app.command()
@replay_options()
def run(
    trace: Annotated[Path, typer.Argument(help="Trace file (JSONL).")],
    target: Annotated[
        str | None,
        typer.Option(
            help="URL, URL1,URL2,... (see --routing) or sim[:preset] (default); sim:llama plays llama-server.",
            rich_help_panel=SERVER,
        ),
    ] = None,
    routing: Annotated[
        str | None,
        typer.Option(
            help="Over several targets: sticky (default) | round-robin | least.",
            rich_help_panel=SERVER,
        ),
    ] = None,
    session_header: Annotated[
        str | None,
        typer.Option(
            metavar="NAME",
            help="Header with a session's stable affinity value, e.g. X-Session-ID.",
            rich_help_panel=REQUESTS,
        ),
    ] = None,
    session_field: Annotated[
        str | None,
        typer.Option(
            metavar="NAME",
            help="The same value in this body field.",
            rich_help_panel=REQUESTS,
        ),
    ] = None,
    server: Annotated[
        Path | None,
        typer.Option(help="Target TOML (the tool starts it).", rich_help_panel=SERVER),
    ] = None,
    service: Annotated[
        Path | None,
        typer.Option(help="Daily service TOML, stopped for the run.", rich_help_panel=SERVER),
    ] = None,
    workdir: Annotated[
        Path | None, typer.Option(help="Started servers' logs and caches.", rich_help_panel=SERVER)
    ] = None,
    dry_run: Annotated[
        bool, typer.Option(help="Say what the run would do; do none.", rich_help_panel=SERVER)
    ] = False,
    out: Annotated[
        Path, typer.Option(help="Results (JSONL), as requests finish.", rich_help_panel=OUTPUT)
    ] = Path("results.jsonl"),
    options: ReplayOptions = REPLAY_DEFAULTS,  # in its place: the replay options (`replay_options`)
    sim_args: Annotated[
        str,
        typer.Option("--sim-args", help="Simulator flags, as '-c 65536'.", rich_help_panel=SERVER),
    ] = "",
    workers: Annotated[
        int, typer.Option(help="Processes the sessions are spread over.", rich_help_panel=CLIENT)
    ] = 1,
    shard: Annotated[
        str | None,
        typer.Option(help="Shard i/N of the sessions (auto/N: k8s).", rich_help_panel=CLIENT),
    ] = None,
    start_at: Annotated[
        str | None,
        typer.Option(
            metavar="TIME", help="Begin at this ISO 8601 instant (shards).", rich_help_panel=SCHEDULE
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option(help="No progress, no report.", rich_help_panel=OUTPUT)] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Replace an existing --out.", rich_help_panel=OUTPUT)
    ] = False,
    fail_on_errors: Annotated[
        bool,
        typer.Option(
            help="Exit 1 if a request failed (the --no- form: 0 once the run finished).",
            rich_help_panel=OUTPUT,
        ),
    ] = True,
) -> None:
    """Replay a trace against a server and write per-request results."""
    from replay.commands.run import RunArgs
    from replay.commands.run import run as replay_run

    args = RunArgs(
        trace=trace,
        options=options,
        target=target,
        routing=routing,
        session_header=session_header,
        session_field=session_field,
        server=server,
        service=service,
        workdir=workdir,
        dry_run=dry_run,
        out=out,
        sim_args=sim_args,
        workers=workers,
        shard=shard,
        start_at=start_at,
        quiet=quiet,
        force=force,
        fail_on_errors=fail_on_errors,
    )
    raise typer.Exit(replay_run(args, console))


@app.command()
def report(
    results: Annotated[list[Path], typer.Argument(help="Results files: each is a run, shown side by side.")],
    json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    html: Annotated[
        Path | None,
        typer.Option(help="Also write a self-contained HTML report (and summary.md) into this directory."),
    ] = None,
    merge: Annotated[
        bool, typer.Option(help="Pool the files into one table (the shards or parts of one run).")
    ] = False,
    force: Force = False,
    verbose: Verbose = False,
) -> None:
    """Per-switch-class table (TTFT percentiles, re-processed and cached tokens, errors)."""
    from replay.commands.report import ReportArgs
    from replay.commands.report import report as replay_report

    args = ReportArgs(results=results, as_json=json, html=html, force=force, merge=merge, verbose=verbose)
    raise typer.Exit(replay_report(args, console))


@app.command()
def restore(
    journal: Annotated[
        Path | None, typer.Option(help="Journal file (default: the tool's state directory).")
    ] = None,
    dry_run: Annotated[bool, typer.Option(help="Print the actions; take none.")] = False,
    service: Annotated[
        Path | None, typer.Option(help="Daily-service TOML of the run: its journal, in its state_dir.")
    ] = None,
) -> None:
    """Finish giving the daily service back after a run that crashed (e.g. kill -9)."""
    from replay.commands.restore import RestoreArgs
    from replay.commands.restore import restore as replay_restore

    raise typer.Exit(replay_restore(RestoreArgs(journal=journal, dry_run=dry_run, service=service), console))


@app.command()
@replay_options(history=AB_HISTORY)
def ab(
    trace: Annotated[Path, typer.Argument(help="Trace file (JSONL).")],
    a: Annotated[Path, typer.Option("--a", help="Target TOML of build A.")],
    b: Annotated[Path, typer.Option("--b", help="Target TOML of build B.")],
    repeat: Annotated[
        int, typer.Option(help="Blocks of A B B A (2, the default, gives 8 runs; 1 is still A B B A).")
    ] = 2,
    out_dir: Annotated[
        Path | None, typer.Option(help="Where results, logs and ab.json go (must be empty).")
    ] = None,
    options: ReplayOptions = REPLAY_DEFAULTS,  # in its place: the replay options (`replay_options`)
    reuse_cache: Annotated[bool, typer.Option(help="One disk cache per arm, kept across its runs.")] = False,
    keep_cache: Annotated[bool, typer.Option(help="Keep each run's disk cache after it.")] = False,
    service: Annotated[
        Path | None, typer.Option(help="Daily-service TOML: stopped once for the whole A/B.")
    ] = None,
    json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    allow_identical: Annotated[
        bool, typer.Option(help="Run arms with no difference (an A/A noise check) instead of refusing.")
    ] = False,
    confidence: Annotated[float, typer.Option(help="Confidence of the B/A intervals.")] = 0.95,
    a_ref: Annotated[
        str | None, typer.Option(help="Git ref for arm A: built in its own worktree of A's checkout.")
    ] = None,
    b_ref: Annotated[str | None, typer.Option(help="Git ref for arm B (see --a-ref).")] = None,
    verbose: Verbose = False,
) -> None:
    """A/B two server builds on the same trace, A B B A, with a verdict from B/A intervals.

    History is recorded by default: both arms get the same prompts (live: each arm's own replies
    go back into its history; where they differ, later prompts differ too)."""
    from replay.commands.ab import AbArgs
    from replay.commands.ab import ab as replay_ab

    args = AbArgs(
        trace=trace,
        a=a,
        b=b,
        options=options,
        repeat=repeat,
        out_dir=out_dir,
        reuse_cache=reuse_cache,
        keep_cache=keep_cache,
        service=service,
        as_json=json,
        allow_identical=allow_identical,
        confidence=confidence,
        a_ref=a_ref,
        verbose=verbose,
        b_ref=b_ref,
    )
    raise typer.Exit(replay_ab(args, console))


sim_app = typer.Typer(
    no_args_is_help=True,
    help="The embedded simulator of ds4-server's cache policy (or llama-server's: --server llama).",
)
app.add_typer(sim_app, name="sim")


@sim_app.command(
    "serve",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
def sim_serve(ctx: typer.Context) -> None:
    """Serve the simulator on 127.0.0.1 (ds4's flags, or llama-server's with --server llama; --help lists them)."""
    from replay.commands.sim import SimServeArgs, serve

    raise typer.Exit(serve(SimServeArgs(argv=list(ctx.args))))


size_app = typer.Typer(no_args_is_help=True, help="How big must the disk KV budget be?")
app.add_typer(size_app, name="size")


@size_app.command("chain")
def size_chain(
    tokens: Annotated[str, typer.Option(help="Conversation length read from scratch, e.g. 77K.")],
    start: Annotated[str, typer.Option(help="Tokens restored before reading, e.g. 14336.")] = "0",
    per_token: Annotated[str | None, typer.Option(help="Checkpoint bytes per token, e.g. 34.5KiB.")] = None,
    fixed: Annotated[str | None, typer.Option(help="Fixed bytes per file, e.g. 22.9MiB.")] = None,
    interval: Annotated[int | None, typer.Option(help="--kv-cache-continued-interval-tokens")] = None,
    chunk: Annotated[
        int | None, typer.Option(help="Prefill chunk (continued saves land on chunk ends).")
    ] = None,
    preset: Annotated[str, typer.Option(help="Model preset: qwen38-q2 | deepseek-v4-flash")] = "qwen38-q2",
    others: Annotated[
        str, typer.Option(help="Other conversations active the same day, e.g. 130K,130K.")
    ] = "",
    anchor: Annotated[int | None, typer.Option(help="Chat anchor position of the cold save.")] = None,
    json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Files and bytes a cold prefill leaves, file by file, and the budget rule."""
    from replay.commands.size import ChainArgs, chain

    args = ChainArgs(
        tokens=tokens,
        start=start,
        per_token=per_token,
        fixed=fixed,
        interval=interval,
        chunk=chunk,
        preset=preset,
        others=others,
        anchor=anchor,
        as_json=json,
    )
    raise typer.Exit(chain(args, console))


@size_app.command("sweep")
def size_sweep(
    trace: Annotated[Path, typer.Argument(help="Trace file (JSONL).")],
    budgets: Annotated[
        str, typer.Option(help="Budgets to try, e.g. 4G,24G,64G.")
    ] = "4G,8G,16G,24G,32G,48G,64G",
    preset: Annotated[str, typer.Option(help="Model preset: qwen38-q2 | deepseek-v4-flash")] = "qwen38-q2",
    plan: Annotated[
        str,
        typer.Option(
            help="How requests are sent, as `replay run --plan`: alternate (= sequential) | overlap | "
            "timed | closed-loop. Under the last three the order depends on modelled time and each "
            "budget walks the event-loop model. auto: a built-in scenario's trace as `scenario run` "
            "replays it (its plan, server flags and earlier day's files), any other alternate."
        ),
    ] = "auto",
    speed: Annotated[
        float,
        typer.Option(help="Trace seconds per modelled second (timed, closed-loop), as `replay run --speed`."),
    ] = 1.0,
    concurrency: Annotated[
        int | None, typer.Option(help="Requests in flight at most (overlap: K, default 2).")
    ] = None,
    round_robin: Annotated[bool, typer.Option(help="alternate: sessions take turns.")] = False,
    think: Annotated[str, typer.Option(help="off | on | auto, as `replay run --think`.")] = "auto",
    sim_args: Annotated[
        str, typer.Option(help="Simulator flags, as `replay run --sim-args` (e.g. '--build sept').")
    ] = "",
    history: Annotated[str, typer.Option(help="live | recorded")] = "live",
    slots: Annotated[str, typer.Option(help="Resident slot counts to try, e.g. 1,2.")] = "1",
    routing: Annotated[str, typer.Option(help="upstream,reuse-aware")] = "upstream",
    target: Annotated[
        str | None,
        typer.Option(metavar="TOKENS", help="Goal: no switch re-reads more than this many tokens, e.g. 20K."),
    ] = None,
    stale: Annotated[
        str | None, typer.Option(help="Earlier days' checkpoints already on disk, e.g. 8.6G.")
    ] = None,
    hidden_reasoning: Annotated[
        bool, typer.Option(help="Replies carry reasoning the client never resends.")
    ] = False,
    ctx: Annotated[
        str | None,
        typer.Option(metavar="TOKENS", help="Context tokens of the model, e.g. 1M (default: the preset's)."),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            help="Processes: one reads and renders the trace, the others split the budgets "
            "(default: one per core for big traces)."
        ),
    ] = None,
    json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    server: Annotated[
        str, typer.Option(help="ds4 | llama: whose cache model to walk (llama: --cache-ram and --np).")
    ] = "ds4",
    cache_ram: Annotated[
        str, typer.Option(help="llama: host prompt cache sizes to try, e.g. 0,2G,8G,16G.")
    ] = "0,2G,8G,16G",
    n_parallel: Annotated[str, typer.Option("--np", help="llama: slot counts to try (-np), e.g. 1,2.")] = "1",
) -> None:
    """Run the cache model offline over a trace for each budget; find the smallest that meets --target."""
    from replay.commands.size import SweepArgs, sweep

    args = SweepArgs(
        trace=trace,
        budgets=budgets,
        preset=preset,
        plan=plan,
        speed=speed,
        concurrency=concurrency,
        round_robin=round_robin,
        think=think,
        sim_args=sim_args,
        history=history,
        slots=slots,
        routing=routing,
        target=target,
        stale=stale,
        hidden_reasoning=hidden_reasoning,
        ctx=ctx,
        workers=workers,
        as_json=json,
        server=server,
        cache_ram=cache_ram,
        n_parallel=n_parallel,
    )
    raise typer.Exit(sweep(args, console))


@app.command()
def demo(
    out: Annotated[
        Path | None,
        typer.Option(
            metavar="DIR",
            help="Folder the traces, results and HTML report go into (default: a new replay-demo/run-N).",
        ),
    ] = None,
    force: Force = False,
) -> None:
    """Replay two agents switching on the simulator at a 4 GB and a 64 GB disk budget, and compare."""
    from replay.commands.demo import DemoArgs
    from replay.commands.demo import demo as replay_demo

    raise typer.Exit(replay_demo(DemoArgs(out=out, force=force), console))


scenario_app = typer.Typer(
    no_args_is_help=True, help="Built-in scenarios: the situations this tool reproduces."
)
app.add_typer(scenario_app, name="scenario")
Params = Annotated[
    list[str] | None, typer.Option("--param", help="Override a spec parameter: k=v (repeatable).")
]


@scenario_app.command("list")
def scenario_list() -> None:
    """The built-in scenarios, one line each."""
    from replay.commands.scenario import list_

    raise typer.Exit(list_(console))


@scenario_app.command("show")
def scenario_show(
    name: Annotated[str, typer.Argument(help="Scenario name or spec file.")],
    param: Params = None,
    inputs: Annotated[
        bool,
        typer.Option(
            "--inputs",
            help="Every input with its value, the report's words or why it is assumed, and how far "
            "each row moves across its plausible range (measured on the model: a minute or so).",
        ),
    ] = False,
    verbose: Verbose = False,
) -> None:
    """What a scenario reproduces, what to look for, the flags it is about, how to run it."""
    from replay.commands.scenario import ShowArgs, show

    raise typer.Exit(show(ShowArgs(name=name, params=param or [], inputs=inputs, verbose=verbose), console))


@scenario_app.command("generate")
def scenario_generate(
    name: Annotated[str, typer.Argument(help="Scenario name or spec file.")],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Trace to write (default NAME.jsonl).")
    ] = None,
    param: Params = None,
    force: Force = False,
) -> None:
    """Write the scenario's trace (deterministic: same spec, same bytes)."""
    from replay.commands.scenario import GenerateArgs, generate

    raise typer.Exit(generate(GenerateArgs(name=name, out=out, params=param or [], force=force), console))


@scenario_app.command("run")
@replay_options(*CLIENT_OPTIONS, timeout=SCENARIO_TIMEOUT_S)
def scenario_run(
    name: Annotated[str, typer.Argument(help="Scenario name or spec file.")],
    out: Annotated[
        Path | None,
        typer.Option(
            metavar="DIR",
            help="Folder the arms' results and the HTML report go into (default: a new replay-scenario/NAME/run-N).",
        ),
    ] = None,
    arm: Annotated[list[str] | None, typer.Option(help="Run only these arms (repeatable).")] = None,
    param: Params = None,
    time_scale: Annotated[float | None, typer.Option(help="Simulator speed-up over modelled time.")] = None,
    options: ReplayOptions = REPLAY_DEFAULTS,  # in its place: the client's options (`replay_options`)
    force: Force = False,
) -> None:
    """Run every arm of a scenario on the simulator, compare them, write the report."""
    from replay.commands.scenario import ScenarioRunArgs
    from replay.commands.scenario import run as replay_scenario

    args = ScenarioRunArgs(
        name=name, out=out, params=param or [], arms=arm, time_scale=time_scale, options=options, force=force
    )
    raise typer.Exit(replay_scenario(args, console))


@scenario_app.command("check")
def scenario_check(
    names: Annotated[
        list[str] | None, typer.Argument(help="Scenarios to check (default: all with expectations).")
    ] = None,
    json: Annotated[bool, typer.Option("--json", help="The verdicts as JSON.")] = False,
    out: Annotated[
        Path | None, typer.Option(metavar="DIR", help="Keep the arms' results in this folder.")
    ] = None,
    force: Force = False,
    verbose: Verbose = False,
) -> None:
    """Run the scenarios' arms and compare each field figure with the modelled one (exit 1 if any
    fails, or if a wall-clock run strays from the walk by more than half a row's tolerance)."""
    from replay.commands.scenario import CheckArgs, check

    raise typer.Exit(
        check(CheckArgs(names=names or [], json=json, out=out, force=force, verbose=verbose), console)
    )


@app.command()
@replay_options(*CLIENT_OPTIONS)
def probe(
    server: Annotated[
        Path | None, typer.Option(help="Target TOML of the server to probe (it is restarted for E5).")
    ] = None,
    target: Annotated[str | None, typer.Option(help="'sim' to probe the simulator instead.")] = None,
    sim_args: Annotated[str, typer.Option("--sim-args", help="Extra simulator flags.")] = "",
    scenario: Annotated[str, typer.Option(help="Probe scenario (name or spec file).")] = "cache-probe",
    param: Params = None,
    out: Annotated[
        Path | None,
        typer.Option(
            metavar="DIR",
            help="Folder the trace, results, slot files and logs go into (default: a new replay-probe/run-N).",
        ),
    ] = None,
    slot: Annotated[
        int | None,
        typer.Option(
            help="Slot to save and restore for E5 (llama-server; default: the one holding the document)."
        ),
    ] = None,
    options: ReplayOptions = REPLAY_DEFAULTS,  # in its place: the client's options (`replay_options`)
    json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    force: Force = False,
) -> None:
    """E1-E5 cache probe on a real server: what it re-reads after small changes, and after a restart."""
    from replay.commands.probe import ProbeArgs
    from replay.commands.probe import probe as replay_probe

    args = ProbeArgs(
        server=server,
        target=target,
        sim_args=sim_args,
        scenario=scenario,
        params=param or [],
        out=out,
        slot=slot,
        options=options,
        as_json=json,
        force=force,
    )
    raise typer.Exit(replay_probe(args, console))


@app.command()
def record(
    upstream: Annotated[str, typer.Option(help="The real server's base URL, e.g. http://127.0.0.1:8000.")],
    out: Annotated[Path, typer.Option(help="Trace file to write (one line per completed request).")],
    listen: Annotated[
        str, typer.Option(help="HOST:PORT the agent talks to instead of the server.")
    ] = "127.0.0.1:8001",
    anonymize: Annotated[
        bool, typer.Option(help="Write synthetic text of the same token counts (needs --key).")
    ] = False,
    key: Annotated[str | None, typer.Option(help="Secret for --anonymize: equal text stays equal.")] = None,
    keep_rejected: Annotated[
        bool,
        typer.Option(
            help="Record requests the upstream refused (HTTP >= 400) in full, not as 'rejected' lines."
        ),
    ] = False,
    max_body: Annotated[
        str, typer.Option(help="Largest request body accepted (413 above), e.g. 64MiB.")
    ] = "64MiB",
    header_timeout: Annotated[
        float, typer.Option(help="Seconds a client has to send a request's headers.")
    ] = 30.0,
    body_timeout: Annotated[
        float, typer.Option(help="Seconds a client has to send a whole request body.")
    ] = 120.0,
    keep_alive_timeout: Annotated[
        float, typer.Option(help="Idle seconds before a connection is closed.")
    ] = 5.0,
    max_connections: Annotated[int, typer.Option(help="Requests served at once (503 beyond).")] = 1024,
    log: Annotated[
        Path | None, typer.Option(help="Append a line per call: method, path, status, bytes, recorded.")
    ] = None,
    force: Force = False,
) -> None:
    """Pass an agent's traffic through to the server unchanged, and write it as a trace."""
    from replay.commands.record import RecordArgs
    from replay.commands.record import record as replay_record

    args = RecordArgs(
        upstream=upstream,
        out=out,
        listen=listen,
        anonymize=anonymize,
        key=key,
        keep_rejected=keep_rejected,
        max_body=max_body,
        header_timeout=header_timeout,
        body_timeout=body_timeout,
        keep_alive_timeout=keep_alive_timeout,
        max_connections=max_connections,
        log=log,
        force=force,
    )
    raise typer.Exit(replay_record(args, console))


@app.command()
def twin(
    source: Annotated[Path, typer.Argument(help="Trace (with --server), or results file (with --log).")],
    server: Annotated[
        Path | None, typer.Option(help="Target TOML of the real llama-server to run the trace on.")
    ] = None,
    log: Annotated[
        Path | None, typer.Option(help="The log of the server that made RESULTS (offline).")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            metavar="DIR", help="Folder for both runs and their logs (default: a new replay-twin/run-N)."
        ),
    ] = None,
    min_agreement: Annotated[
        float | None, typer.Option(help="Exit 1 when the agreement (0..1) is below this.")
    ] = None,
    timeout: Annotated[float, typer.Option(help="Per-request timeout, seconds.")] = 600.0,
    json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    force: Force = False,
) -> None:
    """The cache model against a real server, request by request: where they re-process the same tokens."""
    from replay.commands.twin import TwinArgs
    from replay.commands.twin import twin as replay_twin

    args = TwinArgs(
        source=source,
        server=server,
        log=log,
        out=out,
        min_agreement=min_agreement,
        timeout=timeout,
        as_json=json,
        force=force,
    )
    raise typer.Exit(replay_twin(args, console))


@app.command()
def anonymize(
    src: Annotated[Path, typer.Argument(help="Trace to anonymize.")],
    dst: Annotated[Path, typer.Argument(help="Anonymized trace to write.")],
    key: Annotated[str, typer.Option(help="Secret: equal text stays equal, different stays different.")],
    force: Force = False,
) -> None:
    """Replace every text with synthetic text of the same token count, keeping structure and timing."""
    from replay.commands.trace import AnonymizeArgs
    from replay.commands.trace import anonymize as replay_anonymize

    raise typer.Exit(replay_anonymize(AnonymizeArgs(src=src, dst=dst, key=key, force=force), console))


@app.command("import")
def import_(
    fmt: Annotated[
        str | None,
        typer.Argument(
            help="hermes | opencode | codex | claude-code | mooncake | sharegpt | weka | otel | swe-agent | tracelab"
        ),
    ] = None,
    src: Annotated[
        Path | None, typer.Argument(help="What the agent left: a file, folder or database (see --list).")
    ] = None,
    out: Annotated[Path | None, typer.Argument(help="Trace to write.")] = None,
    since: Annotated[
        str | None, typer.Option(help="Leave out requests sent before this time (ISO 8601, local time).")
    ] = None,
    until: Annotated[str | None, typer.Option(help="Leave out requests sent at or after this time.")] = None,
    session: Annotated[
        list[str] | None,
        typer.Option(help="Keep only sessions whose agent id starts with this (repeatable)."),
    ] = None,
    shared_system: Annotated[
        bool, typer.Option(help="Claude Code: one stand-in system prompt for all sessions of a kind.")
    ] = False,
    gap_cap: Annotated[
        float | None,
        typer.Option(
            help="Public corpora (weka, otel, swe-agent, tracelab): cap think/tool gaps at this many seconds."
        ),
    ] = None,
    list_: Annotated[
        bool, typer.Option("--list", help="Show each format and where each agent keeps its files.")
    ] = False,
    force: Force = False,
) -> None:
    """Turn what an agent left on disk (or another tool's traces) into a replayable trace."""
    from replay.commands.trace import ImportArgs, import_trace

    args = ImportArgs(
        fmt=fmt,
        src=src,
        out=out,
        since=since,
        until=until,
        sessions=tuple(session or ()),
        shared_system=shared_system,
        gap_cap=gap_cap,
        list_formats=list_,
        force=force,
    )
    raise typer.Exit(import_trace(args, console))


@app.command("export")
def export(
    fmt: Annotated[str, typer.Argument(help="mooncake")],
    src: Annotated[Path, typer.Argument(help="Trace to export.")],
    out: Annotated[Path, typer.Argument(help="File to write.")],
    force: Force = False,
) -> None:
    """Write a trace in another tool's format (Mooncake: for AIPerf and SGLang)."""
    from replay.commands.trace import ExportArgs, export_trace

    raise typer.Exit(export_trace(ExportArgs(fmt=fmt, src=src, out=out, force=force), console))


llama_app = typer.Typer(no_args_is_help=True, help="A real llama.cpp server as a target: tiny test models.")
app.add_typer(llama_app, name="llama")


@llama_app.command("make-model")
def llama_make_model(
    path: Annotated[Path, typer.Argument(help="Where to write the GGUF file.")],
    layers: Annotated[int, typer.Option(help="Transformer layers.")] = 2,
    dim: Annotated[int, typer.Option(help="Hidden size.")] = 64,
    arch: Annotated[str, typer.Option(help="llama | gemma2 (sliding window: context checkpoints)")] = "llama",
    swa: Annotated[int, typer.Option(help="gemma2 sliding-window size.")] = 256,
    ctx: Annotated[int, typer.Option(help="Training context length.")] = 16384,
    seed: Annotated[int, typer.Option(help="Weights seed; same arguments give the same bytes.")] = 0,
    slow: Annotated[bool, typer.Option(help="8 layers x 512 dims: a cache miss costs seconds.")] = False,
    force: Force = False,
) -> None:
    """Write a random-weight GGUF whose output is printable and always runs to max_tokens."""
    from replay.commands.llama import MakeModelArgs, make_model

    args = MakeModelArgs(
        path=path, layers=layers, dim=dim, arch=arch, swa=swa, ctx=ctx, seed=seed, slow=slow, force=force
    )
    raise typer.Exit(make_model(args, console))


logs_app = typer.Typer(no_args_is_help=True, help="Server logs: the figures people compute by hand.")
app.add_typer(logs_app, name="logs")


@logs_app.command("summary")
def logs_summary(
    logs: Annotated[list[Path], typer.Argument(help="Server log files (ds4-server or llama-server).")],
    json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    kind: Annotated[str, typer.Option(help="auto | ds4 | llamacpp")] = "auto",
    year: Annotated[int | None, typer.Option(help="Year of ds4's year-less timestamps.")] = None,
) -> None:
    """Requests, finish reasons, continuation rate, restores, stores, evictions, decode by depth."""
    from replay.commands.report import LogsSummaryArgs, logs_summary

    raise typer.Exit(logs_summary(LogsSummaryArgs(logs=logs, kind=kind, year=year, as_json=json), console))


k8s_app = typer.Typer(no_args_is_help=True, help="More than one client host: a Kubernetes Indexed Job.")
app.add_typer(k8s_app, name="k8s")


@k8s_app.command("render")
def k8s_render(
    trace: Annotated[Path, typer.Argument(metavar="TRACE", help="Trace file the shards replay.")],
    shards: Annotated[int, typer.Option(metavar="N", help="Client pods; each replays shard i/N.")],
    target: Annotated[str, typer.Option(metavar="URL", help="The inference server as the pods reach it.")],
    name: Annotated[str, typer.Option(help="Job name; also names its ConfigMap, claim and collector.")] = (
        "agent-replay"
    ),
    image: Annotated[str | None, typer.Option(help="The agent-replay image (see Containerfile).")] = None,
    workers: Annotated[int, typer.Option(metavar="M", help="Processes per pod; sizes its CPU request.")] = 1,
    namespace: Annotated[str | None, typer.Option(help="Namespace of every object.")] = None,
    start_at: Annotated[
        str | None, typer.Option(metavar="TIME", help="ISO 8601 instant all shards start at.")
    ] = None,
    start_in: Annotated[
        float, typer.Option(metavar="S", help="Without --start-at: start this many seconds from now.")
    ] = 120.0,
    trace_claim: Annotated[
        str | None, typer.Option(metavar="PVC", help="A claim holding the trace (over 1 MB).")
    ] = None,
    results_claim: Annotated[
        str | None, typer.Option(metavar="PVC", help="A ReadWriteMany claim for results (default: made).")
    ] = None,
    storage_class: Annotated[
        str | None,
        typer.Option(
            metavar="CLASS", help="Storage class of the results claim made (one that gives ReadWriteMany)."
        ),
    ] = None,
    fail_on_errors: Annotated[
        bool,
        typer.Option(help="A shard whose requests partly failed fails its index (default: it is a result)."),
    ] = False,
    run_arg: Annotated[
        list[str] | None, typer.Option(metavar="ARG", help="More `replay run` arguments, one per option.")
    ] = None,
    out: Annotated[Path | None, typer.Option(metavar="FILE", help="Write here instead of stdout.")] = None,
    force: Force = False,
) -> None:
    """Manifests for a run sharded over N pods (an Indexed Job), for `kubectl apply -f -`."""
    from replay.commands.k8s import RenderOptions, render

    options = RenderOptions(
        trace=trace,
        shards=shards,
        target=target,
        name=name,
        workers=workers,
        namespace=namespace,
        start_at=start_at,
        start_in=start_in,
        trace_claim=trace_claim,
        results_claim=results_claim,
        storage_class=storage_class,
        fail_on_errors=fail_on_errors,
        run_args=tuple(run_arg or ()),
        out=out,
        force=force,
        **({"image": image} if image else {}),
    )
    raise typer.Exit(render(options, err))


# What `--help` shows for each kind of value, by parameter name: one table for every verb instead
# of a metavar written on each of ~130 options. Names not listed fall back by type (`_metavar`).
METAVARS = {
    "trace": "TRACE",
    "traces": "TRACE...",
    "results": "RESULTS...",
    "logs": "LOG...",
    "target": "URL|sim[:PRESET]",
    "upstream": "URL",
    "url": "URL",
    "listen": "HOST:PORT",
    "name": "NAME",
    "model": "NAME",
    "image": "IMAGE",
    "key": "SECRET",
    "shard": "i/N|auto/N",
    "start_at": "TIME",
    "budgets": "SIZES",
    "sim_args": "FLAGS",
    "loop": "MODE",
    "connections": "MODE",
    "max_body": "SIZE",
    "tokens": "TOKENS",
    "start": "TOKENS",
    "param": "KEY=VALUE",
    "arm": "ARM",
    "api": "API",
    "plan": "PLAN",
    "history": "MODE",
    "think": "MODE",
    "kind": "KIND",
    "preset": "PRESET",
    "format": "FORMAT",
    "namespace": "NAMESPACE",
}


def _metavar(param: Any) -> str | None:
    """The placeholder people read: TRACE, FILE, DIR, URL, N, S; None for a flag (no value).
    Typer ships its own copy of click, so parameters are read by their attributes."""
    if getattr(param, "is_flag", False):
        return None
    name = param.name or ""
    if name in METAVARS:
        return METAVARS[name]
    kind = getattr(getattr(param, "type", None), "name", "")
    many = "..." if param.nargs != 1 or getattr(param, "multiple", False) else ""
    if kind == "path":
        folder = name.endswith("dir") or (param.type.dir_okay and not param.type.file_okay)
        return ("DIR" if folder else "FILE") + many
    if kind == "integer":
        return "N" + many
    if kind == "float":
        return "S" if any(w in name for w in ("timeout", "duration", "delay", "_in", "time")) else "X"
    return name.upper().replace("_", "-") + many or None


def command() -> Any:
    """The click command tree with readable metavars on every value-taking parameter."""
    root = typer.main.get_command(app)
    stack = [root]
    while stack:
        cmd = stack.pop()
        stack.extend(getattr(cmd, "commands", {}).values())
        for param in cmd.params:
            if param.metavar is None and (shown := _metavar(param)) is not None:
                param.metavar = shown
            if getattr(param, "is_flag", False) and param.default is False:
                param.secondary_opts = []  # a flag is off unless given: no `--no-dry-run` twin,
                param.show_default = False  # and no `[default: no-dry-run]`
    return root


def main() -> None:
    """Run the CLI; a ReplayError from any command is one line on stderr and its exit code."""
    try:
        command()(prog_name="replay")
    except ReplayError as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
