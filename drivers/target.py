"""A target server described in a small TOML file, so `replay run --server` and A/B read the same thing.

Example (every key but ``kind`` is optional; relative paths are relative to the TOML file)::

    kind = "ds4"                      # ds4 | llamacpp | vllm | sglang | sim | external
    name = "pr-1058"                  # default: the file's stem
    checkout = "~/src/ds4"            # a git checkout: commit, branch, dirty state are recorded
    ref = "pr-765"                    # build this git ref of the checkout in a worktree of its own
    build = "make"                    # run in the checkout before starting (string: via sh -c)
    binary = "ds4-server"             # path, relative to the checkout, or a name on PATH
    model = "~/models/ds4flash.gguf"   # "./x" and "~/x" are paths; "org/name" is left as is
    flags = ["-c", "100000", "--batched-session", "2"]
    host = "127.0.0.1"
    port = 8011                       # default: a free ephemeral port
    env = { DS4_METAL_PREFILL_CHUNK = "1024" }
    ready_timeout = 600               # seconds for the model to load
    stop_timeout = 300                # seconds allowed for a shutdown checkpoint after SIGTERM
    kill_on_timeout = true            # SIGKILL after stop_timeout (false: leave it and fail loudly)
    kv_disk_dir = "auto"              # ds4/sim: "auto" = a directory of its own per build
    health = "/health"                # override the readiness probe path (HTTP kinds)
    url = "http://127.0.0.1:8000"     # external only: the server is already running (a,b: several)
    replicas = 3                      # start 3 of this server, each its own PID, port, disk directory
    routing = "sticky"                # over several: sticky | round-robin | least (as --routing)
    session_header = "X-Session-ID"   # as --session-header; session_field as --session-field
    policy = "cache_aware"            # kind "sglang-router" only: its policy, and
    backend = "sims.toml"             # the target file of the servers it routes to
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from replay.errors import UsageError

KINDS = ("ds4", "llamacpp", "vllm", "sglang", "sglang-router", "sim", "external")
ROUTER_POLICIES = ("cache_aware", "round_robin", "random", "power_of_two")  # sglang-router's


@dataclass(frozen=True)
class Target:
    kind: str
    name: str
    path: Path | None = None  # the TOML file it came from
    binary: str | None = None
    checkout: Path | None = None
    build: str | list[str] | None = None
    model: str | None = None
    flags: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    ready_timeout: float = 600.0
    stop_timeout: float = 300.0
    kill_on_timeout: bool = True
    build_timeout: float = 3600.0
    kv_disk_dir: str | None = None  # None | "auto" | a path
    health: str | None = None
    url: str | None = None
    ref: str | None = None  # a git ref of `checkout`, built in its own worktree (drivers.refs)
    replicas: int = 1  # how many of this server to start (a fleet on one machine)
    replica: int | None = None  # which one this is, of a fleet `replica_targets` made
    # How a run routes over several targets; None: the run's options (checked by the engine).
    routing: str | None = None
    session_header: str | None = None
    session_field: str | None = None
    # kind 'sglang-router': its policy, and the target file of the servers it fronts.
    policy: str | None = None
    backend: Path | None = None

    @property
    def where(self) -> str:
        return str(self.path) if self.path else f"target {self.name}"


_TYPES: dict[str, tuple[type, ...]] = {
    "kind": (str,),
    "name": (str,),
    "binary": (str,),
    "checkout": (str,),
    "build": (str, list),
    "model": (str,),
    "flags": (list,),
    "host": (str,),
    "port": (int,),
    "env": (dict,),
    "ready_timeout": (int, float),
    "stop_timeout": (int, float),
    "kill_on_timeout": (bool,),
    "build_timeout": (int, float),
    "kv_disk_dir": (str,),
    "health": (str,),
    "url": (str,),
    "ref": (str,),
    "replicas": (int,),
    "routing": (str,),
    "session_header": (str,),
    "session_field": (str,),
    "policy": (str,),
    "backend": (str,),
}


def load_target(path: str | Path) -> Target:
    """Parse and check a target TOML; every problem is reported as ``file: problem``."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such target file") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: not valid TOML: {e}") from None
    return target_from_dict(data, path=path)


