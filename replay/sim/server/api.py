"""Wire formats: OpenAI chat and Anthropic messages in, ds4-shaped JSON and SSE out.

Requests become the neutral message format (the brief's contract) so both APIs render to the same
prompt, as ds4 renders both to one template. Responses carry ds4's usage fields exactly and the
simulator's `x_sim` modelled-time object on the final response object.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import orjson

from replay.serving.counts import COUNT_MAX
from replay.serving.fields import FieldError, RequestFields
from replay.sim.model.events import Result
from replay.sim.model.job import thinking_requested
from replay.sim.model.reply import Reply

Message = dict[str, Any]
STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens", "error": "end_turn"}


class BadRequest(Exception):
    """A request ds4 would refuse with `{"error": {...}}`; `status` is the HTTP code."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def error_body(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind}}


@dataclass(slots=True)
class ChatRequest:
    api: str
    model: str
    messages: list[Message]
    tools: list[dict[str, Any]] | None
    max_tokens: int | None
    stream: bool
    include_usage: bool
    thinking: bool = True


# Every field is read through `RequestFields` (replay.serving.fields): a wrong type or shape anywhere is
# a `FieldError` naming the field, which the app answers 400. One parser per API; a new API is a
# new `parse_*` returning a `ChatRequest`.

OPENAI_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def content_of(f: RequestFields, key: str = "content") -> str:
    """Text of an OpenAI/Anthropic content value: a string, or text parts joined (others skipped)."""
    value = f.value(key)
    if value is None or isinstance(value, str):
        return value or ""
    if not isinstance(value, list):
        raise FieldError(f.at(key), "text or an array of parts", value)
    parts = value
    at = f.at(key)
    texts: list[str] = []
    for i, part in enumerate(parts):
        if isinstance(part, str):
            texts.append(part)
            continue
        block = RequestFields(part, f"{at}[{i}]")
        text = block.text("text")
        if text is not None:
            texts.append(text)
    return "\n".join(texts)


def _arguments(f: RequestFields, key: str) -> str:
    value = f.value(key)
    if isinstance(value, str):
        return value
    return orjson.dumps(value if value is not None else {}).decode()


def _max_tokens(f: RequestFields, ctx: int, *keys: str) -> int | None:
    """The reply cap: at most the context (2**63 or 2e9 would decode to the full context)."""
    for key in keys:
        value = f.count(key, ctx, "the context size")
        if value is not None:
            return value
    return None


def _openai_tools(f: RequestFields) -> list[dict[str, Any]] | None:
    """Function tools, `{"type": "function", "function": {...}}` or the flat `{"name", ...}` form."""
    tools = f.objects("tools")
    for t in tools:
        fn = t.obj("function") or t
        fn.text("name")
        fn.text("description")
        fn.obj("parameters")
    return [t.raw for t in tools] or None


def parse_openai(body: dict[str, Any], *, ctx: int = COUNT_MAX) -> ChatRequest:
    f = RequestFields(body)
    raw = f.objects("messages", required=True)
    if not raw:
        raise BadRequest("'messages' must be a non-empty array")
    messages: list[Message] = []
    for m in raw:
        role = m.choice("role", OPENAI_ROLES, required=True)
        role = {"developer": "system", "function": "tool"}.get(role or "", role)
        msg: Message = {"role": role, "content": content_of(m)}
        if role == "assistant":
            calls = []
            for tc in m.objects("tool_calls"):
                fn = tc.obj("function") or tc  # tolerate the flat {"name", "arguments"} form
                calls.append(
                    {
                        "id": tc.text("id") or "",
                        "name": fn.text("name") or "",
                        "arguments": _arguments(fn, "arguments"),
                    }
                )
            if calls:
                msg["tool_calls"] = calls
        if role == "tool":
            msg["tool_call_id"] = m.text("tool_call_id") or m.text("name") or ""
        messages.append(msg)
    options = f.obj("stream_options")
    f.number("temperature")  # not modelled, but a server would refuse one that is not a number
    return ChatRequest(
        api="openai",
        model=f.text("model") or "",
        messages=messages,
        tools=_openai_tools(f),
        max_tokens=_max_tokens(f, ctx, "max_completion_tokens", "max_tokens"),
        stream=bool(f.boolean("stream")),
        include_usage=bool(options is not None and options.boolean("include_usage")),
        thinking=thinking_requested(body),
    )


