"""`replay import FORMAT IN OUT` and `replay export FORMAT IN OUT`: one registry per direction."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from replay.errors import TraceError, UsageError
from replay.importers.base import ImportOptions
from replay.importers.claude_code import import_claude_code
from replay.importers.codex import import_codex
from replay.importers.hermes import import_hermes
from replay.importers.mooncake import export_mooncake, import_mooncake
from replay.importers.opencode import import_opencode
from replay.importers.otel import import_otel
from replay.importers.sharegpt import import_sharegpt
from replay.importers.swe import import_swe
from replay.importers.tracelab import import_tracelab
from replay.importers.weka import import_weka
from replay.outputs import replacing
from replay.trace.reader import validate

Converter = Callable[..., dict[str, int]]


@dataclass(frozen=True, slots=True)
class Format:
    """An importable format: its converter, what SRC is, and where the agent keeps its files."""

    convert: Converter
    takes: str
    linux: str
    macos: str


IMPORTS: dict[str, Format] = {
    "claude-code": Format(
        import_claude_code,
        "a transcript (.jsonl), a project folder or the projects folder",
        "~/.claude/projects/<project path, / as ->/<session>.jsonl ($CLAUDE_CONFIG_DIR)",
        "~/.claude/projects/<project path, / as ->/<session>.jsonl ($CLAUDE_CONFIG_DIR)",
    ),
    "codex": Format(
        import_codex,
        "a rollout (.jsonl) or a folder of them",
        "~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl ($CODEX_HOME)",
        "~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl ($CODEX_HOME)",
    ),
    "hermes": Format(
        import_hermes,
        "state.db, or the folder holding it",
        "~/.hermes/state.db ($HERMES_HOME)",
        "~/.hermes/state.db ($HERMES_HOME)",
    ),
    "opencode": Format(
        import_opencode,
        "opencode.db, the storage folder, an `opencode export` file or a `run --format json` stream",
        "~/.local/share/opencode/opencode.db, older: ~/.local/share/opencode/storage/ ($XDG_DATA_HOME)",
        "~/.local/share/opencode/opencode.db, older: ~/.local/share/opencode/storage/ ($XDG_DATA_HOME)",
    ),
    "mooncake": Format(import_mooncake, "a Mooncake trace (.jsonl)", "-", "-"),
    "sharegpt": Format(import_sharegpt, "ShareGPT conversations (.json or .jsonl)", "-", "-"),
    "otel": Format(
        import_otel,
        "OpenTelemetry GenAI spans: OTLP JSON (.jsonl as the collector writes it, .json) or a folder",
        "-",
        "-",
    ),
    "swe-agent": Format(
        import_swe,
        "Mini-SWE-agent (.traj.json) or SWE-agent (.traj) trajectories, or a folder of them",
        "-",
        "-",
    ),
    "tracelab": Format(
        import_tracelab,
        "TraceLab round traces (the corpus's syfi_coding_trace.jsonl or .jsonl.gz, or a folder)",
        "-",
        "-",
    ),
    "weka": Format(
        import_weka,
        "SemiAnalysis/WEKA Claude Code traces (traces.jsonl, a .json trace or a folder)",
        "-",
        "-",
    ),
}
IMPORTERS: dict[str, Converter] = {name: f.convert for name, f in IMPORTS.items()}
EXPORTERS: dict[str, Converter] = {"mooncake": export_mooncake}
# Converters that take `ImportOptions` (the others predate it and know no filters).
_WITH_OPTIONS = {
    "claude-code",
    "codex",
    "hermes",
    "opencode",
    "mooncake",
    "weka",
    "otel",
    "swe-agent",
    "tracelab",
}


def _check(fmt: str, table: dict[str, Converter], verb: str, src: Path, out: Path) -> Converter:
    if fmt not in table:
        raise UsageError(f"cannot {verb} {fmt!r} (known: {', '.join(table)})")
    if not src.exists():
        raise UsageError(f"{src} does not exist")
    if src.resolve() == out.resolve():
        raise UsageError("the output would overwrite the input")
    return table[fmt]


def run_import(fmt: str, src: Path, out: Path, options: ImportOptions | None = None) -> str:
    """Convert into a temporary sibling of `out`, validate it, rename it to `out` (`replacing`):
    a failed import leaves no partial trace and an existing `out` as it was. One line says what
    came out."""
    convert = _check(fmt, IMPORTERS, "import", src, out)
    if (
        fmt not in _WITH_OPTIONS
        and options is not None
        and (options.since or options.until or options.sessions)
    ):
        raise UsageError(f"{fmt} has no timestamps or session ids to filter by")
    with replacing(out) as written:
        if fmt in _WITH_OPTIONS:
            counts = convert(src, written, options=options or ImportOptions())
        else:
            counts = convert(src, written)
        checked = _validated(written, out)
    return (
        f"{out}: {checked['requests']} requests in {checked['sessions']} sessions from {fmt} ({_fmt(counts)})"
    )


def _validated(written: Path, out: Path) -> dict[str, int]:
    """What a converter wrote must validate; a failure names `out`, which is left as it was."""
    try:
        return validate(written)
    except TraceError as exc:
        if exc.path != str(written):
            raise
        problem = f"{exc.problem} (in the converted trace, so {out} was not written)"
        raise TraceError(str(out), exc.line, problem) from None


def list_formats() -> str:
    """`replay import --list`: each format, what SRC is, and where the agent keeps its files."""
    lines = []
    for name, f in IMPORTS.items():
        lines.append(f"{name}: {f.takes}")
        if f.linux != "-":
            if f.linux == f.macos:
                lines.append(f"    Linux and macOS: {f.linux}")
            else:
                lines.append(f"    Linux: {f.linux}")
                lines.append(f"    macOS: {f.macos}")
    return "\n".join(lines)


def run_export(fmt: str, src: Path, out: Path) -> str:
    """Convert into a temporary sibling of `out`, renamed to `out` when complete."""
    convert = _check(fmt, EXPORTERS, "export", src, out)
    with replacing(out) as written:
        counts = convert(src, written)
    return f"{out}: {fmt} ({_fmt(counts)})"


def _fmt(counts: dict[str, int]) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in counts.items())
