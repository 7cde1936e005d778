"""Git refs as targets: each ref built in a worktree of its own, one build per commit, reused.

``ref = "pr-765"`` in a target TOML (or ``replay ab --a-ref/--b-ref``) names a ref of the target's
``checkout``. The ref is resolved to a commit; the commit gets a detached worktree under the
worktree cache (``$AGENT_REPLAY_WORKTREES``, else ``$XDG_CACHE_HOME/agent-replay/worktrees``, one
folder per checkout), the target's build command runs there once, and a marker file records that
it succeeded with that command. The next A/B of the same commit reuses the build: a ref that moved
gets a new commit and so a new worktree. The user's own checkout is never touched beyond
``git worktree add``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from dataclasses import replace
from pathlib import Path

from drivers.build import run_build
from drivers.target import Target
from replay.errors import DriverError, UsageError

MARKER = ".agent-replay-built"


def cache_root() -> Path:
    env = os.environ.get("AGENT_REPLAY_WORKTREES")
    if env:
        return Path(env).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "agent-replay" / "worktrees"


def _git(checkout: Path, *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            ["git", "-C", str(checkout), *args],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DriverError(f"git {' '.join(args)} in {checkout}: {e}") from None


def resolve_commit(checkout: Path, ref: str) -> str:
    out = _git(checkout, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if out.returncode != 0 or not out.stdout.strip():
        raise UsageError(f"{checkout}: git ref {ref!r} names no commit (fetch it first?)")
    return out.stdout.strip()


def worktree_dir(checkout: Path, commit: str) -> Path:
    top = _git(checkout, "rev-parse", "--path-format=absolute", "--git-common-dir").stdout.strip()
    repo = Path(top or checkout).resolve()
    tag = hashlib.sha1(str(repo).encode()).hexdigest()[:8]
    name = repo.parent.name if repo.name == ".git" else repo.name
    return cache_root() / f"{name}-{tag}" / commit[:16]


def _build_command(target: Target) -> str:
    return target.build if isinstance(target.build, str) else " ".join(target.build or [])


def prepare_ref(target: Target) -> Target:
    """The target moved to a built worktree of its ref (built now unless a build of this commit
    with the same command is already there); a target without a ref comes back as it is."""
    if target.ref is None:
        return target
    if target.checkout is None:
        raise UsageError(f"{target.where}: ref {target.ref!r} needs a checkout")
    commit = resolve_commit(target.checkout, target.ref)
    wt = worktree_dir(target.checkout, commit)
    if target.checkout.resolve() == wt.resolve():
        return target
    if not (wt / ".git").exists():
        wt.parent.mkdir(parents=True, exist_ok=True)
        out = _git(target.checkout, "worktree", "add", "--detach", "--force", str(wt), commit)
        if out.returncode != 0:
            raise DriverError(f"git worktree add for {target.ref} ({commit[:12]}): {out.stderr.strip()}")
    moved = replace(target, checkout=wt)
    marker = wt / MARKER
    done = marker.read_text() if marker.exists() else None
    command = _build_command(target)
    if target.build is not None and done != command:
        marker.unlink(missing_ok=True)
        run_build(moved, wt.parent / f"{commit[:16]}.build.log")
        marker.write_text(command)
    return replace(moved, build=None)  # built: start_target must not build it again
