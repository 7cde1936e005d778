"""A request as the llama model runs it: the prompt's tokens (with where user messages start), the
reply it will generate, and the request's own cache settings.

The prompt is ChatML, as the test models' template renders it (replay/testing/gguf_model.py,
`CHATML_TEMPLATE`): per message `<|im_start|>` role "\\n" content `<|im_end|>` "\\n", then the
generation prompt `<|im_start|>assistant\\n`, after the model's BOS. llama.cpp tokenizes the
rendered text with special tokens parsed (`tokenize_input_prompts`), so every stretch between two
special tokens is one fragment (`ChatTokenizer.fragment`): with the model's vocabulary
(`spm.SpmVocab`) the simulator's token counts are the server's. Without a model file the
simulator's word tokenizer stands in.

User messages start at their `<|im_start|>` token: `common_chat_msg_delimiters::split` finds the
template's user delimiter (`<|im_start|>user`) in the tokens, and the checkpoint rules read the
starts (`common_chat_msg_spans::is_user_start`, `last_user_message_pos`).
"""

from __future__ import annotations

import sys
import zlib
from dataclasses import dataclass
from itertools import chain
from typing import Any

import orjson

from replay.sim.model.llama.spm import SpmVocab, detokenize
from replay.sim.model.reply import reply_text
from replay.sim.model.seq import TokenSeq
from replay.sim.model.tokenizer import Block, tokenize

IM_START = sys.intern("<|im_start|>")
IM_END = sys.intern("<|im_end|>")


class ChatTokenizer:
    """Text to tokens as the simulated server does it: the model's SentencePiece vocabulary and
    BOS, or (`spm` None) the simulator's word tokenizer with a `<s>` BOS when the model adds one."""

    def __init__(self, spm: SpmVocab | None = None, bos: str | None = None) -> None:
        self.spm = spm
        self.bos: Block = (sys.intern(bos),) if bos else ()

    def fragment(self, text: str) -> Block:
        """The tokens of a text between two special tokens."""
        if self.spm is not None:
            return self.spm.fragment(text)
        return tokenize(text)

    def text(self, tokens: Block) -> str:
        if self.spm is not None:
            return detokenize(tokens)
        return "".join(tokens)


@dataclass(init=False, slots=True)
class LlamaPrompt:
    """A rendered prompt: its tokens and the positions where user messages start."""

    seq: TokenSeq
    user_starts: tuple[int, ...]

    def __init__(self, seq: TokenSeq, user_starts: tuple[int, ...]) -> None:
        self.seq = seq
        self.user_starts = user_starts

    def __len__(self) -> int:
        return len(self.seq)

    @property
    def last_user(self) -> int:
        """`last_user_message_pos`: -1 when there is none."""
        return self.user_starts[-1] if self.user_starts else -1

    def is_user_start(self, pos: int) -> bool:
        return pos in self.user_starts


def content_text(content: Any) -> str:
    """A message's text: a string, or its text parts joined by newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p if isinstance(p, str) else p.get("text", "") for p in content if isinstance(p, str | dict)]
        return "\n".join(p for p in parts if isinstance(p, str))
    return str(content)


def message_text(msg: dict[str, Any], tools: list[dict[str, Any]] | None, first: bool) -> str:
    """What the template writes between a message's role line and its end marker. Tool calls and
    tool definitions (which the test template leaves out) are written as JSON text, the tools after
    the first system message."""
    text = content_text(msg.get("content"))
    for call in msg.get("tool_calls") or ():
        fn = call.get("function", call) if isinstance(call, dict) else {}
        body = {"name": fn.get("name", ""), "arguments": fn.get("arguments", "{}")}
        text += "\n<tool_call>\n" + orjson.dumps(body).decode() + "\n</tool_call>"
    if first and tools and msg.get("role") == "system":
        text += "\n\n# Tools\n\n" + "\n".join(orjson.dumps(t).decode() for t in tools)
    return text


def render(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, tok: ChatTokenizer
) -> LlamaPrompt:
    """The prompt llama-server builds for a chat request: BOS, each message, the generation prompt."""
    blocks: list[Block] = [tok.bos] if tok.bos else []
    pos = len(tok.bos)
    starts: list[int] = []
    if tools and (not messages or messages[0].get("role") != "system"):
        messages = [{"role": "system", "content": ""}, *messages]
    for i, msg in enumerate(messages):
        role = str(msg.get("role") or "user")
        if role == "user":
            starts.append(pos)
        block = (IM_START, *tok.fragment(role + "\n" + message_text(msg, tools, i == 0)), IM_END)
        block += tok.fragment("\n")
        blocks.append(block)
        pos += len(block)
    blocks.append((IM_START, *tok.fragment("assistant\n")))
    return LlamaPrompt(TokenSeq(tuple(blocks)), tuple(starts))


@dataclass(init=False, slots=True)
class LlamaReply:
    """The generated tokens and the text of each: exactly `len(tokens)` tokens, as a model without
    an end-of-generation token stops only at `max_tokens` (finish "length")."""

    tokens: Block
    texts: tuple[str, ...]
    finish: str

    def __init__(self, tokens: Block, texts: tuple[str, ...], finish: str) -> None:
        self.tokens = tokens
        self.texts = texts
        self.finish = finish

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def content(self) -> str:
        return "".join(self.texts)

    def text_upto(self, n: int) -> str:
        """The text of the first `n` generated tokens, for streaming."""
        return "".join(self.texts[:n])


def make_reply(prompt: LlamaPrompt, n: int, tok: ChatTokenizer, finish: str = "length") -> LlamaReply:
    """`n` generated tokens, a pure function of the prompt's end (equal prompts, equal replies)."""
    if n <= 0:
        return LlamaReply((), (), finish)
    tail = "".join(chain.from_iterable(prompt.seq.blocks[-4:]))
    words = reply_text(n, zlib.crc32(tail.encode()) ^ len(prompt))
    pieces = tok.spm.fragment(words, after_special=False) if tok.spm is not None else tokenize(words)
    while len(pieces) < n:
        pieces = pieces + pieces[: n - len(pieces)]
    pieces = pieces[:n]
    return LlamaReply(pieces, tuple(tok.text((p,)) for p in pieces), finish)


@dataclass(init=False, slots=True)
class LlamaJob:
    """One completion task: the prompt, the reply, and the request's own settings (`cache_prompt`,
    `id_slot`, `n_cache_reuse`, as `params_from_json_cmpl` reads them)."""

    id: int
    prompt: LlamaPrompt
    reply: LlamaReply
    session: str | None
    cache_prompt: bool
    id_slot: int
    n_cache_reuse: int

    def __init__(
        self,
        id: int,  # noqa: A002
        prompt: LlamaPrompt,
        reply: LlamaReply,
        session: str | None = None,
        cache_prompt: bool = True,
        id_slot: int = -1,
        n_cache_reuse: int = 0,
    ) -> None:
        self.id = id
        self.prompt = prompt
        self.reply = reply
        self.session = session
        self.cache_prompt = cache_prompt
        self.id_slot = id_slot
        self.n_cache_reuse = n_cache_reuse

    @property
    def n_tokens(self) -> int:
        return len(self.prompt.seq)

    @property
    def full(self) -> TokenSeq:
        """What the slot holds after the reply: the prompt and every generated token but the last
        (sampled, never decoded)."""
        return self.prompt.seq.extend(self.reply.tokens[: max(0, len(self.reply.tokens) - 1)])
