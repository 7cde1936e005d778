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


def chain(
    tokens: int,
    *,
    start: int = 0,
    cfg: SimConfig | None = None,
    anchor: int | None = None,
    final: bool = True,
) -> Chain:
    """Files written reading `tokens` tokens after restoring `start` (0 = from scratch).

    The prefill is walked as the simulator walks it (`DiskLane._prefill`): prefill quanta from
    `start`, a continued save wherever a progress event lands on the interval, the cold save (from
    scratch only, prompt within [min, cold_max]) when the prefill reaches its cut (the anchor or the
    fallback cut), so a cold read also writes the continued saves it passes before the cut; then,
    with `final`, the copy of the whole conversation the next switch (evict) or a shutdown writes.
    """
    cfg = cfg or config_for()
    files: list[ChainFile] = []

    def save(n: int, reason: str) -> int:
        # The store keeps one file per prefix (`DiskStore.find_same`): a cut that lands where a file
        # already is (the restored one, or a continued save at the same length) writes nothing.
        if n != start and all(f.tokens != n for f in files):
            files.append(ChainFile(n, cfg.file_bytes(n), reason))
        return n

    last = start
    progress = policy.shows_progress(start, tokens, cfg)
    cut = None
    if policy.cold_save_applies(start, tokens, cfg):
        cut = policy.cold_cut(tokens, anchor, cfg)
    pos = start
    if progress and policy.continued_due(pos, last, cfg):
        last = save(pos, "continued")
    step = cfg.prefill_step
    while pos < tokens:
        stop = cut if cut is not None and pos < cut else tokens
        pos += max(1, min(step, stop - pos))
        if cut is not None and pos == cut and pos < tokens:
            cut = None
            last = save(pos, "cold")
        if progress and policy.continued_due(pos, last, cfg):
            last = save(pos, "continued")
    if policy.continued_due(tokens, last, cfg):
        last = save(tokens, "continued")
    if cut == tokens:
        last = save(tokens, "cold")
    if final and tokens >= cfg.kv_cache_min_tokens and tokens > last:
        save(tokens, "evict")
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
