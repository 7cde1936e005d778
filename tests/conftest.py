"""Fixtures shared by every test directory; subdirectories keep their own in their conftest."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.scripted_server import ScriptedServer

SLOW_LIST = Path(__file__).with_name("slow.txt")


def slow_node_ids() -> set[str]:
    """The tests `tests/slow.txt` names (measured by `just test-profile`)."""
    lines = SLOW_LIST.read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `slow` the tests that took a worker more than a few seconds: `just test` (the
    newcomer's command, a few minutes) leaves them to `just test-slow`; CI runs both. A `timing`
    test stays in `just test`'s pass of tests run alone."""
    slow = slow_node_ids()
    for item in items:
        if item.nodeid in slow and item.get_closest_marker("timing") is None:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def _scripted_server_session() -> Iterator[ScriptedServer]:
    with ScriptedServer() as server:
        yield server


@pytest.fixture
def scripted_server(_scripted_server_session: ScriptedServer) -> ScriptedServer:
    """The session's scripted SSE server, with scripts and records cleared for this test."""
    _scripted_server_session.reset()
    return _scripted_server_session


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """The API clients run on asyncio only (their transport is an asyncio protocol)."""
    return "asyncio"
