"""ds4-server builds: the cache rules of each version the reports ran, one set per build.

A scenario names the build its report ran (`--build sept`), never a rule on its own, so every
scenario that runs one build runs the very same rules. Each rule cites the source it is read
from; `shared/reference/ds4-server.md` section 0 says which code points were read.

* `may`: antirez/ds4 main @ 8d57664 (2026-05-21), `ds4_kvstore.c`: eviction after the store
  with the new file protected, score `(h + 1) * tokens / size`; a disk hit deeper than cold_max
  deletes the file ("consumed", issue 673); continued saves at exact multiples of the interval.
* `aug`: upstream b0309611 (2026-08-05) as read in ds4-server.md 4.4/4.5: eviction before the
  store, anchors (cold, evict, shutdown) x2, a never-hit continued file that is a strict prefix of
  the incoming one x0.05 (rising to x0.5 with hits); restored files are kept (24fa85e, 2026-08-04,
  "Keep disk KV checkpoints after successful loads", quoted in report 000).
* `sept`: the September builds the reports ran (000: 9139e2a, 14 Sept; 003: f06d3eb or later,
  15-17 Sept), before 4d7028e/ada805a changed slot routing and eviction tiers (000, 20 Sept).
  The kvstore of that era (a Qwen3.8 fork of early September, `ds4_kvstore.c`) has August's
  score, pre-eviction by the incoming file's size and exact-multiple continued saves. Report
  003: "the superseded prefixes in it are the first thing the evictor drops"; its overnight run
  found tool-call conversations stored and found under the tool key and a plain-text one stored
  under another key (`tool_replay_key`, with a client-visible key for tool-call replies).
  One build, not two: no source read here holds 9139e2a or f06d3eb (the antirez/ds4 snapshot
  ends at 8d57664, 2026-05-21; the forks with later history end 2026-08-08), but a fork's
  upstream-intake note (2026-10-05) names f06d3eb "Merge Qwen3.8 Flash Next support from PR
  #991", and 000 found PR #991 merged when main was 9139e2a ("17 コミット先の 9139e2a ... 10 本以上が
  Qwen 関連"): 9139e2a is "f06d3eb or later", the build 003 names. So 000's 0 restores in 43 h
  (cold and continued saves off) are not a second rule; `daily-use` keeps them as known gaps.
"""

from __future__ import annotations

from dataclasses import dataclass

from replay.sim.model.config import ContinuedTrigger, Eviction, SimConfig, VisibleKey


@dataclass(frozen=True, slots=True)
class Build:
    """The rules of one ds4 build, as `SimConfig` fields."""

    name: str
    about: str
    eviction: Eviction
    consume_deep_hits: bool
    continued_trigger: ContinuedTrigger
    visible_key: VisibleKey
    tool_replay_key: bool

    def rules(self) -> dict[str, object]:
        return {
            "eviction": self.eviction,
            "consume_deep_hits": self.consume_deep_hits,
            "continued_trigger": self.continued_trigger,
            "visible_key": self.visible_key,
            "tool_replay_key": self.tool_replay_key,
        }

    def apply(self, cfg: SimConfig) -> SimConfig:
        return cfg.with_(build=self.name, **self.rules())


BUILDS: dict[str, Build] = {
    "may": Build(
        name="may",
        about="antirez/ds4 @ 8d57664, 2026-05-21 (ds4-server.md version A)",
        eviction="base",
        consume_deep_hits=True,
        continued_trigger="exact",
        visible_key="no-tools",
        tool_replay_key=False,
    ),
    "aug": Build(
        name="aug",
        about="upstream b0309611, 2026-08-05 (ds4-server.md version B)",
        eviction="aug",
        consume_deep_hits=False,
        continued_trigger="exact",
        visible_key="no-tools",
        tool_replay_key=False,
    ),
    "sept": Build(
        name="sept",
        about="the September builds of reports 000 and 003 (9139e2a, f06d3eb+), before 4d7028e",
        eviction="aug",
        consume_deep_hits=False,
        continued_trigger="exact",
        visible_key="tool-calls",
        tool_replay_key=True,
    ),
    # A PR is a build too: the September build with ds4 PR 1058 (open), which keys every reply of
    # a tool conversation by its client-visible transcript (ds4-server.md 4.7), so a file is no
    # longer found only by the kind of its last reply.
    "sept-pr1058": Build(
        name="sept-pr1058",
        about="the September build with PR 1058 (every reply keyed by its client-visible transcript)",
        eviction="aug",
        consume_deep_hits=False,
        continued_trigger="exact",
        visible_key="all",
        tool_replay_key=False,
    ),
}

# The `SimConfig` fields a build sets: a scenario arm that names a build sets none of them itself.
RULE_FIELDS: tuple[str, ...] = (
    "eviction",
    "consume_deep_hits",
    "continued_trigger",
    "visible_key",
    "tool_replay_key",
)
