"""Anthropic messages: request body (converted from neutral messages) and stream reader."""

from __future__ import annotations

from typing import Any

import httpx
import orjson

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
from replay.engine.openai import OPENAI_HEADERS, function_tools
from replay.engine.sse import SseEvent
from replay.engine.usage import COUNT_PATHS, parse_usage
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
                    "input": _tool_input(tc.get("arguments") or ""),
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


class AnthropicReader(ReplyParts):
    """Messages events and bodies, every field read through `ReplyFields` (a wrong type is
    `BadShape`: the request's `bad_payload`)."""

    terminal = "message_stop"

    def __init__(self) -> None:
        super().__init__()
        self.stop_reason: str | None = None
        self.usage: dict[str, Any] = {}
        self.x_sim: dict[str, Any] | None = None

    def event(self, ev: SseEvent) -> bool:
        obj = load_event(ev.data)
        raw = obj.raw
        if raw.get("type") == "content_block_delta":  # most of a stream: one text delta, checked inline
            delta_raw = raw.get("delta")
            if type(delta_raw) is dict and delta_raw.get("type") == "text_delta":
                text = delta_raw.get("text")
                if type(text) is str:
                    if text:
                        self.content.append(text)
                        return True
                    return False
        kind = obj.text("type") or ev.event
        if kind == "content_block_delta":
            delta = obj.obj("delta")
            if delta is None:
                return False
            dtype = delta.text("type")
            if dtype == "text_delta":
                text = delta.text("text")
                if text:
                    self.content.append(text)
                    return True
            elif dtype == "thinking_delta":
                text = delta.text("thinking")
                if text:
                    self.reasoning.append(text)
                    return True
            elif dtype == "input_json_delta":
                part = delta.text("partial_json")
                index = obj.integer("index")
                entry = self.tools.get(-1 if index is None else index)
                if part and entry is not None:
                    entry["arguments"] += part
                    return True
            return False
        if kind == "content_block_start":
            index = obj.integer("index")
            block = obj.obj("content_block")
            if block is None:
                return False
            return self._block_start(len(self.tools) if index is None else index, block)
        if kind == "message_delta":
            delta = obj.obj("delta")
            reason = delta.text("stop_reason") if delta is not None else None
            if reason:
                self.stop_reason = reason
            self._merge_usage(obj.obj("usage"))
            x_sim = obj.obj("x_sim")
            if x_sim is not None and x_sim.raw:
                self.x_sim = check_modelled(x_sim)
            return False
        if kind == "message_start":
            msg = obj.obj("message")
            if msg is not None:
                self._merge_usage(msg.obj("usage"))
            return False
        if kind == "message_stop":
            self.done = True
            return False
        if kind == "error" or ev.event == "error":
            self.error = stream_error(obj.raw)
        return False  # ping, content_block_stop, signature deltas, future event types

    def _block_start(self, index: int, block: ReplyFields) -> bool:
        btype = block.text("type")
        if btype == "tool_use":
            # The name arrives here, as it does in OpenAI's first tool-call delta: a token.
            self.tools[index] = {
                "id": block.text("id") or "",
                "name": block.text("name") or "",
                "arguments": "",
            }
            return True
        if btype == "text":
            text = block.text("text")
            if text:
                self.content.append(text)
                return True
        if btype == "thinking":
            text = block.text("thinking")
            if text:
                self.reasoning.append(text)
                return True
        return False

    def _merge_usage(self, usage: ReplyFields | None) -> None:
        # message_start carries the prompt counts, message_delta the final output count.
        if usage:
            check_counts({"usage": usage.raw}, COUNT_PATHS, usage.path.rpartition(".")[0])
            self.usage.update((k, v) for k, v in usage.raw.items() if v is not None)

    def body(self, obj: ReplyFields) -> None:
        self.done = True
        for i, block in enumerate(obj.objects("content")):
            btype = block.text("type")
            if btype == "text":
                self.content.append(block.text("text") or "")
            elif btype == "thinking":
                self.reasoning.append(block.text("thinking") or "")
            elif btype == "tool_use":
                block_input = block.obj("input")
                args = orjson.dumps(block_input.raw if block_input is not None else {}).decode()
                self.tools[i] = {
                    "id": block.text("id") or "",
                    "name": block.text("name") or "",
                    "arguments": args,
                }
        self.stop_reason = obj.text("stop_reason")
        self._merge_usage(obj.obj("usage"))
        x_sim = obj.obj("x_sim")
        self.x_sim = check_modelled(x_sim) if x_sim is not None else None

    def fill(self, res: RequestRecord) -> None:
        tool_calls = self.tool_calls()
        for tc in tool_calls:
            tc["arguments"] = tc["arguments"] or "{}"
        self.fill_message(res, tool_calls)
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
