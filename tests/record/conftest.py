"""Fixtures for the recorder tests: a recording proxy in front of the scripted server."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # makes `recordkit` importable

from recordkit import FixedWall  # noqa: E402

from replay.record.serve import RecordingServer  # noqa: E402
from replay.record.sessions import SessionInference  # noqa: E402


@pytest.fixture
def recording(scripted_server, tmp_path) -> Iterator[RecordingServer]:
    """A recording proxy in front of the scripted server, writing tmp_path/trace.jsonl.

    The wall clock is pinned mid-minute so no session is taken for a cron job by chance.
    """
    server = RecordingServer(
        scripted_server.url, tmp_path / "trace.jsonl", inference=SessionInference(wall_clock=FixedWall(30.0))
    )
    with server:
        yield server
