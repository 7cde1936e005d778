"""Anthropic messages: request body (converted from neutral messages) and stream reader."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx
import orjson

from replay.engine.exchange import (
    THINK_FIELDS,
    ApiCall,
    OnState,
    exchange,
    load_event,
    reply_message,
    stream_error,
)
from replay.engine.openai import OPENAI_HEADERS, function_tools
from replay.engine.sse import SseEvent
from replay.engine.usage import parse_usage
from replay.metrics.record import RequestRecord

_ANTHROPIC_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
}

# --- Anthropic messages ---------------------------------------------------------------


def _tool_input(arguments: str) -> Any:
    """Tool-call arguments are JSON text in the neutral format, an object on this wire."""
    try:
        return orjson.loads(arguments) if arguments else {}
    except orjson.JSONDecodeError:
        # A recorded call cut short by max_tokens: keep the text rather than drop the call.
        return {"_raw_arguments": arguments}


def anthropic_messages_wire(
    messages: list[dict[str, Any]], marks: list[tuple[int, dict[str, Any]]] | None = None
) -> tuple[str | list[dict[str, Any]] | None, list[dict[str, Any]]]:
    """Neutral -> Anthropic wire: (system, turns).

    System (and developer) messages become the `system` parameter, unless marked `inline`: those
    stay in `messages` with role `system` where they were (Claude Code sends such entries). Tool results
    become `tool_result` blocks in a user turn; tool calls become `tool_use` blocks. Consecutive
    turns of the same role merge, since the API wants user and assistant to alternate. `marks`
    put a `cache_control` on the last block of a message (and make `system` a list of blocks).
    """
    marked = dict(marks or ())
    system: list[tuple[int, str]] = []
    turns: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]] | str, index: int) -> None:
        mark = marked.get(index)
        if mark is not None and isinstance(blocks, str):
            blocks = [{"type": "text", "text": blocks}]
        if turns and turns[-1]["role"] == role and role != "system":
            prev = turns[-1]["content"]
            if isinstance(prev, str):
                prev = [{"type": "text", "text": prev}]
            new = [{"type": "text", "text": blocks}] if isinstance(blocks, str) else blocks
            turns[-1]["content"] = prev + new
        else:
            turns.append({"role": role, "content": blocks})
        if mark is not None:
            content = turns[-1]["content"]
            content[-1] = {**content[-1], "cache_control": mark}

    for index, m in enumerate(messages):
        role = m.get("role")
        content = m.get("content") or ""
        if role in ("system", "developer"):
            if m.get("inline"):
                add("system", content, index)
            else:
                system.append((index, content))
        elif role == "tool":
            add(
                "user",
                [{"type": "tool_result", "tool_use_id": m.get("tool_call_id", ""), "content": content}],
                index,
            )
        elif role == "assistant" and m.get("tool_calls"):
            blocks: list[dict[str, Any]] = [{"type": "text", "text": content}] if content else []
            blocks += [
                {
                    "type": "tool_use",
                    "id": tc["id"],
                    "name": tc["name"],
                    "input": _tool_input(tc["arguments"]),
                }
                for tc in m["tool_calls"]
            ]
            add("assistant", blocks, index)
        else:
            add("user" if role != "assistant" else "assistant", content, index)
    if not system:
        return None, turns
    if any(i in marked for i, _ in system):
        blocks = []
        for i, text in system:
            block: dict[str, Any] = {"type": "text", "text": text}
            if i in marked:
                block["cache_control"] = marked[i]
            blocks.append(block)
        return blocks, turns
    return "\n\n".join(text for _, text in system), turns


def anthropic_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for t in tools:
        fn = t.get("function", t)
        tool = {
            "name": fn["name"],
            "input_schema": fn.get("parameters") or {"type": "object", "properties": {}},
        }
        if fn.get("description"):
            tool["description"] = fn["description"]
        if isinstance(t.get("cache_control"), dict):
            tool["cache_control"] = t["cache_control"]
        out.append(tool)
    return out


def anthropic_body(call: ApiCall) -> dict[str, Any]:
    system, turns = anthropic_messages_wire(call.messages, call.cache_marks)
    body: dict[str, Any] = {
        "model": call.model,
        "messages": turns,
        "max_tokens": call.max_tokens,
        "stream": call.stream,
    }
    if system is not None:
        body["system"] = system
    if call.temperature is not None:
        body["temperature"] = call.temperature
    if call.tools:
        body["tools"] = anthropic_tools(function_tools(call.tools))
    body.update(THINK_FIELDS["anthropic"][call.think])
    body.update(call.extra_body)
    return body


class AnthropicReader:
    terminal = "message_stop"

    def __init__(self) -> None:
        self.done = False
        self.error: str | None = None
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tools: dict[int, dict[str, str]] = {}
        self.stop_reason: str | None = None
        self.usage: dict[str, Any] = {}
        self.x_sim: dict[str, Any] | None = None

    def event(self, ev: SseEvent) -> bool:
        obj = load_event(ev.data)
        kind = obj.get("type") or ev.event
        if kind == "content_block_delta":
            delta = obj.get("delta") or {}
            dtype = delta.get("type")
            if dtype == "text_delta":
                text = delta.get("text")
                if text:
                    self.content.append(text)
                    return True
            elif dtype == "thinking_delta":
                text = delta.get("thinking")
                if text:
                    self.reasoning.append(text)
                    return True
            elif dtype == "input_json_delta":
                part = delta.get("partial_json")
                entry = self.tools.get(obj.get("index", -1))
                if part and entry is not None:
                    entry["arguments"] += part
                    return True
            return False
        if kind == "content_block_start":
            return self._block_start(obj.get("index", len(self.tools)), obj.get("content_block") or {})
        if kind == "message_delta":
            delta = obj.get("delta") or {}
            if delta.get("stop_reason"):
                self.stop_reason = delta["stop_reason"]
            self._merge_usage(obj.get("usage"))
            if obj.get("x_sim"):
                self.x_sim = obj["x_sim"]
            return False
        if kind == "message_start":
            msg = obj.get("message") or {}
            self._merge_usage(msg.get("usage"))
            return False
        if kind == "message_stop":
            self.done = True
            return False
        if kind == "error" or ev.event == "error":
            self.error = stream_error(obj)
        return False  # ping, content_block_stop, signature deltas, future event types

    def _block_start(self, index: int, block: dict[str, Any]) -> bool:
        btype = block.get("type")
        if btype == "tool_use":
            # The name arrives here, as it does in OpenAI's first tool-call delta: a token.
            self.tools[index] = {"id": block.get("id", ""), "name": block.get("name", ""), "arguments": ""}
            return True
        if btype == "text" and block.get("text"):
            self.content.append(block["text"])
            return True
        if btype == "thinking" and block.get("thinking"):
            self.reasoning.append(block["thinking"])
            return True
        return False

    def _merge_usage(self, usage: Mapping[str, Any] | None) -> None:
        # message_start carries the prompt counts, message_delta the final output count.
        if usage:
            self.usage.update((k, v) for k, v in usage.items() if v is not None)

    def body(self, obj: dict[str, Any]) -> None:
        self.done = True
        for i, block in enumerate(obj.get("content") or ()):
            btype = block.get("type")
            if btype == "text":
                self.content.append(block.get("text", ""))
            elif btype == "thinking":
                self.reasoning.append(block.get("thinking", ""))
            elif btype == "tool_use":
                args = orjson.dumps(block.get("input", {})).decode()
                self.tools[i] = {"id": block.get("id", ""), "name": block.get("name", ""), "arguments": args}
        self.stop_reason = obj.get("stop_reason")
        self._merge_usage(obj.get("usage"))
        self.x_sim = obj.get("x_sim")

    def fill(self, res: RequestRecord) -> None:
        tool_calls = [self.tools[i] for i in sorted(self.tools)]
        for tc in tool_calls:
            tc["arguments"] = tc["arguments"] or "{}"
        if self.content or self.reasoning or tool_calls or self.done:
            res.message = reply_message(self.content, self.reasoning, tool_calls)
        reason = self.stop_reason
        res.finish = _ANTHROPIC_FINISH.get(reason, reason) if reason else None
        res.raw_usage = self.usage or None
        res.x_sim = self.x_sim
        res.usage = parse_usage({"usage": self.usage})


_ANTHROPIC_HEADERS = {**OPENAI_HEADERS, "anthropic-version": "2023-06-01"}


async def anthropic_messages(
    client: httpx.AsyncClient, call: ApiCall, on_state: OnState = None, rec: RequestRecord | None = None
) -> RequestRecord:
    """POST /v1/messages."""
    headers = {**_ANTHROPIC_HEADERS, "accept": "text/event-stream" if call.stream else "application/json"}
    return await exchange(
        client, call, "/v1/messages", anthropic_body(call), headers, AnthropicReader(), on_state, rec
    )
