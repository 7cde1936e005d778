"""A simulator and a recording proxy in front of it, both with small limits, shared by the tests
of this directory (each test leaves them serving: that is one of the things checked)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.serverkit import TEST_LIMITS, Child, start_proxy, start_sim


@pytest.fixture(scope="session")
def sim() -> Iterator[Child]:
    server = start_sim(*TEST_LIMITS, "--ctx", "8192", "--tokens", "8")  # short replies: a fuzz runs fast
    yield server
    server.stop()


@pytest.fixture(scope="session")
def proxy(sim: Child, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Child]:
    out = tmp_path_factory.mktemp("proxy") / "trace.jsonl"
    server = start_proxy(sim.url, out, *TEST_LIMITS)
    server.trace = out  # type: ignore[attr-defined]
    yield server
    server.stop()
