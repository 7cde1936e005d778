"""A deterministic, lossless word-piece tokenizer standing in for the model's BPE.

What matters for cache behaviour is not the exact vocabulary but that (a) equal text gives equal
tokens, (b) a text's token count is close to a real tokenizer's (about one token per English word,
so `replay.trace.synth` text of N tokens comes out at N tokens), and (c) joining the tokens gives the
text back byte for byte, so a checkpoint's text can be written to disk and compared again.

A token is a run of up to 15 letters, up to 3 digits or one other symbol, each with at most one
leading space, or a run of whitespace. Tokens are interned strings, so comparing two token tuples
is mostly pointer comparison.
"""

from __future__ import annotations

import re
import sys
from collections import OrderedDict

Block = tuple[str, ...]

_TOKEN = re.compile(r" ?[^\W\d_]{1,15}| ?\d{1,3}| ?[^\w\s]| ?_|\s+")

EMPTY: Block = ()


# Recent texts and their tokens (insertion order, the oldest dropped first): equal texts share one
# tuple, which is what makes comparing two renderings mostly identity checks. Bounded in entries and
# in characters, so a server that once saw a 60 MB prompt does not keep it (and its tokens) for good;
# a text larger than a whole context's worth is never kept.
_CACHE_SIZE = 1 << 16
_CACHE_CHARS = 1 << 26  # 64 Mi characters: a few dozen long conversations
_TEXT_MAX = 1 << 23  # 8 Mi characters: about 1.5M tokens
_cache: OrderedDict[str, Block] = OrderedDict()
_cached_chars = [0]
_evicted = [0]  # texts dropped for the bounds since start: see `cache_fill`
_keeping = [True]  # whether new texts go in the cache: see `keep_new`


def tokenize(text: str) -> Block:
    """The tokens of `text`; cached, so equal texts share one tuple (fast identity comparison)."""
    block = _cache.get(text)
    if block is None:
        if len(text) > _TEXT_MAX or not _keeping[0]:  # never kept, so not interned either: the
            return tuple(_TOKEN.findall(text))  # interned table would stay at its largest size
        block = tuple(map(sys.intern, _TOKEN.findall(text))) if text else EMPTY
        remember(text, block)
    return block


def remember(text: str, block: Block) -> None:
    """Put a text whose tokens are already known (a generated reply) in the cache."""
    size = len(text)
    if text in _cache:
        _cache[text] = block  # a generated reply's own tokens win over the regex's
        return
    if size > _TEXT_MAX:
        return
    _cache[text] = block
    _cached_chars[0] += size
    while len(_cache) > _CACHE_SIZE or _cached_chars[0] > _CACHE_CHARS:
        old, _ = _cache.popitem(last=False)
        _cached_chars[0] -= len(old)
        _evicted[0] += 1


def keep_new(on: bool) -> bool:
    """Whether texts tokenized from now on are kept in the cache (texts already in it are still
    found there); returns the previous setting. An importer sees each text once, to count it: kept,
    a big input's texts would only fill the cache to its bounds (64 Mi characters and their
    tokens, 250-300 MiB) for nothing."""
    was = _keeping[0]
    _keeping[0] = on
    return was


def cache_fill() -> dict[str, int | bool]:
    """How full the text cache is against its bounds; a soak's warm-up lasts until it is `settled`.

    Full is not yet settled: CPython's dict keeps deleted entries until it copies itself into a
    fresh table, sized from its live entries, when its entries array runs out. While the cache
    fills, that array doubles each time it is used up, so when full it has room for fewer than
    twice the texts kept: the first copy made while full comes within one turnover, and it sets
    the table at its lasting size (65,536 texts: 2^18 slots instead of 2^17, +2.9 MiB with the
    OrderedDict's node index; the soak's step ~12,000 requests after the cache was full). Every
    later copy has as many live texts, so the same size. Settled: evicted as many texts as it holds.
    """
    texts = len(_cache)
    return {
        "texts": texts,
        "max_texts": _CACHE_SIZE,
        "chars": _cached_chars[0],
        "max_chars": _CACHE_CHARS,
        "evicted": _evicted[0],
        "settled": _evicted[0] > 0 and _evicted[0] >= texts,
    }


def count_tokens(text: str) -> int:
    return len(tokenize(text))


def special(*pieces: str) -> Block:
    """A block of template markers that must stay single tokens (never passed through the regex)."""
    return tuple(sys.intern(p) for p in pieces)
