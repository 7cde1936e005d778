"""What a file given where a trace was expected really is, and the command that takes it.

`replay validate share.json` used to say `share.json:1: bad JSON: unexpected end of data`: precise,
but the user needed `replay import sharegpt`. The reader asks `sniff` when a file fails before its
`trace` header, so every verb that reads a trace (validate, run, size sweep, anonymize, export)
names the right command. Each row reads only the start of the file (or the names in a folder) and
looks for marks no trace has; adding a format is adding a row.
"""

from __future__ import annotations

import re
import sqlite3
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

HEAD_BYTES = 1 << 18  # enough for the first line of any of these, or a JSON array's first item
_FOLDER_FILES = 200  # names looked at in a folder (a projects folder can hold thousands)


@dataclass(frozen=True, slots=True)
class Head:
    """The start of a file: its bytes, and the JSON objects of its first lines (those that parse)."""

    path: Path
    raw: bytes
    objects: list[dict[str, Any]]

    @property
    def first(self) -> dict[str, Any]:
        return self.objects[0] if self.objects else {}

    def text(self) -> str:
        return self.raw.decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class Kind:
    what: str  # "ShareGPT conversations", said as "this is ..."
    command: str  # with {src} and {out}: what to run instead
    matches: Callable[[Head], bool]


def _keys(obj: dict[str, Any], *keys: str) -> bool:
    return all(k in obj for k in keys)


def _any_line(head: Head, test: Callable[[dict[str, Any]], bool]) -> bool:
    return any(test(obj) for obj in head.objects)


def _sharegpt(head: Head) -> bool:
    """A JSON array (or lines) of conversations holding `from`/`value` or `role`/`content` turns."""
    if "conversations" in head.first or "conversation" in head.first:
        return True
    start = head.raw.lstrip()[:1]
    return start == b"[" and re.search(rb'"conversations?"\s*:\s*\[', head.raw[:65536]) is not None


def _claude_code(obj: dict[str, Any]) -> bool:
    return _keys(obj, "sessionId", "type") and ("parentUuid" in obj or "uuid" in obj)


def _codex(obj: dict[str, Any]) -> bool:
    kinds = ("session_meta", "response_item", "event_msg", "turn_context", "compacted")
    return obj.get("type") in kinds and "payload" in obj


def _opencode(head: Head) -> bool:
    """`opencode export` (an `info` and its `messages`) or `opencode run --format json` events."""
    if (
        head.raw.lstrip()[:1] == b"{"
        and re.search(rb'"messages"\s*:\s*\[', head.raw)
        and b'"info"' in head.raw
    ):
        return True
    kinds = ("step_start", "step_finish", "text", "tool_use", "reasoning")
    return _any_line(head, lambda o: o.get("type") in kinds and "sessionID" in o)


def _server_log(head: Head) -> bool:
    text = head.text()
    return "ds4-server: " in text or ("slot " in text and "| task " in text) or "llama_" in text


def _toml(head: Head) -> dict[str, Any]:
    """The file as TOML, if the whole of it is TOML (empty otherwise)."""
    if len(head.raw) >= HEAD_BYTES:
        return {}
    try:
        return tomllib.loads(head.text())
    except tomllib.TOMLDecodeError:
        return {}


