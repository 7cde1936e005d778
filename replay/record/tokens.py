"""A tokenizer-free token count for text whose real tokenizer we do not have.

Anonymisation and the importers must replace text with synthetic text "of the same token count"
and cut prompts into fixed-size token blocks, without a model's tokenizer. A word counts one
token and each punctuation mark another: close to BPE counts for prose and code alike, and exactly
one token per word on `replay.trace.synth` text, so re-counting synthetic text gives back the
number it was made from.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

_TOKEN = re.compile(r"\w+|[^\w\s]")


def count_tokens(text: str) -> int:
    return sum(1 for _ in _TOKEN.finditer(text)) if text else 0


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


def token_starts(text: str) -> Iterator[int]:
    """Character offset where each token begins."""
    for match in _TOKEN.finditer(text):
        yield match.start()
