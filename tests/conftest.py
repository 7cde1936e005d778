"""Fixtures shared by every test directory; subdirectories keep their own in their conftest."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.scripted_server import ScriptedServer


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
