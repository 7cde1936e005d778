"""Our simulator (``python -m replay.sim``): ds4's flags and readiness line, or, with
``--server llama`` in its flags, llama-server's (``-m`` is then a GGUF file, the disk directory is
``--slot-save-path``, and ``--metrics`` is on, as for a real llama-server).

With a ``checkout`` (another copy of this repository, say a branch), the simulator runs from that
checkout's code, so an A/B of two simulator builds is an A/B of two source trees.
"""

from __future__ import annotations

import os
import sys
from importlib import metadata
from pathlib import Path

from drivers.servers.base import Launch, base_url, has_flag, kv_disk_dir, refuse_flags
from drivers.target import Target

READY_LINE = (
    r"listening on (?P<url>http://\S+)"  # ds4's `listening on`, llama-server's `server is listening on`
)


def plays_llama(flags: tuple[str, ...] | list[str]) -> bool:
    """Whether the simulator's flags make it llama-server (`--server llama`)."""
    flags = list(flags)
    return "--server=llama" in flags or any(
        a == "--server" and i + 1 < len(flags) and flags[i + 1] == "llama" for i, a in enumerate(flags)
    )


def executable(target: Target) -> str | None:
    return None  # a Python module: the checkout commit identifies it


def plan(target: Target, *, port: int, workdir: Path, build_key: str) -> Launch:
    refuse_flags(target, "--host", use="host =")
    refuse_flags(target, "--port", use="port =")
    python = target.binary or sys.executable
    argv = [python, "-m", "replay.sim", "--host", target.host, "--port", str(port)]
    llama = plays_llama(target.flags)
    if target.model and not has_flag(target.flags, "-m", "--model"):
        argv += ["--model", target.model]
    notes: dict[str, str] = {}
    dirs: list[Path] = []
    kv = kv_disk_dir(target, workdir, build_key)
    if kv is not None:
        flag = "--slot-save-path" if llama else "--kv-disk-dir"
        argv += [flag, str(kv)]
        notes["slot_save_path" if llama else "kv_disk_dir"] = str(kv)
        dirs.append(kv)
    if llama and not has_flag(target.flags, "--metrics"):
        argv.append("--metrics")
    argv += target.flags
    env = dict(target.env)
    version = None
    if target.checkout is not None:
        parts = [str(target.checkout), env.get("PYTHONPATH") or os.environ.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in parts if p)
        notes["PYTHONPATH"] = str(target.checkout)
    else:
        try:
            version = f"agent-replay {metadata.version('agent-replay')}"
        except metadata.PackageNotFoundError:
            version = None
    url = base_url(target.host, port)
    return Launch(
        argv=argv,
        url=url,
        env=env,
        cwd=target.checkout,
        ready_line=READY_LINE,
        ready_http=url + target.health if target.health else None,
        version=version,
        metrics_path="/metrics" if llama else None,
        notes=notes,
        dirs=tuple(dirs),
    )
