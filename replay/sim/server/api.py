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

from replay.sim.model.events import Result
from replay.sim.model.render import content_text
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


def thinking_requested(body: dict[str, Any]) -> bool:
    """ds4 thinks by default; these switches turn it off for one request (reference section 2)."""
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "disabled":
        return False
    if body.get("think") is False or body.get("reasoning_effort") == "none":
        return False
    return body.get("model") != "deepseek-chat"


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


def _int_or_none(body: dict[str, Any], *keys: str) -> int | None:
    for key in keys:
        if key in body and body[key] is not None:
            value = body[key]
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise BadRequest(f"'{key}' must be a non-negative integer")
            return value
    return None


def _arguments(value: Any) -> str:
    if isinstance(value, str):
        return value
    return orjson.dumps(value if value is not None else {}).decode()


def parse_openai(body: dict[str, Any]) -> ChatRequest:
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("'messages' must be a non-empty array")
    messages: list[Message] = []
    for m in raw:
        if not isinstance(m, dict):
            raise BadRequest("each message must be an object")
        role = m.get("role")
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant", "tool"):
            raise BadRequest(f"unsupported message role {role!r}")
        msg: Message = {"role": role, "content": content_text(m.get("content"))}
        if role == "assistant" and m.get("tool_calls"):
            calls = []
            for tc in m["tool_calls"]:
                fn = tc.get("function") or tc  # tolerate the flat {"name", "arguments"} form
                calls.append(
                    {
                        "id": tc.get("id", ""),
                        "name": fn.get("name", ""),
                        "arguments": _arguments(fn.get("arguments")),
                    }
                )
            msg["tool_calls"] = calls
        if role == "tool":
            msg["tool_call_id"] = m.get("tool_call_id", "")
        messages.append(msg)
    tools = body.get("tools") or None
    if tools is not None and not isinstance(tools, list):
        raise BadRequest("'tools' must be an array")
    options = body.get("stream_options") or {}
    return ChatRequest(
        api="openai",
        model=str(body.get("model") or ""),
        messages=messages,
        tools=tools,
        max_tokens=_int_or_none(body, "max_completion_tokens", "max_tokens"),
        stream=bool(body.get("stream")),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        thinking=thinking_requested(body),
    )


def parse_anthropic(body: dict[str, Any]) -> ChatRequest:
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("'messages' must be a non-empty array")
    messages: list[Message] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": content_text(system)})
    for m in raw:
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
            raise BadRequest("each message must be an object with role 'user', 'assistant' or 'system'")
        content = m.get("content")
        if m["role"] == "system":  # Claude Code's own entries (agent and skill lists), kept in place
            messages.append({"role": "system", "content": content_text(content)})
        elif m["role"] == "assistant":
            messages.append(_anthropic_assistant(content))
        else:
            messages.extend(_anthropic_user(content))
    tools = None
    if body.get("tools"):
        if not isinstance(body["tools"], list):
            raise BadRequest("'tools' must be an array")
        tools = [
            {
                "type": "function",
                "function": {
                    "name": t.get("name", ""),
                    "description": t.get("description", ""),
                    "parameters": t.get("input_schema", {}),
                },
            }
            for t in body["tools"]
            if isinstance(t, dict)
        ]
    return ChatRequest(
        api="anthropic",
        model=str(body.get("model") or ""),
        messages=messages,
        tools=tools,
        max_tokens=_int_or_none(body, "max_tokens"),
        stream=bool(body.get("stream")),
        include_usage=True,
        thinking=thinking_requested(body),
    )


def _anthropic_assistant(content: Any) -> Message:
    if not isinstance(content, list):
        return {"role": "assistant", "content": content_text(content)}
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            texts.append(str(block.get("text", "")))
        elif block.get("type") == "tool_use":
            calls.append(
                {
                    "id": block.get("id", ""),
                    "name": block.get("name", ""),
                    "arguments": _arguments(block.get("input")),
                }
            )
    msg: Message = {"role": "assistant", "content": "\n".join(texts)}
    if calls:
        msg["tool_calls"] = calls
    return msg


def _anthropic_user(content: Any) -> list[Message]:
    if not isinstance(content, list):
        return [{"role": "user", "content": content_text(content)}]
    out: list[Message] = []
    texts: list[str] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "tool_result":
            if texts:
                out.append({"role": "user", "content": "\n".join(texts)})
                texts = []
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": block.get("tool_use_id", ""),
                    "content": content_text(block.get("content")),
                }
            )
        elif block.get("type") == "text":
            texts.append(str(block.get("text", "")))
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
