"""SGLang's router (``python -m sglang_router.launch_router``, the PyPI package ``sglang-router``)
in front of N servers: ``binary`` is the Python that has it installed, ``policy`` its routing
policy (``cache_aware``, ``round_robin``, ``random``, ``power_of_two``), ``backend`` the target
file of the servers it fronts (``replicas = N``), started first; their URLs become its
``--worker-urls``. ``/health`` answers 200 once it serves.
"""

from __future__ import annotations

import sys
from pathlib import Path

from drivers.build import resolve_binary
from drivers.ports import free_port
from drivers.servers.base import Launch, base_url, has_flag, refuse_flags
from drivers.target import Target
from replay.errors import UsageError

POLICIES = ("cache_aware", "round_robin", "random", "power_of_two")
PACKAGE = "sglang-router"


def executable(target: Target) -> str:
    return resolve_binary(target, sys.executable)


def package(target: Target) -> str:
    return PACKAGE


def plan(target: Target, *, port: int, workdir: Path, build_key: str) -> Launch:
    refuse_flags(target, "--host", use="host =")
    refuse_flags(target, "--port", use="port =")
    refuse_flags(target, "--policy", use="policy =")
    if not has_flag(target.flags, "--worker-urls"):
        raise UsageError(
            f"{target.where}: kind 'sglang-router' starts in front of its backend's servers (backend =)"
        )
    python = executable(target)
    policy = target.policy or "cache_aware"
    argv = [python, "-m", "sglang_router.launch_router", "--host", target.host, "--port", str(port)]
    argv += ["--policy", policy, *target.flags]
    if not has_flag(target.flags, "--prometheus-port"):
        # Its metrics listener defaults to port 29000 for every router: a second router on the
        # machine (two arms side by side, a user's own) would panic at start.
        argv += ["--prometheus-host", target.host, "--prometheus-port", str(free_port(target.host))]
    if not has_flag(target.flags, "--log-level"):
        # Its debug log is the only place it says which worker it sent a request to (a line
        # `Sending request url=WORKER` in the span naming the request's X-Request-ID).
        argv += ["--log-level", "debug"]
    url = base_url(target.host, port)
    return Launch(
        argv=argv,
        url=url,
        env=dict(target.env),
        cwd=target.checkout,
        ready_http=url + (target.health or "/health"),
        version_argv=[
            python,
            "-c",
            f"import importlib.metadata as m; print('{PACKAGE}', m.version('{PACKAGE}'))",
        ],
        notes={"policy": policy},
    )
