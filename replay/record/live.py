"""The live table `replay record` shows: each session, its depth, and its last request.

Rendered by rich's refresh thread while the proxy's event loop mutates the state, so it reads
copies (`list(...)`) and plain fields only, and never blocks the loop.
"""

from __future__ import annotations

import time

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from replay.record.proxy import RecordingProxy
from replay.record.recorder import Recorder

_STATUS_STYLE = {"ok": "green", "client_disconnected": "yellow"}
MAX_ROWS = 20


class RecordView:
    def __init__(self, recorder: Recorder, proxy: RecordingProxy, upstream: str, out: str) -> None:
        self.recorder = recorder
        self.proxy = proxy
        self.upstream = upstream
        self.out = out

    def __rich__(self) -> Group:
        stats = self.recorder.stats
        head = Text.assemble(
            ("recorded ", "bold"),
            str(stats.recorded),
            ("  errors ", "bold"),
            (str(stats.errors), "red" if stats.errors else ""),
            ("  rejected ", "bold"),
            (str(sum(stats.rejected.values())), "yellow" if stats.rejected else ""),
            ("  in flight ", "bold"),
            str(self.proxy.in_flight),
            ("  passthrough ", "bold"),
            str(self.proxy.passthrough),
            ("  -> ", "dim"),
            (self.out, "dim"),
        )
        table = Table(box=None, padding=(0, 2), header_style="bold")
        for col in (
            "session",
            "role",
            "api",
            "requests",
            "depth",
            "in flight",
            "last",
            "status",
            "prompt",
            "ago",
        ):
            table.add_column(
                col, justify="right" if col in ("requests", "depth", "in flight", "prompt", "ago") else "left"
            )
        now = time.perf_counter_ns()
        inference = self.recorder.inference
        total = len(inference.sessions)
        for s in inference.recent(MAX_ROWS):  # not a sort of every session ever seen
            last = s.last
            done = s.last_done
            status = "in flight" if s.in_flight else (done.status if done else "")
            table.add_row(
                s.id,
                s.role,
                s.api,
                str(s.requests),
                str(s.depth),
                str(s.in_flight) if s.in_flight else "",
                last.tag if last else "",
                Text(
                    status, style=_STATUS_STYLE.get(status, "red" if status and status != "in flight" else "")
                ),
                str(done.prompt_tokens) if done and done.prompt_tokens is not None else "",
                f"{(now - last.arrived_ns) / 1e9:.0f}s" if last else "",
            )
        rows: list[Text | Table] = [head, table]
        if total > MAX_ROWS:
            rows.append(Text(f"... {total - MAX_ROWS} more sessions", style="dim"))
        if stats.last_problem:
            rows.append(Text(stats.last_problem, style="yellow"))
        return Group(*rows)


def live_view(view: RecordView, console: Console) -> Live:
    return Live(view, console=console, refresh_per_second=4, transient=False)
