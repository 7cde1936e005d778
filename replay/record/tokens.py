"""Token counts for text whose model tokenizer we do not have: the simulator's tokenizer.

Anonymisation replaces text with synthetic text "of the same token count", and the Mooncake
importer and exporter cut prompts into 512-token blocks. Both count with the simulator's
word-piece tokenizer (`replay.sim.model.tokenizer`), so an anonymised or imported trace has, on the
simulator, the prompt lengths and shared prefixes the original had; it is lossless (tokens join
back to the text) and gives exactly one token per `replay.trace.synth` word.

Synthetic content stored as a list of parts is joined by newlines, and a newline between two
words is a token of its own: `PART_SEPARATOR_TOKENS` is what each join costs.
"""

from __future__ import annotations

from replay.sim.model.tokenizer import tokenize

PART_SEPARATOR_TOKENS = 1


def count_tokens(text: str) -> int:
    return len(tokenize(text)) if text else 0


def tokens(text: str) -> tuple[str, ...]:
    return tokenize(text)


def token_starts(text: str) -> list[int]:
    """Character offset where each token begins (the tokenizer is lossless, so offsets add up)."""
    out = []
    pos = 0
    for tok in tokenize(text):
        out.append(pos)
        pos += len(tok)
    return out
