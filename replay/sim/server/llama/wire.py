"""llama-server's wire shapes: chat and native completion requests in, its JSON and SSE out.

Request fields are read through `replay.serving.fields` (a wrong type is a 400 naming the field).
Replies carry what the server's carry (reference/llama-server.md, "What comes back"): `usage` with
`prompt_tokens_details.cached_tokens` = `timings.cache_n`, and `timings` (`cache_n`, `prompt_n`, ...);
streams send a role chunk, a chunk per token, a final chunk with `finish_reason` and `timings`, then
(with `stream_options.include_usage`) a usage chunk with `choices: []`, then `[DONE]`. The
simulator adds its modelled seconds as `x_sim`, as the ds4 simulator does.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import orjson

from replay.serving.counts import COUNT_MAX
from replay.serving.fields import FieldError, RequestFields
from replay.sim.model.llama.events import LlamaResult
from replay.sim.model.llama.prompt import LlamaReply


@dataclass(slots=True)
class LlamaRequest:
    messages: list[dict[str, Any]] | None  # chat
    prompt: str | None  # /completion
    tools: list[dict[str, Any]] | None
    max_tokens: int | None
    stream: bool
    include_usage: bool
    cache_prompt: bool
    id_slot: int
    n_cache_reuse: int | None
    model: str


def _content(f: RequestFields) -> str:
    value = f.value("content")
    if value is None or isinstance(value, str):
        return value or ""
    if not isinstance(value, list):
        raise FieldError(f.at("content"), "text or an array of parts", value)
    at = f.at("content")
    parts: list[str] = []
    for i, part in enumerate(value):
        if isinstance(part, str):
            parts.append(part)
            continue
        text = RequestFields(part, f"{at}[{i}]").text("text")
        if text is not None:
            parts.append(text)
    return "\n".join(parts)


def _common(f: RequestFields, ctx: int) -> dict[str, Any]:
    max_tokens = None
    for key in ("max_completion_tokens", "max_tokens", "n_predict"):
        value = f.value(key)
        if isinstance(value, int) and not isinstance(value, bool) and value < 0:
            continue  # -1: no cap, as llama-server reads it
        count = f.count(key, min(ctx, COUNT_MAX), "the context size")
        if count is not None:
            max_tokens = count
            break
    options = f.obj("stream_options")
    cache_prompt = f.boolean("cache_prompt")
    id_slot = f.value("id_slot")
    if id_slot is not None and (isinstance(id_slot, bool) or not isinstance(id_slot, int)):
        raise FieldError(f.at("id_slot"), "an integer", id_slot)
    reuse = f.value("n_cache_reuse")
    if reuse is not None and (isinstance(reuse, bool) or not isinstance(reuse, int)):
        raise FieldError(f.at("n_cache_reuse"), "an integer", reuse)
    f.number("temperature")
    return {
        "max_tokens": max_tokens,
        "stream": bool(f.boolean("stream")),
        "include_usage": bool(options is not None and options.boolean("include_usage")),
        "cache_prompt": True if cache_prompt is None else cache_prompt,
        "id_slot": -1 if id_slot is None else id_slot,
        "n_cache_reuse": reuse,
        "model": f.text("model") or "",
    }


def parse_chat(body: dict[str, Any], ctx: int) -> LlamaRequest:
    f = RequestFields(body)
    messages: list[dict[str, Any]] = []
    for m in f.objects("messages", required=True):
        role = m.text("role", required=True) or "user"
        msg: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": _content(m)}
        calls = [c.raw for c in m.objects("tool_calls")]
        if calls:
            msg["tool_calls"] = calls
        messages.append(msg)
    if not messages:
        raise FieldError("messages", "a non-empty array", [])
    tools = [t.raw for t in f.objects("tools")] or None
    return LlamaRequest(messages=messages, prompt=None, tools=tools, **_common(f, ctx))


def parse_completion(body: dict[str, Any], ctx: int) -> LlamaRequest:
    f = RequestFields(body)
    prompt = f.value("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise FieldError(f.at("prompt"), "a non-empty string", prompt)
    return LlamaRequest(messages=None, prompt=prompt, tools=None, **_common(f, ctx))


def usage(r: LlamaResult) -> dict[str, Any]:
    return {
        "completion_tokens": r.predicted_n,
        "prompt_tokens": r.prompt_tokens,
        "total_tokens": r.prompt_tokens + r.predicted_n,
        "prompt_tokens_details": {"cached_tokens": r.cache_n},
    }


def chat_body(req: LlamaRequest, reply: LlamaReply, r: LlamaResult, model: str, build: str) -> dict[str, Any]:
    return {
        "choices": [
            {
                "finish_reason": r.finish,
                "index": 0,
                "message": {"role": "assistant", "content": reply.content},
            }
        ],
        "created": int(time.time()),
        "model": req.model or model,
        "system_fingerprint": build,
        "object": "chat.completion",
        "usage": usage(r),
        "id": "chatcmpl-" + uuid.uuid4().hex[:32],
        "timings": r.timings(),
        "x_sim": r.x_sim(),
    }


def completion_body(reply: LlamaReply, r: LlamaResult, model: str, prompt: str) -> dict[str, Any]:
    """`/completion`'s final object (`server_task_result_cmpl_final::to_json_non_oaicompat`)."""
    return {
        "index": 0,
        "content": reply.content,
        "tokens": [],
        "id_slot": r.slot,
        "stop": True,
        "model": model,
        "tokens_predicted": r.predicted_n,
        "tokens_evaluated": r.prompt_tokens,
        "prompt": prompt,
        "has_new_line": False,
        "truncated": False,
        "stop_type": "limit",
        "stopping_word": "",
        "tokens_cached": r.cache_n + r.prompt_n + max(0, r.predicted_n - 1),
        "timings": r.timings(),
        "x_sim": r.x_sim(),
    }