def parse_anthropic(body: dict[str, Any], *, ctx: int = COUNT_MAX) -> ChatRequest:
    f = RequestFields(body)
    raw = f.objects("messages", required=True)
    if not raw:
        raise BadRequest("'messages' must be a non-empty array")
    messages: list[Message] = []
    system = content_of(f, "system")
    if system:
        messages.append({"role": "system", "content": system})
    for m in raw:
        role = m.choice("role", ("user", "assistant", "system"), required=True)
        if role == "system":  # Claude Code's own entries (agent and skill lists), kept in place
            messages.append({"role": "system", "content": content_of(m)})
        elif role == "assistant":
            messages.append(_anthropic_assistant(m))
        else:
            messages.extend(_anthropic_user(m))
    tools = None
    if f.items("tools"):
        tools = [
            {
                "type": "function",
                "function": {
                    "name": t.text("name") or "",
                    "description": t.text("description") or "",
                    "parameters": (t.obj("input_schema") or RequestFields({})).raw,
                },
            }
            for t in f.objects("tools")
        ]
    f.number("temperature")
    return ChatRequest(
        api="anthropic",
        model=f.text("model") or "",
        messages=messages,
        tools=tools,
        max_tokens=_max_tokens(f, ctx, "max_tokens"),
        stream=bool(f.boolean("stream")),
        include_usage=True,
        thinking=thinking_requested(body),
    )


def _blocks(m: RequestFields) -> list[RequestFields] | None:
    """An Anthropic message's content blocks, or None when the content is plain text."""
    value = m.value("content")
    if value is None or isinstance(value, str):
        return None
    at = m.at("content")  # bare strings among blocks are skipped, as they always were
    return [
        RequestFields(b, f"{at}[{i}]") for i, b in enumerate(m.items("content")) if not isinstance(b, str)
    ]


def _anthropic_assistant(m: RequestFields) -> Message:
    blocks = _blocks(m)
    if blocks is None:
        return {"role": "assistant", "content": content_of(m)}
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in blocks:
        kind = block.text("type")
        if kind == "text":
            texts.append(block.text("text") or "")
        elif kind == "tool_use":
            calls.append(
                {
                    "id": block.text("id") or "",
                    "name": block.text("name") or "",
                    "arguments": _arguments(block, "input"),
                }
            )
    msg: Message = {"role": "assistant", "content": "\n".join(texts)}
    if calls:
        msg["tool_calls"] = calls
    return msg


def _anthropic_user(m: RequestFields) -> list[Message]:
    blocks = _blocks(m)
    if blocks is None:
        return [{"role": "user", "content": content_of(m)}]
    out: list[Message] = []
    texts: list[str] = []
    for block in blocks:
        kind = block.text("type")
        if kind == "tool_result":
            if texts:
                out.append({"role": "user", "content": "\n".join(texts)})
                texts = []
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": block.text("tool_use_id") or "",
                    "content": content_of(block),
                }
            )
        elif kind == "text":
            texts.append(block.text("text") or "")
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


# --- usage ---------------------------------------------------------------------------------------


def openai_usage(r: Result) -> dict[str, Any]:
    return {
        "prompt_tokens": r.prompt_tokens,
        "completion_tokens": r.completion_tokens,
        "total_tokens": r.prompt_tokens + r.completion_tokens,
        "prompt_tokens_details": {
            "cached_tokens": r.cached_tokens,
            "cache_write_tokens": r.reprocessed_tokens,
        },
    }


def anthropic_usage(r: Result) -> dict[str, Any]:
    return {
        "input_tokens": 0,
        "cache_read_input_tokens": r.cached_tokens,
        "cache_creation_input_tokens": r.reprocessed_tokens,
        "output_tokens": r.completion_tokens,
    }


# --- non-streaming bodies ------------------------------------------------------------------------


def openai_body(req: ChatRequest, reply: Reply, r: Result) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": reply.content if not reply.tool_calls else None,
    }
    if reply.reasoning:
        message["reasoning_content"] = reply.reasoning
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in reply.tool_calls
        ]
    return {
        "id": "chatcmpl-" + uuid.uuid4().hex[:24],
        "object": "chat.completion",
        "created": int(time.time()),
        "model": req.model,
        "choices": [{"index": 0, "message": message, "finish_reason": r.finish}],
        "usage": openai_usage(r),
        "x_sim": r.x_sim(),
    }


def anthropic_body(req: ChatRequest, reply: Reply, r: Result) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if reply.reasoning:
        content.append({"type": "thinking", "thinking": reply.reasoning, "signature": ""})
    if reply.content:
        content.append({"type": "text", "text": reply.content})
    for c in reply.tool_calls:
        content.append(
            {"type": "tool_use", "id": c["id"], "name": c["name"], "input": orjson.loads(c["arguments"])}
        )
    return {
        "id": "msg_" + uuid.uuid4().hex[:24],
        "type": "message",
        "role": "assistant",
        "model": req.model,
        "content": content,
        "stop_reason": STOP_REASONS.get(r.finish, "end_turn"),
        "stop_sequence": None,
        "usage": anthropic_usage(r),
        "x_sim": r.x_sim(),
    }


# --- streams -------------------------------------------------------------------------------------


def sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


PREFILL_COMMENT = b": prefill\n\n"


