"""The embedded simulated ds4-server: ds4's cache policy in virtual time, and an HTTP front end.

`sim/model` is pure and holds the one rule set (slots, live KV, disk checkpoints, policy), walked two
ways: `CacheModel` (an event loop with concurrency, queueing and time) is what `replay sim serve`
and a `--plan timed` sweep run; `sequential` walks one request at a time, and a default sweep shares
its disk lanes across budgets (`replay.sizing.lanes`). Property tests keep the two equal.
`sim/server` is the HTTP app; `serve` imports it lazily so that sizing does not load the web stack.
`sim/router.py` models what stands in front of several servers: SGLang's router, which worker each
request goes to and what that worker re-reads (not compiled: off the cache model's per-request path).
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
