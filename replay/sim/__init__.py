"""The embedded simulated ds4-server: ds4's cache policy in virtual time, and an HTTP front end.

`CacheModel` is pure (jobs in at virtual times, events out) and is what both `replay sim serve`
and `replay size sweep` run, so offline what-ifs and online behaviour cannot disagree. `serve`
starts the HTTP server (`python -m replay.sim`); it is imported lazily so that sizing does not
load the web stack.
"""

from __future__ import annotations

from replay.sim.model.config import PRESETS, SimConfig, config_for
from replay.sim.model.engine import CacheModel
from replay.sim.model.events import Result
from replay.sim.model.job import ContextTooLong, Job, build_job


def serve(argv: list[str] | None = None) -> int:
    """Run the simulated server with ds4-style flags; returns the process exit code."""
    from replay.sim.server.process import serve as _serve

    return _serve(argv)


__all__ = [
    "PRESETS",
    "CacheModel",
    "ContextTooLong",
    "Job",
    "Result",
    "SimConfig",
    "build_job",
    "config_for",
    "serve",
]
