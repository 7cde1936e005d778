"""`--help` that people read: every option described, values named (TRACE, FILE, N, URL), defaults shown."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

import pytest

from replay.cli import command
from replay.sim.server.options import build_parser


def _commands(cmd: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    subs = getattr(cmd, "commands", {})
    out = [(path, cmd)] if not subs else []
    for name, sub in sorted(subs.items()):
        out += _commands(sub, (*path, name))
    return out


COMMANDS = _commands(command())
PLACEHOLDER = re.compile(r"<(bool|path|str|int|float|list\[[^\]]*\])>|\{[a-z_]+\}")


@pytest.mark.parametrize(("path", "cmd"), COMMANDS, ids=lambda x: " ".join(x) if isinstance(x, tuple) else "")
def test_every_option_is_described_and_names_its_value(path: tuple[str, ...], cmd: Any) -> None:
    for param in cmd.params:
        if path == ("sim", "serve"):
            continue  # its flags are the simulator's own (argparse), checked below
        assert (getattr(param, "help", None) or "").strip(), (
            f"replay {' '.join(path)}: {param.name} has no help"
        )
        if not getattr(param, "is_flag", False):
            assert param.metavar and not PLACEHOLDER.search(f"<{param.metavar}>"), (
                path,
                param.name,
                param.metavar,
            )


@pytest.mark.parametrize("path", [("run",), ("size", "sweep"), ("report",), ("k8s", "render"), ()])
def test_help_shows_no_internal_placeholders(path: tuple[str, ...]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "replay", *path, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "120"},
    )
    assert done.returncode == 0, done.stderr
    assert not PLACEHOLDER.search(done.stdout), PLACEHOLDER.search(done.stdout)


def test_the_simulator_describes_every_flag_with_its_default() -> None:
    parser = build_parser()
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            assert action.help, action.dest
    text = " ".join(parser.format_help().split())
    assert "--kv-disk-space-mb N" in text and "--port N" in text
    assert "(default: 8000)" in text and "(default: 510.0 for qwen38-q2)" in text
