"""`replay import FORMAT IN OUT` and `replay export FORMAT IN OUT`: one registry per direction."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from replay.errors import ReplayError, UsageError
from replay.record.claude_code import import_claude_code
from replay.record.mooncake import export_mooncake, import_mooncake
from replay.record.sharegpt import import_sharegpt
from replay.trace.reader import validate

Converter = Callable[[Path, Path], dict[str, int]]

IMPORTERS: dict[str, Converter] = {
    "claude-code": import_claude_code,
    "mooncake": import_mooncake,
    "sharegpt": import_sharegpt,
}
EXPORTERS: dict[str, Converter] = {"mooncake": export_mooncake}


def _check(fmt: str, table: dict[str, Converter], verb: str, src: Path, out: Path) -> Converter:
    if fmt not in table:
        raise UsageError(f"cannot {verb} {fmt!r} (known: {', '.join(table)})")
    if not src.exists():
        raise UsageError(f"{src} does not exist")
    if src.resolve() == out.resolve():
        raise UsageError("the output would overwrite the input")
    return table[fmt]


def run_import(fmt: str, src: Path, out: Path) -> str:
    """Convert, validate what was written, and say what came out in one line."""
    convert = _check(fmt, IMPORTERS, "import", src, out)
    try:
        counts = convert(src, out)
    except ReplayError:
        out.unlink(missing_ok=True)  # a half-written trace is no trace
        raise
    checked = validate(out)
    return (
        f"{out}: {checked['requests']} requests in {checked['sessions']} sessions from {fmt} ({_fmt(counts)})"
    )


def run_export(fmt: str, src: Path, out: Path) -> str:
    counts = _check(fmt, EXPORTERS, "export", src, out)(src, out)
    return f"{out}: {fmt} ({_fmt(counts)})"


def _fmt(counts: dict[str, int]) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in counts.items())
