"""`replay sim serve`: the simulator on 127.0.0.1, with ds4's own flags."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True, slots=True)
class SimServeArgs:
    argv: list[str] = field(default_factory=list)  # ds4-server's flags, parsed by the simulator


def serve(args: SimServeArgs) -> int:
    if "-h" in args.argv or "--help" in args.argv:
        return print_help()
    from replay.sim import serve as serve_sim

    return serve_sim(list(args.argv))


def print_help() -> int:
    """The simulator's flags (its own argparse parser, which `python -m replay.sim` uses as it
    is) shown as every other verb shows its options: typer's panels, one per group of flags."""
    from typer.core import TyperCommand, TyperOption

    from replay.sim.server.options import build_parser

    parser = build_parser()
    params = []
    for group in parser._action_groups:
        for action in group._group_actions:
            if not action.option_strings or action.dest == "help":
                continue
            text, default = _split_default(action.help or "")
            params.append(
                TyperOption(
                    param_decls=[*action.option_strings, action.dest],
                    help=text[:1].upper() + text[1:] + ("" if text.endswith(".") else "."),
                    metavar=_metavar(action),
                    is_flag=action.nargs == 0,
                    default=default,
                    show_default=default is not None,
                    rich_help_panel=(group.title or "options").capitalize(),
                )
            )
    command = TyperCommand("serve", params=params, help=parser.description)
    try:
        command.main(["--help"], prog_name="replay sim serve")
    except SystemExit as done:
        return int(done.code or 0)
    return 0


def _split_default(text: str) -> tuple[str, str | None]:
    """`"prefill step, tokens (default: 2048 for qwen38-q2)"` -> the text and `2048 for qwen38-q2`."""
    m = re.fullmatch(r"(.*?)\s*\(default: (.*)\)", text, re.S)
    return (m.group(1), m.group(2)) if m else (text, None)


def _metavar(action: argparse.Action) -> str | None:
    if action.nargs == 0:
        return None
    if action.choices is not None:
        return "|".join(str(c) for c in action.choices)
    return action.metavar if isinstance(action.metavar, str) else None
