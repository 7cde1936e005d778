"""Which positions a slot's memory holds: what llama-server asks `llama_memory_seq_pos_min` before
it reuses a prefix and records in every checkpoint.

- A full-attention cache holds positions 0..n-1 of the sequence.
- A recurrent state holds one position, the last (`llama_memory_recurrent::seq_pos_min`); a hybrid
  memory's minimum is the larger of its two parts' (`llama_memory_hybrid::seq_pos_min`).
- A sliding-window cache (`iswa`) answers with its SWA part (`llama_kv_cache_iswa::seq_pos_min`), a
  ring of cells (`SwaRing`) that keeps what was written last, not a fixed window: which positions
  are still there depends on how the tokens arrived (in ubatches, after truncations and restores),
  so the ring is simulated cell by cell.
"""

from __future__ import annotations

from dataclasses import dataclass


def is_masked(n_swa: int, p0: int, p1: int) -> bool:
    """`llama_hparams::is_masked_swa`, standard window: position p0 is outside p1's window."""
    return p1 - p0 >= n_swa


class SwaRing:
    """One KV stream's SWA cells: a position and a sequence per cell, a head where the next search
    starts (src/llama-kv-cache.cpp)."""

    def __init__(self, size: int, n_swa: int) -> None:
        self.size = size
        self.n_swa = n_swa
        self.seq = [-1] * size
        self.pos = [-1] * size
        self.head = 0
        self.used = 0

    def copy(self) -> SwaRing:
        out = SwaRing(self.size, self.n_swa)
        out.seq, out.pos, out.head, out.used = self.seq.copy(), self.pos.copy(), self.head, self.used
        return out

    def pos_max(self, seq: int) -> int:
        best = -1
        for i in range(self.size):
            if self.seq[i] == seq and self.pos[i] > best:
                best = self.pos[i]
        return best

    def pos_min(self, seq: int) -> int:
        best = -1
        for i in range(self.size):
            if self.seq[i] == seq and (best < 0 or self.pos[i] < best):
                best = self.pos[i]
        return best

    def positions(self, seq: int) -> list[int]:
        return sorted(self.pos[i] for i in range(self.size) if self.seq[i] == seq)

    def unmasked(self, seq: int) -> list[int]:
        """The positions `state_write` saves: those inside the window of the sequence's last one."""
        top = self.pos_max(seq)
        return [p for p in self.positions(seq) if not is_masked(self.n_swa, p, top)]

    def _find(self, n: int) -> list[int]:
        """`find_slot(ubatch, cont = false)`: the first `n` usable cells from the head, wrapping; a
        cell is usable when empty or when its position is outside its sequence's window."""
        head = self.head
        if head > self.used + 2 * n:
            head = 0  # enough unused cells before the head: search from the start
        tops: dict[int, int] = {}
        out: list[int] = []
        for k in range(self.size):
            i = (head + k) % self.size
            s = self.seq[i]
            usable = s < 0
            if not usable:
                top = tops.get(s)
                if top is None:
                    top = self.pos_max(s)
                    tops[s] = top
                usable = is_masked(self.n_swa, self.pos[i], top + 1)
            if usable:
                out.append(i)
                if len(out) == n:
                    break
        return out

    def place(self, seq: int, positions: list[int]) -> None:
        """`find_slot` then `apply_ubatch` for one ubatch of `seq`: overwritten cells are freed,
        and every position of a sequence up to the highest one overwritten is purged with them
        (positions stay contiguous)."""
        if not positions:
            return
        cells = self._find(len(positions))
        rm: dict[int, int] = {}
        for i, p in zip(cells, positions, strict=False):
            s = self.seq[i]
            if s >= 0:
                rm[s] = max(rm.get(s, -1), self.pos[i])
                self.used -= 1
            self.seq[i] = seq
            self.pos[i] = p
            self.used += 1
        for s, top in rm.items():
            for i in range(self.size):
                if self.seq[i] == s and self.pos[i] <= top:
                    self._free(i)
        if cells:
            self.head = cells[-1] + 1  # may equal size: the next search wraps

    def remove(self, seq: int, p0: int) -> None:
        """`seq_rm(seq, p0, -1)`: drop the sequence's positions from p0 on; the next search starts
        at the first cell freed, if that is before the head ("so searching can start there")."""
        first = -1
        for i in range(self.size):
            if self.seq[i] == seq and self.pos[i] >= p0:
                self._free(i)
                if first < 0:
                    first = i
        if 0 <= first < self.head:
            self.head = first

    def _free(self, i: int) -> None:
        self.seq[i] = -1
        self.pos[i] = -1
        self.used -= 1


