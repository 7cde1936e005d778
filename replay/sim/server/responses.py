"""The OpenAI Responses API (`POST /v1/responses`) on the simulator: input items in, typed events out.

Requests become the neutral message list the other APIs render to (instructions first, then, with
`previous_response_id`, the stored input and output of that response, without its instructions,
as OpenAI's API does; then the input items), so a
Responses conversation shares its prefix the way a chat one does. Every response is remembered
under its id (unless `store` is false) for later `previous_response_id` requests, a bounded number
of them. Streams follow OpenAI's event order: `response.created`, `response.in_progress`, per output
item `response.output_item.added` ... deltas ... `response.output_item.done`, then
`response.completed` (or `response.incomplete` at the token cap) with the usage; every event
carries a `sequence_number`.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from typing import Any

import orjson

from replay.serving.counts import COUNT_MAX
from replay.serving.fields import FieldError, RequestFields
from replay.sim.model.events import Result
from replay.sim.model.reply import Reply
from replay.sim.server.api import BadRequest, ChatRequest, Message, _Deltas, _max_tokens, content_of, sse

API = "openai-responses"
STORE_MAX = 1024  # responses kept for previous_response_id


class ResponseStore:
    """The conversations behind recent response ids (request messages plus the reply)."""

    def __init__(self, limit: int = STORE_MAX) -> None:
        self.limit = limit
        self._held: OrderedDict[str, list[Message]] = OrderedDict()

    def get(self, response_id: str) -> list[Message] | None:
        return self._held.get(response_id)

    def put(self, response_id: str, messages: list[Message]) -> None:
        self._held[response_id] = messages
        if len(self._held) > self.limit:
            self._held.popitem(last=False)


ROLES = ("user", "system", "developer", "assistant")


def _call_arguments(item: RequestFields) -> str:
    """A call's arguments (`input` for custom tools): JSON text, or a JSON value written out."""
    key = "arguments" if "arguments" in item else "input"
    value = item.value(key)
    if value is None or isinstance(value, str):
        return value or ""
    return orjson.dumps(value).decode()


def _items(f: RequestFields) -> list[Message]:
    raw = f.value("input")
    if raw is None or isinstance(raw, str):
        return [{"role": "user", "content": raw}] if raw is not None else []
    if not isinstance(raw, list):
        raise FieldError("input", "a string or an array of items", raw)
    out: list[Message] = []
    for item in f.objects("input"):
        kind = item.text("type") or "message"
        if kind == "message":
            role = item.choice("role", ROLES, required=True)
            text = content_of(item)
            if role == "assistant" and out and out[-1]["role"] == "assistant":
                out[-1]["content"] += text
                continue
            out.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind in ("function_call", "custom_tool_call"):
            call = {
                "id": item.text("call_id") or "",
                "name": item.text("name") or "",
                "arguments": _call_arguments(item),
            }
            if not (out and out[-1]["role"] == "assistant"):
                out.append({"role": "assistant", "content": ""})
            out[-1].setdefault("tool_calls", []).append(call)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": item.text("call_id") or "",
                    "content": content_of(item, "output"),
                }
            )
        elif kind == "reasoning" and not (out and out[-1]["role"] == "assistant"):
            out.append({"role": "assistant", "content": ""})
        # other item types (web search calls, item references) hold nothing the model reads here
    return out


def chat_tools(f: RequestFields) -> list[dict[str, Any]] | None:
    """Responses function tools in the chat shape the renderer and the reply planner read."""
    out = []
    for t in f.objects("tools"):
        kind = t.text("type")
        name = t.text("name")
        description = t.text("description")
        if kind == "function":
            t.obj("parameters")
            fn = {k: v for k, v in t.raw.items() if k != "type"}
            out.append({"type": "function", "function": fn})
        elif name is not None:  # custom (free-form) tools: a name and a description
            fn = {"name": name, "description": description or "", "parameters": {"type": "object"}}
            out.append({"type": "function", "function": fn})
    return out or None


def _thinking(f: RequestFields) -> bool:
    reasoning = f.obj("reasoning")
    if reasoning is None:
        return False
    return reasoning.text("effort") not in ("none", "minimal")


