"""The disk checkpoint store: files, budget with ds4's 1% slack, score eviction, prefix restore.

Pure bookkeeping in virtual time; writing placeholder files is the server's job (`files.py`), driven
by the events this store's caller emits. Every checkpoint is a full snapshot: nested prefixes share
nothing, which is why one long prefill's chain of files grows with the square of its length.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

from replay.sim import policy
from replay.sim.config import SimConfig
from replay.sim.seq import TokenSeq, is_prefix


@dataclass(eq=False, slots=True)
class Checkpoint:
    """One `<sha1>.kv` file: the tokens it restores and ds4's header fields."""

    seq: TokenSeq
    reason: str
    key: str
    size: int
    created: float
    last_used: float
    hits: int = 0
    trimmed: int = 0
    _name: str | None = field(default=None, repr=False)

    @property
    def tokens(self) -> int:
        return len(self.seq)

    @property
    def name(self) -> str:
        """File name: sha1 of the stored text, as ds4 names its files (computed only when asked)."""
        if self._name is None:
            self._name = hashlib.sha1(self.seq.text().encode()).hexdigest() + ".kv"
        return self._name

    def text_bytes(self) -> int:
        return len(self.seq.text().encode())


@dataclass(slots=True)
class StoreOutcome:
    """What one store did: the file (None if skipped or already present) and the files it evicted."""

    stored: Checkpoint | None
    evicted_before: list[Checkpoint]
    evicted_after: list[Checkpoint]
    duplicate: bool = False
    skipped: str | None = None


class DiskStore:
    def __init__(self, cfg: SimConfig, files: list[Checkpoint] | None = None) -> None:
        self.cfg = cfg
        self.files: list[Checkpoint] = list(files or [])
        self.total = sum(cp.size for cp in self.files)
        self._longest_first: list[Checkpoint] | None = None

    @property
    def budget(self) -> int:
        return self.cfg.budget_bytes

    def need(self, size: int) -> int:
        """Bytes a file needs to be allowed in: its size plus ds4's 1% safety slack."""
        return size + size // 100

    def trim(self, now: float) -> list[Checkpoint]:
        """The startup pass: evict until the directory fits the budget."""
        return self._evict_while(lambda: self.total > self.budget, now, protect=None, incoming=None)

    def find_same(self, seq: TokenSeq) -> Checkpoint | None:
        n = len(seq)
        for cp in self.files:
            if cp.tokens == n and is_prefix(cp.seq, seq):
                return cp
        return None

    def store(self, seq: TokenSeq, reason: str, key: str, now: float, trimmed: int = 0) -> StoreOutcome:
        """Write a checkpoint of `seq`, evicting by ds4's rule for the configured build."""
        size = self.cfg.file_bytes(len(seq))
        if self.need(size) > self.budget:
            mib = 1024 * 1024
            return StoreOutcome(
                None,
                [],
                [],
                skipped=(
                    f"estimated file size {size / mib:.2f} MiB ({self.need(size) / mib:.2f} MiB with safety) "
                    f"exceeds budget {self.budget / mib:.0f} MiB"
                ),
            )
        if self.find_same(seq) is not None:
            return StoreOutcome(None, [], [], duplicate=True)
        before: list[Checkpoint] = []
        if self.cfg.eviction == "aug":
            before = self._evict_while(
                lambda: self.total + self.need(size) > self.budget, now, protect=None, incoming=seq
            )
        cp = Checkpoint(seq, reason, key, size, created=now, last_used=now, trimmed=trimmed)
        self.files.append(cp)
        self.total += size
        self._longest_first = None
        after: list[Checkpoint] = []
        if self.cfg.eviction == "base":
            after = self._evict_while(lambda: self.total > self.budget, now, protect=cp, incoming=None)
        return StoreOutcome(cp, before, after)

    def lookup(self, prompt: TokenSeq) -> Checkpoint | None:
        """The longest stored prefix of the prompt (tie: more tokens), honouring min tokens."""
        if self._longest_first is None:
            self._longest_first = sorted(self.files, key=lambda c: c.tokens, reverse=True)
        for cp in self._longest_first:
            if policy.restorable(cp, len(prompt), self.cfg) and is_prefix(cp.seq, prompt):
                return cp
        return None

    def hit(self, cp: Checkpoint, now: float) -> None:
        cp.hits += 1
        cp.last_used = now

    def remove(self, cp: Checkpoint) -> None:
        self.files.remove(cp)
        self.total -= cp.size
        self._longest_first = None

    def _evict_while(
        self, over: Callable[[], bool], now: float, protect: Checkpoint | None, incoming: TokenSeq | None
    ) -> list[Checkpoint]:
        """Evict lowest score first (ties: least recently used) while `over()`; a file's score does
        not depend on the other files, so one ranking serves the whole pass."""
        evicted: list[Checkpoint] = []
        if not over():
            return evicted
        ranked = sorted(
            (cp for cp in self.files if cp is not protect),
            key=lambda cp: (policy.eviction_score(cp, now, self.cfg, incoming), cp.last_used),
        )
        for victim in ranked:
            if not over():
                break
            self.remove(victim)
            evicted.append(victim)
        return evicted
