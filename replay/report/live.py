"""The live progress display of a run: requests done, each session's state, the current switch."""

from __future__ import annotations

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from replay.engine.run import Progress

_STYLE = {"prefill": "yellow", "decoding": "green", "waiting": "dim", "done": "dim"}


class ProgressView:
    def __init__(self, progress: Progress) -> None:
        self.progress = progress

    def __rich__(self) -> Group:
        p = self.progress
        head = Text.assemble(
            ("requests ", "bold"),
            f"{p.done}/{p.total}",
            ("  in flight ", "bold"),
            str(p.in_flight),
            ("  held ", "bold"),
            "-" if p.held_mean is None else f"{p.held_mean:.1f}",
            ("  lag ", "bold"),
            "-" if p.lag_ms is None else f"{p.lag_ms:.1f} ms",
            ("  errors ", "bold"),
            (str(p.errors), "red" if p.errors else ""),
            ("  last ", "bold"),
            p.last_switch,
        )
        table = Table.grid(padding=(0, 2))
        shown = list(p.sessions.items())[:12]
        for sid, state in shown:
            table.add_row(sid, Text(state, style=_STYLE.get(state, "")))
        if len(p.sessions) > len(shown):
            table.add_row(f"... {len(p.sessions) - len(shown)} more sessions", "")
        return Group(head, table)


def progress_view(progress: Progress, console: Console) -> Live:
    return Live(ProgressView(progress), console=console, refresh_per_second=4, transient=True)
