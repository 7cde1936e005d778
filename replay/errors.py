"""The tool's exception hierarchy: callers catch at the level they can handle.

The CLI maps each class to an exit code and a one-line message, so every error
message here is written to stand alone on one line.
"""

from __future__ import annotations


class ReplayError(Exception):
    """Base of every error the tool raises on purpose."""

    exit_code = 1


class TraceError(ReplayError):
    """A trace (or scenario spec, or results file) is malformed; names file and line."""

    exit_code = 2

    def __init__(self, path: str, line: int, problem: str) -> None:
        self.path = path
        self.line = line
        self.problem = problem
        super().__init__(f"{path}:{line}: {problem}")


class UsageError(ReplayError):
    """Options that cannot work together, or a missing input file."""

    exit_code = 2


class TargetError(ReplayError):
    """The target server cannot be reached or refuses to serve the run at all."""

    exit_code = 2


class DriverError(ReplayError):
    """Starting, stopping or restoring a server process failed."""

    exit_code = 1


class Stopped(ReplayError):
    """SIGTERM arrived during work that has no results to keep (a sizing sweep): stop cleanly."""

    exit_code = 143


class Interrupted(ReplayError):
    """SIGTERM or SIGHUP outside a replay's own loop (loading the trace, starting a server,
    reading its log afterwards): raised so that every `with` block unwinds, stopping the servers
    the run started (by PID) and removing its scratch folder. Exits 128 + the signal's number."""

    def __init__(self, signum: int, name: str) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {name}")
