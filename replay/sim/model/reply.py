"""The simulator's generated replies: deterministic text or a tool call, exactly N tokens long.

A reply is built before the job runs because its tokens are what the live KV holds afterwards: the
visible part renders exactly as the client will send it back, and with hidden reasoning a
`<think>` block precedes it that no client ever resends.
"""

from __future__ import annotations

import hashlib
import sys
import zlib
from array import array
from dataclasses import dataclass, field
from functools import cache
from itertools import chain
from typing import Any

import orjson

from replay.sim.model.render import Prompt, assistant_body, reasoning_blocks
from replay.sim.model.tokenizer import Block, remember
from replay.trace.synth import WORDS, synth_text

REASONING_OVERHEAD = 5  # <think>\n ... \n</think>\n\n


@dataclass(init=False, slots=True)
class Reply:
    content: str
    reasoning: str
    tool_calls: tuple[dict[str, Any], ...]
    finish: str
    hidden_blocks: tuple[Block, ...]
    visible_blocks: tuple[Block, ...]
    # Counted once: the cache model asks for them at every step of every model in a sweep.
    hidden_tokens: int = field(init=False, compare=False)
    tokens: int = field(init=False, compare=False)

    def __init__(
        self,
        content: str,
        reasoning: str,
        tool_calls: tuple[dict[str, Any], ...],
        finish: str,
        hidden_blocks: tuple[Block, ...],
        visible_blocks: tuple[Block, ...],
    ) -> None:
        self.content = content
        self.reasoning = reasoning
        self.tool_calls = tool_calls
        self.finish = finish
        self.hidden_blocks = hidden_blocks
        self.visible_blocks = visible_blocks
        self.hidden_tokens = sum(map(len, hidden_blocks))
        self.tokens = self.hidden_tokens + sum(map(len, visible_blocks))

    @property
    def blocks(self) -> tuple[Block, ...]:
        return self.hidden_blocks + self.visible_blocks

    @property
    def tool_start(self) -> int | None:
        """Index of the first generated token of the tool call (continued saves stop there)."""
        return (
            self.hidden_tokens + (len(self.visible_blocks[0]) if self.content else 0)
            if self.tool_calls
            else None
        )

    def message(self) -> dict[str, Any]:
        """The reply in the neutral message format (what a live-history client sends back)."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [dict(c) for c in self.tool_calls]
        if self.reasoning:
            msg["reasoning"] = self.reasoning
        return msg

    def text_upto(self, gen: int) -> tuple[str, str, float]:
        """(reasoning, content, tool-call fraction) visible after `gen` generated tokens, for streaming."""
        hidden = self.hidden_tokens
        reasoning_tokens = max(0, hidden - REASONING_OVERHEAD)
        r_done = min(reasoning_tokens, max(0, gen - 2))
        reasoning = _first_words(self.reasoning, r_done)
        v = max(0, gen - hidden)
        if self.tool_calls:
            total = max(1, self.tokens - hidden)
            return reasoning, "", min(1.0, v / total)
        return reasoning, _first_words(self.content, v), 1.0 if v else 0.0


def _first_words(text: str, n: int) -> str:
    if n <= 0 or not text:
        return ""
    parts = text.split(" ", n)
    return text if len(parts) <= n else " ".join(parts[:n])


def reply_seed(prompt: Prompt) -> int:
    """A seed from the end of the prompt: equal prompts get equal replies, different turns differ."""
    tail = "".join(chain.from_iterable(prompt.seq.blocks[-4:]))
    return zlib.crc32(tail.encode()) ^ len(prompt)


def call_id(seed: int, index: int) -> str:
    return "call_" + hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=12).hexdigest()


def make_reply(
    prompt: Prompt,
    max_tokens: int,
    *,
    finish: str = "stop",
    tool_name: str | None = None,
    hidden_reasoning: bool = False,
    reasoning_tokens: int = 64,
    room: int | None = None,
    tool_arguments: str | None = None,
) -> Reply:
    """A reply of `max_tokens` tokens (fewer if `room`, the context left, is smaller: finish=length).

    `finish="tool_calls"` with a tool name gives one tool call whose arguments fill the length; a tool
    call is never cut short, so a very small `max_tokens` gives a slightly longer reply.
    With `tool_arguments` (JSON text) the call carries those, whatever their length.
    """
    seed = reply_seed(prompt)
    n = max(0, max_tokens)
    capped = room is not None and room < n
    if capped:
        n = max(0, room or 0)
    if n == 0:
        return Reply("", "", (), "length", (), ())
    hidden: tuple[Block, ...] = ()
    reasoning = ""
    if hidden_reasoning and n >= 4 * REASONING_OVERHEAD:
        words = max(1, min(reasoning_tokens, n // 2) - REASONING_OVERHEAD)
        reasoning = synth_text(words, seed ^ 0x5EED)
        hidden = reasoning_blocks(reasoning)
    visible = n - sum(len(b) for b in hidden)
    if finish == "tool_calls" and tool_name and not capped:
        call = {"id": call_id(seed, 0), "name": tool_name, "arguments": ""}
        if tool_arguments is not None:
            call["arguments"] = tool_arguments
            return Reply("", reasoning, (call,), "tool_calls", hidden, assistant_body("", (call,)))
        base = _body_tokens(call, 1, seed)
        words = max(1, visible - (base - 1))
        call["arguments"] = _arguments(words, seed)
        body = assistant_body("", (call,))
        return Reply("", reasoning, (call,), "tool_calls", hidden, body)
    content = reply_text(visible, seed)
    kind = "length" if capped or finish == "length" else "stop"
    return Reply(content, reasoning, (), kind, hidden, assistant_body(content, ()))


_WORDS = tuple(sys.intern(w) for w in WORDS)
_SPACED = tuple(sys.intern(" " + w) for w in WORDS)
TABLE_WORDS = 1 << 18  # the run of words replies are cut from


@cache
def _word_table() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The words replies are cut from, made once per process from one hash stream (the same on
    every machine): each position's word alone, and with its leading space."""
    picks = array("H", hashlib.shake_128(b"replay reply words").digest(2 * TABLE_WORDS))
    if sys.byteorder == "big":
        picks.byteswap()
    n = len(_WORDS)
    return tuple(_WORDS[i % n] for i in picks), tuple(_SPACED[i % n] for i in picks)


def reply_text(tokens: int, seed: int) -> str:
    """`tokens` words for a text reply, a pure function of the seed, with its tokens put in the
    tokenizer's cache: a reply is generated once per request and tokenized again in every later
    turn that resends it, so both must be cheap (a slice of a word table, no regex)."""
    if tokens <= 0:
        return ""
    bare, spaced = _word_table()
    start = seed % TABLE_WORDS
    words = spaced[start + 1 : start + tokens]
    while len(words) < tokens - 1:  # past the table's end: on from its start
        words += spaced[: tokens - 1 - len(words)]
    block = (bare[start], *words)
    text = "".join(block)
    remember(text, block)
    return text


def _arguments(words: int, seed: int) -> str:
    return orjson.dumps({"command": synth_text(words, seed)}).decode()


def _body_tokens(call: dict[str, Any], words: int, seed: int) -> int:
    probe = dict(call, arguments=_arguments(words, seed))
    return sum(len(b) for b in assistant_body("", (probe,)))
