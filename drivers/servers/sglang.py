"""SGLang (``python -m sglang.launch_server``): ``binary`` is the Python that has sglang installed.

SGLang reports cached prompt tokens only with ``--enable-cache-report`` and serves Prometheus
metrics only with ``--enable-metrics``; both are added. ``/health`` answers 200 once it serves.
"""

from __future__ import annotations

import sys
from pathlib import Path

from drivers.build import resolve_binary
from drivers.servers.base import Launch, base_url, has_flag, refuse_flags
from drivers.target import Target
from replay.errors import UsageError

CACHE_FLAG = "--enable-cache-report"
METRICS_FLAG = "--enable-metrics"


def executable(target: Target) -> str:
    return resolve_binary(target, sys.executable)


def plan(target: Target, *, port: int, workdir: Path, build_key: str) -> Launch:
    refuse_flags(target, "--host", use="host =")
    refuse_flags(target, "--port", use="port =")
    if not target.model and not has_flag(target.flags, "--model-path"):
        raise UsageError(f"{target.where}: kind 'sglang' needs model = 'path or hub id'")
    python = executable(target)
    argv = [python, "-m", "sglang.launch_server"]
    if target.model and not has_flag(target.flags, "--model-path"):
        argv += ["--model-path", target.model]
    argv += ["--host", target.host, "--port", str(port)]
    notes = {}
    for flag in (CACHE_FLAG, METRICS_FLAG):
        if not has_flag(target.flags, flag):
            argv.append(flag)
            notes[flag.lstrip("-")] = "added"
    argv += target.flags
    url = base_url(target.host, port)
    return Launch(
        argv=argv,
        url=url,
        env=dict(target.env),
        cwd=target.checkout,
        ready_http=url + (target.health or "/health"),
        version_argv=[python, "-c", "import sglang; print('sglang', sglang.__version__)"],
        metrics_path="/metrics",
        notes=notes,
    )
