"""The OpenAI Responses API (`POST /v1/responses`): request body and stream reader.

Neutral messages become input items: a leading system message becomes `instructions` (unless
marked `inline`), other system and developer messages, user and assistant text become `message`
items, an assistant's tool calls become `function_call` items (or `custom_tool_call` for Codex's
free-form tools), tool results `function_call_output` items. Reasoning is never resent, as
everywhere. With `previous_response_id` only the messages after the ones the server holds go out.

The stream is typed events (`response.created`, `response.output_text.delta`, ...,
`response.completed`); TTFT stops at the first output delta (text, reasoning or tool-call
arguments) or at an output item that opens a tool call, as the chat readers count a tool name.
"""

from __future__ import annotations

from typing import Any

import httpx

from replay.engine.exchange import (
    THINK_FIELDS,
    ApiCall,
    OnState,
    exchange,
    load_event,
    reply_message,
    stream_error,
)
from replay.engine.openai import OPENAI_HEADERS
from replay.engine.sse import SseEvent
from replay.engine.usage import parse_usage
from replay.metrics.record import RequestRecord

API = "openai-responses"
_TEXT_DELTAS = ("response.output_text.delta", "response.refusal.delta")
_REASONING_DELTAS = ("response.reasoning_text.delta", "response.reasoning_summary_text.delta")
_ARG_DELTAS = ("response.function_call_arguments.delta", "response.custom_tool_call_input.delta")
_TERMINAL = ("response.completed", "response.incomplete", "response.failed")


def _text_part(role: str, text: Any) -> list[dict[str, Any]]:
    kind = "output_text" if role == "assistant" else "input_text"
    return [{"type": kind, "text": text if isinstance(text, str) else ""}]


def responses_input(messages: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """Neutral -> (instructions, input items)."""
    instructions: str | None = None
    start = 0
    if messages and messages[0].get("role") == "system" and not messages[0].get("inline"):
        content = messages[0].get("content")
        instructions = content if isinstance(content, str) else ""
        start = 1
    return instructions, items_of(messages[start:])


def items_of(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        content = m.get("content")
        if role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": m.get("tool_call_id", ""),
                    "output": content if isinstance(content, str) else "",
                }
            )
            continue
        if role == "assistant":
            if content:
                items.append({"type": "message", "role": "assistant", "content": _text_part(role, content)})
            for call in m.get("tool_calls") or ():
                if call.get("type") == "custom":
                    items.append(
                        {
                            "type": "custom_tool_call",
                            "call_id": call.get("id", ""),
                            "name": call.get("name", ""),
                            "input": call.get("arguments", ""),
                        }
                    )
                else:
                    items.append(
                        {
                            "type": "function_call",
                            "call_id": call.get("id", ""),
                            "name": call.get("name", ""),
                            "arguments": call.get("arguments", ""),
                        }
                    )
            continue
        items.append({"type": "message", "role": role or "user", "content": _text_part(str(role), content)})
    return items


def responses_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trace's chat-style function tools as Responses tools; other tool types pass as they are."""
    out = []
    for t in tools:
        fn = t.get("function")
        if t.get("type") != "function" or not isinstance(fn, dict):
            out.append(t)
            continue
        tool: dict[str, Any] = {"type": "function", "name": fn.get("name", "")}
        if fn.get("description"):
            tool["description"] = fn["description"]
        tool["parameters"] = fn.get("parameters") or {"type": "object", "properties": {}}
        if "strict" in fn:
            tool["strict"] = fn["strict"]
        out.append(tool)
    return out


def responses_body(call: ApiCall) -> dict[str, Any]:
    instructions, items = responses_input(call.messages)
    if call.previous_response_id is not None:
        # The server holds the earlier messages; instructions are never inherited, so they go again.
        items = items_of(call.messages[max(call.previous_messages, 1 if instructions is not None else 0) :])
    body: dict[str, Any] = {"model": call.model}
    if instructions is not None:
        body["instructions"] = instructions
    body["input"] = items
    body["max_output_tokens"] = call.max_tokens
    body["stream"] = call.stream
    if call.previous_response_id is not None:
        body["previous_response_id"] = call.previous_response_id
    if call.temperature is not None:
        body["temperature"] = call.temperature
    if call.tools:
        body["tools"] = responses_tools(call.tools)
    body.update(THINK_FIELDS[API][call.think])
    body.update(call.extra_body)
    return body


def _obj(value: Any) -> dict[str, Any]:
    """An object of the protocol, or an empty one when the server sent another type there."""
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _index(obj: dict[str, Any], default: int) -> int:
    index = obj.get("output_index")
    return index if type(index) is int else default


