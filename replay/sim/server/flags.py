"""Which server the simulator plays, and the check of its flags a run does before anything starts."""

from __future__ import annotations

from replay.sim.server import options as ds4_options
from replay.sim.server.llama import options as llama_options


def server_kind(argv: list[str]) -> str:
    """`--server llama` (llama-server's flags, API and log) or ds4 (the default)."""
    for i, arg in enumerate(argv):
        if arg == "--server" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--server="):
            return arg.partition("=")[2]
    return "ds4"


def flag_problem(argv: list[str]) -> str | None:
    """What the simulator would refuse in these flags, as a line; None when they parse. A run checks
    its `--target sim[:...]` and `--sim-args` with this rather than learning of a typo from a child
    process that exits with a usage message."""
    if server_kind(argv) == "llama":
        return llama_options.flag_problem(argv)
    return ds4_options.flag_problem(argv)
