"""A file of another kind given where a trace is expected: the error names the command that takes it,
and that command works on it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from replay.errors import TraceError
from replay.importers.registry import run_import
from replay.trace.reader import read_trace, validate
from replay.trace.sniff import sniff
from tests.support.agentstores import (
    codex_rollout,
    opencode_events,
    opencode_session,
    slow_morning_hermes,
    write_opencode_db,
    write_opencode_storage,
)

DATA = Path(__file__).parents[1] / "data" / "record"
CLAUDE = DATA / "claude_code" / "0a1b2c3d-1111-4222-8333-444455556666.jsonl"


def _sharegpt_lines(tmp: Path) -> Path:
    items = orjson.loads((DATA / "sharegpt.json").read_bytes())
    path = tmp / "share.jsonl"
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in items))
    return path


def _opencode_export(tmp: Path) -> Path:
    path = tmp / "export.json"
    path.write_bytes(orjson.dumps(opencode_session(), option=orjson.OPT_INDENT_2))
    return path


def _opencode_stream(tmp: Path) -> Path:
    path = tmp / "events.jsonl"
    path.write_bytes(opencode_events(opencode_session()))
    return path


# What a user may hand `replay validate` (or run, size sweep ...) by mistake, and the import it needs.
IMPORTS: list[tuple[str, Callable[[Path], Path]]] = [
    ("sharegpt", lambda tmp: DATA / "sharegpt.json"),
    ("sharegpt", _sharegpt_lines),
    ("mooncake", lambda tmp: DATA / "mooncake.jsonl"),
    ("claude-code", lambda tmp: CLAUDE),
    ("claude-code", lambda tmp: DATA / "claude_code"),
    ("codex", lambda tmp: codex_rollout(tmp / "rollout-2026-11-30T06-45-00-x.jsonl")),
    ("codex", lambda tmp: codex_rollout(tmp / "sessions" / "rollout-a.jsonl").parent),
    ("hermes", lambda tmp: slow_morning_hermes(tmp / "state.db")),
    ("hermes", lambda tmp: slow_morning_hermes(tmp / "state.db").parent),
    ("opencode", lambda tmp: write_opencode_db(tmp / "opencode.db", [opencode_session()])),
    ("opencode", lambda tmp: write_opencode_storage(tmp / "storage", [opencode_session()])),
    ("opencode", _opencode_export),
    ("opencode", _opencode_stream),
]


@pytest.mark.parametrize(("fmt", "make"), IMPORTS, ids=[f"{f}-{i}" for i, (f, _) in enumerate(IMPORTS)])
def test_another_tools_file_names_its_import_and_that_import_works(
    fmt: str, make: Callable[[Path], Path], tmp_path: Path
) -> None:
    (tmp_path / "sessions").mkdir()
    src = make(tmp_path)
    with pytest.raises(TraceError) as caught:
        validate(src)
    message = str(caught.value)
    assert "not an agent-replay trace" in message and f"replay import {fmt} {src} " in message, message
    out = tmp_path / message.rsplit(" ", 1)[1]  # the trace the command would write
    run_import(fmt, src, out)  # the command it names takes the file
    assert validate(out)["requests"] > 0


def _results(tmp: Path) -> Path:
    path = tmp / "r.jsonl"
    path.write_bytes(orjson.dumps({"kind": "run", "format": "agent-replay-results/1"}) + b"\n")
    return path


def _ab(tmp: Path) -> Path:
    path = tmp / "ab.json"
    path.write_bytes(orjson.dumps({"format": "agent-replay-ab/2", "arms": {}}, option=orjson.OPT_INDENT_2))
    return path


def _log(tmp: Path) -> Path:
    path = tmp / "server.log"
    path.write_text("ds4-server: listening on 127.0.0.1:8000\nds4-server: kv disk budget 65536 MiB\n")
    return path


def _llama_log(tmp: Path) -> Path:
    path = tmp / "llama.log"
    path.write_text(
        "0.00.052.101 I main: server is listening on http://127.0.0.1:8080\n"
        "0.01.002.412 I slot launch_slot_: id  0 | task 0 | processing task\n"
    )
    return path


def _gzip(tmp: Path) -> Path:
    import gzip

    path = tmp / "trace.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"kind": "trace"}\n'))
    return path


ROOT = Path(__file__).parents[2]
OTHERS: list[tuple[str, Callable[[Path], Path]]] = [
    ("replay report {src}", _results),
    ("replay report {src}", _ab),
    ("replay logs summary {src}", _log),
    ("replay logs summary {src}", _llama_log),
    ("replay scenario generate {src}", lambda tmp: ROOT / "traces" / "scenarios" / "switching.toml"),
    ("replay run TRACE --server {src}", lambda tmp: ROOT / "examples" / "servers" / "ds4.toml"),
    ("replay run TRACE --server {src}", lambda tmp: ROOT / "examples" / "servers" / "sim-64g.toml"),
    ("replay run TRACE --service {src}", lambda tmp: ROOT / "examples" / "services" / "systemd-user.toml"),
    ("gunzip -k {src}", _gzip),
]


@pytest.mark.parametrize(("command", "make"), OTHERS, ids=[c.split(" {")[0] for c, _ in OTHERS])
def test_a_results_file_a_log_or_a_toml_names_the_verb_that_reads_it(
    command: str, make: Callable[[Path], Path], tmp_path: Path
) -> None:
    src = make(tmp_path)
    with pytest.raises(TraceError) as caught:
        read_trace(src)
    assert command.format(src=src) in str(caught.value), caught.value


def test_a_damaged_trace_or_an_unknown_file_keeps_the_readers_own_message(tmp_path: Path) -> None:
    damaged = tmp_path / "t.jsonl"
    damaged.write_text('{"kind": "trace", "format": "agent-replay-trace/1"}\n{"kind": "session", "id": 1}\n')
    with pytest.raises(TraceError, match=r"t.jsonl:2: .*'id'"):
        validate(damaged)
    prose = tmp_path / "notes.txt"
    prose.write_text("kind = 'trace'? no: these are notes\n")
    with pytest.raises(TraceError, match=r"notes.txt:1: bad JSON"):
        validate(prose)
    assert sniff(ROOT / "README.md") is None  # prose with TOML in its code blocks is no target
