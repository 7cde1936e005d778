"""Compiles the pure cache model and a disk-budget sweep's per-request path with mypyc, when it can
(the list: `replay/_compiled.py`).

They stay plain Python (the source is what runs where no compiler is, with `REPLAY_PURE=1`, or
when a source file changed after it was compiled: see `replay/_compiled.py`); compiled, a sweep of
a big trace runs nearly twice as fast. A machine without a C compiler gets a warning and the pure
package. The metadata is in pyproject.toml.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
# The one list of modules, shared with the import-time check (loaded alone, not through `replay`).
_spec = importlib.util.spec_from_file_location("_replay_compiled", HERE / "replay" / "_compiled.py")
assert _spec is not None and _spec.loader is not None
compiled = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compiled)


class OptionalBuildExt(build_ext):
    """A failed compile leaves the pure-Python package, with a warning instead of an error. Only a
    build that compiled every module records their hashes, so a part-built one is never used."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler, no headers: the source still runs
            print(
                f"warning: replay's modules were not compiled ({exc}); using the pure Python", file=sys.stderr
            )
            return
        # What was compiled, so that an edited source is never shadowed by its old compiled copy.
        root = HERE if self.inplace else Path(self.build_lib)
        (root / "replay" / compiled.HASHES).write_text(json.dumps(compiled.source_hashes(HERE), indent=1))


def ext_modules() -> list:  # type: ignore[type-arg]
    if os.environ.get("REPLAY_PURE") == "1":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("warning: mypyc is not installed; replay's modules stay pure Python", file=sys.stderr)
        return []
    paths = [name.replace(".", "/") + ".py" for name in compiled.MODULES]
    try:
        return mypycify(paths, opt_level="3")
    except BaseException as exc:  # a type error mypyc cannot compile: the source still runs
        print(f"warning: mypyc refused replay's modules ({exc!r}); using the pure Python", file=sys.stderr)
        return []


setup(ext_modules=ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
