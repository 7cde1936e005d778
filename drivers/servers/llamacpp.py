"""llama.cpp's server: a ``llama-server`` executable, or the xllamacpp wheel through our launcher.

Both take the same llama-server flags (``drivers.servers.xllamacpp_launch`` maps them onto
xllamacpp and refuses any it cannot map). ``binary = "xllamacpp"``, or no binary while xllamacpp is
importable, picks the wheel; any other binary is exec'd as is. Readiness is ``GET /health``:
503 while the model loads, 200 once it serves. ``--metrics`` is added so the Prometheus counters
can be compared with per-request usage.
"""

from __future__ import annotations

import importlib.util
import sys
from importlib import metadata
from pathlib import Path

from drivers.build import resolve_binary
from drivers.servers.base import Launch, base_url, has_flag, refuse_flags
from drivers.target import Target

XLLAMACPP = "xllamacpp"


def uses_xllamacpp(target: Target) -> bool:
    if target.binary == XLLAMACPP:
        return True
    return target.binary is None and importlib.util.find_spec(XLLAMACPP) is not None


def executable(target: Target) -> str | None:
    return None if uses_xllamacpp(target) else resolve_binary(target, "llama-server")


def package(target: Target) -> str | None:
    """The Python distribution that holds the server's code, when it runs from the wheel."""
    return XLLAMACPP if uses_xllamacpp(target) else None


def plan(target: Target, *, port: int, workdir: Path, build_key: str) -> Launch:
    refuse_flags(target, "--host", use="host =")
    refuse_flags(target, "--port", use="port =")
    version = None
    version_argv = None
    if uses_xllamacpp(target):
        argv = [sys.executable, "-m", "drivers.servers.xllamacpp_launch"]
        try:
            version = f"xllamacpp {metadata.version(XLLAMACPP)}"
        except metadata.PackageNotFoundError:
            version = None
    else:
        binary = resolve_binary(target, "llama-server")
        argv = [binary]
        version_argv = [binary, "--version"]
    if target.model and not has_flag(target.flags, "-m", "--model"):
        argv += ["-m", target.model]
    argv += ["--host", target.host, "--port", str(port)]
    if not has_flag(target.flags, "--metrics"):
        argv.append("--metrics")
    argv += target.flags
    url = base_url(target.host, port)
    return Launch(
        argv=argv,
        url=url,
        env=dict(target.env),
        cwd=target.checkout,
        ready_http=url + (target.health or "/health"),
        version_argv=version_argv,
        version=version,
        metrics_path="/metrics",
        notes={"launcher": "xllamacpp" if version_argv is None else "llama-server"},
    )