@dataclass(init=False, slots=True)
class MemState:
    """A sequence's state as `state_write` saves it (the host prompt cache, a slot file): the full
    cache's token count, the SWA positions inside the window, the recurrent state's position."""

    n: int
    swa: tuple[int, ...]
    rec_pos: int

    def __init__(self, n: int, swa: tuple[int, ...], rec_pos: int) -> None:
        self.n = n
        self.swa = swa
        self.rec_pos = rec_pos


class SlotMemory:
    """One slot's sequence in the memory kinds of `arch.Arch.kind`."""

    def __init__(self, seq: int, kind: str, ring: SwaRing | None, n_ubatch: int) -> None:
        self.seq = seq
        self.kind = kind
        self.ring = ring
        self.n_ubatch = n_ubatch
        self.n = 0
        self.rec_pos = -1

    def pos_min(self) -> int:
        if self.n <= 0:
            return -1
        if self.kind in ("hybrid", "recurrent"):
            return self.rec_pos
        if self.ring is not None:
            return self.ring.pos_min(self.seq)
        return 0

    def pos_max(self) -> int:
        if self.n <= 0:
            return -1
        if self.ring is not None:
            return self.ring.pos_max(self.seq)
        return self.n - 1

    def append(self, n_tokens: int) -> None:
        """Decode `n_tokens` more tokens (one batch: llama_decode splits it into ubatches)."""
        if self.ring is not None:
            p = self.n
            end = self.n + n_tokens
            while p < end:
                q = min(end, p + self.n_ubatch)
                self.ring.place(self.seq, list(range(p, q)))
                p = q
        self.n += n_tokens
        if self.kind in ("hybrid", "recurrent") and self.n > 0:
            self.rec_pos = self.n - 1

    def truncate(self, p0: int) -> None:
        """`seq_rm(id, p0, -1)`. A recurrent state cannot lose part of its past: it is cleared only
        from 0 (llama_memory_recurrent::seq_rm refuses a partial removal)."""
        if p0 >= self.n:
            return
        self.n = max(0, p0)
        if self.ring is not None:
            self.ring.remove(self.seq, max(0, p0))
        if p0 <= 0:
            self.rec_pos = -1

    def clear(self) -> None:
        self.truncate(0)

    def snapshot(self) -> MemState:
        swa = tuple(self.ring.unmasked(self.seq)) if self.ring is not None and self.n > 0 else ()
        return MemState(self.n, swa, self.rec_pos)

    def load(self, state: MemState) -> None:
        """`state_read` of a whole state (a prompt cache entry, a slot file)."""
        self.clear()
        self.n = state.n
        self.rec_pos = state.rec_pos
        if self.ring is not None:
            self.ring.place(self.seq, list(state.swa))

    def load_partial(self, swa: tuple[int, ...], pos_max: int) -> None:
        """A checkpoint's `load_tgt(PARTIAL_ONLY)`: the SWA cells or the recurrent state it holds."""
        if self.ring is not None:
            self.ring.remove(self.seq, 0)
            self.ring.place(self.seq, list(swa))
        if self.kind in ("hybrid", "recurrent"):
            self.rec_pos = pos_max
