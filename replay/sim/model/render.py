"""ChatML-like chat template over the neutral message format, rendered straight to token blocks.

The template decides where conversations share a prefix: an append-only conversation renders each
turn as the previous rendering plus new blocks, a compaction or an edit in the middle of a message
breaks the prefix exactly there, and the server's own reply (the tokens it generated after the
generation prompt) is a prefix of the next request's rendering when the client sends that reply
back unchanged. Tools are rendered right after the system prompt, inside the system turn, so a
shared system prompt plus identical tools is a shared prefix.

The chat anchor (ds4's cold-save cut) is the position of the last user-turn marker before the first
assistant marker: the system prompt, the tools and any earlier user scaffolding.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from itertools import chain
from typing import Any

import orjson

from replay.sim.model.seq import TokenSeq
from replay.sim.model.tokenizer import Block, special, tokenize

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END: Block = special(IM_END, "\n")
NEWLINE: Block = special("\n")
THINK_OPEN: Block = special("<think>", "\n")
THINK_CLOSE: Block = special("\n", "</think>", "\n\n")
CALL_OPEN: Block = special("<tool_call>", "\n")
CALL_CLOSE: Block = special("\n", "</tool_call>")
TOOLS_HEADER: Block = special("\n\n", "# Tools", "\n\n")

Message = dict[str, Any]


@lru_cache(maxsize=16)
def header(role: str) -> Block:
    return special(IM_START, role, "\n")


@dataclass(init=False, slots=True)
class Prompt:
    """A rendered prompt: its tokens, the chat anchor (None when there is none) and whether it has tools."""

    seq: TokenSeq
    anchor: int | None
    has_tools: bool

    def __init__(self, seq: TokenSeq, anchor: int | None, has_tools: bool) -> None:
        self.seq = seq
        self.anchor = anchor
        self.has_tools = has_tools

    def __len__(self) -> int:
        return len(self.seq)


def content_text(content: Any) -> str:
    """Text of an OpenAI/Anthropic content value: a string, or a list of text parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "\n".join(parts)
    return str(content)


def tool_call_text(name: str, arguments: str) -> str:
    return '{"name": ' + orjson.dumps(name).decode() + ', "arguments": ' + (arguments or "{}") + "}"


def assistant_body(
    content: str, tool_calls: list[dict[str, Any]] | tuple[dict[str, Any], ...]
) -> tuple[Block, ...]:
    """Blocks of an assistant turn between its header and its end marker (what the model generates)."""
    blocks: list[Block] = []
    if content:
        blocks.append(tokenize(content))
    for i, call in enumerate(tool_calls):
        if content or i:
            blocks.append(NEWLINE)
        blocks.append(CALL_OPEN)
        blocks.append(tokenize(tool_call_text(str(call.get("name", "")), str(call.get("arguments") or "{}"))))
        blocks.append(CALL_CLOSE)
    return tuple(blocks)


def reasoning_blocks(reasoning: str) -> tuple[Block, ...]:
    return (THINK_OPEN, tokenize(reasoning), THINK_CLOSE)


@lru_cache(maxsize=64)
def _tools_block(tools_json: bytes) -> Block:
    return _render_tools(tools_json)


def _render_tools(tools_json: bytes) -> Block:
    tools = orjson.loads(tools_json)
    # Servers check tools are objects; a trace or a sizing input may still hold anything.
    lines = [orjson.dumps(t.get("function", t) if isinstance(t, dict) else t).decode() for t in tools]
    return tokenize("\n".join(lines))


_TOOLS_CACHED_MAX = 1 << 20  # larger tool lists are rendered each time rather than kept


def tools_block(tools: list[dict[str, Any]] | None) -> Block:
    if not tools:
        return ()
    key = orjson.dumps(tools)
    if len(key) > _TOOLS_CACHED_MAX:
        return _render_tools(key)
    return _tools_block(key)


@dataclass(init=False, slots=True)
class Rendered:
    """A conversation rendered up to some message, before the generation prompt.

    `add(more)` renders further messages on top without touching what is already rendered (a new
    value: a request's rendering can be extended by every request that follows it), and
    `prompt()` closes it with the generation prompt. Rendering a conversation turn by turn this way
    gives exactly what `render` gives for the whole list at once.
    """

    tools: list[dict[str, Any]] | None
    seq: TokenSeq
    started: bool
    tools_pending: bool
    seen_assistant: bool
    last_user: int | None
    anchor: int | None

    def __init__(
        self,
        tools: list[dict[str, Any]] | None = None,
        seq: TokenSeq | None = None,
        started: bool = False,
        tools_pending: bool = False,
        seen_assistant: bool = False,
        last_user: int | None = None,
        anchor: int | None = None,
    ) -> None:
        self.tools = tools
        self.seq = seq if seq is not None else TokenSeq()
        self.started = started
        self.tools_pending = tools_pending
        self.seen_assistant = seen_assistant
        self.last_user = last_user
        self.anchor = anchor

    def add(self, messages: Iterable[Message]) -> Rendered:
        blocks: list[Block] = []
        anchor, last_user = self.anchor, self.last_user
        seen_assistant, tools_pending, tools = self.seen_assistant, self.tools_pending, self.tools
        messages = iter(messages)
        first = next(messages, None)
        if first is None:
            return self
        if not self.started:
            tools_pending = bool(tools)
            if tools_pending and first.get("role") != "system":
                blocks += (header("system"), TOOLS_HEADER, tools_block(tools), END)
                tools_pending = False
        for msg in chain((first,), messages):
            role = msg.get("role", "user")
            if role == "assistant":
                if not seen_assistant:
                    seen_assistant = True
                    anchor = last_user
                blocks.append(header("assistant"))
                blocks += assistant_body(content_text(msg.get("content")), msg.get("tool_calls") or ())
                blocks.append(END)
                continue
            if role == "user" and not seen_assistant:
                last_user = len(self.seq) + sum(map(len, blocks))  # before the first reply only
            blocks.append(header(role))
            blocks.append(tokenize(content_text(msg.get("content"))))
            if role == "system" and tools_pending:
                blocks += (TOOLS_HEADER, tools_block(tools))
                tools_pending = False
            blocks.append(END)
        seq = self.seq.extend(*blocks)
        return Rendered(tools, seq, True, tools_pending, seen_assistant, last_user, anchor)

    def prompt(self) -> Prompt:
        """The prompt to send: everything rendered, then the generation prompt."""
        if not self.started and self.tools:
            return _tools_only(self.tools)
        anchor = self.anchor if self.seen_assistant else self.last_user
        return Prompt(self.seq.extend(header("assistant")), anchor, bool(self.tools))


def _tools_only(tools: list[dict[str, Any]]) -> Prompt:
    """No messages at all, with tools: the tools' system turn, then the generation prompt."""
    blocks = (header("system"), TOOLS_HEADER, tools_block(tools), END, header("assistant"))
    return Prompt(TokenSeq(blocks), None, True)


def render(messages: list[Message], tools: list[dict[str, Any]] | None = None) -> Prompt:
    """Render a chat prompt ending with the generation prompt (`<|im_start|>assistant\\n`)."""
    return Rendered(tools).add(messages).prompt()
