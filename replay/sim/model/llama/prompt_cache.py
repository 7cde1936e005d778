"""The host-memory prompt cache (`--cache-ram` MiB): whole slot states kept in RAM after their slot
moves on to another prompt, found again by the prompt they hold.

Rules from tools/server/server-task.cpp at b11549, `server_prompt_cache`:
- `alloc`: a state whose tokens are a prefix of a stored one is not stored again; a state larger
  than the limit is skipped; stored states that are prefixes of the new one are dropped; then the
  oldest go until the new one fits. A state weighs its memory plus its checkpoints.
- `load`: the stored state with the best f_keep (share of its tokens kept) and f_sim (share of the
  new prompt covered), both better than the slot's own and f_keep at least 0.25, replaces the
  slot's state and leaves the cache.
- `update`: the oldest go while over the size limit, then while over the token limit, which grows
  to what the size limit holds at the cache's average bytes per token.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from replay.sim.model.llama.checkpoints import Checkpoint
from replay.sim.model.llama.memory import MemState
from replay.sim.model.seq import TokenSeq, common_prefix


@dataclass(init=False, slots=True)
class Entry:
    """One `server_prompt_cache_state`: the tokens, the checkpoints and the state bytes."""

    tokens: TokenSeq
    checkpoints: list[Checkpoint]
    state: MemState
    state_bytes: int

    def __init__(
        self, tokens: TokenSeq, checkpoints: list[Checkpoint], state: MemState, state_bytes: int
    ) -> None:
        self.tokens = tokens
        self.checkpoints = checkpoints
        self.state = state
        self.state_bytes = state_bytes

    @property
    def size(self) -> int:
        return self.state_bytes + sum(c.size for c in self.checkpoints)


@dataclass(init=False, slots=True)
class Saved:
    """What `alloc` did: stored (the entry), or skipped ("contained", "too-large"); the prefixes it
    dropped and the entries evicted to make room."""

    entry: Entry | None
    skipped: str | None
    obsolete: list[Entry]
    evicted: list[Entry]

    def __init__(
        self, entry: Entry | None, skipped: str | None, obsolete: list[Entry], evicted: list[Entry]
    ) -> None:
        self.entry = entry
        self.skipped = skipped
        self.obsolete = obsolete
        self.evicted = evicted


@dataclass(init=False, slots=True)
class Candidate:
    """One stored prompt as `load` weighs it (its `- prompt with length` line)."""

    tokens: int
    lcp: int
    f_keep: float
    f_sim: float

    def __init__(self, tokens: int, lcp: int, f_keep: float, f_sim: float) -> None:
        self.tokens = tokens
        self.lcp = lcp
        self.f_keep = f_keep
        self.f_sim = f_sim


@dataclass(init=False, slots=True)
class Lookup:
    """What `load` saw: the slot's own f_keep and f_sim, every candidate, the entry taken."""

    base_keep: float
    base_sim: float
    candidates: list[Candidate]
    found: Entry | None
    f_keep: float
    f_sim: float

    def __init__(
        self,
        base_keep: float,
        base_sim: float,
        candidates: list[Candidate],
        found: Entry | None,
        f_keep: float,
        f_sim: float,
    ) -> None:
        self.base_keep = base_keep
        self.base_sim = base_sim
        self.candidates = candidates
        self.found = found
        self.f_keep = f_keep
        self.f_sim = f_sim


def f32(x: float) -> float:
    """A ratio as llama.cpp computes it, in float32 (the comparisons are between float32s)."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


class PromptCache:
    def __init__(self, limit_mib: int, limit_tokens: int) -> None:
        self.limit_bytes = 1024 * 1024 * max(0, limit_mib)  # -1 (no limit) counts as 0: no limit
        self.limit_tokens = limit_tokens
        self.entries: list[Entry] = []

    def copy(self) -> PromptCache:
        out = PromptCache(0, self.limit_tokens)
        out.limit_bytes = self.limit_bytes
        out.entries = list(self.entries)
        return out

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries)

    @property
    def n_tokens(self) -> int:
        return sum(len(e.tokens) for e in self.entries)

    def alloc(
        self, tokens: TokenSeq, checkpoints: list[Checkpoint], state: MemState, state_bytes: int
    ) -> Saved:
        for e in self.entries:
            if common_prefix(e.tokens, tokens) == len(tokens):
                return Saved(None, "contained", [], [])
        new = Entry(tokens, list(checkpoints), state, state_bytes)
        if self.limit_bytes > 0 and new.size > self.limit_bytes:
            return Saved(None, "too-large", [], [])
        obsolete = [e for e in self.entries if common_prefix(e.tokens, tokens) == len(e.tokens)]
        if obsolete:
            self.entries = [e for e in self.entries if e not in obsolete]
        evicted: list[Entry] = []
        if self.limit_bytes > 0:
            while self.entries and self.size + new.size > self.limit_bytes:
                evicted.append(self.entries.pop(0))
        self.entries.append(new)
        return Saved(new, None, obsolete, evicted)

    def load(self, slot_tokens: TokenSeq, new_tokens: TokenSeq) -> Lookup:
        lcp = common_prefix(slot_tokens, new_tokens)
        n_new = max(1, len(new_tokens))
        keep_best = f32(lcp / len(slot_tokens)) if len(slot_tokens) else -1.0
        sim_best = f32(lcp / n_new)
        base_keep, base_sim = keep_best, sim_best
        best: Entry | None = None
        candidates: list[Candidate] = []
        for e in self.entries:
            cur = common_prefix(e.tokens, new_tokens)
            keep = f32(cur / max(1, len(e.tokens)))
            sim = f32(cur / n_new)
            candidates.append(Candidate(len(e.tokens), cur, keep, sim))
            if keep < 0.25:
                continue  # "don't trash large prompts"
            if keep_best < keep and sim_best < sim:
                keep_best, sim_best, best = keep, sim, e
        if best is not None:
            self.entries.remove(best)
        return Lookup(base_keep, base_sim, candidates, best, keep_best, sim_best)

    def update(self) -> tuple[list[Entry], list[Entry]]:
        """Evictions for the size limit, then for the token limit."""
        by_size: list[Entry] = []
        if self.limit_bytes > 0:
            while self.entries and self.size > self.limit_bytes:
                by_size.append(self.entries.pop(0))
        by_tokens: list[Entry] = []
        per_token = max(1.0, f32(self.size / max(1, self.n_tokens)))
        limit = (
            max(self.limit_tokens, int(self.limit_bytes / per_token))
            if self.limit_bytes > 0
            else self.limit_tokens
        )
        if self.limit_tokens > 0:
            while self.entries and self.n_tokens > limit:
                by_tokens.append(self.entries.pop(0))
        return by_size, by_tokens

    def token_limit_estimate(self) -> int:
        per_token = max(1.0, f32(self.size / max(1, self.n_tokens)))
        return (
            max(self.limit_tokens, int(self.limit_bytes / per_token))
            if self.limit_bytes > 0
            else self.limit_tokens
        )
