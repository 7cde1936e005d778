"""Token sequences built from shared blocks, and the one prefix comparison the cache model needs.

A rendered 130K-token prompt is a few hundred blocks (one per message piece) that are the very
same tuples as in the previous request of that conversation, so comparing two prompts costs one
identity check per block until the first block that differs, and token comparisons only inside it.
A `TokenSeq` may be a prefix view of its blocks (`n` shorter than the blocks hold): checkpoints and
partial live states share the blocks of the prompt they came from instead of copying them.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate

from replay.sim.model.tokenizer import Block

GRID = 128


class TokenSeq:
    __slots__ = ("blocks", "ends", "n", "_grid")

    def __init__(self, blocks: tuple[Block, ...] = (), n: int | None = None) -> None:
        self._grid: list[int] | None = None
        self.blocks: tuple[Block, ...] = ()
        self.ends: list[int] = []
        self.n = 0
        if not blocks:  # cheap, as `_raw` starts from it
            return
        self.blocks = tuple(b for b in blocks if b)
        self.ends = list(accumulate(map(len, self.blocks)))
        total = self.ends[-1] if self.ends else 0
        self.n = total if n is None else min(n, total)

    @staticmethod
    def _raw(blocks: tuple[Block, ...], ends: list[int], n: int, grid: list[int] | None = None) -> TokenSeq:
        out = TokenSeq()
        out.blocks, out.ends, out.n, out._grid = blocks, ends, n, grid
        return out

    def __len__(self) -> int:
        return self.n

    def __bool__(self) -> bool:
        return self.n > 0

    def __repr__(self) -> str:
        return f"TokenSeq(n={self.n}, blocks={len(self.blocks)})"

    def extend(self, *blocks: Block) -> TokenSeq:
        """This sequence followed by `blocks` (a prefix view is cut to its length first)."""
        if self.ends and self.ends[-1] != self.n:
            return TokenSeq(self._whole_blocks() + blocks)
        new = blocks if all(blocks) else tuple(b for b in blocks if b)
        ends = self.ends.copy()
        n = self.n
        for block in new:
            n += len(block)
            ends.append(n)
        grid = self._grid[: self.n // GRID + 1] if self._grid is not None else None
        return TokenSeq._raw(self.blocks + new, ends, n, grid)

    def prefix(self, n: int) -> TokenSeq:
        """The first `n` tokens, sharing blocks."""
        if n >= self.n:
            return self
        k = bisect_left(self.ends, n) + 1 if n > 0 else 0
        n = max(n, 0)
        grid = self._grid[: n // GRID + 1] if self._grid is not None else None
        return TokenSeq._raw(self.blocks[:k], self.ends[:k], n, grid)

    def tokens(self, start: int = 0) -> list[str]:
        """The tokens from `start` on, as one flat list."""
        out: list[str] = []
        k = bisect_left(self.ends, start + 1) if start > 0 else 0
        skip = start - (self.ends[k - 1] if k else 0)
        for block in self.blocks[k:]:
            out.extend(block[skip:] if skip else block)
            skip = 0
            if len(out) >= self.n - start:
                break
        del out[max(self.n - start, 0) :]
        return out

    def grid(self) -> list[int]:
        """`grid()[k]` is a hash of the first `k * GRID` tokens, for every k up to n // GRID.

        It depends on the tokens only, never on how they are split into blocks, so equal prefixes
        give equal hashes: the disk index buckets checkpoints by it. Computed once per sequence,
        and inherited by prefix views and extensions, so a conversation hashes only what is new.
        """
        grid = self._grid
        if grid is None:
            grid = [0]
        last = self.n // GRID
        if len(grid) <= last:
            done = len(grid) - 1
            flat = self.tokens(done * GRID)
            h = grid[-1]
            for i in range(0, (last - done) * GRID, GRID):
                h = hash((h, tuple(flat[i : i + GRID])))
                grid.append(h)
        self._grid = grid
        return grid

    def text(self) -> str:
        return "".join(self.tokens())

    def _whole_blocks(self) -> tuple[Block, ...]:
        if not self.ends or self.ends[-1] == self.n:
            return self.blocks
        k = bisect_left(self.ends, self.n)
        start = self.ends[k - 1] if k else 0
        return self.blocks[:k] + (self.blocks[k][: self.n - start],)


def _equal_blocks(a: tuple[Block, ...], b: tuple[Block, ...]) -> int:
    """How many leading blocks are equal; tuple slices compare in C (identity first)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n - 1  # a[:lo] == b[:lo] and a[:hi+1] != b[:hi+1]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def common_prefix(a: TokenSeq, b: TokenSeq) -> int:
    """Length of the longest common token prefix of `a` and `b`."""
    limit = min(a.n, b.n)
    ablocks, bblocks = a.blocks, b.blocks
    k = _equal_blocks(ablocks, bblocks)
    pos = a.ends[k - 1] if k else 0
    if pos >= limit:
        return limit
    i = j = k
    oa = ob = 0
    while pos < limit:
        ba, bb = ablocks[i], bblocks[j]
        if oa == 0 and ob == 0 and (ba is bb or (len(ba) == len(bb) and ba == bb)):
            pos += len(ba)
            i += 1
            j += 1
            continue
        k = min(len(ba) - oa, len(bb) - ob, limit - pos)
        sa, sb = ba[oa : oa + k], bb[ob : ob + k]
        if sa != sb:
            return pos + next(x for x in range(k) if sa[x] != sb[x])
        pos += k
        oa += k
        ob += k
        if oa == len(ba):
            i, oa = i + 1, 0
        if ob == len(bb):
            j, ob = j + 1, 0
    return min(pos, limit)


def is_prefix(a: TokenSeq, b: TokenSeq) -> bool:
    """True when `a` is a (not necessarily strict) prefix of `b`."""
    return a.n <= b.n and common_prefix(a, b) == a.n
