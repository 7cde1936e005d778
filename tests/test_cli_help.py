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


def _help(*path: str, columns: int = 120) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "replay", *path, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": str(columns)},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_each_value_is_named_for_what_it_is() -> None:
    assert re.search(r"--target\s+TOKENS\s", _help("size", "sweep"))  # a token goal, not a server
    for path in (("scenario", "run"), ("scenario", "check"), ("demo",), ("probe",)):
        assert re.search(r"--out\s+DIR\s", _help(*path)), path  # each writes a folder
    assert re.search(r"--max-body\s+SIZE\s", _help("record"))


def test_sim_serve_help_looks_like_the_rest_and_writes_sizes_as_record_does() -> None:
    text = _help("sim", "serve")
    assert "╭─ Server" in text and "╭─ Client limits" in text and "╭─ Model" in text
    assert re.search(r"--max-body\s+SIZE\s+Largest request body \(413 above\)\. \[default: 64MiB\]", text)
    assert "67108864" not in text and "[default: 64MiB]" in _help("record")
    assert "[default: 34.5KiB for qwen38-q2]" in text


def test_run_help_reads_at_a_glance_at_80_columns() -> None:
    text = _help("run", columns=80)
    assert len(text.splitlines()) <= 70, len(text.splitlines())
    assert "╭─ Server" in text and "╭─ Schedule" in text and "╭─ Client" in text
    # a flag is off unless given: the one two-way switch is the exit code's (a Kubernetes shard
    # passes --no-fail-on-errors)
    assert set(re.findall(r"--no-[\w-]+", text)) == {"--no-fail-on-errors"}
