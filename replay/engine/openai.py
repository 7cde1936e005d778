"""OpenAI chat completions: request body and stream reader."""

from __future__ import annotations

from typing import Any

import httpx
import orjson

from replay.engine.decode import ReplyFields, as_object, check_counts, check_modelled, load_json
from replay.engine.exchange import (
    THINK_FIELDS,
    ApiCall,
    OnState,
    ReplyParts,
    exchange,
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


_PLAIN_KEYS = frozenset(("content", "reasoning_content", "reasoning"))


def _plain_delta(raw: dict[str, Any]) -> tuple[str, str] | None:
    """(key, text) of a chunk that is one choice whose delta holds only its content or only its
    reasoning (`reasoning_content` or `reasoning`), with no finish, else None.

    Most of a stream is such chunks; reading them without building `ReplyFields` keeps the checked
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
    for key, text in delta.items():
        if key in _PLAIN_KEYS and type(text) is str:
            return key, text
    return None


def _plain_text(middle: bytes) -> str | None:
    """The text of a JSON string's inside when it needs no unescaping (no quote, backslash or
    control character) and is valid UTF-8, else None. Only printable text is taken: what
    `isprintable` refuses (controls, and a few spaces and marks JSON would allow) takes the
    general path, which is never wrong, only slower."""
    try:
        text = middle.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if text.isprintable() and '"' not in text and "\\" not in text:
        return text
    return None


_LEARN_TRIES = 3  # chunks a stream may spend learning its content chunks' shape (each: 2 decodes)


class OpenAIReader(ReplyParts):
    """Chat-completions chunks and bodies, every field read through `ReplyFields` (a wrong type is
    `BadShape`: the request's `bad_payload`).

    Most of a stream is content (or reasoning) chunks whose bytes differ only in the text:
    `{...,"delta":{"content":"` + text + `"},"finish_reason":null}]}`. Once one of them has been
    decoded, its bytes before and after the text (`_head`, `_foot`) are kept if they pass a proof:
    with the text replaced by "Q" and then by "Z", both decode and read as plain content (the same
    key) "Q" and "Z". Then the quote ending `_head` opens a string (a letter after a closed string
    is not JSON), that string is the text (its value alone changed between the two), and any chunk
    that is `_head` + text + `_foot`, where the text needs no unescaping, is the same JSON with
    that text: it is read without decoding the chunk. Anything else takes the general path, and a
    stream that moves from reasoning to content learns the new shape.
    """

    terminal = "[DONE]"

    def __init__(self) -> None:
        super().__init__()
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None
        self.timings: dict[str, Any] | None = None
        self.meta_info: dict[str, Any] | None = None
        self.x_sim: dict[str, Any] | None = None
        self._head = b""  # a content chunk's bytes before its text; empty: none learnt
        self._foot = b""  # and after it
        self._into = self.content  # where the learnt shape's text goes: content or reasoning
        self._learn = _LEARN_TRIES

    def _tail(self, obj: ReplyFields) -> None:
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

    def _learn_shape(self, data: bytes, key: str, text: str) -> None:
        """Keep `data`'s bytes around its `key` text as the stream's plain shape, if they pass the
        proof in the class docstring (a try is spent only on the proof)."""
        if _plain_text(text.encode()) is None:
            return
        quoted = b'"' + text.encode() + b'"'
        at = data.rfind(quoted)
        if at < 0:
            return
        self._learn -= 1
        head = data[: at + 1]
        foot = data[at + len(quoted) - 1 :]
        for mark in ("Q", "Z"):
            try:
                raw = orjson.loads(head + mark.encode() + foot)
            except orjson.JSONDecodeError:
                return
            if type(raw) is not dict or _plain_delta(raw) != (key, mark):
                return
        self._head = head
        self._foot = foot
        self._into = self.content if key == "content" else self.reasoning

    def event(self, ev: SseEvent) -> bool:
        data = ev.data
        head = self._head
        fits = False
        if head and data.startswith(head) and data.endswith(self._foot) and ev.event == "message":
            end = len(data) - len(self._foot)
            if end >= len(head):
                fits = True
                text = _plain_text(data[len(head) : end])
                if text is not None:  # a chunk of the learnt shape
                    if text:
                        self._into.append(text)
                        return True
                    return False
        if data == b"[DONE]":
            self.done = True
            return False
        raw = load_json(data)
        if ev.event == "message" and type(raw) is dict:
            plain = _plain_delta(raw)
            if plain is not None:  # the common token chunk, its every field checked inline
                key, text = plain
                if self._learn and not fits:  # none learnt yet, or the shape changed
                    self._learn_shape(data, key, text)
                if text:
                    (self.content if key == "content" else self.reasoning).append(text)
                    return True
                return False
        obj = as_object(raw, data)
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

    def _tool_deltas(self, delta: ReplyFields) -> None:
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

    def body(self, obj: ReplyFields) -> None:
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
