from rich.console import Console

from replay.engine.run import Progress
from replay.report.live import ProgressView


def test_live_view_shows_counts_session_states_and_the_last_switch():
    progress = Progress(total=9, done=4, errors=1, in_flight=1, last_switch="cron (switch)")
    progress.sessions = {"main": "prefill", "cron": "waiting"} | {f"s{i}": "waiting" for i in range(20)}
    console = Console(record=True, width=100)
    console.print(ProgressView(progress))
    text = console.export_text()
    assert "4/9" in text and "errors 1" in text and "cron (switch)" in text
    assert "main" in text and "prefill" in text
    assert "... 10 more sessions" in text
