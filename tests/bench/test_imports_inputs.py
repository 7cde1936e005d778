"""The imports bench's inputs: every importer kind has a generator, and what it writes imports."""

from __future__ import annotations

import pytest

from bench import imports
from replay.importers.base import ImportOptions
from replay.importers.registry import IMPORTS, run_import


def test_every_importer_kind_is_measured():
    assert set(imports.KINDS) == set(IMPORTS) == set(imports.INPUTS)


@pytest.mark.parametrize("kind", ["claude-code", "codex", "hermes", "opencode", "sharegpt", "mooncake"])
def test_a_generated_input_imports_with_the_size_asked(kind, tmp_path):
    name, gen = imports.INPUTS[kind]
    src = tmp_path / name
    made = gen(src, 300_000)
    assert 300_000 <= made < 2_000_000
    line = run_import(kind, src, tmp_path / "t.jsonl", ImportOptions(progress=False))
    requests, sessions = (int(x) for x in line.split(": ", 1)[1].split(" (")[0].split()[::3][:2])
    assert requests > 20 and sessions > 1, line