def sse(data: Any) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


class ChatStream:
    """The chunks of one streamed chat completion."""

    def __init__(self, req: LlamaRequest, reply: LlamaReply, model: str, build: str) -> None:
        self.req = req
        self.reply = reply
        self.model = req.model or model
        self.build = build
        self.id = "chatcmpl-" + uuid.uuid4().hex[:32]
        self.created = int(time.time())
        self.sent = 0
        self.started = False

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "choices": [{"finish_reason": finish, "index": 0, "delta": delta}],
            "created": self.created,
            "id": self.id,
            "model": self.model,
            "system_fingerprint": self.build,
            "object": "chat.completion.chunk",
        }

    def start(self) -> bytes:
        if self.started:
            return b""
        self.started = True
        return sse(self._chunk({"role": "assistant", "content": None}))

    def tokens(self, gen: int) -> bytes:
        out = [self.start()]
        while self.sent < min(gen, len(self.reply.texts)):
            out.append(sse(self._chunk({"content": self.reply.texts[self.sent]})))
            self.sent += 1
        return b"".join(out)

    def finish(self, r: LlamaResult) -> bytes:
        if r.error is not None:
            err = {"error": {"code": 400, "message": r.error, "type": "exceed_context_size_error"}}
            return b"error: " + orjson.dumps(err) + b"\n\n"
        out = [self.tokens(r.predicted_n)]
        final = self._chunk({}, r.finish)
        final["timings"] = r.timings()
        out.append(sse(final))
        if self.req.include_usage:
            tail = {
                **self._chunk({}),
                "choices": [],
                "usage": usage(r),
                "timings": r.timings(),
                "x_sim": r.x_sim(),
            }
            out.append(sse(tail))
        out.append(b"data: [DONE]\n\n")
        return b"".join(out)


class CompletionStream:
    """`/completion` with `stream: true`: a `{"content", "stop": false}` event per token, then the
    final object with `stop: true` (no `[DONE]`)."""

    def __init__(self, reply: LlamaReply, model: str, prompt: str) -> None:
        self.reply = reply
        self.model = model
        self.prompt = prompt
        self.sent = 0

    def tokens(self, gen: int) -> bytes:
        out: list[bytes] = []
        while self.sent < min(gen, len(self.reply.texts)):
            out.append(
                sse(
                    {
                        "index": 0,
                        "content": self.reply.texts[self.sent],
                        "tokens": [],
                        "stop": False,
                        "id_slot": -1,
                    }
                )
            )
            self.sent += 1
        return b"".join(out)

    def finish(self, r: LlamaResult) -> bytes:
        if r.error is not None:
            return sse({"error": {"code": 400, "message": r.error, "type": "exceed_context_size_error"}})
        return self.tokens(r.predicted_n) + sse(completion_body(self.reply, r, self.model, self.prompt))
