"""What a server kind tells the launcher: argv, environment, URL and how to know it is ready.

A kind module (``ds4.py``, ``llamacpp.py``, ...) has two functions: ``executable(target)``, the
file whose hash and ``--version`` identify the build (None when the server is a Python module),
and ``plan(target, port=, workdir=, build_key=)`` returning a ``Launch``. Nothing here starts a
process, so a dry run can print exactly what would be run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from drivers.target import Target
from replay.errors import UsageError


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    url: str  # base URL clients use, no trailing slash
    env: dict[str, str] = field(default_factory=dict)  # added to the tool's environment
    cwd: Path | None = None
    ready_line: str | None = None  # regex searched in the server's log
    ready_http: str | None = None  # URL polled until it answers 200
    version_argv: list[str] | None = None  # run once to record the build's version
    version: str | None = None  # a version known without running anything
    metrics_path: str | None = None  # Prometheus endpoint, where the kind has one
    notes: dict[str, str] = field(default_factory=dict)  # quirks applied, for the run header
    dirs: tuple[Path, ...] = ()  # directories to create (mode 0700) just before starting
    stoppable: bool = True  # False: external, the tool never stops it


def has_flag(flags: Sequence[str], *names: str) -> bool:
    """True if any of ``names`` appears as ``--x`` or ``--x=value``."""
    return any(f in names or f.split("=", 1)[0] in names for f in flags)


def refuse_flags(target: Target, *names: str, use: str) -> None:
    """Flags the target file sets through its own keys must not also be in ``flags``."""
    for name in names:
        if has_flag(target.flags, name):
            raise UsageError(f"{target.where}: set {use} instead of the {name} flag")


def kv_disk_dir(target: Target, workdir: Path, build_key: str) -> Path | None:
    """ds4-style disk KV directory: one per build under the run directory, or the user's own; a
    replica of a fleet (`replicas = N`) has one of its own inside it."""
    if target.kv_disk_dir is None:
        return None
    path = workdir / "kv" / build_key if target.kv_disk_dir == "auto" else Path(target.kv_disk_dir)
    return path if target.replica is None else path / f"replica-{target.replica}"


def base_url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "localhost") else host
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    return f"http://{shown}:{port}"
