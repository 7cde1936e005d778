"""The tokenizer's text cache is settled only once its dict's table has reached its lasting size,
and after that the table does not grow (issue #23, item 3: a soak's warm-up waits for `settled`).

Counts of bytes of the table (`dict.__sizeof__`: slots and entries, not the texts), not timings.
"""

from __future__ import annotations

import sys
from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.sim.model import tokenizer


def fresh_cache(monkeypatch: pytest.MonkeyPatch, texts: int, chars: int = 1 << 26) -> None:
    monkeypatch.setattr(tokenizer, "_CACHE_SIZE", texts)
    monkeypatch.setattr(tokenizer, "_CACHE_CHARS", chars)
    monkeypatch.setattr(tokenizer, "_cache", OrderedDict())
    monkeypatch.setattr(tokenizer, "_cached_chars", [0])
    monkeypatch.setattr(tokenizer, "_evicted", [0])


def table_bytes() -> int:
    return dict.__sizeof__(tokenizer._cache)


def fill_until_settled(start: int = 0) -> int:
    """New texts (as a fixed active set sends: every turn adds a few) until the cache says settled."""
    n = start
    while not tokenizer.cache_fill()["settled"]:
        tokenizer.tokenize(f"tool result {n}")
        n += 1
        assert n < 100 * tokenizer._CACHE_SIZE, tokenizer.cache_fill()
    return n


@pytest.mark.parametrize("bound", [256, 1 << 12])
def test_full_is_not_settled_and_settled_is_lasting(monkeypatch: pytest.MonkeyPatch, bound: int) -> None:
    fresh_cache(monkeypatch, bound)
    n = 0
    while tokenizer.cache_fill()["texts"] < bound:
        tokenizer.tokenize(f"tool result {n}")
        n += 1
    full = tokenizer.cache_fill()
    assert not full["settled"] and full["evicted"] == 0
    at_full = table_bytes()
    n = fill_until_settled(n)
    settled = table_bytes()
    assert settled > at_full  # the step issue #23's soak took for growth: it belongs to warm-up
    for i in range(n, n + 10 * bound):
        tokenizer.tokenize(f"tool result {i}")
        assert table_bytes() == settled, i
    fill = tokenizer.cache_fill()
    assert fill["texts"] == bound and fill["evicted"] == n + 10 * bound - bound and fill["settled"]


@settings(max_examples=25, deadline=None)
@given(bound=st.integers(3, 2000), repeats=st.integers(1, 4))
def test_settled_table_does_not_grow_under_a_fixed_set(bound: int, repeats: int) -> None:
    """Any bound of 3 texts or more (CPython's smallest table has room for 5, more than twice 1 or
    2); texts seen again (a conversation's history resent) mixed with new ones."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        fresh_cache(monkeypatch, bound)
        n = fill_until_settled()
        settled = table_bytes()
        size = sys.getsizeof(tokenizer._cache)
        for i in range(n, n + 5 * bound + 50):
            for back in range(repeats):
                tokenizer.tokenize(f"tool result {max(0, i - back)}")
            assert table_bytes() == settled, i
        assert sys.getsizeof(tokenizer._cache) == size  # the node index too


def test_a_chars_bound_settles_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bound by characters (a few long texts), the cache settles and its table then stays bounded."""
    fresh_cache(monkeypatch, 1 << 16, chars=200 * 40)
    n = fill_until_settled()
    assert tokenizer.cache_fill()["texts"] < 1 << 16
    sizes = set()
    for i in range(n, n + 20_000):
        tokenizer.tokenize(f"{i:>8} " + "word " * (i % 14))
        sizes.add(table_bytes())
    assert max(sizes) <= 2 * min(sizes), sorted(sizes)
