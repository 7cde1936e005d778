"""The disk checkpoint store: files, budget with ds4's 1% slack, score eviction, prefix restore.

Pure bookkeeping in virtual time; writing placeholder files is the server's job (`files.py`), driven
by the events this store's caller emits. Every checkpoint is a full snapshot: nested prefixes share
nothing, which is why one long prefill's chain of files grows with the square of its length.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from replay.sim.model import policy
from replay.sim.model.checkpoint import Checkpoint
from replay.sim.model.config import SimConfig
from replay.sim.model.seq import GRID, TokenSeq, is_prefix


@dataclass(init=False, slots=True)
class StoreOutcome:
    """What one store did: the file (None if skipped or already present) and the files it evicted."""

    stored: Checkpoint | None
    evicted_before: list[Checkpoint]
    evicted_after: list[Checkpoint]
    duplicate: bool
    skipped: str | None

    def __init__(
        self,
        stored: Checkpoint | None,
        evicted_before: list[Checkpoint],
        evicted_after: list[Checkpoint],
        duplicate: bool = False,
        skipped: str | None = None,
    ) -> None:
        self.stored = stored
        self.evicted_before = evicted_before
        self.evicted_after = evicted_after
        self.duplicate = duplicate
        self.skipped = skipped


class DiskStore:
    def __init__(self, cfg: SimConfig, files: list[Checkpoint] | None = None) -> None:
        self.cfg = cfg
        self.budget = cfg.budget_bytes
        # Insertion-ordered, so listing the files gives them in store order.
        self.files: dict[Checkpoint, None] = dict.fromkeys(files or ())
        self.total = sum(cp.size for cp in self.files)
        # The most the directory has held: the May build ("base") writes a file and only then
        # evicts, so for a moment it holds the new file over the budget (ds4 4.4); the August
        # build evicts first. Sizing reports this peak, the report's disk strip shows the same.
        self.peak = self.total
        # Files bucketed by (n // GRID, hash of their first n // GRID * GRID tokens): a prompt's
        # stored prefixes are in the buckets of its own grid hashes, so a lookup visits a few
        # candidates instead of every file. Buckets keep store order (ties go to the older file).
        self._index: dict[tuple[int, int], list[Checkpoint]] = {}
        # Eviction ranking without scoring every file per pass: a never-hit file's score does not
        # change with time (no hits to decay), so those wait in a heap keyed as the full ranking
        # is, (score, last used, store order); files with hits are scored at each pass. Heap
        # entries of files removed or hit since are dropped when they surface.
        self._order: dict[Checkpoint, int] = {}
        self._stored = 0
        self._still: list[tuple[float, float, int, Checkpoint]] = []
        self._hit: dict[Checkpoint, None] = {}
        for cp in self.files:
            self._add(cp)

    def copy(self, cfg: SimConfig) -> DiskStore:
        """An independent store with the same files, ranking and index, under `cfg`'s budget: a
        sweep's budgets share one store while no save could tell them apart, then part."""
        out = DiskStore(cfg)
        out.total, out._stored, out.peak = self.total, self._stored, self.peak
        new = {cp: cp.copy() for cp in self.files}
        out.files = dict.fromkeys(new.values())
        out._index = {key: [new[cp] for cp in bucket] for key, bucket in self._index.items()}
        out._order = {new[cp]: n for cp, n in self._order.items()}
        out._hit = {new[cp]: None for cp in self._hit}
        # Entries of removed files are dropped as they surface anyway; the others keep their keys.
        out._still = [(s, used, n, new[cp]) for s, used, n, cp in self._still if cp in new]
        heapq.heapify(out._still)
        return out

    @staticmethod
    def need(size: int) -> int:
        """Bytes a file needs to be allowed in: its size plus ds4's 1% safety slack."""
        return size + size // 100

    def trim(self, now: float) -> list[Checkpoint]:
        """The startup pass: evict until the directory fits the budget (the peak counts from here)."""
        evicted = self._evict_over(0, now, protect=None, incoming=None)
        self.peak = self.total
        return evicted

    @staticmethod
    def _key(seq: TokenSeq) -> tuple[int, int]:
        k = len(seq) // GRID
        return k, seq.grid()[k]

    def find_same(self, seq: TokenSeq) -> Checkpoint | None:
        n = len(seq)
        for cp in self._index.get(self._key(seq), ()):
            if cp.tokens == n and is_prefix(cp.seq, seq):
                return cp
        return None

    def store(
        self, seq: TokenSeq, reason: str, key: str, now: float, trimmed: int = 0, *, checked: bool = False
    ) -> StoreOutcome:
        """Write a checkpoint of `seq`, evicting by ds4's rule for the configured build.

        `checked`: the caller has just seen that the file fits the budget and is not on disk yet.
        """
        size = self.cfg.file_bytes(len(seq))
        if not checked:
            if self.need(size) > self.budget:
                mib = 1024 * 1024
                return StoreOutcome(
                    None,
                    [],
                    [],
                    skipped=(
                        f"estimated file size {size / mib:.2f} MiB ({self.need(size) / mib:.2f} MiB with "
                        f"safety) exceeds budget {self.budget / mib:.0f} MiB"
                    ),
                )
            if self.find_same(seq) is not None:
                return StoreOutcome(None, [], [], duplicate=True)
        before: list[Checkpoint] = []
        if self.cfg.eviction == "aug":
            # `ds4_kvstore_evict(kc, live, est_file_bytes, &incoming)`: room for the file itself
            # (the 1% slack only decides whether it may be written at all).
            before = self._evict_over(size, now, protect=None, incoming=seq)
        cp = Checkpoint(seq, reason, key, size, created=now, last_used=now, trimmed=trimmed)
        self.files[cp] = None
        self.total += size
        if self.total > self.peak:
            self.peak = self.total
        after: list[Checkpoint] = []
        if self.cfg.eviction == "base":
            after = self._evict_over(0, now, protect=cp, incoming=None)
        self._add(cp)  # after the pass: the new file is protected from it
        return StoreOutcome(cp, before, after)

    def _add(self, cp: Checkpoint) -> None:
        cp._key = self._key(cp.seq)
        self._index.setdefault(cp._key, []).append(cp)
        self._stored += 1
        self._order[cp] = self._stored
        if cp.hits:
            self._hit[cp] = None
        else:
            score = policy.eviction_score(cp, cp.last_used, self.cfg)
            heapq.heappush(self._still, (score, cp.last_used, self._stored, cp))

    def lookup(self, prompt: TokenSeq, wanted: str | None = None) -> Checkpoint | None:
        """The longest stored prefix of the prompt (tie: the older file), honouring min tokens
        and, when `wanted` is given, the key the request looks up under.

        Buckets are visited from the prompt's longest grid prefix down; every file in bucket k
        is shorter than any in bucket k + 1, so the first bucket with a match holds the answer.
        """
        grid = prompt.grid()
        best: Checkpoint | None = None
        for k in range(len(prompt) // GRID, self.cfg.kv_cache_min_tokens // GRID - 1, -1):
            for cp in self._index.get((k, grid[k]), ()):
                if (best is None or cp.tokens > best.tokens) and (
                    policy.restorable(cp, len(prompt), self.cfg, wanted) and is_prefix(cp.seq, prompt)
                ):
                    best = cp
            if best is not None:
                return best
        return None

    def hit(self, cp: Checkpoint, now: float) -> None:
        cp.hits += 1
        cp.last_used = now
        if cp in self._order:
            self._hit[cp] = None
            self._prune_heap()

    def remove(self, cp: Checkpoint) -> None:
        del self.files[cp]
        del self._order[cp]
        self._hit.pop(cp, None)
        key = cp._key or self._key(cp.seq)
        bucket = self._index[key]
        bucket.remove(cp)
        if not bucket:
            del self._index[key]
        self.total -= cp.size
        self._prune_heap()

    def _prune_heap(self) -> None:
        """Drop the heap entries of files since hit or removed once they outnumber the live ones:
        they only go when they surface in an eviction pass, and a store that restores (and so
        consumes) its files without filling up would keep every one, and its tokens, for ever."""
        heap = self._still
        if len(heap) <= 2 * (len(self._order) - len(self._hit)) + 1024:
            return
        order, hit = self._order, self._hit
        heap[:] = [
            e for e in heap if e[3] in order and e[3] not in hit
        ]  # in place: an eviction pass holds it
        heapq.heapify(heap)

    def _evict_over(
        self, extra: int, now: float, protect: Checkpoint | None, incoming: TokenSeq | None
    ) -> list[Checkpoint]:
        """Evict lowest score first (ties: least recently used, then the older file) while the
        files and `extra` bytes exceed the budget; a file's score does not depend on the other
        files, so one ranking serves the whole pass. `protect` is never in the heap (it is added
        after its pass)."""
        evicted: list[Checkpoint] = []
        limit = self.budget - extra
        if self.total <= limit:
            return evicted
        # Scored now: files with hits, and (August build) never-hit continued files that are a
        # prefix of the incoming one, whose score depends on it.
        moving = self._hit
        if incoming is not None and self.cfg.eviction == "aug":
            moving = dict(moving)
            for cp in self._prefixes(incoming):
                if cp.reason == "continued" and len(cp.seq) < len(incoming):
                    moving[cp] = None
        scored = sorted(
            (policy.eviction_score(cp, now, self.cfg, incoming), cp.last_used, self._order[cp], cp)
            for cp in moving
            if cp is not protect
        )
        i = 0
        held: list[tuple[float, float, int, Checkpoint]] = []
        heap, order = self._still, self._order
        while self.total > limit:
            while heap and (heap[0][3] not in order or heap[0][3] in moving):
                entry = heapq.heappop(heap)
                if entry[3] in moving and entry[3] in order and not entry[3].hits:
                    held.append(entry)  # scored differently for this pass only
            if i < len(scored) and (not heap or scored[i] < heap[0]):
                victim = scored[i][3]
                i += 1
            elif heap:
                victim = heapq.heappop(heap)[3]
            else:
                break
            self.remove(victim)
            evicted.append(victim)
        for entry in held:
            heapq.heappush(heap, entry)
        return evicted

    def _prefixes(self, seq: TokenSeq) -> list[Checkpoint]:
        """Every stored file whose tokens are a prefix of `seq`."""
        grid = seq.grid()
        return [
            cp
            for k in range(len(seq) // GRID, -1, -1)
            for cp in self._index.get((k, grid[k]), ())
            if is_prefix(cp.seq, seq)
        ]
