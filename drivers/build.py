"""Which build produced a result: checkout commit, branch, dirty state, binary hash and version.

Testing a PR branch is the point of a target file, so every result must say exactly which build
it came from. A dirty checkout is recorded as dirty (with how many files differ) rather than
hidden behind the commit it started from; the binary's sha256 tells two builds of one commit
apart.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from drivers.process import run_to_end
from drivers.target import Target
from replay.errors import DriverError, UsageError

# Set by `binaries_may_be_missing` (a dry run): binaries not on PATH are listed here, not refused.
_MISSING: ContextVar[list[str] | None] = ContextVar("missing_binaries", default=None)


@contextmanager
def binaries_may_be_missing() -> Iterator[list[str]]:
    """While planning a dry run: a binary not on PATH is planned under its bare name and its name
    added to the list this yields, so the dry run can show what it would run and say what is missing."""
    missing: list[str] = []
    token = _MISSING.set(missing)
    try:
        yield missing
    finally:
        _MISSING.reset(token)


def resolve_binary(target: Target, default: str) -> str:
    """The executable to run: absolute, relative to the checkout, or found on PATH."""
    name = target.binary or default
    path = Path(name).expanduser()
    if path.is_absolute():
        return str(path)
    if target.checkout is not None and ("/" in name or (target.checkout / name).exists()):
        return str(target.checkout / name)
    if "/" in name:
        return str(path.resolve())
    found = shutil.which(name)
    if found is None:
        missing = _MISSING.get()
        if missing is None:
            raise UsageError(
                f"{target.where}: binary {name!r} is not on PATH (set binary = '/path/to/{name}')"
            )
        if name not in missing:
            missing.append(name)
        return name
    return found


def run_build(target: Target, log_path: Path) -> float | None:
    """Run the target's build command in its checkout; seconds taken, or None when there is none."""
    if target.build is None or target.checkout is None:
        return None
    argv = ["/bin/sh", "-c", target.build] if isinstance(target.build, str) else list(target.build)
    t0 = time.monotonic()
    code = run_to_end(
        argv,
        log_path=log_path,
        timeout=target.build_timeout,
        env=target.env,
        cwd=target.checkout,
        name=f"build of {target.name}",
    )
    if code != 0:
        raise DriverError(
            f"{target.where}: build {_show(target.build)!r} failed with exit code {code}; see {log_path}"
        )
    return time.monotonic() - t0


_SHOWN_CHANGED = 20


def git_identity(checkout: Path) -> dict[str, Any]:
    """Commit, branch and dirty state of a checkout, read without touching it."""

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "--no-optional-locks", "-C", str(checkout), *args],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"path": str(checkout), "git": False}
    branch = git("symbolic-ref", "--short", "-q", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    changed = [line for line in (status or "").splitlines() if line.strip()]
    return {
        "path": str(checkout),
        "git": True,
        "commit": commit,
        "branch": branch,  # None: detached HEAD
        "describe": git("describe", "--always", "--dirty", "--tags"),
        "dirty": bool(changed),
        "changed_files": len(changed),
        "changed": [line.split(None, 1)[-1] for line in changed[:_SHOWN_CHANGED]],  # the first few paths
    }


def version_line(argv: list[str], timeout: float = 15.0) -> str | None:
    """First line of a ``--version`` run that names a version (else its first line), or None."""
    fd, name = tempfile.mkstemp(prefix="replay-version-", suffix=".log")
    os.close(fd)
    log = Path(name)
    try:
        code = run_to_end(argv, log_path=log, timeout=timeout, name=f"{Path(argv[0]).name} --version")
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except DriverError:
        return None
    finally:
        log.unlink(missing_ok=True)
    if code != 0 or not lines:
        return None
    for line in lines:
        if "version" in line.lower():
            return line
    return lines[0]


def build_key(target: Target, identity: dict[str, Any]) -> str:
    """A short name for this build, for directories whose files are not portable between builds."""
    checkout = identity.get("checkout") or identity.get("source") or {}
    binary = identity.get("binary") or {}
    package = identity.get("package") or {}
    tag = (
        checkout.get("commit", "")[:12]
        or (binary.get("combined_sha256") or binary.get("sha256", ""))[:12]
        or "-".join(filter(None, [package.get("version"), package.get("combined_sha256", "")[:12]]))
        or "unversioned"
    )
    if checkout.get("dirty"):
        tag += "-dirty"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in target.name)
    return f"{safe}-{tag}"


def _show(build: str | list[str]) -> str:
    return build if isinstance(build, str) else shlex.join(build)