class _Deltas:
    """What of the reply the client has already been sent, so each update sends only the new part."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.reasoning = 0
        self.content = 0
        self.args = 0
        self.tool_opened = False

    def take(self, gen: int) -> tuple[str, str, str, bool]:
        reasoning, content, frac = self.reply.text_upto(gen)
        r_new, c_new = reasoning[self.reasoning :], content[self.content :]
        self.reasoning, self.content = len(reasoning), len(content)
        a_new = ""
        opening = False
        if self.reply.tool_calls and frac > 0:
            args = self.reply.tool_calls[0]["arguments"]
            upto = len(args) if frac >= 1.0 else int(len(args) * frac)
            a_new, self.args = args[self.args : upto], max(self.args, upto)
            opening = not self.tool_opened
            self.tool_opened = True
        return r_new, c_new, a_new, opening


class OpenAIStream:
    def __init__(self, req: ChatRequest, reply: Reply) -> None:
        self.req = req
        self.reply = reply
        self.id = "chatcmpl-" + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.deltas = _Deltas(reply)
        self.role_sent = False

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.req.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    def prompt_start(self, cached: int, prompt: int) -> bytes:
        return b""

    def role(self) -> bytes:
        if self.role_sent:
            return b""
        self.role_sent = True
        return sse(self._chunk({"role": "assistant", "content": ""}))

    def progress(self, gen: int) -> bytes:
        out = [self.role()]
        reasoning, content, args, opening = self.deltas.take(gen)
        if reasoning:
            out.append(sse(self._chunk({"reasoning_content": reasoning})))
        if content:
            out.append(sse(self._chunk({"content": content})))
        if opening:
            call = self.reply.tool_calls[0]
            head = {
                "index": 0,
                "id": call["id"],
                "type": "function",
                "function": {"name": call["name"], "arguments": ""},
            }
            out.append(sse(self._chunk({"tool_calls": [head]})))
        if args:
            out.append(sse(self._chunk({"tool_calls": [{"index": 0, "function": {"arguments": args}}]})))
        return b"".join(out)

    def finish(self, r: Result) -> bytes:
        if r.error:
            return self.role() + sse(error_body(r.error, "server_error"), event="error")
        out = [self.progress(r.completion_tokens)]
        final = self._chunk({}, r.finish)
        if self.req.include_usage:
            out.append(sse(final))
            usage = {**self._chunk({}), "choices": [], "usage": openai_usage(r), "x_sim": r.x_sim()}
            out.append(sse(usage))
        else:
            final["x_sim"] = r.x_sim()
            out.append(sse(final))
        out.append(b"data: [DONE]\n\n")
        return b"".join(out)


class AnthropicStream:
    def __init__(self, req: ChatRequest, reply: Reply) -> None:
        self.req = req
        self.reply = reply
        self.id = "msg_" + uuid.uuid4().hex[:24]
        self.deltas = _Deltas(reply)
        self.started = False
        self.block: str | None = None
        self.index = -1

    def prompt_start(self, cached: int, prompt: int) -> bytes:
        if self.started:
            return b""
        self.started = True
        usage = {
            "input_tokens": 0,
            "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": prompt - cached,
            "output_tokens": 0,
        }
        message = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.req.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        }
        return sse({"type": "message_start", "message": message}, event="message_start")

    def role(self) -> bytes:
        return b""

    def _open(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self._close()
        self.index += 1
        self.block = kind
        return out + sse(
            {"type": "content_block_start", "index": self.index, "content_block": block},
            event="content_block_start",
        )

    def _close(self) -> bytes:
        if self.block is None:
            return b""
        self.block = None
        return sse({"type": "content_block_stop", "index": self.index}, event="content_block_stop")

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse(
            {"type": "content_block_delta", "index": self.index, "delta": delta}, event="content_block_delta"
        )

    def progress(self, gen: int) -> bytes:
        out: list[bytes] = []
        reasoning, content, args, opening = self.deltas.take(gen)
        if reasoning:
            if self.block != "thinking":
                out.append(self._open("thinking", {"type": "thinking", "thinking": ""}))
            out.append(self._delta({"type": "thinking_delta", "thinking": reasoning}))
        if content:
            if self.block != "text":
                out.append(self._open("text", {"type": "text", "text": ""}))
            out.append(self._delta({"type": "text_delta", "text": content}))
        if opening:
            call = self.reply.tool_calls[0]
            out.append(
                self._open(
                    "tool_use", {"type": "tool_use", "id": call["id"], "name": call["name"], "input": {}}
                )
            )
        if args:
            out.append(self._delta({"type": "input_json_delta", "partial_json": args}))
        return b"".join(out)

    def finish(self, r: Result) -> bytes:
        start = self.prompt_start(r.cached_tokens, r.prompt_tokens)
        if r.error:
            return start + sse(
                {"type": "error", "error": {"type": "api_error", "message": r.error}}, event="error"
            )
        out = [start, self.progress(r.completion_tokens), self._close()]
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": STOP_REASONS.get(r.finish, "end_turn"), "stop_sequence": None},
            "usage": {"output_tokens": r.completion_tokens},
            "x_sim": r.x_sim(),
        }
        out.append(sse(delta, event="message_delta"))
        out.append(sse({"type": "message_stop"}, event="message_stop"))
        return b"".join(out)
