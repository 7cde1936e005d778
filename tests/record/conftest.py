"""Fixtures for the recorder tests: a recording proxy in front of the scripted server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from replay.record.serve import RecordingServer
from replay.record.sessions import SessionInference
from tests.support.recordkit import FixedWall


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
