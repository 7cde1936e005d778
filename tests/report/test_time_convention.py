"""Every figure says which clock it is on: modelled (what the real server would take) or measured here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rich.console import Console

from replay.metrics.hist import Summary
from replay.report.table import class_table
from replay.sim.server.process import _clock_line


def _render(table: object) -> str:
    console = Console(width=200, record=True)
    console.print(table)
    return console.export_text()


def test_the_terminal_table_on_the_simulator_says_how_much_faster_it_ran() -> None:
    text = _render(class_table(Summary(), time_scale=200.0))
    assert "ran modelled time 200x faster" in text and "about 200x longer" in text


def test_the_terminal_table_of_a_real_server_says_its_times_are_wall_clock() -> None:
    assert "Times measured here (wall clock)." in _render(class_table(Summary()))


def test_the_simulator_states_its_time_scale() -> None:
    assert _clock_line(200.0).startswith("time scale 200: modelled time runs 200x faster")
    assert "takes 1.2 s" in _clock_line(200.0)
    assert "wall-clock speed" in _clock_line(1.0)


def test_restore_with_nothing_to_restore_says_so_and_succeeds(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "replay", "restore", "--journal", str(tmp_path / "journal.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "nothing to restore" in done.stdout + done.stderr
