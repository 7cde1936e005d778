"""The text of `replay scenario list` and `replay scenario show NAME`."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.markdown import Markdown
from rich.table import Table

from replay.scenario.build import plan_requests
from replay.scenario.spec import Arm, Scenario, Step


def arm_sim_flags(arm: Arm, time_scale: float, clock: str | None = None) -> list[str]:
    """The arm's simulator flags with the time scale (an arm's own `--time-scale` wins) and the
    report's clock at the first request, so the simulator's log reads in the report's own hours."""
    flags = list(arm.sim)
    if "--time-scale" not in flags:
        flags += ["--time-scale", f"{time_scale:g}"]
    if clock is not None and "--clock" not in flags:
        flags += ["--clock", clock]
    return flags


def run_command_line(spec: Scenario, arm: Arm, trace: str = "TRACE.jsonl") -> str:
    """The `replay run` command line that replays one arm by hand (shown by `scenario show`)."""
    flags = arm_sim_flags(arm, spec.run.time_scale)
    fleet = arm.fleet
    if fleet is None:
        parts = ["replay run", trace, "--target sim", f"--plan {spec.run.plan}"]
    elif fleet.router is not None:  # the files `scenario run` writes for it
        parts = ["replay run", trace, "--server router.toml", f"--plan {spec.run.plan}"]
    else:
        parts = ["replay run", trace, "--server sims.toml", f"--routing {fleet.routing}"]
        parts.append(f"--plan {spec.run.plan}")
    if spec.run.concurrency:
        parts.append(f"--concurrency {spec.run.concurrency}")
    if spec.run.round_robin:
        parts.append("--round-robin")
    if spec.run.think != "off":
        parts.append(f"--think {spec.run.think}")
    if spec.run.plan in ("timed", "closed-loop"):
        parts.append(f"--speed {spec.run.time_scale:g}")
    if fleet is None:
        parts.append(f"--sim-args '{' '.join(flags)}'")
        return " ".join(parts)
    sims = f"sims.toml: kind = 'sim', replicas = {fleet.replicas}, flags = {flags}"
    if fleet.router is not None:
        sims = (
            f"router.toml: kind = 'sglang-router', policy = '{fleet.router}', backend = 'sims.toml'; " + sims
        )
    return " ".join(parts) + f"  ({sims})"


def list_table(scenarios: list[Scenario]) -> Table:
    table = Table(title="Built-in scenarios (replay scenario show NAME)", title_justify="left")
    table.add_column("name", no_wrap=True)
    table.add_column("what it reproduces")
    table.add_column("arms", no_wrap=True)
    for s in scenarios:
        table.add_row(s.name, s.title, ", ".join(a.name for a in s.arms))
    return table


def _sessions(spec: Scenario) -> list[str]:
    lines = []
    for s in spec.sessions.values():
        if s.document_tokens:
            size = f"a {s.document_tokens:,}-token document in {s.paragraphs} paragraphs"
        else:
            size = (
                f"starts at {s.start_tokens:,} tokens"
                if s.start_tokens
                else f"starts with a {s.task_tokens:,}-token task"
            )
        system = {
            "shared": f"shared {spec.system_tokens:,}-token system prompt",
            "own": f"own {s.system_tokens:,}-token system prompt",
            "none": "no system prompt",
        }[s.system]
        reply = "tool-call replies" if s.reply == "tool" else "plain-text replies"
        lines.append(f"- `{s.id}` ({s.role}): {size}, {system}, {reply} of {s.reply_tokens} tokens")
    return lines


def _turns(step: Step) -> str:
    """`main x10 to 126,000, fin1 x8 to 60,000`: each session's share of a turn step."""
    parts = []
    for sid in step.sessions:
        text = sid + (f" x{step.repeat[sid]}" if step.repeat[sid] != 1 and not step.until[sid] else "")
        if step.grow[sid]:
            text += f" +{step.grow[sid]:,} per turn"
        if step.grow_to[sid]:
            text += f" to {step.grow_to[sid]:,}"
        if step.until[sid]:
            text += f" until {step.until[sid]:,}"
        parts.append(text)
    if step.order == "parallel":
        parts.append("side by side")
    return ", ".join(parts)


