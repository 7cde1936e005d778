"""`scenario show` and `scenario check` read at a glance; `--verbose` adds the modelling notes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from replay.commands.scenario import ShowArgs, gap_line, show
from replay.scenario import find_scenario
from replay.scenario.check import Verdict


def _show(name: str, verbose: bool) -> str:
    console = Console(width=100, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    assert show(ShowArgs(name=name, verbose=verbose), console) == 0
    return console.export_text()


def test_show_slow_morning_fits_a_screen_and_verbose_adds_the_notes() -> None:
    short, long = _show("slow-morning", False), _show("slow-morning", True)
    assert len(short.splitlines()) <= 70, len(short.splitlines())
    assert "known gap:" not in short and "replay scenario run slow-morning" in short
    assert "--verbose adds 19 field figures (11 known gaps" in short
    spec = find_scenario("slow-morning")
    note = "Trace time 0 is 06:40"
    assert note in spec.notes
    assert note not in short and note in long
    assert "known gap:" in long and "replay run --out slow-morning-64G.jsonl" in long


def test_a_known_gap_is_one_line_unless_verbose() -> None:
    spec = find_scenario("slow-morning")
    expect = next(e for e in spec.expects if e.gap and len(e.gap) > 300)
    verdict = Verdict("slow-morning", expect, "44.9-254 s", 100.0, False)
    assert verdict.status == "known gap"
    line = gap_line(verdict)
    assert "\n" not in line and len(line) < len(expect.gap) / 2
    assert line.endswith("model " + expect.gap.split(": ")[0])
    assert gap_line(verdict, verbose=True).endswith(expect.gap.split(": ", 1)[1])


def test_scenario_run_prints_the_verdict_ending_with_its_action(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "replay", "scenario", "run", "switching", "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "2000"},
    )
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("verdict: "))
    assert "Action: set `--kv-disk-space-mb " in line, line
