"""Generated models for the llama.cpp tests: written once per session, each in well under a second."""

from __future__ import annotations

from pathlib import Path

import pytest

from replay.testing.gguf_model import make_model


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("models") / "tiny-llama.gguf")


@pytest.fixture(scope="session")
def tiny_gemma2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("models") / "tiny-gemma2.gguf", arch="gemma2", swa=256)
