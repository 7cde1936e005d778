"""The options of a replay, one object for every verb that replays (run, ab, probe, scenario).

Nothing here imports the engine at load: the command line builds these options when it starts, and
the engine (httpx, anyio) loads only when a verb runs.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from replay.engine.defaults import CONNECTIONS, HISTORY, LOOP, PLAN, SPEED, THINK, TIMEOUT_S
from replay.engine.routing import DEFAULT_ROUTING, check_routing

if TYPE_CHECKING:
    from replay.engine.plans import Plan
    from replay.engine.run import EngineConfig


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplayOptions:
    """What a replay asks of the engine, whichever verb starts it (run, ab, probe, a scenario's
    arms) and whichever server it runs against.

    The command line declares each of the first twelve fields once (`replay.cli.REPLAY_OPTIONS`,
    by the same name) and gives the verbs that take it an option of that name and default; the
    rest are set by `run` from its target file and `--start-at`, and `modelled_done` by a scenario.
    Adding an option is a field here and its declaration there (and, for the engine, its line in
    `engine_config`).
    """

    plan: str = PLAN
    concurrency: int | None = None  # overlap's requests in flight; timed's, closed-loop's cap
    speed: float = SPEED
    round_robin: bool = False  # alternate: sessions take turns
    api: str | None = None  # None: each session's own
    model: str | None = None  # None: each session's own
    history: str = HISTORY
    think: str = THINK
    timeout: float = TIMEOUT_S
    max_duration: float | None = None  # stop the run after this many seconds
    loop: str = LOOP
    connections: str = CONNECTIONS
    start_at: float | None = None  # epoch seconds: the schedule begins then (a sharded run's barrier)
    routing: str = DEFAULT_ROUTING  # over several targets (engine.routing)
    session_header: str | None = None  # a header carrying a session's affinity value
    session_field: str | None = None  # a body field carrying it
    modelled_done: bool = False  # EngineConfig.modelled_done: our simulator at the plan's speed

    def check(self) -> None:
        """Refuse what the engine does not know, before anything starts (nothing sent, no server
        started)."""
        from replay.engine.run import check_options

        check_options(
            self.history, self.think, self.api, self.timeout, self.max_duration, self.loop, self.connections
        )
        check_routing(self.routing, self.session_header, self.session_field)
        self.make_plan()

    def make_plan(self) -> Plan:
        """The schedule the options name (a new one each call: a plan is the options' product)."""
        from replay.engine.plans import make_plan

        return make_plan(
            self.plan, concurrency=self.concurrency, speed=self.speed, round_robin=self.round_robin
        )

    def engine_config(self, base_url: str, backends: tuple[str, ...] = ()) -> EngineConfig:
        from replay.engine.run import EngineConfig

        return EngineConfig(
            base_url=base_url,
            backends=backends,
            routing=self.routing,
            session_header=self.session_header,
            session_field=self.session_field,
            api=self.api,
            model=self.model,
            history=self.history,
            think=self.think,
            timeout_s=self.timeout,
            run_id=uuid.uuid4().hex[:8],
            loop=self.loop,
            connections=self.connections,
            modelled_done=self.modelled_done,
        )