class ResponsesReader:
    terminal = "response.completed"

    def __init__(self) -> None:
        self.done = False
        self.error: str | None = None
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tools: dict[int, dict[str, str]] = {}
        self.status: str | None = None
        self.incomplete: str | None = None
        self.usage: dict[str, Any] | None = None
        self.response_id: str | None = None
        self.x_sim: dict[str, Any] | None = None

    def event(self, ev: SseEvent) -> bool:
        obj = load_event(ev.data)
        kind = obj.get("type") or ev.event
        if kind in _TEXT_DELTAS:
            delta = obj.get("delta")
            if isinstance(delta, str) and delta:
                self.content.append(delta)
                return True
            return False
        if kind in _ARG_DELTAS:
            delta = obj.get("delta")
            entry = self.tools.get(_index(obj, -1))
            if isinstance(delta, str) and delta and entry is not None:
                entry["arguments"] += delta
                return True
            return False
        if kind in _REASONING_DELTAS:
            delta = obj.get("delta")
            if isinstance(delta, str) and delta:
                self.reasoning.append(delta)
                return True
            return False
        if kind == "response.output_item.added":
            return self._item_added(_index(obj, len(self.tools)), _obj(obj.get("item")))
        if kind == "response.output_item.done":
            self._item_done(_index(obj, -1), _obj(obj.get("item")))
            return False
        if kind in _TERMINAL:
            resp = _obj(obj.get("response"))
            self._response(resp)
            self.done = kind != "response.failed"
            if kind == "response.failed":
                self.error = stream_error(resp.get("error") or obj)
            return False
        if kind == "response.created" or kind == "response.in_progress":
            resp = _obj(obj.get("response"))
            if isinstance(resp.get("id"), str):
                self.response_id = resp["id"]
            return False
        if kind == "error" or ev.event == "error":
            self.error = stream_error(obj)
        return False  # content_part.*, *.done, future event types

    def _item_added(self, index: int, item: dict[str, Any]) -> bool:
        kind = item.get("type")
        if kind in ("function_call", "custom_tool_call"):
            entry = {"id": _text(item.get("call_id")), "name": _text(item.get("name")), "arguments": ""}
            if kind == "custom_tool_call":
                entry["type"] = "custom"
            self.tools[index] = entry
            return True
        return False

    def _item_done(self, index: int, item: dict[str, Any]) -> None:
        """A finished call item holds the whole arguments: trust it over the deltas."""
        entry = self.tools.get(index)
        if entry is None:
            return
        args = item.get("arguments", item.get("input"))
        if isinstance(args, str):
            entry["arguments"] = args

    def _response(self, resp: dict[str, Any]) -> None:
        if isinstance(resp.get("id"), str):
            self.response_id = resp["id"]
        self.status = resp.get("status") if isinstance(resp.get("status"), str) else None
        details = resp.get("incomplete_details")
        if isinstance(details, dict) and isinstance(details.get("reason"), str):
            self.incomplete = details["reason"]
        if isinstance(resp.get("usage"), dict):
            self.usage = resp["usage"]
        if isinstance(resp.get("x_sim"), dict):
            self.x_sim = resp["x_sim"]

    def body(self, obj: dict[str, Any]) -> None:
        self.done = True
        self._response(obj)
        output = obj.get("output")
        for i, item in enumerate(output if isinstance(output, list) else ()):
            item = _obj(item)
            kind = item.get("type")
            if kind == "message":
                for part in _list(item.get("content")):
                    part = _obj(part)
                    if part.get("type") in ("output_text", "refusal"):
                        self.content.append(_text(part.get("text") or part.get("refusal")))
            elif kind == "reasoning":
                for part in _list(item.get("content")) + _list(item.get("summary")):
                    part = _obj(part)
                    if isinstance(part.get("text"), str):
                        self.reasoning.append(part["text"])
            elif kind in ("function_call", "custom_tool_call"):
                self._item_added(i, item)
                self._item_done(i, item)

    def fill(self, res: RequestRecord) -> None:
        tool_calls = [self.tools[i] for i in sorted(self.tools)]
        if self.content or self.reasoning or tool_calls or self.done:
            res.message = reply_message(self.content, self.reasoning, tool_calls)
        if tool_calls:
            res.finish = "tool_calls"
        elif self.status == "incomplete":
            res.finish = "length" if self.incomplete in (None, "max_output_tokens") else self.incomplete
        elif self.status is not None:
            res.finish = "stop"
        res.raw_usage = self.usage
        res.x_sim = self.x_sim
        res.response_id = self.response_id
        res.usage = parse_usage({"usage": self.usage})


async def openai_responses(
    client: httpx.AsyncClient, call: ApiCall, on_state: OnState = None, rec: RequestRecord | None = None
) -> RequestRecord:
    """POST /v1/responses."""
    headers = {**OPENAI_HEADERS, "accept": "text/event-stream" if call.stream else "application/json"}
    body = responses_body(call)
    return await exchange(client, call, "/v1/responses", body, headers, ResponsesReader(), on_state, rec)
