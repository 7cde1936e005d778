"""llama-server's host-RAM prompt cache (`--cache-ram`), replayed entry by entry from its log.

The server's `server_prompt_cache` (tools/server/server-task.cpp, both A/B builds):

- `prompt_save` prints `saving prompt with length N, total state size = X MiB`, then `alloc` skips
  the save (`prompt is already in the cache`, `prompt state size ... exceeds cache size limit`,
  `failed to allocate memory`), or removes every cached prompt the new one contains (`removing
  obsolete cached prompt with length M`, no size printed) and the oldest entries while the new one
  would not fit (`making room ..., removing oldest entry (size = Y MiB)`), and appends the entry;
- `load` scores every entry (`- prompt with length N, lcp = L, f_keep = F, f_sim = S`) and the one
  it takes (`found better prompt with f_keep = F, f_sim = S`) leaves the cache
  (`states.erase(it_best)`): a restore takes memory back;
- `update` drops the oldest entries while over the size or token limit (`removing oldest entry
  (size = Y MiB)`) and prints `cache state: P prompts, X MiB` and `- prompt 0x..: N tokens,
  checkpoints: C, X MiB` for each entry, oldest first.

An entry's size counts its context checkpoints (`server_prompt_cache_state::size`) and the save
line's does not, so the slots' checkpoints are followed too (created, superseded, erased as
invalidated, old or too close; a slot's list comes back with the entry it loads and from the slot
file it restores, and goes when the slot is cleared): an entry saved is the slot's state plus its
checkpoints. Each listing then replaces the ledger, so one line misread costs one step, not the run.
Numbers only: the pointers of the listing are never read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from drivers.logs import llamacpp as ll

Checkpoint = tuple[int, float]  # n_tokens, MiB


@dataclass(slots=True)
class Entry:
    tokens: int
    mib: float
    checkpoints: list[Checkpoint] | None = None  # None: listed by the server, not seen saved


@dataclass(slots=True)
class Effect:
    """What one log line did to the cache: `mib` added (save) or taken out (load, eviction)."""

    mib: float | None = None
    entry_tokens: int | None = None
    saved: bool | None = None  # a save line: was the entry kept (None: the log stops before it says)
    skipped: str | None = None  # why not: present | too_big | no_memory
    ledger_mib: float | None = None  # a `cache state` line: what the ledger held at that point


@dataclass(slots=True)
class HostCache:
    """The entries the server holds, oldest first, and what each line did to them."""

    entries: list[Entry] = field(default_factory=list)
    effects: dict[int, Effect] = field(default_factory=dict)  # log line -> effect
    _pending: tuple[int, Entry] | None = None  # a save line not yet committed, and its entry
    _candidates: list[ll.PromptCacheCandidate] = field(default_factory=list)
    _listing: list[Entry] | None = None  # entries listed after the last `cache state`
    _slot: int | None = None  # the slot last selected: the one saved and loaded into
    _slot_checkpoints: dict[int | None, list[Checkpoint]] = field(default_factory=dict)
    _slot_files: dict[int | None, list[Checkpoint]] = field(default_factory=dict)  # last slot-file save

    @property
    def mib(self) -> float:
        return sum(e.mib for e in self.entries)

    def feed(self, ev: ll.Event) -> None:
        if isinstance(ev, ll.PromptCacheEntry):
            if self._listing is not None:  # the server's own list replaces the ledger
                known = next((e for e in self.entries if e.tokens == ev.tokens), None)
                same = known is not None and known.checkpoints is not None
                ckpts = known.checkpoints if same and len(known.checkpoints or ()) == ev.checkpoints else None
                self._listing.append(Entry(ev.tokens, ev.mib, ckpts))
                self.entries = list(self._listing)
            return
        self._listing = None
        if isinstance(ev, ll.SlotEvent) and self._checkpoint(ev):
            return
        if isinstance(ev, ll.PromptCacheSkip):
            if self._pending is not None:
                self.effects[self._pending[0]] = Effect(saved=False, skipped=ev.cause)
                self._pending = None
            return
        if isinstance(ev, ll.PromptCacheObsolete):
            gone = self._take(lambda e: e.tokens == ev.tokens)
            self.effects[ev.line] = Effect(mib=gone.mib if gone else None, entry_tokens=ev.tokens)
            return
        if isinstance(ev, ll.PromptCacheEvict) and ev.cause == "room":
            self._take(lambda _e: True)  # the oldest, before the pending save is appended
            return
        self._commit()
        if isinstance(ev, ll.PromptCacheSave) and ev.tokens is not None and ev.mib is not None:
            ckpts = list(self._slot_checkpoints.get(self._slot, ()))
            self._pending = (ev.line, Entry(ev.tokens, ev.mib + sum(m for _, m in ckpts), ckpts))
        elif isinstance(ev, ll.PromptCacheLookup):
            self._candidates = []
        elif isinstance(ev, ll.PromptCacheCandidate):
            self._candidates.append(ev)
        elif isinstance(ev, ll.PromptCacheLoad):
            self._load(ev)
        elif isinstance(ev, ll.PromptCacheEvict):
            self._take(lambda _e: True)  # `update`: the oldest goes
        elif isinstance(ev, ll.PromptCacheState):
            self.effects[ev.line] = Effect(mib=ev.mib, ledger_mib=round(self.mib, 3))
            self._listing = []
            if ev.prompts == 0:
                self.entries = []

    def finish(self) -> None:
        self._commit()

    def _commit(self) -> None:
        if self._pending is not None:
            line, entry = self._pending
            self.entries.append(entry)
            self.effects[line] = Effect(mib=round(entry.mib, 3), saved=True)
            self._pending = None

    def _load(self, ev: ll.PromptCacheLoad) -> None:
        """The entry the server loaded: the candidate with the scores it names (its length); its
        checkpoints become the slot's."""
        chosen = [c for c in self._candidates if (c.f_keep, c.sim) == (ev.f_keep, ev.sim)]
        tokens = chosen[0].tokens if chosen else None
        gone = self._take(lambda e: e.tokens == tokens) if tokens is not None else None
        self._slot_checkpoints[self._slot] = list((gone.checkpoints or []) if gone else [])
        mib = round(gone.mib, 3) if gone else None
        self.effects[ev.line] = Effect(mib=mib, entry_tokens=tokens)

    def _checkpoint(self, ev: ll.SlotEvent) -> bool:
        """Follow one slot's checkpoints (server-context.cpp `create_checkpoint`, `update_slots`);
        True when `ev` was about them."""
        ckpts = self._slot_checkpoints.setdefault(ev.slot, [])
        if isinstance(ev, ll.SlotSelected | ll.IdleSlotSave):
            self._slot = ev.slot  # the slot whose prompt the next save line stores
            return False
        if isinstance(ev, ll.CheckpointCreated) and ev.n_tokens is not None:
            ckpts.append((ev.n_tokens, ev.mib or 0.0))
        elif isinstance(
            ev, ll.CheckpointSuperseded | ll.CheckpointErased | ll.CheckpointEvicted | ll.CheckpointPruned
        ):
            i = next((i for i, c in enumerate(ckpts) if c[0] == ev.n_tokens), None)
            if i is not None:
                ckpts.pop(i)
        elif isinstance(ev, ll.SlotCleared):
            ckpts.clear()
        elif isinstance(ev, ll.SlotFileCheckpoints):
            if ev.action == "save":
                self._slot_files[ev.slot] = list(ckpts)
            else:  # the file holds what the last save of this slot wrote, when the counts agree
                saved = self._slot_files.get(ev.slot, [])
                ckpts[:] = saved if len(saved) == ev.count else []
        else:
            return False
        return True

    def _take(self, which: Callable[[Entry], bool]) -> Entry | None:
        """The oldest entry `which` picks, out of the cache."""
        for i, e in enumerate(self.entries):
            if which(e):
                return self.entries.pop(i)
        return None


def replay_host_cache(events: Sequence[ll.Event]) -> HostCache:
    """The cache after every line of the log, as `effects` per line."""
    cache = HostCache()
    for ev in events:
        cache.feed(ev)
    cache.finish()
    return cache
