"""`replay sim serve`: the simulator on 127.0.0.1, with ds4's own flags."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True, slots=True)
class SimServeArgs:
    argv: list[str] = field(default_factory=list)  # ds4-server's flags, parsed by the simulator


def serve(args: SimServeArgs) -> int:
    from replay.sim import serve as serve_sim

    return serve_sim(list(args.argv))
