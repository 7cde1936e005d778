"""Imports keep what one moment of the input needs, not what grows with it (issue 36, item 4).

`bench/imports.py` measures the peak RSS on 2 GB inputs; these tests show the mechanisms on small
ones: the tokenizer's cache is not filled with texts an importer counts once, OpenCode's database
sessions are read one at a time, and an `opencode run --format json` event stream is never held
whole."""

from __future__ import annotations

import gc
import tracemalloc
from collections import OrderedDict
from pathlib import Path
from typing import Any

import orjson
import pytest

from replay.importers import opencode
from replay.importers.base import ImportOptions
from replay.importers.codex import import_codex
from replay.importers.opencode import import_opencode
from replay.importers.sharegpt import import_sharegpt
from replay.sim.model import tokenizer
from replay.trace import read_trace, validate
from replay.trace.model import Message
from replay.trace.writer import TraceWriter
from tests.support.agentstores import (
    MORNING,
    OC_T0,
    codex_rollout,
    opencode_events,
    opencode_session,
    write_opencode_db,
)


def _sharegpt(path: Path, n: int) -> Path:
    convs = [
        {
            "id": f"c{i}",
            "conversations": [
                {"from": "human", "value": f"question {i} about the parser"},
                {"from": "gpt", "value": f"answer {i}: the parser returns a value"},
            ],
        }
        for i in range(n)
    ]
    path.write_bytes(orjson.dumps(convs))
    return path


def _codex(folder: Path, n: int) -> Path:
    folder.mkdir()
    for i in range(n):
        sid = f"0199a1b2-c3d4-7e5f-8a9b-{i:012x}"
        codex_rollout(folder / f"rollout-2026-09-21T00-00-00-{sid}.jsonl", sid, MORNING + i * 3600)
    return folder


