"""The modules setup.py compiles with mypyc, and the check that runs them only while they match
their source.

The compiled copies sit beside the source (an editable install builds them in the work tree), so a
source file edited after the build would otherwise keep running as it was. At build time setup.py
writes each source's hash to `_compiled.json`; at import, if a compiled module is missing or any
source differs from its hash, or `REPLAY_PURE=1` is set, every one of them runs from its source
(they call each other compiled, so it is all or none). Nothing here imports the rest of replay.

Their dataclasses that a sweep makes per request write their `__init__` out (`init=False`):
mypyc compiles a written one, not the one `dataclass` generates (ten times slower to call). They
are values all the same: nothing changes them once made.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

# The pure cache model (every module of `replay.sim.model`), what a sweep reads it with from
# `replay.trace`, and the sweep's own per-request path (`replay.sizing`: requests sent in modelled
# time, jobs made from the trace, the budgets' lanes, the hand-over to worker processes), which runs once per request and budget
# and so must be compiled with the model it drives.
MODEL: tuple[str, ...] = (
    "replay.sim.model.tokenizer",
    "replay.sim.model.seq",
    "replay.sim.model.render",
    "replay.sim.model.reply",
    "replay.sim.model.config",
    "replay.sim.model.builds",
    "replay.sim.model.job",
    "replay.sim.model.checkpoint",
    "replay.sim.model.policy",
    "replay.sim.model.disk",
    "replay.sim.model.events",
    "replay.sim.model.engine",
    "replay.sim.model.sequential",
    # llama-server's model (`replay.sim.model.llama`), in import order.
    "replay.sim.model.llama.build",
    "replay.sim.model.llama.arch",
    "replay.sim.model.llama.config",
    "replay.sim.model.llama.spm",
    "replay.sim.model.llama.prompt",
    "replay.sim.model.llama.memory",
    "replay.sim.model.llama.checkpoints",
    "replay.sim.model.llama.prompt_cache",
    "replay.sim.model.llama.events",
    "replay.sim.model.llama.context",
    "replay.sim.model.llama.task",
    "replay.sim.model.llama.engine",
    "replay.sim.model.llama.sequential",
)
# The one rule for a count in JSON, which the trace reader and the engine's reply decoding call
# per count they read (our servers call it too, from source).
RULES: tuple[str, ...] = ("replay.serving.counts",)
TRACE: tuple[str, ...] = (
    "replay.trace.model",
    "replay.trace.reader",
    "replay.trace.materialize",
    "replay.trace.synth",
)
SWEEP: tuple[str, ...] = (
    "replay.sizing.timeline",
    "replay.sizing.jobs",
    "replay.sizing.lanes",
    "replay.sizing.parallel",
)
# The engine's per-request hot path: SSE splitting, checked JSON decoding, the exchange, the three
# reply readers, usage rules and the record they fill (the target: client CPU per request), the
# chunked body's framing (`engine.chunks`), and the record's way out: its results line and the
# summary's histograms, written once per request. The HTTP/1.1 connections (`engine.http1`,
# `engine.transport`) stay source: their classes build on asyncio's and httpcore's.
ENGINE: tuple[str, ...] = (
    "replay.metrics.record",
    "replay.metrics.hist",
    "replay.metrics.results",
    "replay.engine.sse",
    "replay.engine.chunks",
    "replay.engine.decode",
    "replay.engine.usage",
    "replay.engine.exchange",
    "replay.engine.openai",
    "replay.engine.anthropic",
    "replay.engine.responses",
)
MODULES: tuple[str, ...] = MODEL + RULES + TRACE + SWEEP + ENGINE

HASHES = "_compiled.json"  # beside this file, written by setup.py's build
ROOT = Path(__file__).resolve().parent.parent


def source_hashes(root: Path = ROOT) -> dict[str, str]:
    """sha256 of each compiled module's source."""
    return {name: hashlib.sha256(_source(root, name).read_bytes()).hexdigest() for name in MODULES}


def _source(root: Path, name: str) -> Path:
    return root / (name.replace(".", "/") + ".py")


def _compiled(root: Path, name: str) -> bool:
    base = root / name.replace(".", "/")
    return any(
        base.with_name(base.name + suffix).exists() for suffix in importlib.machinery.EXTENSION_SUFFIXES
    )


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Finds the compiled modules' source files ahead of their compiled copies."""

    def __init__(self, root: Path) -> None:
        self.sources = {name: _source(root, name) for name in MODULES}

    def find_spec(self, fullname: str, path: Any = None, target: ModuleType | None = None) -> Any:
        source = self.sources.get(fullname)
        return importlib.util.spec_from_file_location(fullname, source) if source is not None else None


def check(root: Path = ROOT) -> str:
    """Decide once, before any of them is imported: "compiled", "pure" (nothing was compiled),
    or "source" (compiled but not used; a warning says why unless REPLAY_PURE=1 asked for it)."""
    if not any(_compiled(root, name) for name in MODULES):
        return "pure"
    why = None
    if os.environ.get("REPLAY_PURE") != "1":
        try:
            built = json.loads((root / "replay" / HASHES).read_text())
        except (OSError, ValueError):  # a build that failed part way writes none
            built = None
        missing = [name for name in MODULES if not _compiled(root, name)]
        changed = [name for name, digest in source_hashes(root).items() if (built or {}).get(name) != digest]
        if built is not None and not missing and not changed:
            return "compiled"
        if built is None:
            why = "the build left no record of what it compiled"
        elif missing:
            why = f"{missing[0]} is not compiled"
        else:
            why = f"{_source(root, changed[0]).relative_to(root)} changed after it was compiled"
    sys.meta_path[:] = [_SourceFirst(root), *(f for f in sys.meta_path if not isinstance(f, _SourceFirst))]
    if why is not None:
        warnings.warn(
            f"replay: {why}, so its compiled modules run from source (rebuild: pip install -e .)",
            RuntimeWarning,
            stacklevel=2,
        )
    return "source"
