"""OpenAI chat completions: request body and stream reader."""

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
from replay.engine.sse import SseEvent
from replay.engine.usage import parse_usage
from replay.metrics.record import RequestRecord

# --- OpenAI chat completions ----------------------------------------------------------


def openai_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Neutral -> OpenAI wire; only assistant turns with tool calls or reasoning change."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if "inline" in m or m.get("role") == "developer":
            # Trace-only marks; `developer` goes as `system`, which every chat template knows.
            m = {k: v for k, v in m.items() if k != "inline"}
            if m.get("role") == "developer":
                m["role"] = "system"
        if m.get("role") != "assistant" or ("tool_calls" not in m and "reasoning" not in m):
            out.append(m)
            continue
        wire = {k: v for k, v in m.items() if k not in ("tool_calls", "reasoning")}
        if m.get("tool_calls"):
            wire["tool_calls"] = [
                {
                    "id": tc["id"],
                    "type": "function",
                    "function": {"name": tc["name"], "arguments": tc["arguments"]},
                }
                for tc in m["tool_calls"]
            ]
        out.append(wire)
    return out


def function_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The function tools only: a Responses trace also holds tool types (web_search, namespace,
    custom) that chat completions and Anthropic messages cannot express."""
    if all(t.get("type", "function") == "function" for t in tools):
        return tools
    return [t for t in tools if t.get("type", "function") == "function"]


def openai_body(call: ApiCall) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": call.model,
        "messages": openai_messages(call.messages),
        "max_tokens": call.max_tokens,
        "stream": call.stream,
    }
    if call.stream:
        body["stream_options"] = {"include_usage": True}
    if call.temperature is not None:
        body["temperature"] = call.temperature
    if call.tools:
        body["tools"] = function_tools(call.tools)
    body.update(THINK_FIELDS["openai"][call.think])
    body.update(call.extra_body)
    return body


class OpenAIReader:
    terminal = "[DONE]"

    def __init__(self) -> None:
        self.done = False
        self.error: str | None = None
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tools: dict[int, dict[str, str]] = {}
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None
        self.timings: dict[str, Any] | None = None
        self.meta_info: dict[str, Any] | None = None
        self.x_sim: dict[str, Any] | None = None

    def _tail(self, obj: dict[str, Any]) -> None:
        # Usage, timings and x_sim may ride on any chunk; the last one that carries them wins.
        usage = obj.get("usage")
        if usage:
            self.usage = usage
        timings = obj.get("timings")
        if timings:
            self.timings = timings
        meta = obj.get("meta_info")
        if meta:
            self.meta_info = meta
        x_sim = obj.get("x_sim")
        if x_sim:
            self.x_sim = x_sim

    def event(self, ev: SseEvent) -> bool:
        data = ev.data
        if data == b"[DONE]":
            self.done = True
            return False
        obj = load_event(data)
        if ev.event == "error" or ("error" in obj and not obj.get("choices")):
            self.error = stream_error(obj)
            return False
        if "usage" in obj or "timings" in obj or "x_sim" in obj or "meta_info" in obj:
            self._tail(obj)
        token = False
        for choice in obj.get("choices") or ():
            delta = choice.get("delta")
            if delta:
                text = delta.get("content")
                if text:
                    self.content.append(text)
                    token = True
                text = delta.get("reasoning_content") or delta.get("reasoning")
                if text:
                    self.reasoning.append(text)
                    token = True
                calls = delta.get("tool_calls")
                if calls:
                    self._tool_deltas(calls)
                    token = True
            reason = choice.get("finish_reason")
            if reason:
                self.finish = reason
        return token

    def _tool_deltas(self, calls: list[dict[str, Any]]) -> None:
        for pos, tc in enumerate(calls):
            index = tc.get("index", pos)
            entry = self.tools.get(index)
            if entry is None:
                entry = self.tools[index] = {"id": "", "name": "", "arguments": ""}
            if tc.get("id"):
                entry["id"] = tc["id"]
            fn = tc.get("function") or {}
            name = fn.get("name")
            # Most servers send the name once; some repeat it on every delta, a few split it.
            if name and name != entry["name"]:
                entry["name"] += name
            args = fn.get("arguments")
            if args:
                entry["arguments"] += args

    def body(self, obj: dict[str, Any]) -> None:
        self.done = True
        self._tail(obj)
        choices = obj.get("choices") or [{}]
        choice = choices[0]
        msg = choice.get("message") or {}
        if msg.get("content"):
            self.content.append(msg["content"])
        reasoning = msg.get("reasoning_content") or msg.get("reasoning")
        if reasoning:
            self.reasoning.append(reasoning)
        for i, tc in enumerate(msg.get("tool_calls") or ()):
            fn = tc.get("function") or {}
            self.tools[i] = {
                "id": tc.get("id", ""),
                "name": fn.get("name", ""),
                "arguments": fn.get("arguments", ""),
            }
        self.finish = choice.get("finish_reason")

    def fill(self, res: RequestRecord) -> None:
        tool_calls = [self.tools[i] for i in sorted(self.tools)]
        if self.content or self.reasoning or tool_calls or self.done:
            res.message = reply_message(self.content, self.reasoning, tool_calls)
        res.finish = self.finish
        res.raw_usage = self.usage
        res.timings = self.timings
        res.x_sim = self.x_sim
        res.usage = parse_usage({"usage": self.usage, "timings": self.timings, "meta_info": self.meta_info})


OPENAI_HEADERS = {"content-type": "application/json", "accept-encoding": "identity", "connection": "close"}


async def openai_chat(
    client: httpx.AsyncClient, call: ApiCall, on_state: OnState = None, rec: RequestRecord | None = None
) -> RequestRecord:
    """POST /v1/chat/completions."""
    headers = {**OPENAI_HEADERS, "accept": "text/event-stream" if call.stream else "application/json"}
    return await exchange(
        client, call, "/v1/chat/completions", openai_body(call), headers, OpenAIReader(), on_state, rec
    )
