"""agent-replay: record LLM agent traffic and replay it against an inference server."""

from replay import _compiled

COMPILED = _compiled.check()  # before any compiled module is imported

from replay.errors import DriverError, ReplayError, TargetError, TraceError, UsageError  # noqa: E402

__version__ = "0.1.0"

__all__ = ["DriverError", "ReplayError", "TargetError", "TraceError", "UsageError", "__version__"]
