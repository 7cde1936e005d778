"""Turn stored messages into the plain messages an API client sends.

Synthetic content becomes text, content lists are joined, `{"$reply": id}` becomes the reply to
request `id` chosen by the caller (the live reply in `live` history mode, the recorded one in
`recorded` mode).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from replay.trace.model import Message, Request
from replay.trace.synth import synth_text

ReplyFor = Callable[[int], Message]


def text_of(content: Any) -> str:
    """Plain text of a stored content value: text, synth spec, or a list of those joined by newlines."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        return "\n".join(text_of(part) for part in content)
    spec = content["synth"]
    return synth_text(spec["tokens"], spec["seed"])


def plain_message(msg: Message) -> Message:
    """A stored message with its content made plain text; other fields kept."""
    content = msg.get("content")
    if isinstance(content, str) or content is None:
        return msg
    return {**msg, "content": text_of(content)}


def recorded_reply(requests: dict[int, Request]) -> ReplyFor:
    """A `ReplyFor` that answers with each request's recorded reply message."""

    def reply_for(rid: int) -> Message:
        return recorded_message(requests[rid])

    return reply_for


def recorded_message(request: Request) -> Message:
    """The reply message the trace recorded for `request` (an empty one if none)."""
    reply = request.reply or {}
    return reply.get("message") or {"role": "assistant", "content": ""}


def materialize(request: Request, reply_for: ReplyFor) -> list[Message]:
    """The messages to send for `request`, with replies spliced in by `reply_for`."""
    out: list[Message] = []
    for msg in request.messages():
        ref = msg.get("$reply")
        out.append(plain_message(reply_for(ref) if ref is not None else msg))
    return out
