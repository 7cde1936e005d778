"""One checkpoint file: the tokens it restores, ds4's header fields, its file name.

Its own module so that the policy (what a checkpoint is worth) and the store (which files are on
disk) both read it and neither imports the other.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import lru_cache

from replay.sim.model.seq import TokenSeq
from replay.sim.model.tokenizer import Block


@lru_cache(maxsize=1024)
def _block_bytes(block: Block) -> bytes:
    """A block's UTF-8 text; a conversation's files share most blocks, so each is encoded once."""
    return "".join(block).encode()


def text_sha1(seq: TokenSeq) -> str:
    """sha1 of the sequence's text, fed block by block (no joined copy of the whole text)."""
    h = hashlib.sha1()
    for block, end in zip(seq.blocks, seq.ends, strict=True):
        if end <= seq.n:
            h.update(_block_bytes(block))
        else:
            h.update("".join(block[: len(block) - (end - seq.n)]).encode())
            break
    return h.hexdigest()


@dataclass(eq=False, init=False, slots=True)
class Checkpoint:
    """One `<sha1>.kv` file: the tokens it restores and ds4's header fields."""

    seq: TokenSeq
    reason: str
    key: str
    size: int
    created: float
    last_used: float
    hits: int
    trimmed: int
    _name: str | None = field(init=False, repr=False)
    _key: tuple[int, int] | None = field(init=False, repr=False)  # its disk-index bucket

    def __init__(
        self,
        seq: TokenSeq,
        reason: str,
        key: str,
        size: int,
        created: float,
        last_used: float,
        hits: int = 0,
        trimmed: int = 0,
    ) -> None:
        self.seq = seq
        self.reason = reason
        self.key = key
        self.size = size
        self.created = created
        self.last_used = last_used
        self.hits = hits
        self.trimmed = trimmed
        self._name = None
        self._key = None

    def copy(self) -> Checkpoint:
        out = Checkpoint(self.seq, self.reason, self.key, self.size, self.created, self.last_used, self.hits)
        out.trimmed, out._name, out._key = self.trimmed, self._name, self._key
        return out

    @property
    def tokens(self) -> int:
        return len(self.seq)

    @property
    def name(self) -> str:
        """File name: sha1 of the stored text, as ds4 names its files (computed only when asked)."""
        if self._name is None:
            self._name = text_sha1(self.seq) + ".kv"
        return self._name

    def text_bytes(self) -> int:
        return len(self.seq.text().encode())
