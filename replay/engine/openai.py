"""OpenAI chat completions: request body and stream reader."""

from __future__ import annotations

from typing import Any

import httpx

from replay.engine.decode import Fields, check_counts, check_modelled
from replay.engine.exchange import (
    THINK_FIELDS,
    ApiCall,
    OnState,
    ReplyParts,
    exchange,
    load_event,
    stream_error,
)
from replay.engine.sse import SseEvent
from replay.engine.usage import COUNT_PATHS, parse_usage
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
                    "function": {"name": tc["name"], "arguments": tc.get("arguments", "")},
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


_TAIL_KEYS = frozenset(("usage", "timings", "meta_info", "x_sim", "error"))


def _plain_content(raw: dict[str, Any]) -> str | None:
    """The text of a chunk that is one choice with a content-only delta and no finish, else None.

    Most of a stream is such chunks; reading them without building `Fields` keeps the checked
    reader as fast as the unchecked one was. Every type is still checked: None sends the chunk
    down the general path, which names what is wrong.
    """
    choices = raw.get("choices")
    if type(choices) is not list or len(choices) != 1 or not _TAIL_KEYS.isdisjoint(raw):
        return None
    choice = choices[0]
    if type(choice) is not dict or choice.get("finish_reason") is not None:
        return None
    delta = choice.get("delta")
    if type(delta) is not dict or len(delta) != 1:
        return None
    text = delta.get("content")
    return text if type(text) is str else None


class OpenAIReader(ReplyParts):
    """Chat-completions chunks and bodies, every field read through `Fields` (a wrong type is
    `BadShape`: the request's `bad_payload`)."""

    terminal = "[DONE]"

    def __init__(self) -> None:
        super().__init__()
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None
        self.timings: dict[str, Any] | None = None
        self.meta_info: dict[str, Any] | None = None
        self.x_sim: dict[str, Any] | None = None

    def _tail(self, obj: Fields) -> None:
        # Usage, timings and x_sim may ride on any chunk; the last one that carries them wins.
        usage = obj.obj("usage")
        timings = obj.obj("timings")
        meta = obj.obj("meta_info")
        check_counts(
            {
                "usage": obj.value("usage"),
                "timings": obj.value("timings"),
                "meta_info": obj.value("meta_info"),
            },
            COUNT_PATHS,
            obj.path,
        )
        if usage and usage.raw:
            self.usage = usage.raw
        if timings and timings.raw:
            self.timings = timings.raw
        if meta and meta.raw:
            self.meta_info = meta.raw
        x_sim = obj.obj("x_sim")
        if x_sim and x_sim.raw:
            self.x_sim = check_modelled(x_sim)

    def event(self, ev: SseEvent) -> bool:
        data = ev.data
        if data == b"[DONE]":
            self.done = True
            return False
        obj = load_event(data)
        if ev.event == "message":
            text = _plain_content(obj.raw)
            if text is not None:  # the common token chunk, its every field checked inline
                if text:
                    self.content.append(text)
                    return True
                return False
        if ev.event == "error" or ("error" in obj and not obj.value("choices")):
            self.error = stream_error(obj.raw)
            return False
        if "usage" in obj or "timings" in obj or "x_sim" in obj or "meta_info" in obj:
            self._tail(obj)
        token = False
        for choice in obj.objects("choices"):
            delta = choice.obj("delta")
            if delta is not None:
                text = delta.text("content")
                if text:
                    self.content.append(text)
                    token = True
                text = delta.text("reasoning_content") or delta.text("reasoning")
                if text:
                    self.reasoning.append(text)
                    token = True
                if delta.value("tool_calls"):
                    self._tool_deltas(delta)
                    token = True
            reason = choice.text("finish_reason")
            if reason:
                self.finish = reason
        return token

    def _tool_deltas(self, delta: Fields) -> None:
        for pos, tc in enumerate(delta.objects("tool_calls")):
            index = tc.integer("index")
            if index is None:
                index = pos
            entry = self.tools.get(index)
            if entry is None:
                entry = self.tools[index] = {"id": "", "name": "", "arguments": ""}
            call_id = tc.text("id")
            if call_id:
                entry["id"] = call_id
            fn = tc.obj("function")
            if fn is None:
                continue
            name = fn.text("name")
            # Most servers send the name once; some repeat it on every delta, a few split it.
            if name and name != entry["name"]:
                entry["name"] += name
            args = fn.text("arguments")
            if args:
                entry["arguments"] += args

    def body(self, obj: Fields) -> None:
        self.done = True
        self._tail(obj)
        choice = obj.first_object("choices")
        if choice is None:
            return
        msg = choice.obj("message")
        if msg is not None:
            content = msg.text("content")
            if content:
                self.content.append(content)
            reasoning = msg.text("reasoning_content") or msg.text("reasoning")
            if reasoning:
                self.reasoning.append(reasoning)
            for i, tc in enumerate(msg.objects("tool_calls")):
                fn = tc.obj("function")
                self.tools[i] = {
                    "id": tc.text("id") or "",
                    "name": (fn.text("name") if fn else None) or "",
                    "arguments": (fn.text("arguments") if fn else None) or "",
                }
        self.finish = choice.text("finish_reason")

    def fill(self, res: RequestRecord) -> None:
        tool_calls = self.tool_calls()
        self.fill_message(res, tool_calls)
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