def parse_responses(body: dict[str, Any], store: ResponseStore, *, ctx: int = COUNT_MAX) -> ChatRequest:
    """Read through `RequestFields` like `parse_openai`: a wrong type or shape anywhere is a `FieldError`."""
    f = RequestFields(body)
    messages: list[Message] = []
    previous = f.text("previous_response_id")
    if previous is not None:
        held = store.get(previous)
        if held is None:
            raise BadRequest(f"Previous response with id '{previous}' not found.", 400)
        messages.extend(dict(m) for m in held)
    instructions = f.text("instructions")
    if instructions is not None:
        # A chained response does not inherit the earlier instructions: these go first instead.
        messages.insert(0, {"role": "system", "content": instructions})
    messages.extend(_items(f))
    if not messages:
        raise BadRequest("'input' must not be empty")
    f.boolean("store")  # read by `remember`; a server would refuse one that is not a boolean
    f.number("temperature")
    return ChatRequest(
        api=API,
        model=f.text("model") or "",
        messages=messages,
        tools=chat_tools(f),
        max_tokens=_max_tokens(f, ctx, "max_output_tokens", "max_tokens"),
        stream=bool(f.boolean("stream")),
        include_usage=True,
        thinking=_thinking(f),
    )


def responses_usage(r: Result, reply: Reply) -> dict[str, Any]:
    return {
        "input_tokens": r.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": r.cached_tokens,
            "cache_write_tokens": r.reprocessed_tokens,
        },
        "output_tokens": r.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reply.hidden_tokens if reply.reasoning else 0},
        "total_tokens": r.prompt_tokens + r.completion_tokens,
    }


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}]
        if status == "completed"
        else [],
    }


def _reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}] if text else [],
    }


def _call_item(item_id: str, call: dict[str, Any], arguments: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call["id"],
        "name": call["name"],
        "arguments": arguments,
    }


def _output(reply: Reply, ids: dict[str, str]) -> list[dict[str, Any]]:
    out = []
    if reply.reasoning:
        out.append(_reasoning_item(ids["reasoning"], reply.reasoning))
    if reply.content:
        out.append(_message_item(ids["message"], reply.content, "completed"))
    for call in reply.tool_calls:
        out.append(_call_item(ids["call"], call, call["arguments"], "completed"))
    return out


def _response(req: ChatRequest, rid: str, created: int, status: str, output: list[Any]) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "model": req.model,
        "output": output,
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
        "usage": None,
        "incomplete_details": None,
        "error": None,
    }


def _ids() -> dict[str, str]:
    return {
        k: f"{p}_{uuid.uuid4().hex[:24]}"
        for k, p in (("message", "msg"), ("reasoning", "rs"), ("call", "fc"))
    }


def _final(
    req: ChatRequest, reply: Reply, r: Result, rid: str, created: int, ids: dict[str, str]
) -> dict[str, Any]:
    status = "incomplete" if r.finish == "length" else "completed"
    resp = _response(req, rid, created, status, _output(reply, ids))
    if status == "incomplete":
        resp["incomplete_details"] = {"reason": "max_output_tokens"}
    resp["usage"] = responses_usage(r, reply)
    resp["x_sim"] = r.x_sim()
    return resp


def new_response_id() -> str:
    return "resp_" + uuid.uuid4().hex


def responses_body(req: ChatRequest, reply: Reply, r: Result, rid: str) -> dict[str, Any]:
    return _final(req, reply, r, rid, int(time.time()), _ids())


