"""ds4-server (antirez/ds4): readiness is its ``listening on`` line; one lock file per instance.

Quirks applied (see reference ds4-server.md 1b, 4.6, 8): ds4 refuses to start while another ds4
holds ``DS4_LOCK_FILE`` (default /tmp/ds4.lock, shared by the user's daily server), so each
instance gets its own; disk KV checkpoint files are not portable between builds, so
``kv_disk_dir = "auto"`` gives each build its own directory. There is no ``--version`` flag: the
checkout commit and the binary's hash identify the build. Stopping is one SIGTERM and a long wait
(the shutdown checkpoint), which the target's ``stop_timeout`` sets.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from drivers.build import resolve_binary
from drivers.servers.base import Launch, base_url, has_flag, kv_disk_dir, refuse_flags
from drivers.target import Target

READY_LINE = r"listening on (?P<url>http://\S+)"


def executable(target: Target) -> str:
    return resolve_binary(target, "ds4-server")


def plan(target: Target, *, port: int, workdir: Path, build_key: str) -> Launch:
    refuse_flags(target, "--host", use="host =")
    refuse_flags(target, "--port", use="port =")
    argv = [executable(target)]
    if target.model and not has_flag(target.flags, "-m", "--model"):
        argv += ["-m", target.model]
    argv += ["--host", target.host, "--port", str(port)]
    notes: dict[str, str] = {}
    dirs: list[Path] = []
    kv = kv_disk_dir(target, workdir, build_key)
    if kv is not None:
        argv += ["--kv-disk-dir", str(kv)]
        notes["kv_disk_dir"] = str(kv)
        dirs.append(kv)
    argv += target.flags
    lock = workdir / "locks" / f"ds4-{port}-{uuid.uuid4().hex[:12]}.lock"
    dirs.append(lock.parent)
    notes["DS4_LOCK_FILE"] = str(lock)
    url = base_url(target.host, port)
    return Launch(
        argv=argv,
        url=url,
        env={**target.env, "DS4_LOCK_FILE": str(lock)},
        cwd=target.checkout,
        ready_line=READY_LINE,
        ready_http=url + target.health if target.health else None,
        notes=notes,
        dirs=tuple(dirs),
    )
