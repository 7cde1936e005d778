"""Start a target from its TOML and hand back what a run needs: URL, PID, build identity, log path.

``plan_target`` works out everything without running anything (a dry run prints it);
``start_target`` builds (if the file says how), records the build's identity, starts the server
as a ``ChildProcess``, waits for readiness and, on leaving the ``with``, stops it by its PID with
the target's own stop policy. A guard passes its ``adopt`` so the server's PID is in the journal
from the moment it exists.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx

from drivers.build import build_key, git_identity, run_build, version_line
from drivers.identity import model_fingerprint, native_identity, package_identity
from drivers.ports import free_port, port_owners
from drivers.process import ChildProcess
from drivers.refs import prepare_ref
from drivers.servers import ds4, external, llamacpp, sglang, sglang_router, sim, vllm
from drivers.servers.base import Launch
from drivers.target import Target, load_target
from replay.errors import DriverError

KINDS: dict[str, ModuleType] = {
    "ds4": ds4,
    "llamacpp": llamacpp,
    "vllm": vllm,
    "sglang": sglang,
    "sglang-router": sglang_router,
    "sim": sim,
    "external": external,
}

# This tool's own tree (the sim target's source): drivers/ sits beside replay/, in the same checkout
# or site-packages, so it is found without importing the package drivers serve.
TOOL_TREE = Path(__file__).resolve().parent.parent

_SECRET = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)


@dataclass(frozen=True)
class LaunchPlan:
    target: Target
    port: int
    launch: Launch
    build: dict[str, Any]  # the run header's target.build, minus what only running can tell
    log_path: Path | None


@dataclass(frozen=True)
class Served:
    url: str
    pid: int | None  # None: an external server whose listener this user cannot see
    build: dict[str, Any]
    log_path: Path | None
    target: Target
    process: ChildProcess | None  # None: external, never stopped by the tool


def plan_target(target: Target | str | Path, workdir: Path) -> LaunchPlan:
    """Everything ``start_target`` would run, computed without running it."""
    if not isinstance(target, Target):
        target = load_target(target)
    kind = KINDS[target.kind]
    if target.kind == "external":
        port = external.endpoint(target)[1]
    else:
        port = target.port or free_port(target.host)
    identity: dict[str, Any] = {}
    if target.checkout is not None:
        identity["checkout"] = git_identity(target.checkout)
        if target.ref is not None:
            identity["checkout"]["ref"] = target.ref
    elif target.kind == "sim":
        identity["source"] = git_identity(TOOL_TREE)
    executable = kind.executable(target)
    if executable is not None:
        identity["binary"] = native_identity(executable)
    package = getattr(kind, "package", lambda _t: None)(target)
    if package is not None:
        identity["package"] = package_identity(package) or {"name": package, "installed": False}
    key = build_key(target, identity)
    launch = kind.plan(target, port=port, workdir=Path(workdir), build_key=key)
    build = {
        "kind": target.kind,
        "name": target.name,
        "file": str(target.path) if target.path else None,
        **identity,
        "build_key": key,
        "build_command": target.build,
        "model": _model_identity(target.model),
        "version": launch.version,
        "argv": launch.argv,
        "env": {k: "<redacted>" if _SECRET.search(k) else v for k, v in launch.env.items()},
        "notes": launch.notes,
        "url": launch.url,
        "metrics_path": launch.metrics_path,
    }
    log_path = Path(workdir) / f"{_safe(target.name)}.{port}.log" if launch.stoppable else None
    return LaunchPlan(target, port, launch, build, log_path)


def describe_plan(plan: LaunchPlan) -> list[str]:
    """The actions ``start_target`` would take, one line each, for a dry run."""
    t = plan.target
    lines = []
    if t.build is not None:
        lines.append(f"would build in {t.checkout}: {t.build}")
    if not plan.launch.stoppable:
        lines.append(f"would use the running server at {plan.launch.url} (never stopped)")
        return lines
    for d in plan.launch.dirs:
        lines.append(f"would create {d}")
    env = " ".join(f"{k}={v}" for k, v in plan.build["env"].items())
    lines.append(f"would start: {env + ' ' if env else ''}{' '.join(plan.launch.argv)}")
    lines.append(f"  log {plan.log_path}; ready when {_readiness(plan.launch)} within {t.ready_timeout:g}s")
    lines.append(
        f"  stop: one SIGTERM, wait {t.stop_timeout:g}s, then "
        + ("SIGKILL its process group" if t.kill_on_timeout else "leave it running and fail")
    )
    return lines


@contextmanager
def start_target(
    target: Target | str | Path,
    workdir: Path,
    *,
    adopt: Callable[[ChildProcess], None] | None = None,
) -> Iterator[Served]:
    """Build, start and wait for a target; stop it (by PID) when the block ends."""
    if not isinstance(target, Target):
        target = load_target(target)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    target = prepare_ref(target)  # a ref: its own built worktree (cached by commit)
    build_s = run_build(target, workdir / f"{_safe(target.name)}.build.log")
    plan = plan_target(target, workdir)
    launch = plan.launch
    build = dict(plan.build)
    build["build_seconds"] = build_s
    if launch.version_argv and build["version"] is None:
        build["version"] = version_line(launch.version_argv, timeout=60.0)
    if not launch.stoppable:
        if launch.ready_http:
            _probe_external(launch.ready_http, target.ready_timeout)
        owners = port_owners(plan.port)
        pid = owners[0].pid if len(owners) == 1 else None
        build["pid"] = pid
        yield Served(launch.url, pid, build, None, target, None)
        return
    for d in launch.dirs:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
    assert plan.log_path is not None
    child = ChildProcess(
        launch.argv,
        log_path=plan.log_path,
        env=launch.env,
        cwd=launch.cwd,
        stop_timeout=target.stop_timeout,
        give_up=target.kill_on_timeout,
        name=f"{target.kind}:{target.name}",
    )
    if adopt is not None:
        adopt(child)
    with child:
        t0 = time.monotonic()
        if launch.ready_line:
            child.wait_for_line(launch.ready_line, target.ready_timeout)
        if launch.ready_http:
            left = max(0.1, target.ready_timeout - (time.monotonic() - t0))
            child.wait_for_http(launch.ready_http, left)
        build["pid"] = child.pid
        build["ready_seconds"] = time.monotonic() - t0
        yield Served(launch.url, child.pid, build, plan.log_path, target, child)


def _probe_external(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer"
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        while True:
            try:
                status = client.get(url).status_code
                if status == 200:
                    return
                last = f"HTTP {status}"
            except httpx.HTTPError as e:
                last = type(e).__name__
            if time.monotonic() >= deadline:
                raise DriverError(f"external server not ready after {timeout:g}s ({url}: {last})")
            time.sleep(0.1)


def _readiness(launch: Launch) -> str:
    parts = []
    if launch.ready_line:
        parts.append(f"a log line matches {launch.ready_line!r}")
    if launch.ready_http:
        parts.append(f"GET {launch.ready_http} answers 200")
    return " and ".join(parts) or "started"


def _model_identity(model: str | None) -> dict[str, Any] | None:
    """Path, size and a head-and-tail hash (hashing a multi-GiB model whole would cost minutes)."""
    if model is None:
        return None
    found = model_fingerprint(model)
    if found is not None:
        return {**found, "mtime": int(Path(model).stat().st_mtime)}
    return {"name": model}


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