@pytest.mark.parametrize("fmt", ["sharegpt", "codex", "opencode"])
def test_an_import_leaves_the_tokenizer_cache_as_it_was(
    fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An importer counts each text once: kept in the tokenizer's cache, a big input's texts
    filled it to its bounds (64 Mi characters and their tokens: ShareGPT 302 MiB peak RSS at 1 GB,
    Codex about 90 MiB more per GB until full). They are counted, not kept; the cache is on again
    after the import."""
    monkeypatch.setattr(tokenizer, "_cache", OrderedDict())
    monkeypatch.setattr(tokenizer, "_cached_chars", [0])
    out = tmp_path / "t.jsonl"
    if fmt == "sharegpt":
        counts = import_sharegpt(_sharegpt(tmp_path / "s.json", 30), out)
    elif fmt == "codex":
        counts = import_codex(_codex(tmp_path / "sessions", 3), out)
    else:
        sessions = [opencode_session(f"ses_{i:02d}", t0=OC_T0 + i * 600_000) for i in range(3)]
        counts = import_opencode(write_opencode_db(tmp_path / "opencode.db", sessions), out)
    assert counts["requests"] > 0
    assert read_trace(out).requests  # the counts went into what was written
    assert tokenizer.cache_fill()["texts"] == 0
    tokenizer.tokenize("kept again after the import")
    assert tokenizer.cache_fill()["texts"] == 1


def test_opencode_database_sessions_are_read_one_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session of the database is read when the time-ordered merge reaches it and let go when
    it ends: sessions one after another are never all held (they were, as a list, for the whole
    import)."""
    live = [0, 0]  # held now, most held at once

    class Counted(opencode._Session):
        __slots__ = ()

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            live[0] += 1
            live[1] = max(live[1], live[0])

        def __del__(self) -> None:
            live[0] -= 1

    monkeypatch.setattr(opencode, "_Session", Counted)
    sessions = [opencode_session(f"ses_{i:02d}", t0=OC_T0 + i * 3_600_000) for i in range(30)]
    src = write_opencode_db(tmp_path / "opencode.db", sessions)
    counts = import_opencode(src, tmp_path / "t.jsonl")
    assert counts["conversations"] == 30
    assert len(read_trace(tmp_path / "t.jsonl").requests) == counts["requests"]
    assert 1 <= live[1] <= 3, live


def _peak_bytes(src: Path, out: Path) -> int:
    import_opencode(src, out, ImportOptions(progress=False))  # modules and caches warmed
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        import_opencode(src, out, ImportOptions(progress=False))
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_opencode_event_stream_is_read_as_it_streams(tmp_path: Path) -> None:
    """`opencode run --format json` output is read a session at a time (a first pass keeps where
    each session's lines are): five times the sessions take about the same memory, where holding
    every event's part took more than the file's size."""

    def stream(path: Path, n: int) -> Path:  # sessions an hour apart, one after another
        path.write_bytes(
            b"".join(
                opencode_events(opencode_session(f"ses_{i:04d}", t0=OC_T0 + i * 3_600_000)) for i in range(n)
            )
        )
        return path

    small = stream(tmp_path / "small.jsonl", 100)
    large = stream(tmp_path / "large.jsonl", 500)
    before = _peak_bytes(small, tmp_path / "s.jsonl")
    after = _peak_bytes(large, tmp_path / "l.jsonl")
    assert len(read_trace(tmp_path / "l.jsonl").sessions) == 500
    grown = large.stat().st_size - small.stat().st_size
    assert after - before < grown / 4, (before, after, grown)


def _chain(path: Path, n: int) -> Path:
    """One session of n requests of one message each."""
    with TraceWriter(path, source="test") as writer:
        writer.session("s")
        for i in range(n):
            message: Message = {"role": "user", "content": f"step {i}"}
            writer.request("s", float(i), [message])
    return path


def test_validation_holds_a_few_bytes_a_request(tmp_path: Path) -> None:
    """`replay import` validates what it wrote; the check keeps each request's message count (a
    later request may extend any earlier one), in two arrays: 16 bytes a request, where a dict
    took ~96 (about 100 MiB on a 2 GB Codex import's million requests)."""
    small, large = _chain(tmp_path / "s.jsonl", 20_000), _chain(tmp_path / "l.jsonl", 60_000)
    peaks = []
    for path in (small, large, small, large):
        gc.collect()
        tracemalloc.start()
        try:
            assert validate(path)["requests"] in (20_000, 60_000)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    per_request = (peaks[3] - peaks[2]) / 40_000
    assert per_request < 40, peaks


def _sessions(path: Path, n: int) -> Path:
    """n one-request sessions with the labels an importer writes."""
    with TraceWriter(path, source="test") as writer:
        for i in range(n):
            sid = f"codex-0199a1b2-c3d4-7e5f-8a9b-{i:012x}"
            labels = {
                "source": "codex",
                "file": f"rollout-2026-09-21T00-00-00-{sid}.jsonl",
                "cli_version": "0.171.0",
            }
            writer.session(sid, labels=labels)
            writer.request(sid, float(i), [{"role": "user", "content": "go"}])
    return path


def test_validation_keeps_no_session_labels(tmp_path: Path) -> None:
    """Validating keeps each session's id, not its labels (~1 KB a session: 33 MiB of a 2 GB Codex
    import's validation); a loaded trace still has them."""
    small, large = _sessions(tmp_path / "s.jsonl", 5_000), _sessions(tmp_path / "l.jsonl", 15_000)
    peaks = []
    for path in (small, large):
        gc.collect()
        tracemalloc.start()
        try:
            validate(path)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    per_session = (peaks[1] - peaks[0]) / 10_000
    assert per_session < 600, peaks  # 380-440 measured (848 with the labels)
    loaded = read_trace(large)
    assert loaded.sessions[f"codex-0199a1b2-c3d4-7e5f-8a9b-{7:012x}"].labels["cli_version"] == "0.171.0"
