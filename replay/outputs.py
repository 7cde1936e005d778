"""The one rule for every file a command writes for its user (README, "Files the tool writes").

1. Checked first: `check_file` and `check_folder` run before anything is sent, started, bound or
   written. A folder where a file goes (or a file where a folder goes), a missing parent folder,
   a place no file can be created in, or the command's own input: one line, exit 2.
2. What exists is kept: an existing output file is refused unless `--force` (or a verb that
   appends, such as `record --log`), and a folder a command writes into must be new or empty.
3. Whole files (what `import`, `export`, `anonymize`, `scenario generate`, `k8s render --out` and
   `report --html` write, a merged results file) are written into a hidden temporary sibling and
   renamed over the name when complete (`replacing`): a command that fails leaves the old file
   byte for byte and no temporary behind, and no reader ever sees half a file.
4. Files appended as measured (the trace `record` writes, the results of `run`) are written in
   place, so a crash keeps every line measured; with `--force` an old one is replaced only once
   every check has passed (the socket listening, the target answering).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from replay.errors import UsageError


def check_file(
    path: Path, *, option: str = "", force: bool = False, append: bool = False, inputs: Iterable[Path] = ()
) -> None:
    """Refuse an output file that cannot, or must not, be written (rules 1 and 2).

    `option` names it in the message as the user typed it (`--out`, `OUT`); `append`: the verb adds
    to an existing file rather than replacing it; `inputs`: files the command reads (never an output).
    """
    shown = f"{option} {path}" if option else str(path)
    if _kind(path, shown) == "folder":
        raise UsageError(f"{shown} is a folder; name a file")
    _check_parent(path, shown)
    for source in inputs:
        if _same(path, source):
            raise UsageError(f"{shown} is the input {source}; name another file")
    if _kind(path, shown) == "file":
        if not (force or append):
            raise UsageError(f"{shown} exists; --force replaces it (or name another file)")
        if not os.access(path, os.W_OK):
            raise UsageError(f"{shown}: no permission to write it")
    _check_creatable(path.parent, shown)


def check_folder(path: Path, *, option: str = "", force: bool = False) -> None:
    """Refuse an output folder that cannot be written, or that holds files already unless `force`."""
    shown = f"{option} {path}" if option else str(path)
    kind = _kind(path, shown)
    if kind == "file":
        raise UsageError(f"{shown} is a file; name a folder")
    if kind == "folder":
        if not force and next(path.iterdir(), None) is not None:
            raise UsageError(f"{shown} is not empty; --force writes into it (or name a new folder)")
        _check_creatable(path, shown)
    else:
        _check_parent(path, shown)
        _check_creatable(path.parent, shown)


@contextmanager
def output_folder(out: Path | None, runs: Path, *, force: bool = False) -> Iterator[Path]:
    """Where a command that writes a folder of files puts them: `out` when given (new, empty, or
    `force`), else a new `runs/run-N`, so a second run never replaces the first one's report. A
    `run-N` made here is removed again if the command fails before writing anything into it."""
    if out is not None:
        check_folder(out, option="--out", force=force)
        yield out
        return
    folder = new_run_folder(runs)
    try:
        yield folder
    except BaseException:
        with contextlib.suppress(OSError):
            folder.rmdir()  # only if still empty
        raise


def new_run_folder(root: Path, *, option: str = "--out") -> Path:
    """A new folder `root/run-N` (N one more than the highest there), made now: a second run never
    writes over the first one's files, and two runs started together never share one."""
    top = root
    while not top.parent.exists() and top.parent != top:
        top = top.parent
    check_folder(top, option=option, force=True)
    root.mkdir(parents=True, exist_ok=True)
    taken = [int(p.name[4:]) for p in root.glob("run-*") if p.name[4:].isdigit()]
    n = max(taken, default=0) + 1
    while True:
        folder = root / f"run-{n}"
        try:
            folder.mkdir()
        except FileExistsError:
            n += 1
            continue
        return folder


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A new temporary sibling of `path` to write the whole file into (rule 3): renamed over `path`
    (through a symbolic link, to what it names) when the block ends, removed if it raises."""
    final = Path(os.path.realpath(path)) if path.is_symlink() else path
    tmp = _new_sibling(final)
    try:
        yield tmp
        with open(tmp, "rb+") as written:  # on disk before the name points at it
            os.fsync(written.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> Path:
    """A whole text file (a report page, manifests), written by `replacing`; returns `path`."""
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


def _new_sibling(path: Path) -> Path:
    """An empty hidden file beside `path`, made with the user's umask (as `open` would make `path`)."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return tmp


def _kind(path: Path, shown: str) -> str | None:
    """What is at `path`: a file, a folder or nothing (None); a path that cannot be looked at is
    refused."""
    try:
        return "folder" if path.is_dir() else "file" if path.exists() else None
    except OSError as exc:
        raise UsageError(f"{shown}: cannot look at it ({exc.strerror})") from None


def _check_parent(path: Path, shown: str) -> None:
    parent = path.parent
    kind = _kind(parent, shown)
    if kind is None:
        raise UsageError(f"{shown}: no folder {parent} (create it first)")
    if kind != "folder":
        raise UsageError(f"{shown}: {parent} is not a folder")


def _check_creatable(folder: Path, shown: str) -> None:
    """Make and remove an empty file in `folder`: the only truthful test (root passes every
    permission check, yet cannot create a file in /proc, or on a read-only mount)."""
    try:
        probe = _new_sibling(folder / ".replay-check")
    except OSError as exc:
        raise UsageError(f"{shown}: cannot create files in {folder} ({exc.strerror})") from None
    with contextlib.suppress(OSError):
        probe.unlink()


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and a.samefile(b))
    except OSError:
        return False