def _steps(spec: Scenario) -> list[str]:
    lines = []
    for i, step in enumerate(spec.steps, 1):
        detail = _turns(step) if step.op == "turn" else f"{step.op} {'+'.join(step.sessions)}"
        if step.op == "compaction":
            detail += f": keep {step.keep_messages} messages, ~{step.keep_tokens:,} tokens"
        if step.restart:
            detail += ", after a server restart (tag 'probe': needs a driver)"
        if step.when:
            detail += f" (only when {step.when})"
        lines.append(f"{i}. {step.label or step.op}: {detail}")
    return lines


def describe(spec: Scenario, verbose: bool = False) -> RenderableType:
    """What `show` prints: what it reproduces, what to look for, the flags, the workload, the arms
    and how to run it; `verbose` adds the modelling notes, the expected outcome, every field figure
    with its known gap, the leftover files and one `replay run` line per arm."""
    planned = plan_requests(spec)
    md = [
        f"# {spec.name}: {spec.title}",
        "",
        "## Reproduces",
        spec.reproduces or "-",
        "",
        "## What to look for",
        spec.look_for or "-",
    ]
    if verbose:
        md += ["", "## Expected on the simulator", spec.expected or "-"]
    md += [
        "",
        "## Server flags it is about",
        *(f"- {flag}" for flag in spec.server_flags),
        "",
        f"## Workload ({len(planned)} requests, plan `{spec.run.plan}`)",
        *_sessions(spec),
        "",
        *_steps(spec),
    ]
    if verbose and spec.notes:
        md += ["", spec.notes]
    if spec.params:
        md += [
            "",
            "Parameters (`--param NAME=VALUE`): " + ", ".join(f"`{k}={v}`" for k, v in spec.params.items()),
        ]
    md += ["", "## Arms (simulator flags)"]
    for arm in spec.arms:
        extra = f"; params {arm.params}" if arm.params else ""
        md.append(f"- **{arm.name}**: {arm.about or '-'} (`{' '.join(arm.sim) or 'defaults'}`{extra})")
    if spec.expects and verbose:
        md += ["", f"## Field figures (`replay scenario check {spec.name}`)"]
        for e in spec.expects:
            gap = f" (known gap: {e.gap})" if e.gap else ""
            md.append(f"- {e.arm}, {e.selection}: {e.about or e.metric} = {e.field} [{e.source}]{gap}")
    if spec.leftovers and verbose:
        md += ["", "## On disk at the start (an earlier day's files)"]
        for row in spec.leftovers:
            what = (
                "the shared system prefix"
                if row.what == "system-prefix"
                else f"{row.gib:g} GiB of other files"
            )
            md.append(f"- {what}: {row.hits} hits, last used {row.age_h:g} h before")
    md += ["", "## Run it", "```", f"replay scenario run {spec.name}"]
    if verbose:
        md += ["```", "or by hand, one arm at a time:", "```"]
        md.append(f"replay scenario generate {spec.name} -o {spec.name}.jsonl")
        for arm in spec.arms:
            md.append(
                run_command_line(spec, arm, f"{spec.name}.jsonl").replace(
                    "replay run", f"replay run --out {spec.name}-{arm.name}.jsonl", 1
                )
            )
        md.append(
            f"replay report {' '.join(f'{spec.name}-{a.name}.jsonl' for a in spec.arms)} --html {spec.name}-report/"
        )
    md.append("```")
    if verbose and any(a.params for a in spec.arms):
        md.append("(arms with params need their own trace: add `--param NAME=VALUE` to `generate`.)")
    if not verbose:
        more = []
        if spec.expects:
            gaps = sum(1 for e in spec.expects if e.gap)
            more.append(
                f"{len(spec.expects)} field figures ({gaps} known gaps; `replay scenario check {spec.name}`)"
            )
        if spec.notes or spec.expected:
            more.append("the modelling notes and expected outcome")
        if spec.leftovers:
            more.append("the files on disk at the start")
        if more:
            md += ["", f"`--verbose` adds {', '.join(more)}, and one `replay run` line per arm."]
    return Group(Markdown("\n".join(md)))
