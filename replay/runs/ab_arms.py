"""What each A/B arm really is, and every way the two differ, before anything runs.

An A/B is only as good as its arms: two TOMLs that differ by accident (another model file, a
stale build, a flag left over) compare the wrong things, and two that do not differ at all
compare noise. So the arms' effective settings, binaries (with their libraries), packages,
checkouts and models are flattened to one dotted-key view each and compared; every difference is
listed in the report, different model files are a loud warning, and arms with no difference are
refused unless the user asks for an A/A noise check (``--allow-identical``).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from drivers.launch import plan_target
from drivers.target import Target
from replay.errors import UsageError

ARMS = ("A", "B")
# Where the files are does not make two builds different when their hashes agree.
_PATHS = frozenset({"binary.path", "model.path"})


def arm_view(target: Target, build: dict[str, Any]) -> dict[str, Any]:
    """The arm as a flat dict of what makes a build and a configuration (no names, ports, paths
    of run directories)."""
    view: dict[str, Any] = {"kind": target.kind, "flags": " ".join(target.flags), "host": target.host}
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


def differences(views: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every key whose value differs between the arms (missing on one side counts); flags also
    say what B removes and adds, which is what a reader looks for."""
    a, b = views["A"], views["B"]
    out = []
    for key in dict.fromkeys([*a, *b]):
        if a.get(key) == b.get(key):
            continue
        diff: dict[str, Any] = {"field": key, "a": a.get(key), "b": b.get(key)}
        if key == "flags":
            diff["detail"] = flag_change(str(a.get(key) or "").split(), str(b.get(key) or "").split())
        out.append(diff)
    return out


def flag_change(a: list[str], b: list[str]) -> str:
    """`B removes X; B adds Y` from the two flag lists, by the longest common runs."""
    parts = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op in ("delete", "replace"):
            parts.append(f"B removes {' '.join(a[i1:i2])}")
        if op in ("insert", "replace"):
            parts.append(f"B adds {' '.join(b[j1:j2])}")
    return "; ".join(parts)


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
        builds[arm] = plan_target(targets[arm], workdir).build
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
