"""One checkpoint file: the tokens it restores, ds4's header fields, its file name.

Its own module so that the policy (what a checkpoint is worth) and the store (which files are on
disk) both read it and neither imports the other.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import lru_cache

from replay.sim.model.render import CALL_OPEN, header
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


# The keys of the field build's checkpoint namespace (ds4-server.md 4.1, 4.7: issue 1053).
TOOL_KEY = "tool"
TEXT_KEY = "plain-text"
NO_REPLY_KEY = "none"


def stored_reply_key(seq: TokenSeq) -> str:
    """The key the field build stores a checkpoint under: the kind of the last reply in its text.

    A reply with a tool call carries the tool-id -> exact sampled text map (4.1, `KTM`) and is
    replayed exactly by the next request with tools ("tool"); a plain-text reply has no id to
    replay it by ("plain-text"); a text with no reply yet (system prompt, tools, first user turn)
    is "none". A reply is an assistant header with something after it inside the text, so the
    generation prompt that ends every prompt is not one. Scans back from the end: the blocks
    since the last reply are few, whatever the text's length.
    """
    assistant = header("assistant")
    ends, blocks = seq.ends, seq.blocks
    i = len(ends) - 1
    while i >= 0 and ends[i] > seq.n:
        i -= 1
    tool = False
    body = seq.n > (ends[i] if i >= 0 else 0)  # a partial block after the last whole one
    while i >= 0:
        block = blocks[i]
        if block == assistant:
            if body:
                return TOOL_KEY if tool else TEXT_KEY
            tool = False
        else:
            body = True
            if block == CALL_OPEN:
                tool = True
            elif block[:1] == ("<|im_start|>",):
                tool, body = False, False  # another role's turn: the reply, if any, is earlier
        i -= 1
    return NO_REPLY_KEY


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
    _reply_key: str | None = field(init=False, repr=False)

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
        self._reply_key = None

    def copy(self) -> Checkpoint:
        out = Checkpoint(self.seq, self.reason, self.key, self.size, self.created, self.last_used, self.hits)
        out.trimmed, out._name, out._key = self.trimmed, self._name, self._key
        out._reply_key = self._reply_key
        return out

    @property
    def reply_key(self) -> str:
        """The kind of the last reply in its text, the field build's key (computed when asked)."""
        if self._reply_key is None:
            self._reply_key = stored_reply_key(self.seq)
        return self._reply_key

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
