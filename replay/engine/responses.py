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

from replay.engine.decode import ReplyFields, check_counts, check_modelled
from replay.engine.exchange import (
    THINK_FIELDS,
    ApiCall,
    OnState,
    ReplyParts,
    exchange,
    load_event,
    stream_error,
)
from replay.engine.openai import OPENAI_HEADERS
from replay.engine.sse import SseEvent
from replay.engine.usage import COUNT_PATHS, parse_usage
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


def _index(obj: ReplyFields, default: int) -> int:
    index = obj.integer("output_index")
    return default if index is None else index


class ResponsesReader(ReplyParts):
    """Responses events and bodies, every field read through `ReplyFields` (a wrong type is
    `BadShape`: the request's `bad_payload`)."""

    terminal = "response.completed"

    def __init__(self) -> None:
        super().__init__()
        self.status: str | None = None
        self.incomplete: str | None = None
        self.usage: dict[str, Any] | None = None
        self.response_id: str | None = None
        self.x_sim: dict[str, Any] | None = None

    def event(self, ev: SseEvent) -> bool:
        obj = load_event(ev.data)
        raw = obj.raw
        if raw.get("type") == "response.output_text.delta":  # most of a stream, checked inline
            text = raw.get("delta")
            if type(text) is str:
                if text:
                    self.content.append(text)
                    return True
                return False
        kind = obj.text("type") or ev.event
        if kind in _TEXT_DELTAS:
            text = obj.text("delta")
            if text:
                self.content.append(text)
                return True
            return False
        if kind in _ARG_DELTAS:
            text = obj.text("delta")
            entry = self.tools.get(_index(obj, -1))
            if text and entry is not None:
                entry["arguments"] += text
                return True
            return False
        if kind in _REASONING_DELTAS:
            text = obj.text("delta")
            if text:
                self.reasoning.append(text)
                return True
            return False
        if kind == "response.output_item.added":
            index = _index(obj, len(self.tools))
            item = obj.obj("item")
            return item is not None and self._item_added(index, item)
        if kind == "response.output_item.done":
            index = _index(obj, -1)
            item = obj.obj("item")
            if item is not None:
                self._item_done(index, item)
            return False
        if kind in _TERMINAL:
            resp = obj.obj("response")
            if resp is not None:
                self._response(resp)
            self.done = kind != "response.failed"
            if kind == "response.failed":
                err = resp.value("error") if resp is not None else None
                self.error = stream_error(err or obj.raw)
            return False
        if kind == "response.created" or kind == "response.in_progress":
            resp = obj.obj("response")
            if resp is not None:
                response_id = resp.text("id")
                if response_id is not None:
                    self.response_id = response_id
            return False
        if kind == "error" or ev.event == "error":
            self.error = stream_error(obj.raw)
        return False  # content_part.*, *.done, future event types

    def _item_added(self, index: int, item: ReplyFields) -> bool:
        kind = item.text("type")
        if kind in ("function_call", "custom_tool_call"):
            # The name arrives here, as it does in OpenAI's first tool-call delta: a token.
            entry = {"id": item.text("call_id") or "", "name": item.text("name") or "", "arguments": ""}
            if kind == "custom_tool_call":
                entry["type"] = "custom"
            self.tools[index] = entry
            return True
        return False

    def _item_done(self, index: int, item: ReplyFields) -> None:
        """A finished call item holds the whole arguments: trust it over the deltas."""
        entry = self.tools.get(index)
        if entry is None:
            return
        args = item.text("input") if "arguments" not in item else item.text("arguments")
        if args is not None:
            entry["arguments"] = args

    def _response(self, resp: ReplyFields) -> None:
        response_id = resp.text("id")
        if response_id is not None:
            self.response_id = response_id
        self.status = resp.text("status")
        details = resp.obj("incomplete_details")
        reason = details.text("reason") if details is not None else None
        if reason is not None:
            self.incomplete = reason
        usage = resp.obj("usage")
        if usage is not None:
            check_counts({"usage": usage.raw}, COUNT_PATHS, resp.path)
            self.usage = usage.raw
        x_sim = resp.obj("x_sim")
        if x_sim is not None and x_sim.raw:
            self.x_sim = check_modelled(x_sim)

    def body(self, obj: ReplyFields) -> None:
        self.done = True
        self._response(obj)
        for i, item in enumerate(obj.objects("output")):
            kind = item.text("type")
            if kind == "message":
                for part in item.objects("content"):
                    ptype = part.text("type")
                    if ptype == "output_text":
                        self.content.append(part.text("text") or "")
                    elif ptype == "refusal":
                        self.content.append(part.text("refusal") or "")
            elif kind == "reasoning":
                for key in ("content", "summary"):
                    for part in item.objects(key):
                        text = part.text("text")
                        if text is not None:
                            self.reasoning.append(text)
            elif kind in ("function_call", "custom_tool_call"):
                self._item_added(i, item)
                self._item_done(i, item)

    def fill(self, res: RequestRecord) -> None:
        tool_calls = self.tool_calls()
        self.fill_message(res, tool_calls)
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
