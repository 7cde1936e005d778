"""The arithmetic of one cold read: the checkpoint files a prefill of N tokens leaves, from the same
policy functions the simulator uses, and the budget rule built on it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from replay.sim.model import policy
from replay.sim.model.config import SimConfig, config_for


@dataclass(frozen=True, slots=True)
class ChainFile:
    tokens: int
    bytes: int
    reason: str


@dataclass(frozen=True, slots=True)
class Chain:
    """The checkpoint files one read of `tokens` tokens leaves, restored from `start`."""

    tokens: int
    start: int
    files: tuple[ChainFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    @property
    def final_bytes(self) -> int:
        return self.files[-1].bytes if self.files else 0


def chain(
    tokens: int,
    *,
    start: int = 0,
    cfg: SimConfig | None = None,
    anchor: int | None = None,
    final: bool = True,
) -> Chain:
    """Files written reading `tokens` tokens after restoring `start` (0 = from scratch).

    Cold save (from scratch only, prompt within [min, cold_max]) at the anchor or the fallback cut;
    continued saves where prefill progress events (every prefill chunk from `start`) land on the
    interval; and, with `final`, the copy of the whole conversation the next switch (evict) or a
    shutdown writes.
    """
    cfg = cfg or config_for()
    files: list[ChainFile] = []
    last = start
    cut = None
    if start == 0 and policy.cold_save_applies(0, tokens, cfg):
        cut = policy.cold_cut(tokens, anchor, cfg)
        files.append(ChainFile(cut, cfg.file_bytes(cut), "cold"))
        last = cut
    pos = start
    step = cfg.prefill_step
    while pos < tokens:
        nxt = min(pos + step, tokens)
        if cut is not None and pos < cut < nxt:
            nxt = cut
        pos = nxt
        if policy.continued_due(pos, last, cfg):
            files.append(ChainFile(pos, cfg.file_bytes(pos), "continued"))
            last = pos
    if final and tokens >= cfg.kv_cache_min_tokens and tokens > last:
        files.append(ChainFile(tokens, cfg.file_bytes(tokens), "evict"))
    files.sort(key=lambda f: f.tokens)
    return Chain(tokens, start, tuple(files))


def budget_rule(
    longest: int, others: Sequence[int] = (), *, start: int = 0, cfg: SimConfig | None = None
) -> int:
    """Bytes a budget needs: the chain of the longest conversation read from scratch plus the
    latest copy of every other conversation active the same day (seed figures, section 1), with
    ds4's 1% per-file slack."""
    cfg = cfg or config_for()
    total = chain(longest, start=start, cfg=cfg).total_bytes + sum(cfg.file_bytes(t) for t in others)
    return total + total // 100
