"""The mypyc-compiled modules: used only while they match their source, and equal to it."""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import replay
from bench.simbench import sweep_trace_file
from replay import _compiled
from replay.sizing import sweep_json, sweep_trace

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def test_the_modules_run_as_the_check_decided() -> None:
    """CI sets REPLAY_REQUIRE_COMPILED=1: there, a build that silently fell back to pure Python fails."""
    compiled = {
        name: Path(importlib.import_module(name).__file__ or "").suffix != ".py" for name in _compiled.MODULES
    }
    assert set(compiled.values()) == {replay.COMPILED == "compiled"}, compiled
    if os.environ.get("REPLAY_REQUIRE_COMPILED") == "1":
        assert replay.COMPILED == "compiled"


def test_the_list_is_the_cache_model_and_what_the_sweep_reads_it_with() -> None:
    """Every module of `replay.sim.model` (its `llama` package too); from `replay.trace` the modules a sweep reads a trace
    with; the sweep's own per-request path; and the engine's. A compiled module imports replay's
    other modules only from this list, or a few that are off the per-request path (or, for the
    engine, its HTTP/1.1 framing and kept connections, which build on asyncio's and httpcore's
    classes)."""
    root = Path(replay.__file__).resolve().parent
    base = root / "sim" / "model"
    model = {
        "replay.sim.model." + ".".join(p.relative_to(base).with_suffix("").parts)
        for p in base.rglob("*.py")
        if p.stem != "__init__"
    }
    assert set(_compiled.MODEL) == model
    assert _compiled.RULES == ("replay.serving.counts",)
    assert all(name.startswith("replay.trace.") for name in _compiled.TRACE)
    assert all(name.startswith("replay.sizing.") for name in _compiled.SWEEP)
    assert all(name.startswith(("replay.engine.", "replay.metrics.")) for name in _compiled.ENGINE)
    assert _compiled.MODULES == (
        _compiled.MODEL + _compiled.RULES + _compiled.TRACE + _compiled.SWEEP + _compiled.ENGINE
    )
    allowed = set(_compiled.MODULES) | {
        "replay.errors",
        "replay.clock",  # the one clock: its now_ns IS time.perf_counter_ns unless a test installs one
        "replay.trace",
        "replay.trace.sniff",  # what a file that is no trace is, asked only once reading has failed
        "replay.metrics.switch",
        "replay.sizing.rows",
        "replay.engine.http1",
        "replay.engine.transport",
        "replay.engine.connections",
    }
    for name in _compiled.MODULES:
        tree = ast.parse((root.parent / (name.replace(".", "/") + ".py")).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("replay"):
                names = {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
                assert names & allowed, (name, node.module)


def _fake_build(root: Path, *, hashed: bool = True) -> None:
    """A tree with every module's source and a stand-in compiled file, as a build leaves it."""
    for name in _compiled.MODULES:
        base = root / name.replace(".", "/")
        base.parent.mkdir(parents=True, exist_ok=True)
        base.with_suffix(".py").write_text(f"NAME = {name!r}\n")
        base.with_name(base.name + SUFFIX).write_bytes(b"")
    if hashed:
        (root / "replay" / _compiled.HASHES).write_text(json.dumps(_compiled.source_hashes(root)))


@pytest.fixture
def finders():
    """`check` may put its source-first finder on sys.meta_path: take it off again after."""
    before = list(sys.meta_path)
    yield
    sys.meta_path[:] = before


def test_a_fresh_build_is_used(tmp_path: Path, finders: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REPLAY_PURE", raising=False)
    _fake_build(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _compiled.check(tmp_path) == "compiled"


def test_nothing_built_is_pure(tmp_path: Path, finders: None) -> None:
    for name in _compiled.MODULES:
        path = tmp_path / (name.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    assert _compiled.check(tmp_path) == "pure"


def test_an_edited_source_runs_every_module_from_source(
    tmp_path: Path, finders: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REPLAY_PURE", raising=False)
    _fake_build(tmp_path)
    (tmp_path / "replay" / "sim" / "model" / "disk.py").write_text("NAME = 'edited'\n")
    with pytest.warns(RuntimeWarning, match=r"replay/sim/model/disk\.py changed after it was compiled"):
        assert _compiled.check(tmp_path) == "source"
    finder = sys.meta_path[0]
    for name in _compiled.MODULES:  # all of them: compiled modules call each other compiled
        spec = finder.find_spec(name)
        assert spec is not None and spec.origin == str(tmp_path / (name.replace(".", "/") + ".py"))
    assert finder.find_spec("replay.cli") is None  # never compiled: found as ever


def test_a_build_without_hashes_is_not_trusted(
    tmp_path: Path, finders: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REPLAY_PURE", raising=False)
    _fake_build(tmp_path, hashed=False)
    with pytest.warns(RuntimeWarning, match="the build left no record of what it compiled"):
        assert _compiled.check(tmp_path) == "source"


def test_replay_pure_asks_for_source_quietly(
    tmp_path: Path, finders: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REPLAY_PURE", "1")
    _fake_build(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _compiled.check(tmp_path) == "source"


def test_compiled_and_source_sweeps_agree(tmp_path: Path) -> None:
    """The same sweep in this process (compiled where built) and from source gives the same rows."""
    trace = sweep_trace_file(tmp_path / "t.jsonl", 600, turns=7)
    budgets = [2 << 30, 5 << 30, 40 << 30]
    here = sweep_json(sweep_trace(trace, budgets, target_reread=400))
    code = (
        "import sys, orjson, replay; from replay.sizing import sweep_json, sweep_trace;"
        "assert replay.COMPILED != 'compiled';"
        f"sys.stdout.write(orjson.dumps(sweep_json(sweep_trace(sys.argv[1], {budgets!r}, target_reread=400))).decode())"
    )
    env = dict(os.environ, REPLAY_PURE="1")
    out = subprocess.run(
        [sys.executable, "-c", code, str(trace)], env=env, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == json.loads(json.dumps(here))


def test_a_module_left_uncompiled_runs_every_one_from_source(
    tmp_path: Path, finders: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REPLAY_PURE", raising=False)
    _fake_build(tmp_path)
    (tmp_path / "replay" / "sim" / "model" / ("seq" + SUFFIX)).unlink()
    with pytest.warns(RuntimeWarning, match=r"replay\.sim\.model\.seq is not compiled"):
        assert _compiled.check(tmp_path) == "source"
