"""A server that is already running (the user's own, or one on another port): never started or stopped.

The tool only reads who listens on its port, to put that process in the run header.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from drivers.servers.base import Launch
from drivers.target import Target
from replay.errors import UsageError


def executable(target: Target) -> None:
    return None


def endpoint(target: Target) -> tuple[str, int]:
    assert target.url is not None
    parts = urlsplit(target.url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{target.where}: url {target.url!r} is not http://HOST:PORT")
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


def plan(target: Target, *, port: int, workdir: Path, build_key: str) -> Launch:
    url = (target.url or "").rstrip("/")
    endpoint(target)
    return Launch(
        argv=[],
        url=url,
        ready_http=url + target.health if target.health else None,
        stoppable=False,
    )
