"""`just agents` step one: install the agents (pinned) into the cache folder, say how long it took.

python -m tests.agents.install [claude-code codex opencode hermes]
"""

from __future__ import annotations

import sys
import time

from tests.support.agentkit import AGENTS, cache_dir, install


def main(argv: list[str]) -> int:
    names = argv or list(AGENTS)
    unknown = [n for n in names if n not in AGENTS]
    if unknown:
        print(f"unknown agents: {', '.join(unknown)} (known: {', '.join(AGENTS)})", file=sys.stderr)
        return 2
    t = time.monotonic()
    took = install(names)
    done = ", ".join(f"{n} {s:.0f} s" for n, s in took.items()) or "all already installed"
    print(f"agents in {cache_dir()}: {done}; {time.monotonic() - t:.0f} s in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