class ResponsesStream:
    """Same interface as the chat streams in `api.py`: the app calls it per modelled event."""

    def __init__(self, req: ChatRequest, reply: Reply, rid: str) -> None:
        self.req = req
        self.reply = reply
        self.id = rid
        self.created = int(time.time())
        self.deltas = _Deltas(reply)
        self.ids = _ids()
        self.seq = 0
        self.started = False
        self.open: str | None = None  # the output item being streamed: reasoning | message | call
        self.index = -1
        self.text = ""
        self.reasoning = ""
        self.args = ""

    def _event(self, kind: str, fields: dict[str, Any]) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse(data, event=kind)

    def prompt_start(self, cached: int, prompt: int) -> bytes:
        return b""

    def role(self) -> bytes:
        if self.started:
            return b""
        self.started = True
        resp = _response(self.req, self.id, self.created, "in_progress", [])
        return self._event("response.created", {"response": resp}) + self._event(
            "response.in_progress", {"response": resp}
        )

    def _open(self, kind: str) -> bytes:
        out = self._close()
        self.index += 1
        self.open = kind
        if kind == "reasoning":
            item = _reasoning_item(self.ids["reasoning"], "")
        elif kind == "message":
            item = _message_item(self.ids["message"], "", "in_progress")
        else:
            item = _call_item(self.ids["call"], self.reply.tool_calls[0], "", "in_progress")
        out += self._event("response.output_item.added", {"output_index": self.index, "item": item})
        if kind == "message":
            part = {"type": "output_text", "text": "", "annotations": []}
            out += self._event(
                "response.content_part.added",
                {"item_id": item["id"], "output_index": self.index, "content_index": 0, "part": part},
            )
        return out

    def _close(self) -> bytes:
        kind, self.open = self.open, None
        if kind is None:
            return b""
        where = {"output_index": self.index}
        if kind == "reasoning":
            item = _reasoning_item(self.ids["reasoning"], self.reasoning)
            done = self._event(
                "response.reasoning_text.done",
                {"item_id": item["id"], **where, "content_index": 0, "text": self.reasoning},
            )
        elif kind == "message":
            item = _message_item(self.ids["message"], self.text, "completed")
            ref = {"item_id": item["id"], **where, "content_index": 0}
            done = self._event("response.output_text.done", {**ref, "text": self.text}) + self._event(
                "response.content_part.done", {**ref, "part": item["content"][0]}
            )
        else:
            call = self.reply.tool_calls[0]
            item = _call_item(self.ids["call"], call, self.args, "completed")
            done = self._event(
                "response.function_call_arguments.done",
                {"item_id": item["id"], **where, "name": call["name"], "arguments": self.args},
            )
        return done + self._event("response.output_item.done", {**where, "item": item})

    def progress(self, gen: int) -> bytes:
        out = [self.role()]
        reasoning, content, args, opening = self.deltas.take(gen)
        if reasoning:
            if self.open != "reasoning":
                out.append(self._open("reasoning"))
            self.reasoning += reasoning
            out.append(
                self._event(
                    "response.reasoning_text.delta",
                    {
                        "item_id": self.ids["reasoning"],
                        "output_index": self.index,
                        "content_index": 0,
                        "delta": reasoning,
                    },
                )
            )
        if content:
            if self.open != "message":
                out.append(self._open("message"))
            self.text += content
            out.append(
                self._event(
                    "response.output_text.delta",
                    {
                        "item_id": self.ids["message"],
                        "output_index": self.index,
                        "content_index": 0,
                        "delta": content,
                        "logprobs": [],
                    },
                )
            )
        if opening:
            out.append(self._open("call"))
        if args:
            self.args += args
            out.append(
                self._event(
                    "response.function_call_arguments.delta",
                    {"item_id": self.ids["call"], "output_index": self.index, "delta": args},
                )
            )
        return b"".join(out)

    def finish(self, r: Result) -> bytes:
        if r.error:
            resp = _response(self.req, self.id, self.created, "failed", [])
            resp["error"] = {"code": "server_error", "message": r.error}
            return self.role() + self._event("response.failed", {"response": resp})
        out = [self.progress(r.completion_tokens), self._close()]
        final = _final(self.req, self.reply, r, self.id, self.created, self.ids)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        out.append(self._event(kind, {"response": final}))
        return b"".join(out)


def remember(store: ResponseStore, body: dict[str, Any], req: ChatRequest, reply: Reply, rid: str) -> None:
    """Keep the conversation under the response's id, unless the client said `store: false`."""
    if body.get("store") is False:
        return
    instructions = body.get("instructions")
    held = req.messages[1:] if isinstance(instructions, str) else req.messages
    store.put(rid, [*held, reply.message()])
