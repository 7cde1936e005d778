"""Build identity that tells two builds apart: the executable AND the libraries it loads.

A llama.cpp server from a wheel is a ~15 KB executable whose code lives in ``libllama.so`` and
``libggml*.so`` beside it, so the executable's hash alone says nothing. Here a native build is
the executable plus every shared library it loads from outside the system directories (what
``ldd`` resolves, which follows RPATH/RUNPATH, plus the libraries in the executable's own
directory), each hashed, and one combined hash over all of them. A Python-packaged server
(xllamacpp) is its distribution: name, version, and a combined hash of the native libraries among
its installed files.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

SYSTEM_DIRS = ("/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/", "/lib32/", "/usr/lib32/")
SYSTEM_BIN = ("/bin", "/usr/bin", "/sbin", "/usr/sbin")  # shared with every system tool: not scanned
_NATIVE = re.compile(r"\.(so(\.\d+)*|dylib|pyd|dll)$")
_LDD_LINE = re.compile(r"^\s*(\S+)\s+=>\s+(/\S+)\s+\(0x[0-9a-f]+\)")
# `libggml.so.0.20.0` -> `libggml.so`: the names one library goes by (its soname and link name).
_SO_VERSION = re.compile(r"(\.so)(?:\.\d+)+$")
_HASHES: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> sha256, per process


def sha256_file(path: Path) -> str:
    """The file's sha256, remembered per (path, size, mtime) for this process."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _HASHES:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _HASHES[key] = h.hexdigest()
    return _HASHES[key]


def is_system(path: str) -> bool:
    return path.startswith(SYSTEM_DIRS)


def ldd_libraries(executable: Path) -> list[Path]:
    """Shared libraries the loader resolves for `executable` (empty where ldd is missing or fails)."""
    try:
        out = subprocess.run(
            ["ldd", str(executable)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    found = []
    for line in out.stdout.splitlines():
        m = _LDD_LINE.match(line)
        if m:
            found.append(Path(m.group(2)))
    return found


def native_libraries(executable: Path) -> list[Path]:
    """Non-system libraries it loads, plus the native libraries in its own directory, sorted; one
    path per real file (symlinks and hard links resolved)."""
    libs = {p.resolve() for p in ldd_libraries(executable)}
    parent = executable.resolve().parent
    if str(parent) not in SYSTEM_BIN and not is_system(str(parent) + "/"):
        libs |= {p.resolve() for p in parent.iterdir() if p.is_file() and _NATIVE.search(p.name)}
    inodes: dict[tuple[int, int], Path] = {}
    for p in sorted(libs):
        if not is_system(str(p)):
            st = p.stat()
            inodes.setdefault((st.st_dev, st.st_ino), p)
    return sorted(inodes.values())


def library_name(path: Path) -> str:
    """The name a library is known by whatever its version suffix: `libggml.so.0.20.0` -> `libggml.so`."""
    return _SO_VERSION.sub(r"\1", path.name)


def library_entries(paths: list[Path]) -> list[dict[str, Any]]:
    """One entry per library: a wheel that copies `libx.so`, `libx.so.0` and `libx.so.0.1.0` as three
    files of the same bytes is one library (its other names in `aliases`); copies that differ stay
    apart under their own names."""
    groups: dict[tuple[str, str], list[Path]] = {}
    for p in paths:
        groups.setdefault((library_name(p), sha256_file(p)), []).append(p)
    names = [name for name, _ in groups]
    out = []
    for (name, digest), members in groups.items():
        real = max(members, key=lambda m: (len(m.name), m.name))  # the fully versioned file
        shown = name if names.count(name) == 1 else real.name
        entry: dict[str, Any] = {
            "name": shown,
            "path": str(real),
            "sha256": digest,
            "size": real.stat().st_size,
        }
        aliases = sorted(m.name for m in members if m.name != shown)
        if aliases:
            entry["aliases"] = aliases
        out.append(entry)
    return sorted(out, key=lambda e: e["name"])


def combine(parts: list[tuple[str, str]]) -> str:
    """One hash over (name, sha256) pairs, order-independent."""
    h = hashlib.sha256()
    for name, digest in sorted(parts):
        h.update(f"{name}\0{digest}\n".encode())
    return h.hexdigest()


def native_identity(executable: str | Path) -> dict[str, Any]:
    """Executable and non-system libraries, each hashed, and a combined hash that names the build."""
    exe = Path(executable)
    try:
        st = exe.stat()
    except OSError:
        return {"path": str(exe), "exists": False}
    digest = sha256_file(exe)
    libraries = library_entries([lib for lib in native_libraries(exe) if lib != exe.resolve()])
    parts = [(exe.name, digest), *((lib["name"], lib["sha256"]) for lib in libraries)]
    return {
        "path": str(exe),
        "sha256": digest,
        "size": st.st_size,
        "libraries": libraries,
        "combined_sha256": combine(parts),
    }


def package_identity(name: str) -> dict[str, Any] | None:
    """An installed distribution: name, version, and a combined hash of its native libraries."""
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None
    libraries = []
    for f in dist.files or ():
        if not _NATIVE.search(f.name):
            continue
        path = Path(str(dist.locate_file(f)))
        if path.is_file():
            libraries.append({"name": str(f), "sha256": sha256_file(path), "size": path.stat().st_size})
    return {
        "name": dist.metadata["Name"],
        "version": dist.version,
        "libraries": libraries,
        "combined_sha256": combine([(lib["name"], lib["sha256"]) for lib in libraries]),
    }


def model_fingerprint(path: str | Path) -> dict[str, Any] | None:
    """Size and a hash of the first and last MiB: cheap on a multi-GiB model, and two different
    GGUF files almost never share both their header (metadata, tensor table) and their tail."""
    p = Path(path)
    if not p.is_file():
        return None
    size = p.stat().st_size
    h = hashlib.sha256()
    with open(p, "rb") as f:
        h.update(f.read(1 << 20))
        if size > 2 << 20:
            f.seek(size - (1 << 20))
            h.update(f.read(1 << 20))
    return {"path": str(p), "size": size, "head_tail_sha256": h.hexdigest()}
