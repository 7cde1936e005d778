"""The disk store's indexes (prefix buckets, eviction heap) and the cached file writer give the
same answers as the plain scans they replace."""

from __future__ import annotations

import hashlib
import zlib

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.sim.model import policy
from replay.sim.model.checkpoint import Checkpoint, text_sha1
from replay.sim.model.config import config_for
from replay.sim.model.disk import DiskStore
from replay.sim.model.seq import GRID, TokenSeq, is_prefix
from replay.sim.server.files import MAGIC_V1, CheckpointFiles

VOCAB = ("a", " b", " c", "\n", " é")


def split(tokens: list[str], cuts: list[int]) -> TokenSeq:
    edges = sorted({0, len(tokens), *(c % (len(tokens) + 1) for c in cuts)})
    return TokenSeq(tuple(tuple(tokens[i:j]) for i, j in zip(edges, edges[1:], strict=False)))


tokens_st = st.lists(st.sampled_from(VOCAB), max_size=5 * GRID)
cuts_st = st.lists(st.integers(0, 10_000), max_size=6)


@settings(max_examples=60, deadline=None)
@given(tokens_st, cuts_st, cuts_st, st.integers(0, 10_000))
def test_grid_depends_on_tokens_not_blocks(tokens, cuts_a, cuts_b, cut):
    a, b = split(tokens, cuts_a), split(tokens, cuts_b)
    assert a.grid() == b.grid() and len(a.grid()) == len(tokens) // GRID + 1
    n = cut % (len(tokens) + 1)
    assert a.prefix(n).grid() == split(tokens[:n], []).grid()
    assert a.prefix(n).extend(tuple(tokens[n:])).grid() == a.grid()
    assert a.tokens(n) == tokens[n:]
    assert text_sha1(a.prefix(n)) == hashlib.sha1("".join(tokens[:n]).encode()).hexdigest()


def _store(cfg, seqs, hits):
    files = [
        Checkpoint(s, reason, "token-text", cfg.file_bytes(len(s)), created=-t, last_used=-t, hits=h)
        for s, (reason, h, t) in zip(seqs, hits, strict=False)
    ]
    return DiskStore(cfg, files)


