"""What each A/B arm really is, and every way the two differ, before anything runs.

An A/B is only as good as its arms: two TOMLs that differ by accident (another model file, a
stale build, a flag left over) compare the wrong things, and two that do not differ at all
compare noise. So the arms' effective settings, binaries (with their libraries), packages,
checkouts and models are flattened to one dotted-key view each and compared; every difference is
listed in the report, different model files are a loud warning, and arms with no difference are
refused unless the user asks for an A/A noise check (``--allow-identical``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from drivers.build import version_line
from drivers.launch import plan_target
from drivers.target import Target
from replay.errors import UsageError

ARMS = ("A", "B")
# Where the files are does not make two builds different when their hashes agree.
_PATHS = frozenset({"binary.path", "model.path"})
FLAG = "flag "  # prefix of a view key that holds one command-line flag's value(s)
NOT_SET = "(not set)"
SET = "(set)"  # a flag given without a value
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?$")


def arm_view(target: Target, build: dict[str, Any]) -> dict[str, Any]:
    """The arm as a flat dict of what makes a build and a configuration (no names, ports, paths
    of run directories)."""
    view: dict[str, Any] = {"kind": target.kind, "flags": " ".join(target.flags), "host": target.host}
    for name, values in flag_values(list(target.flags)).items():
        view[FLAG + name] = " ".join(v or SET for v in values)
    for key, value in sorted(target.env.items()):
        view[f"env.{key}"] = value
    view["kv_disk_dir"] = (
        target.kv_disk_dir if target.kv_disk_dir in (None, "auto") else "explicit path (moved per run)"
    )
    view["build_command"] = target.build if isinstance(target.build, str | None) else " ".join(target.build)
    view["version"] = build.get("version")
    binary = build.get("binary") or {}
    if binary:
        view["binary.path"] = binary.get("path")
        view["binary.sha256"] = binary.get("sha256")
        view["binary.combined_sha256"] = binary.get("combined_sha256")
        for lib in binary.get("libraries") or ():
            view[f"library.{lib['name']}"] = lib["sha256"]
    package = build.get("package") or {}
    if package:
        view["package"] = f"{package.get('name')} {package.get('version')}"
        view["package.combined_sha256"] = package.get("combined_sha256")
    checkout = build.get("checkout") or build.get("source") or {}
    for key in ("ref", "commit", "branch", "dirty", "changed_files"):
        if key in checkout:
            view[f"checkout.{key}"] = checkout[key]
    if checkout.get("changed"):
        view["checkout.changed"] = ", ".join(checkout["changed"])
    model = build.get("model") or {}
    for key in ("name", "path", "size", "head_tail_sha256"):
        if key in model:
            view[f"model.{key}"] = model[key]
    return view


def flag_values(flags: list[str]) -> dict[str, list[str | None]]:
    """Each flag's value(s) in order (None for a flag given alone): `-c 4096 --swa-full` ->
    {"-c": ["4096"], "--swa-full": [None]}. A token that starts with `-` and is not a number is a
    flag; `--x=v` carries its value; a flag given twice keeps both values."""
    out: dict[str, list[str | None]] = {}
    i = 0
    while i < len(flags):
        token = flags[i]
        if not token.startswith("-") or _NUMBER.match(token):
            out.setdefault("(argument)", []).append(token)  # a stray value: compared as such
            i += 1
            continue
        name, eq, value = token.partition("=")
        if eq:
            out.setdefault(name, []).append(value)
            i += 1
            continue
        following = flags[i + 1] if i + 1 < len(flags) else None
        takes = following is not None and (not following.startswith("-") or bool(_NUMBER.match(following)))
        out.setdefault(name, []).append(following if takes else None)
        i += 2 if takes else 1
    return out


def differences(views: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every key whose value differs between the arms (missing on one side counts); a flag reads
    `--cache-ram: 0 -> 8192`, named, whatever its place on the command line."""
    a, b = views["A"], views["B"]
    out = []
    for key in dict.fromkeys([*a, *b]):
        if key == "flags" or a.get(key) == b.get(key):
            continue
        diff: dict[str, Any] = {"field": key, "a": a.get(key), "b": b.get(key)}
        if key.startswith(FLAG):
            name = key.removeprefix(FLAG)
            diff["detail"] = f"{name}: {a.get(key) or NOT_SET} -> {b.get(key) or NOT_SET}"
        out.append(diff)
    return out


