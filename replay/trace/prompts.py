"""How many prompt tokens each request of a trace sends, without a tokenizer: what balances shards
(`select`), and what checks a trace against a model's context before anything runs (`validate
--ctx`, `scenario generate`, `size sweep`).

Recorded `usage.prompt_tokens` where the trace has it; else an estimate from the messages: `synth`
content counts as written, text and structured parts at a word-piece tokenizer's ~4 bytes a token,
and a compaction keeps its parent's share by message count. The estimate leaves out the chat
template: on the simulator's tokenizer, request 38 of `switching` with turns=1500 is 262,988
estimated and 263,839 rendered.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from replay.trace.model import Message, Request
from replay.trace.reader import iter_requests, last_references

BYTES_PER_TOKEN = 4


def prompt_sizes(requests: Iterable[Request]) -> Iterator[tuple[Request, int]]:
    """Each request with the prompt tokens it sends, in the order given (parents first, as in a
    trace). Holds two numbers per request, and each tool list it has measured (they repeat)."""
    replies: dict[int, int] = {}
    own: dict[int, int] = {}  # estimated tokens of each request's messages
    tools_seen: dict[int, tuple[object, int]] = {}  # id -> (the list, kept so the id stays its own)
    for req in requests:
        replies[req.id] = reply_tokens(req)
        parent = req.parent
        if parent is None or parent.id not in own:
            before = 0
        elif req.keep >= parent.n_messages:
            before = own[parent.id]
        else:  # a compaction keeps part of the parent: its share, by message count
            before = own[parent.id] * req.keep // max(1, parent.n_messages)
        own[req.id] = before + sum(message_tokens(m, replies) for m in req.append)
        tools = req.params.get("tools")
        if tools is not None and id(tools) not in tools_seen:
            tools_seen[id(tools)] = (tools, value_tokens(tools))
        estimate = own[req.id] + (tools_seen[id(tools)][1] if tools is not None else 0)
        recorded = (req.usage or {}).get("prompt_tokens")
        yield req, recorded if type(recorded) is int and recorded >= 0 else estimate


def reply_tokens(req: Request) -> int:
    value = (req.reply or {}).get("output_tokens")
    return value if type(value) is int and value >= 0 else 0


def message_tokens(msg: Message, replies: dict[int, int]) -> int:
    ref = msg.get("$reply")
    if ref is not None:
        return replies.get(ref, 0)
    return value_tokens(msg.get("content")) + value_tokens(msg.get("tool_calls"))


def value_tokens(value: object) -> int:
    """Estimated tokens of a message part."""
    if value is None:
        return 0
    if isinstance(value, str):
        return len(value) // BYTES_PER_TOKEN
    if isinstance(value, dict) and isinstance(value.get("synth"), dict):
        tokens = value["synth"].get("tokens")
        return tokens if type(tokens) is int and tokens >= 0 else 0
    return len(orjson.dumps(value)) // BYTES_PER_TOKEN


@dataclass(frozen=True, slots=True)
class Overflow:
    """The requests of a trace whose prompt does not fit a context (a server refuses them)."""

    ctx: int
    first: Request
    first_tokens: int
    largest_tokens: int
    count: int  # requests past the context
    total: int  # requests in the trace

    def describe(self, context: str) -> str:
        """`2,965 of 3,002 requests do not fit CONTEXT: request 38 (session b) sends about 262,988
        prompt tokens, the largest 15,305,288`."""
        which = (
            f"{self.count:,} of {self.total:,} requests do not" if self.total > 1 else "the request does not"
        )
        largest = f", the largest {self.largest_tokens:,}" if self.count > 1 else ""
        return (
            f"{which} fit {context}: request {self.first.id} (session {self.first.session}) sends about "
            f"{self.first_tokens:,} prompt tokens{largest}"
        )

    def suggested_ctx(self) -> int:
        """A context that holds the largest prompt with room for its reply: rounded up to 1K."""
        return -(-int(self.largest_tokens * 1.05 + 4096) // 1024) * 1024


def overflow(sizes: Iterable[tuple[Request, int]], ctx: int) -> Overflow | None:
    """Which requests do not fit `ctx` tokens (a prompt of `ctx` or more is refused, as ds4 does)."""
    first: tuple[Request, int] | None = None
    largest = count = total = 0
    for req, tokens in sizes:
        total += 1
        if tokens >= ctx:
            count += 1
            largest = max(largest, tokens)
            if first is None:
                first = (req, tokens)
    if first is None:
        return None
    return Overflow(
        ctx=ctx, first=first[0], first_tokens=first[1], largest_tokens=largest, count=count, total=total
    )


def trace_overflow(path: str | Path, ctx: int) -> Overflow | None:
    """`overflow` of a trace file, read as a stream (a request is let go once nothing names it)."""
    return overflow(prompt_sizes(iter_requests(path, last_references(path).last)), ctx)
