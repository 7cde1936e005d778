"""Where a run sends its requests: a server the drivers start, or one already running.

`--target URL` is a running server the tool never stops; `--target sim[:preset]` is the embedded
simulator (playing ds4-server; `sim:llama[:preset]` plays llama-server) and `--server a.toml` any server kind the drivers know (ds4, llama.cpp, vLLM, SGLang,
sim), started as a child with its own PID and stopped by that PID when the run ends, whatever the
exit path. With `--service daily.toml` the user's daily server is stopped first and given back
exactly once afterwards by the drivers' guard.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from drivers.build import binaries_may_be_missing
from drivers.guard import Guard, load_guard_config
from drivers.launch import Served, describe_plan, plan_target, start_target
from drivers.target import Target, load_target, replica_targets, target_from_dict
from replay.engine.routing import split_targets
from replay.errors import UsageError
from replay.sim.model.config import PRESETS
from replay.sim.model.llama.config import PRESETS as LLAMA_PRESETS
from replay.sim.server.flags import flag_problem, server_kind

# Modelled time runs this many times faster than a real server would, unless the user says.
DEFAULT_SIM_TIME_SCALE = 200.0


def resolve_targets(
    spec: str | None, server: Path | None, sim_args: list[str], scratch: Path
) -> list[Target]:
    """The targets a run's options name: one (see `resolve_target`), or several running servers
    (`--target URL1,URL2,...`) the client routes over."""
    if spec is None or "," not in spec:
        return [resolve_target(spec, server, sim_args, scratch)]
    if server is not None or sim_args:
        raise UsageError("--target URL1,URL2 names running servers: give no --server or --sim-args with it")
    return [
        target_from_dict({"kind": "external", "url": url}, name="external") for url in split_targets(spec)
    ]


def resolve_target(spec: str | None, server: Path | None, sim_args: list[str], scratch: Path) -> Target:
    """The target a run's options name: `--server FILE`, a URL, or `sim[:preset]`."""
    if server is not None:
        if spec is not None or sim_args:
            raise UsageError("--server replaces --target and --sim-args; give one of them")
        return load_target(server)
    spec = spec or "sim"
    if spec.startswith(("http://", "https://")):
        if sim_args:
            raise UsageError("--sim-args only applies to --target sim")
        return target_from_dict({"kind": "external", "url": spec.rstrip("/")}, name="external")
    if spec != "sim" and not spec.startswith("sim:"):
        raise UsageError(
            f"--target must be a URL (http://HOST:PORT), sim[:preset] or sim:llama[:preset], not {spec!r}"
        )
    preset = spec.partition(":")[2]
    if preset == "llama" or preset.startswith("llama:") or server_kind(sim_args) == "llama":
        return _llama_target(
            spec, preset.partition(":")[2] if preset.startswith("llama") else preset, sim_args, scratch
        )
    if preset and preset not in PRESETS:
        raise UsageError(
            f"--target {spec}: unknown simulator preset {preset!r} (known: {', '.join(sorted(PRESETS))}; "
            "sim:llama[:preset] for llama-server)"
        )
    flags = sim_flags(preset, sim_args, scratch)
    problem = flag_problem(flags)
    if problem is not None:
        raise UsageError(f"--sim-args: {problem}")
    return target_from_dict({"kind": "sim", "flags": flags}, name="sim")


def _llama_target(spec: str, preset: str, sim_args: list[str], scratch: Path) -> Target:
    """`--target sim:llama[:preset]` (or `--sim-args "--server llama ..."`): the simulator playing
    llama-server, with a slot-save directory of its own in the run's scratch space."""
    if preset and preset not in LLAMA_PRESETS:
        raise UsageError(
            f"--target {spec}: unknown llama simulator preset {preset!r} (known: {', '.join(sorted(LLAMA_PRESETS))})"
        )
    flags = [] if server_kind(sim_args) == "llama" else ["--server", "llama"]
    if preset:
        flags += ["--preset", preset]
    if "--time-scale" not in sim_args:
        flags += ["--time-scale", str(DEFAULT_SIM_TIME_SCALE)]
    flags += list(sim_args)
    problem = flag_problem(flags)
    if problem is not None:
        raise UsageError(f"--sim-args: {problem}")
    fields: dict[str, object] = {"kind": "sim", "flags": flags}
    if "--slot-save-path" not in sim_args:
        fields["kv_disk_dir"] = str(scratch / "slots")
    return target_from_dict(fields, name="sim")