def model_warning(diffs: list[dict[str, Any]]) -> str | None:
    fields = {d["field"]: d for d in diffs}
    for key in ("model.head_tail_sha256", "model.size", "model.name"):
        if key in fields:
            d = fields[key]
            return (
                f"THE ARMS LOAD DIFFERENT MODELS ({key}: A {d['a']} vs B {d['b']}): every figure compares "
                "two models, not two builds"
            )
    return None


def summary(view: dict[str, Any]) -> str:
    """One line naming the build: binary or package with its combined hash, checkout, model."""
    parts = []
    if "binary.path" in view:
        n = sum(1 for k in view if k.startswith("library."))
        parts.append(
            f"{Path(view['binary.path']).name} sha256 {str(view['binary.sha256'])[:12]}"
            + (f" + {n} libraries, combined {str(view['binary.combined_sha256'])[:12]}" if n else "")
        )
    if "package" in view:
        parts.append(
            f"package {view['package']} (native libraries {str(view['package.combined_sha256'])[:12]})"
        )
    if "checkout.commit" in view:
        ref = f"ref {view['checkout.ref']} " if view.get("checkout.ref") else ""
        dirty = (
            f", dirty ({view.get('checkout.changed_files')} files: {view.get('checkout.changed', '')})"
            if view.get("checkout.dirty")
            else ""
        )
        parts.append(
            f"{ref}commit {str(view['checkout.commit'])[:12]} on {view.get('checkout.branch') or 'detached HEAD'}{dirty}"
        )
    if view.get("version"):
        parts.append(f"version {view['version']!r}")
    if "model.path" in view:
        parts.append(f"model {Path(view['model.path']).name} ({view.get('model.size')} bytes)")
    elif "model.name" in view:
        parts.append(f"model {view['model.name']}")
    parts.append(f"flags [{view['flags']}]" if view["flags"] else "no flags")
    return f"{view['kind']}: " + "; ".join(parts)


def check_arms(targets: dict[str, Target], workdir: Path, allow_identical: bool) -> dict[str, Any]:
    """Identity and differences of the two arms; refuses identical arms unless allowed (exit 2)."""
    views: dict[str, dict[str, Any]] = {}
    builds: dict[str, dict[str, Any]] = {}
    for arm in ARMS:
        plan = plan_target(targets[arm], workdir)
        builds[arm] = dict(plan.build)
        argv = plan.launch.version_argv
        if builds[arm].get("version") is None and argv and Path(argv[0]).is_file():
            builds[arm]["version"] = version_line(argv, timeout=60.0)  # as the server reports it
        views[arm] = arm_view(targets[arm], builds[arm])
    diffs = differences(views)
    identical = all(d["field"] in _PATHS for d in diffs)
    if identical and not allow_identical:
        raise UsageError(
            f"the arms are identical ({targets['A'].where} and {targets['B'].where}: same settings, "
            "binary and library hashes, model): an A/B would compare noise; pass --allow-identical for an "
            "A/A noise check"
        )
    warnings = []
    found = model_warning(diffs)
    if found:
        warnings.append(found)
    if identical:
        warnings.append("A/A check: the arms are identical on purpose (--allow-identical)")
    identity = {arm: {"summary": summary(views[arm]), "view": views[arm]} for arm in ARMS}
    return {"identity": identity, "differences": diffs, "warnings": warnings}