def _sqlite_tables(head: Head) -> set[str]:
    """The tables of an SQLite database, read-only; empty for anything else."""
    if not head.raw.startswith(b"SQLite format 3\x00"):
        return set()
    try:
        conn = sqlite3.connect(f"{head.path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            conn.close()
    except sqlite3.Error:
        return set()


KINDS = (
    Kind(
        "a results file of `replay run`",
        "replay report {src}",
        lambda h: str(h.first.get("format", "")).startswith("agent-replay-results/"),
    ),
    Kind(
        "an A/B summary of `replay ab`",
        "replay report {src}",
        lambda h: (
            str(h.first.get("format", "")).startswith("agent-replay-ab/")
            or re.search(rb'"format"\s*:\s*"agent-replay-ab/', h.raw[:4096]) is not None
        ),
    ),
    Kind(
        "a Mooncake trace",
        "replay import mooncake {src} {out}",
        lambda h: _keys(h.first, "timestamp", "input_length", "output_length", "hash_ids"),
    ),
    Kind("ShareGPT conversations", "replay import sharegpt {src} {out}", _sharegpt),
    Kind(
        "a Claude Code transcript",
        "replay import claude-code {src} {out}",
        lambda h: _any_line(h, _claude_code),
    ),
    Kind("a Codex rollout", "replay import codex {src} {out}", lambda h: _any_line(h, _codex)),
    Kind("an OpenCode export or event stream", "replay import opencode {src} {out}", _opencode),
    Kind(
        "Hermes's store",
        "replay import hermes {src} {out}",
        lambda h: {"sessions", "messages"} <= _sqlite_tables(h),
    ),
    Kind(
        "OpenCode's store",
        "replay import opencode {src} {out}",
        lambda h: {"session", "message", "part"} <= _sqlite_tables(h),
    ),
    Kind("a server log", "replay logs summary {src}", _server_log),
    Kind("a scenario spec", "replay scenario generate {src}", lambda h: "scenario" in _toml(h)),
    Kind("a daily-service TOML", "replay run TRACE --service {src}", lambda h: "service" in _toml(h)),
    Kind(
        "a target TOML",
        "replay run TRACE --server {src}",
        lambda h: (
            "kind" in (doc := _toml(h)) and bool({"binary", "checkout", "url", "flags", "model"} & set(doc))
        ),
    ),
    Kind(
        "a compressed file",
        "decompress it first (gunzip -k {src}, zstd -d {src})",
        lambda h: h.raw.startswith((b"\x1f\x8b", b"\x28\xb5\x2f\xfd")),
    ),
)


def _folder(path: Path) -> tuple[str, str] | None:
    """An agent's store given as a folder: which agent, by the names it keeps there."""
    if (path / "state.db").is_file():
        return "Hermes's folder", "replay import hermes {src} {out}"
    if (
        (path / "opencode.db").is_file()
        or (path / "session").is_dir()
        or (path / "storage" / "session").is_dir()
    ):
        return "OpenCode's folder", "replay import opencode {src} {out}"
    names = []
    for i, child in enumerate(path.rglob("*.jsonl")):
        if i >= _FOLDER_FILES:
            break
        names.append(child)
    if any(p.name.startswith("rollout-") for p in names):
        return "a folder of Codex rollouts", "replay import codex {src} {out}"
    for child in names[:20]:
        try:
            if _any_line(_head(child), _claude_code):
                return "a folder of Claude Code transcripts", "replay import claude-code {src} {out}"
        except OSError:
            continue
    return None


def _head(path: Path) -> Head:
    with open(path, "rb") as handle:
        raw = handle.read(HEAD_BYTES)
    objects = []
    for line in raw.splitlines()[:20]:
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            objects.append(obj)
    if not objects and raw.lstrip()[:1] == b"{":  # one indented JSON document
        try:
            whole = orjson.loads(raw)
        except orjson.JSONDecodeError:
            whole = None
        if isinstance(whole, dict):
            objects.append(whole)
    return Head(path=path, raw=raw, objects=objects)


def sniff_file(path: Path) -> tuple[str, str] | None:
    try:
        head = _head(path)
    except OSError:
        return None
    if b'"kind"' in head.raw[:4096] and head.first.get("kind") == "trace":
        return None  # a trace (perhaps a damaged one): the reader's own message says what is wrong
    for kind in KINDS:
        if kind.matches(head):
            return kind.what, kind.command
    return None


def sniff(path: str | Path) -> str | None:
    """`this is X, not a trace: run Y`, or None when the file is none of the known formats."""
    path = Path(path)
    found = _folder(path) if path.is_dir() else sniff_file(path)
    if found is None:
        return None
    what, command = found
    out = f"{path.name.split('.')[0] or 'imported'}.trace.jsonl"
    return f"this is {what}, not an agent-replay trace: {command.format(src=path, out=out)}"