def sim_flags(preset: str, extra: list[str], scratch: Path) -> list[str]:
    """Simulator flags: the preset, a demo-friendly time scale and a fresh disk-KV directory."""
    flags = ["--preset", preset] if preset else []
    if "--time-scale" not in extra:
        flags += ["--time-scale", str(DEFAULT_SIM_TIME_SCALE)]
    if "--kv-disk-dir" not in extra:
        flags += ["--kv-disk-dir", str(scratch / "kv")]
    return flags + list(extra)


@contextmanager
def open_target(
    target: Target,
    workdir: Path | None = None,
    service: Path | None = None,
    say: Callable[[str], None] | None = None,
) -> Iterator[Served]:
    """Start `target` (under the guard when a daily service is named); stop it when the block ends."""
    with ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="replay-run-")))
        adopt = None
        if service is not None:
            guard = stack.enter_context(Guard(load_guard_config(service), say=say, scratch=workdir))
            adopt = guard.adopt
        yield stack.enter_context(start_target(target, workdir, adopt=adopt))


@contextmanager
def open_targets(
    targets: list[Target],
    workdir: Path | None = None,
    service: Path | None = None,
    say: Callable[[str], None] | None = None,
) -> Iterator[list[Served]]:
    """`open_target` for every server of a run, in order (a target of `replicas = N` is N of them,
    each its own process); all are stopped when the block ends, the last started first."""
    servers = [replica for t in targets for replica in replica_targets(t)]
    with ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="replay-run-")))
        first = stack.enter_context(_open_one(servers[0], workdir, service, say))
        rest = [stack.enter_context(_open_one(t, workdir, None, say)) for t in servers[1:]]
        yield [first, *rest]


@contextmanager
def _open_one(
    target: Target, workdir: Path, service: Path | None, say: Callable[[str], None] | None
) -> Iterator[Served]:
    """One server; a router (kind 'sglang-router') after the servers of its backend, which it is
    given as its workers and which stop after it. Its build record names them and their PIDs."""
    if target.kind != "sglang-router" or target.backend is None:
        with open_target(target, workdir, service, say) as served:
            yield served
        return
    with ExitStack() as stack:
        workers = [
            stack.enter_context(open_target(t, workdir, service if i == 0 else None, say))
            for i, t in enumerate(replica_targets(load_target(target.backend)))
        ]
        urls = [w.url for w in workers]
        router = dataclasses.replace(target, flags=(*target.flags, "--worker-urls", *urls))
        served = stack.enter_context(open_target(router, workdir, None, say))
        served.build["workers"] = [{"url": w.url, "pid": w.pid, "kind": w.target.kind} for w in workers]
        yield served


def dry_run(target: Target, workdir: Path, service: Path | None, say: Callable[[str], None]) -> None:
    """Print every action a run would take, and take none; a server binary that is not there is
    said last, as the step where the run itself would stop."""
    if service is not None:
        with Guard(load_guard_config(service), dry_run=True, say=say):
            pass
    with binaries_may_be_missing() as missing:
        plan = plan_target(target, workdir)
    for line in describe_plan(plan):
        say(line)
    binary = plan.build.get("binary") or {}
    if not missing and binary.get("exists") is False and target.build is None:
        missing.append(str(binary.get("path")))
    for name in missing:
        say(
            f"[yellow]warning:[/yellow] {name} is not installed here (not on PATH, or no such file): "
            f"the run would stop before starting it; set binary = '/path/to/{Path(name).name}' in {target.where}"
        )
