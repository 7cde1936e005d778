"""llama.cpp's SentencePiece tokenizer over a model's own vocabulary, so the simulator counts the
tokens the real server counts (a cached prefix is a number of tokens; off by one, it is wrong).

The rules are `llm_tokenizer_spm_session` in src/llama-vocab.cpp: split the text into characters,
merge the adjacent pair whose joined text is a token with the highest score (ties: the leftmost)
until no pair is a token, then output each piece as its token, or, when it is none, as the pieces
it was merged from, down to `<0xXX>` byte tokens. `llama_vocab::impl::tokenize` prefixes a text
fragment with a space when it follows a special token or starts the text (`add_space_prefix`) and
writes spaces as U+2581.

A vocabulary with no token holding U+2581 past its first character cannot merge across a word
start, so a fragment is tokenized word by word (each word once, cached): the same result, fast on
a 100K-token prompt.
"""

from __future__ import annotations

import heapq
import sys

SPACE = "\u2581"


class SpmVocab:
    """The token texts and scores of a vocabulary, and the pieces a text fragment becomes."""

    def __init__(self, tokens: list[str], scores: list[float], add_space_prefix: bool = True) -> None:
        self.ids: dict[str, int] = {}
        for i, text in enumerate(tokens):
            self.ids.setdefault(text, i)
        self.scores = scores
        self.add_space_prefix = add_space_prefix
        self.word_safe = not any(SPACE in t[1:] for t in tokens)
        self._words: dict[str, tuple[str, ...]] = {}

    def fragment(self, text: str, after_special: bool = True) -> tuple[str, ...]:
        """The pieces of one raw-text fragment (between special tokens), as vocabulary texts."""
        if self.add_space_prefix and after_special:
            text = " " + text
        text = text.replace(" ", SPACE)
        if not text:
            return ()
        if not self.word_safe:
            return tuple(self._merge(text))
        out: list[str] = []
        start = 0
        for i in range(1, len(text) + 1):
            if i == len(text) or text[i] == SPACE:
                word = text[start:i]
                pieces = self._words.get(word)
                if pieces is None:
                    pieces = tuple(sys.intern(p) for p in self._merge(word))
                    if len(self._words) < 1 << 18:
                        self._words[word] = pieces
                out.extend(pieces)
                start = i
        return tuple(out)

    def _merge(self, text: str) -> list[str]:
        n = len(text)
        length = [1] * n
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        texts: list[str] = list(text)
        heap: list[tuple[float, int, int, int]] = []
        for i in range(1, n):
            self._push(heap, texts, i - 1, i)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            if length[left] == 0 or length[right] == 0 or length[left] + length[right] != size:
                continue  # one side was merged since this pair was queued
            texts[left] = texts[left] + texts[right]
            length[left] += length[right]
            length[right] = 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            self._push(heap, texts, prev[left], left)
            self._push(heap, texts, left, nxt[left])
        out: list[str] = []
        i = 0
        while i != -1:
            piece = texts[i]
            if piece in self.ids:
                out.append(piece)
            else:
                # `resegment`: only an unmerged character can be no token (a merge makes one):
                # its UTF-8 bytes, as `<0xXX>` tokens.
                out.extend(f"<0x{b:02X}>" for b in piece.encode())
            i = nxt[i]
        return out

    def _push(self, heap: list[tuple[float, int, int, int]], texts: list[str], left: int, right: int) -> None:
        """`try_add_bigram`: queue a pair whose joined text is a token, best score first, then
        the leftmost (`llm_bigram_spm::comparator`)."""
        if left < 0 or right < 0:
            return
        joined = texts[left] + texts[right]
        tid = self.ids.get(joined)
        if tid is not None:
            heapq.heappush(heap, (-self.scores[tid], left, right, len(joined)))


def detokenize(pieces: tuple[str, ...] | list[str]) -> str:
    """The text of SentencePiece pieces: U+2581 is a space, `<0xXX>` a byte."""
    raw = bytearray()
    for p in pieces:
        if len(p) == 6 and p.startswith("<0x") and p.endswith(">"):
            try:
                raw.append(int(p[3:5], 16))
                continue
            except ValueError:
                pass
        raw.extend(p.replace(SPACE, " ").encode())
    return raw.decode("utf-8", errors="replace")