seq_family = st.lists(st.tuples(st.integers(0, 3), st.integers(GRID // 2, 4 * GRID)), min_size=1, max_size=12)
meta_st = st.lists(
    st.tuples(st.sampled_from(("cold", "continued", "evict")), st.integers(0, 2), st.floats(0, 50_000)),
    min_size=12,
    max_size=12,
)


def _family(spec):
    """Sequences from 4 base conversations cut at various lengths: many share prefixes."""
    bases = [[VOCAB[(i * 7 + j * j) % len(VOCAB)] for j in range(5 * GRID)] for i in range(4)]
    for b in bases[1:]:
        b[: GRID + 3] = bases[0][: GRID + 3]  # a shared system prompt
    return [split(bases[i][:n], [n // 3, GRID]) for i, n in spec], bases


@settings(max_examples=60, deadline=None)
@given(seq_family, meta_st, st.integers(0, 3), st.integers(GRID, 5 * GRID))
def test_lookup_and_find_same_match_a_scan(spec, meta, which, plen):
    cfg = config_for(disk=True, kv_cache_min_tokens=GRID // 2)
    seqs, bases = _family(spec)
    store = _store(cfg, seqs, meta)
    prompt = split(bases[which][:plen], [7])
    ranked = sorted(store.files, key=lambda c: c.tokens, reverse=True)
    want = next(
        (c for c in ranked if policy.restorable(c, len(prompt), cfg) and is_prefix(c.seq, prompt)), None
    )
    assert store.lookup(prompt) is want
    for s in seqs:
        same = store.find_same(split(s.tokens(), [3]))
        assert same is not None and same.seq.tokens() == s.tokens()


@settings(max_examples=60, deadline=None)
@given(seq_family, meta_st, st.sampled_from(("base", "aug")), st.integers(0, 3), st.floats(0, 1))
def test_eviction_order_matches_a_full_sort(spec, meta, eviction, which, frac):
    cfg = config_for(disk=True, eviction=eviction)
    seqs, bases = _family(spec)
    store = _store(cfg, seqs, meta)
    incoming = split(bases[which], []) if eviction == "aug" else None
    now = 60_000.0
    for cp in list(store.files)[::3]:
        store.hit(cp, now - 10)
    pos = {id(cp): i for i, cp in enumerate(store.files)}
    ranked = sorted(store.files, key=lambda c: (policy.eviction_score(c, now, cfg, incoming), c.last_used))
    keep, total, want = int(store.total * frac), store.total, []
    for cp in ranked:
        if total <= keep:
            break
        total -= cp.size
        want.append(pos[id(cp)])
    got = store._evict_over(store.budget - keep, now, None, incoming)  # down to `keep` bytes
    assert [pos[id(cp)] for cp in got] == want
    # a second pass continues the same ranking
    got2 = store._evict_over(store.budget - keep // 2, now, None, incoming)
    rest = [i for i in (pos[id(c)] for c in ranked) if i not in want]
    assert [pos[id(cp)] for cp in got2] == rest[: len(got2)]
    assert store.total <= keep // 2


def test_files_round_trip_and_read_v1(tmp_path):
    cfg = config_for(disk=True)
    seq = split([VOCAB[i % 5] for i in range(3 * GRID)], [10, 200])
    files = CheckpointFiles(tmp_path, 1_000.0)
    cps = [
        Checkpoint(seq.prefix(n), "continued", "token-text", cfg.file_bytes(n), created=1.0, last_used=2.0)
        for n in (GRID, 2 * GRID + 5, 3 * GRID)
    ]
    for cp in cps:
        files.write(cp)
    old = Checkpoint(seq.prefix(77), "evict", "token-text", cfg.file_bytes(77), created=1.0, last_used=2.0)
    header = files._header(old)
    (tmp_path / old.name).write_bytes(MAGIC_V1 + header + zlib.compress(orjson.dumps(old.seq.tokens())))
    found, bad = files.load()
    assert not bad
    by_name = {cp.name: cp for cp in found}
    for cp in [*cps, old]:
        back = by_name[cp.name]
        assert back.seq.tokens() == cp.seq.tokens() and back.tokens == cp.tokens and back.size == cp.size


def test_aug_evicts_a_superseded_continued_prefix_first():
    cfg = config_for(disk=True, eviction="aug")
    seqs, bases = _family([(1, 2 * GRID), (0, 2 * GRID), (0, 3 * GRID)])
    store = _store(cfg, seqs, [("continued", 0, 100.0), ("continued", 0, 50.0), ("continued", 0, 0.0)])
    older_prefix = list(store.files)[1]  # the unrelated file is the oldest: without the rule it goes first
    got = store._evict_over(store.budget - store.total + 1, 60_000.0, None, split(bases[0], []))  # one file
    assert got == [older_prefix]


def test_the_eviction_heap_does_not_keep_files_restored_and_consumed():
    """A store that restores (hits, then removes) its files without ever filling up holds no
    heap entry, and so no tokens, for each file it once had: the heap stays near its live files."""
    cfg = config_for(disk=True, kv_cache_min_tokens=GRID // 2)
    store = DiskStore(cfg)
    tokens = [VOCAB[j % len(VOCAB)] for j in range(2 * GRID)]
    for i in range(5000):
        seq = TokenSeq((tuple([VOCAB[i % len(VOCAB)], str(i), *tokens]),))
        out = store.store(seq, "continued", "token-text", float(i))
        assert out.stored is not None
        if i % 10:  # most are restored and consumed; every tenth stays on disk
            store.hit(out.stored, float(i) + 0.5)
            store.remove(out.stored)
    live = set(store.files)
    assert 0 < len(live) <= 500
    assert len(store._still) <= 2 * len(live) + 1024 + 1
    # Every file that may still be evicted from the heap is in it.
    assert {e[3] for e in store._still if e[3] in store._order} == live
