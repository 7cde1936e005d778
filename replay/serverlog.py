"""What the server's own log says about a run: settings in force, and cache events per request.

The run header carries the settings the server printed at startup, not the flags it was given (a
requested cache setting is not evidence that it is in effect). After the run, ds4-format logs
(ds4-server and the simulator) are correlated with the run's requests into `server` records:
restores, stores, evictions and live misses, numbers only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from drivers.logs import ds4, llamacpp
from drivers.logs.correlate import correlate
from drivers.logs.effective import ds4_settings, llamacpp_settings

DS4_FORMAT_KINDS = ("ds4", "sim")


def effective_settings(kind: str, log_path: Path | None) -> dict[str, Any]:
    """Settings the server printed at startup; empty when it keeps no log we can read."""
    if log_path is None or not Path(log_path).exists():
        return {}
    if kind in DS4_FORMAT_KINDS:
        return dict(ds4_settings(ds4.parse_files([log_path]).events))
    if kind == "llamacpp":
        return dict(llamacpp_settings(llamacpp.parse_files([log_path]).events))
    return {}


def server_records(kind: str, log_path: Path | None, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`server` records for the results file, attributed to request `seq` where the log allows."""
    if kind not in DS4_FORMAT_KINDS or log_path is None or not Path(log_path).exists():
        return []
    parsed = ds4.parse_files([log_path])
    return [dict(r) for r in correlate(requests, parsed.events)]