def target_from_dict(data: dict[str, Any], *, path: Path | None = None, name: str | None = None) -> Target:
    where = str(path) if path else "target"

    def bad(problem: str) -> UsageError:
        return UsageError(f"{where}: {problem}")

    for key, value in data.items():
        if key not in _TYPES:
            raise bad(f"unknown key {key!r} (known: {', '.join(_TYPES)})")
        types = _TYPES[key]
        if isinstance(value, bool) and bool not in types:
            raise bad(f"{key} must be {_type_names(types)}, not a boolean")
        if not isinstance(value, types):
            raise bad(f"{key} must be {_type_names(types)}, not {type(value).__name__}")
    kind = data.get("kind")
    if kind is None:
        raise bad(f"missing key 'kind' (one of {', '.join(KINDS)})")
    if kind not in KINDS:
        raise bad(f"kind {kind!r} is not one of {', '.join(KINDS)}")
    flags = data.get("flags", [])
    if not all(isinstance(f, str | int | float) and not isinstance(f, bool) for f in flags):
        raise bad("flags must be a list of strings (numbers are accepted and turned into strings)")
    env = data.get("env", {})
    for k, v in env.items():
        if not isinstance(v, str | int | float) or isinstance(v, bool):
            raise bad(f"env.{k} must be a string")
    build = data.get("build")
    if isinstance(build, list) and not (build and all(isinstance(b, str) for b in build)):
        raise bad("build must be a command string or a non-empty list of strings")
    port = data.get("port")
    if port is not None and not 0 < port < 65536:
        raise bad(f"port {port} is out of range")
    for key in ("ready_timeout", "stop_timeout", "build_timeout"):
        if key in data and data[key] <= 0:
            raise bad(f"{key} must be positive")
    base = path.parent if path else Path.cwd()
    checkout = _resolve(data["checkout"], base) if "checkout" in data else None
    if checkout is not None and not checkout.is_dir():
        raise bad(f"checkout {checkout} is not a directory")
    if "build" in data and checkout is None:
        raise bad("build needs a checkout to run in")
    if "ref" in data and checkout is None:
        raise bad("ref needs a checkout (the git repository the ref is in)")
    url = data.get("url")
    if kind == "external":
        if not url:
            raise bad("kind 'external' needs url = 'http://HOST:PORT' of the running server")
        for key in ("binary", "checkout", "build", "flags", "env", "kv_disk_dir"):
            if key in data:
                raise bad(f"kind 'external' is already running; {key!r} does not apply")
    elif url:
        raise bad("url is only for kind 'external' (set host and port instead)")
    backend = _resolve(data["backend"], path.parent if path else Path.cwd()) if "backend" in data else None
    if kind == "sglang-router":
        if backend is None:
            raise bad("kind 'sglang-router' needs backend = 'servers.toml' (the servers it routes to)")
        if not backend.is_file():
            raise bad(f"backend {backend} is not a file")
        if data.get("policy", "cache_aware") not in ROUTER_POLICIES:
            raise bad(f"policy must be one of {', '.join(ROUTER_POLICIES)}, not {data['policy']!r}")
    elif "backend" in data or "policy" in data:
        raise bad("backend and policy are for kind 'sglang-router'")
    replicas = data.get("replicas", 1)
    if replicas < 1:
        raise bad(f"replicas must be at least 1, not {replicas}")
    if replicas > 1:
        if kind == "external":
            raise bad("kind 'external' is already running; name several as url = 'http://A,http://B'")
        for flag in ("--kv-disk-dir", "--slot-save-path"):
            if flag in [str(f) for f in flags]:
                raise bad(f"replicas need a disk directory each: set kv_disk_dir instead of the {flag} flag")
        if port is not None and port + replicas > 65536:
            raise bad(f"replicas take ports {port}..{port + replicas - 1}: out of range")
    if "kv_disk_dir" in data and kind not in ("ds4", "sim"):
        raise bad(f"kv_disk_dir applies to ds4 and sim, not {kind}")
    if "kv_disk_dir" in data and "--kv-disk-dir" in [str(f) for f in flags]:
        raise bad("kv_disk_dir and a --kv-disk-dir flag both given; keep one")
    kv_disk_dir = data.get("kv_disk_dir")
    if kv_disk_dir is not None and kv_disk_dir != "auto":
        kv_disk_dir = str(_resolve(kv_disk_dir, base))
    model = data.get("model")
    if model is not None and model.startswith(("~", "./", "../")):
        model = str(_resolve(model, base))  # "org/name" stays a hub id for vllm/sglang
    binary = data.get("binary")
    if binary is not None and binary.startswith(("~", "./", "../")):
        binary = str(_resolve(binary, base))
    return Target(
        kind=kind,
        name=data.get("name") or name or (path.stem if path else kind),
        path=path,
        binary=binary,
        checkout=checkout,
        build=build,
        model=model,
        flags=tuple(str(f) for f in flags),
        host=data.get("host", "127.0.0.1"),
        port=port,
        env={k: str(v) for k, v in env.items()},
        ready_timeout=float(data.get("ready_timeout", 600.0)),
        stop_timeout=float(data.get("stop_timeout", 300.0)),
        kill_on_timeout=data.get("kill_on_timeout", True),
        build_timeout=float(data.get("build_timeout", 3600.0)),
        kv_disk_dir=kv_disk_dir,
        health=data.get("health"),
        url=url,
        ref=data.get("ref"),
        replicas=replicas,
        routing=data.get("routing"),
        session_header=data.get("session_header"),
        session_field=data.get("session_field"),
        policy=data.get("policy"),
        backend=backend,
    )


def replica_targets(target: Target) -> list[Target]:
    """The servers a target stands for: itself, its `replicas` (each named `NAME-i`, on port
    `port + i` when a port is set, with a disk directory of its own), or the running servers an
    external `url = 'A,B'` lists."""
    if target.kind == "external" and target.url is not None and "," in target.url:
        urls = [u.strip().rstrip("/") for u in target.url.split(",")]
        if len(set(urls)) != len(urls) or not all(u.startswith(("http://", "https://")) for u in urls):
            raise UsageError(
                f"{target.where}: url must list distinct URLs (http://HOST:PORT), not {target.url!r}"
            )
        return [replace(target, url=u, name=f"{target.name}-{i}", replica=i) for i, u in enumerate(urls)]
    if target.replicas == 1:
        return [target]
    return [
        replace(
            target,
            name=f"{target.name}-{i}",
            port=None if target.port is None else target.port + i,
            replicas=1,
            replica=i,
        )
        for i in range(target.replicas)
    ]


def _resolve(value: str, base: Path) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else (base / p).resolve()


def _type_names(types: tuple[type, ...]) -> str:
    names = {
        str: "a string",
        list: "a list",
        dict: "a table",
        int: "a number",
        float: "a number",
        bool: "true/false",
    }
    return " or ".join(dict.fromkeys(names[t] for t in types))
