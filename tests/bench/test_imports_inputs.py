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


def test_mooncake_prefix_index_keeps_the_latest_session_per_prefix_across_merges(monkeypatch):
    from replay.importers import mooncake

    monkeypatch.setattr(mooncake._Prefixes, "RECENT", 3)
    index = mooncake._Prefixes()
    for k in range(40):
        index.set(k * 7 - 100, k)
    index.set(-100, 99)  # set again later: the newest wins
    for k in range(40, 60):
        index.set(k * 7 - 100, k)
    assert len(index.levels) <= 6 and sum(len(keys) for keys, _ in index.levels) + len(index.recent) <= 61
    assert index.get(-100) == 99 and index.get(7 * 39 - 100) == 39 and index.get(7 * 59 - 100) == 59
    assert index.get(6) is None and index.get(5) == 15
    seen = mooncake._Seen()
    assert [seen.add(h) for h in (3, 3, 10**12, 10**12, -1, 1 << 20, 3)] == [
        False, True, False, True, False, False, True,
    ]  # fmt: skip


def test_mooncake_import_is_the_same_whatever_the_index_holds_in_memory(tmp_path, monkeypatch):
    from replay.importers import mooncake

    src = tmp_path / "m.jsonl"
    imports.gen_mooncake(src, 400_000)
    mooncake.import_mooncake(src, tmp_path / "a.jsonl")
    monkeypatch.setattr(mooncake._Prefixes, "RECENT", 5)
    mooncake.import_mooncake(src, tmp_path / "b.jsonl")

    def body(p):
        return p.read_bytes().split(b"\n", 1)[1]  # the header holds the time it was written

    assert body(tmp_path / "a.jsonl") == body(tmp_path / "b.jsonl")


def test_a_child_reports_its_own_peak_not_its_big_parents():
    """Linux carries a forking parent's peak RSS across `exec` in `ru_maxrss`: with that, every
    import measured from a 253 MiB bench process read 253 MiB."""
    import subprocess
    import sys

    held = bytearray(200 * 2**20)
    for i in range(0, len(held), 4096):  # touched: resident, not only reserved
        held[i] = 1
    code = "from bench.imports import _peak_mib; print(_peak_mib())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert float(done.stdout) < 150, done.stdout
    del held
