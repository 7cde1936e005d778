"""Wire -> neutral: what an agent sent (OpenAI or Anthropic body) and what it got back.

The other direction lives in `replay.engine.apis` (`openai_messages`, `anthropic_messages_wire`);
this module is its inverse, so a recorded request replays as the same message list. Replies are
read by the engine's own stream readers fed through a tap, so recording and replay interpret a
server's bytes identically.

Normalisation that keeps "the agent resent its reply" recognisable: an assistant's missing content
is "", empty `tool_calls` are dropped, and Anthropic tool inputs (objects on the wire) become compact
JSON text both in requests and in replies. Reasoning is kept as `reasoning`, which replay never
resends. Parts that are not text (images, documents) are dropped: the trace format has no place for
them, and `dropped_parts` counts them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from replay.engine.apis import APIS
from replay.engine.exchange import BadPayload, Reader, error_text
from replay.engine.sse import SseParser
from replay.engine.usage import Usage
from replay.metrics.record import RequestRecord
from replay.trace.model import Message

_CACHE = "_cache_control"  # where a message's cache mark waits until it becomes an index

# Body fields stored in their own place in the trace (or deliberately not stored: `user` carries
# OpenAI's user id); everything else, Anthropic's `metadata` included, goes to `params.extra`.
_NOT_EXTRA = {
    "model",
    "messages",
    "system",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "stream",
    "stream_options",
    "tools",
    "user",
}
_ERROR_BODY_MAX = 64 * 1024
_REPLY_BODY_MAX = 256 * 1024 * 1024


class WireError(ValueError):
    """The body is not a request this module can express as neutral messages."""


def canonical_arguments(arguments: Any) -> str:
    """Tool-call arguments as compact JSON text (Anthropic `input` objects, or JSON text)."""
    if isinstance(arguments, str):
        try:
            return orjson.dumps(orjson.loads(arguments)).decode()
        except orjson.JSONDecodeError:
            return arguments
    return orjson.dumps(arguments if arguments is not None else {}).decode()


@dataclass(slots=True)
class Parsed:
    """A request body in neutral form."""

    api: str
    model: str
    messages: list[Message]
    params: dict[str, Any]
    user_id: str | None = None  # Anthropic metadata.user_id: scopes session inference
    dropped_parts: int = 0
    previous_response_id: str | None = None  # Responses API: the recorder resolves it
    has_instructions: bool = False  # Responses API: messages[0] is `instructions`


def _text_parts(content: Any, counter: list[int]) -> str | list[str]:
    """OpenAI/Anthropic content (text or a list of parts) as neutral content."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise WireError("message content must be text or a list of parts")
    texts: list[str] = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
            texts.append(str(part.get("text", "")))
        else:
            counter[0] += 1
    if len(texts) == 1:
        return texts[0]
    return texts if texts else ""


def openai_to_neutral(messages: Any, counter: list[int] | None = None) -> list[Message]:
    """OpenAI chat messages -> neutral messages."""
    if not isinstance(messages, list):
        raise WireError("'messages' must be a list")
    counter = counter if counter is not None else [0]
    out: list[Message] = []
    for m in messages:
        if not isinstance(m, dict):
            raise WireError("each message must be an object")
        role = m.get("role")
        if role == "developer":
            role = "system"
        if role in ("system", "user"):
            out.append({"role": role, "content": _text_parts(m.get("content"), counter)})
        elif role == "assistant":
            msg: Message = {"role": "assistant", "content": _text_parts(m.get("content"), counter)}
            calls = [_openai_call(tc) for tc in m.get("tool_calls") or ()]
            if calls:
                msg["tool_calls"] = calls
            reasoning = m.get("reasoning_content") or m.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                msg["reasoning"] = reasoning
            out.append(msg)
        elif role in ("tool", "function"):
            call_id = m.get("tool_call_id") if role == "tool" else m.get("name")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": str(call_id or ""),
                    "content": _text_parts(m.get("content"), counter),
                }
            )
        else:
            raise WireError(f"unknown message role {role!r}")
    return out


def _openai_call(tc: Any) -> dict[str, str]:
    if not isinstance(tc, dict):
        raise WireError("each tool call must be an object")
    fn = tc.get("function") or {}
    args = fn.get("arguments", "")
    return {
        "id": str(tc.get("id", "")),
        "name": str(fn.get("name", "")),
        "arguments": args if isinstance(args, str) else canonical_arguments(args),
    }


def anthropic_to_neutral(system: Any, messages: Any, counter: list[int] | None = None) -> list[Message]:
    """Anthropic `system` + `messages` -> neutral messages (one system message per system block)."""
    if not isinstance(messages, list):
        raise WireError("'messages' must be a list")
    counter = counter if counter is not None else [0]
    out: list[Message] = []
    if isinstance(system, str):
        if system:
            out.append({"role": "system", "content": system})
    elif isinstance(system, list):
        for block in system:
            if isinstance(block, dict) and block.get("type") == "text":
                msg: Message = {"role": "system", "content": str(block.get("text", ""))}
                if isinstance(block.get("cache_control"), dict):
                    msg[_CACHE] = block["cache_control"]
                out.append(msg)
            else:
                counter[0] += 1
    elif system is not None:
        raise WireError("'system' must be text or a list of blocks")
    for m in messages:
        if not isinstance(m, dict):
            raise WireError("each message must be an object")
        role = m.get("role")
        if role == "user":
            out.extend(anthropic_user_turn(m.get("content"), counter, marks=True))
        elif role == "assistant":
            out.append(anthropic_assistant_turn(m.get("content"), counter, marks=True))
        elif role == "system":
            # Claude Code puts entries of its own (agent and skill lists) here: kept in place.
            for msg in anthropic_user_turn(m.get("content"), counter, marks=True):
                out.append({**msg, "role": "system", "inline": True})
        else:
            raise WireError(f"unknown message role {role!r}")
    return out


def take_cache_marks(messages: list[Message]) -> list[dict[str, Any]]:
    """The messages' cache marks as `params.cache_control` entries (index, value), taken off them:
    a mark moves to the newest turn with every request, so on the message it would break the
    delta encoding of every turn."""
    marks = []
    for i, m in enumerate(messages):
        if _CACHE in m:
            marks.append({"message": i, "value": m.pop(_CACHE)})
    return marks


def anthropic_user_turn(content: Any, counter: list[int], marks: bool = False) -> list[Message]:
    """One user turn: tool results become tool messages, text blocks user messages, in order.

    With `marks`, a block's `cache_control` ends the message it is in and rides on it under
    `_CACHE` (see `take_cache_marks`)."""
    if content is None or isinstance(content, str):
        return [{"role": "user", "content": content or ""}]
    if not isinstance(content, list):
        raise WireError("user content must be text or a list of blocks")
    out: list[Message] = []
    texts: list[str] = []

    def flush() -> None:
        if texts:
            out.append({"role": "user", "content": texts[0] if len(texts) == 1 else list(texts)})
            texts.clear()

    for block in content:
        btype = block.get("type") if isinstance(block, dict) else None
        mark = block.get("cache_control") if marks and isinstance(block, dict) else None
        if btype == "text":
            texts.append(str(block.get("text", "")))
            if isinstance(mark, dict):
                flush()
                out[-1][_CACHE] = mark
        elif btype == "tool_result":
            flush()
            result = _text_parts(block.get("content"), counter)
            out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")), "content": result})
            if isinstance(mark, dict):
                out[-1][_CACHE] = mark
        elif isinstance(block, str):
            texts.append(block)
        else:
            counter[0] += 1
    flush()
    return out or [{"role": "user", "content": ""}]


def anthropic_assistant_turn(content: Any, counter: list[int], marks: bool = False) -> Message:
    """Text blocks join with no separator, as the stream reader joins text deltas."""
    if content is None or isinstance(content, str):
        return {"role": "assistant", "content": content or ""}
    if not isinstance(content, list):
        raise WireError("assistant content must be text or a list of blocks")
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, str]] = []
    for block in content:
        btype = block.get("type") if isinstance(block, dict) else None
        if btype == "text":
            texts.append(str(block.get("text", "")))
        elif btype == "thinking":
            reasoning.append(str(block.get("thinking", "")))
        elif btype == "tool_use":
            calls.append(
                {
                    "id": str(block.get("id", "")),
                    "name": str(block.get("name", "")),
                    "arguments": canonical_arguments(block.get("input")),
                }
            )
        elif btype == "redacted_thinking":
            continue
        else:
            counter[0] += 1
    msg: Message = {"role": "assistant", "content": "".join(texts)}
    if calls:
        msg["tool_calls"] = calls
    if reasoning:
        msg["reasoning"] = "".join(reasoning)
    last = content[-1] if content else None
    if marks and isinstance(last, dict) and isinstance(last.get("cache_control"), dict):
        msg[_CACHE] = last["cache_control"]
    return msg


def anthropic_tools_to_openai(tools: Any) -> list[dict[str, Any]]:
    """Anthropic tool definitions as the OpenAI function tools the trace stores."""
    out = []
    for t in tools or ():
        if not isinstance(t, dict):
            continue
        fn: dict[str, Any] = {"name": str(t.get("name", t.get("type", "")))}
        if t.get("description"):
            fn["description"] = t["description"]
        fn["parameters"] = t.get("input_schema") or {"type": "object", "properties": {}}
        tool: dict[str, Any] = {"type": "function", "function": fn}
        if isinstance(t.get("cache_control"), dict):
            tool["cache_control"] = t["cache_control"]
        out.append(tool)
    return out


def parse_request(api: str, body: bytes) -> Parsed:
    """A request body as neutral messages and trace params; raises WireError if it cannot be."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise WireError(f"request body is not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise WireError("request body is not a JSON object")
    counter = [0]
    cache_marks: list[dict[str, Any]] = []
    if api == "openai-responses":
        from replay.record.responses import parse_responses  # it builds on this module

        parsed, previous = parse_responses(obj)
        parsed.previous_response_id = previous
        return parsed
    if api == "openai":
        messages = openai_to_neutral(obj.get("messages"), counter)
        tools = obj.get("tools") or None
        max_tokens = obj.get("max_tokens", obj.get("max_completion_tokens"))
        user_id = None
    elif api == "anthropic":
        messages = anthropic_to_neutral(obj.get("system"), obj.get("messages"), counter)
        cache_marks = take_cache_marks(messages)
        tools = anthropic_tools_to_openai(obj.get("tools")) or None
        max_tokens = obj.get("max_tokens")
        meta = obj.get("metadata")
        user_id = (
            meta.get("user_id") if isinstance(meta, dict) and isinstance(meta.get("user_id"), str) else None
        )
    else:
        raise WireError(f"unknown api {api!r}")
    if not messages:
        raise WireError("request has no messages")
    params: dict[str, Any] = {"stream": bool(obj.get("stream", False))}
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool):
        params["max_tokens"] = max_tokens
    if isinstance(obj.get("temperature"), int | float):
        params["temperature"] = obj["temperature"]
    if tools:
        params["tools"] = tools
    if cache_marks:
        params["cache_control"] = cache_marks
    extra = {k: v for k, v in obj.items() if k not in _NOT_EXTRA}
    if extra:
        params["extra"] = extra
    return Parsed(
        api=api,
        model=str(obj.get("model") or "default"),
        messages=messages,
        params=params,
        user_id=user_id,
        dropped_parts=counter[0],
    )


# --- replies ---------------------------------------------------------------------------


@dataclass(slots=True)
class TapResult:
    status: str = "ok"
    error: str | None = None
    http_status: int | None = None
    message: Message | None = None
    finish: str | None = None
    usage: Usage = field(default_factory=Usage)
    raw_usage: dict[str, Any] | None = None
    t_first_token: int | None = None
    n_events: int = 0
    response_id: str | None = None  # Responses API: what a later previous_response_id names


class ReplyTap:
    """Reads a reply's bytes as they pass through, after they were forwarded; never raises.

    SSE replies go through the engine's `SseParser` and the API's reader from the engine's
    registry, JSON replies through the same reader's `body`; error replies keep their first 64 KiB
    for the error text. Chunks are stamped by the caller as they arrived, so first/last token
    times are the wire's.
    """

    def __init__(self, api: str) -> None:
        self.api = api
        self.reader: Reader = APIS[api].reader()
        self.parser = SseParser()
        self.status: int | None = None
        self.sse = False
        self.body = bytearray()
        self.malformed: str | None = None
        self.t_first_token: int | None = None
        self.n_events = 0
        self._truncated = False

    def start(self, status: int, content_type: str) -> None:
        self.status = status
        self.sse = status < 400 and content_type.startswith("text/event-stream")

    def feed(self, chunk: bytes, now_ns: int | None = None) -> None:
        if not self.sse:
            limit = _ERROR_BODY_MAX if (self.status or 0) >= 400 else _REPLY_BODY_MAX
            room = limit - len(self.body)
            if room > 0:
                self.body += chunk[:room]
            self._truncated |= len(chunk) > room
            return
        if self.malformed is not None or self.reader.done or self.reader.error is not None:
            return
        self._events(self.parser.feed, chunk, now_ns if now_ns is not None else time.perf_counter_ns())

    def _events(self, parse: Any, *args: Any) -> None:
        """Parse and read events; JSON that is not the protocol's marks the reply malformed."""
        now = args[-1]
        try:
            for ev in parse(*args[:-1]):
                self.n_events += 1
                if self.reader.done or self.reader.error is not None:
                    continue
                if self.reader.event(ev) and self.t_first_token is None:
                    self.t_first_token = now
        except BadPayload as exc:
            self.malformed = str(exc)
        except (AttributeError, TypeError, KeyError, ValueError) as exc:
            self.malformed = f"unexpected event shape ({type(exc).__name__}: {exc})"

    def finish(self) -> TapResult:
        """The reply as the agent received it, and how the exchange ended as far as the bytes tell.

        `status`: ok, http_error, malformed (bytes that are not the protocol's JSON), server_error
        (an error event inside the stream) or stream_broken (ended without its terminal event).
        """
        res = RequestRecord()
        out = TapResult(http_status=self.status, t_first_token=self.t_first_token, n_events=self.n_events)
        if self.status is not None and self.status >= 400:
            out.status, out.error = "http_error", f"HTTP {self.status}: {error_text(bytes(self.body))}"
            return out
        if self.sse:
            if self.malformed is None and not self.reader.done and self.reader.error is None:
                self._events(self.parser.finish, time.perf_counter_ns())
        elif self.status is not None:
            self._whole()
        self.reader.fill(res)
        out.message, out.finish, out.usage, out.raw_usage = res.message, res.finish, res.usage, res.raw_usage
        out.response_id = res.response_id
        out.t_first_token = self.t_first_token
        if self.malformed is not None:
            out.status, out.error = "malformed", f"malformed reply: {self.malformed}"
        elif self.reader.error is not None:
            out.status, out.error = "server_error", f"server error in stream: {self.reader.error}"
        elif not self.reader.done:
            out.status, out.error = "stream_broken", f"reply ended without {self.reader.terminal}"
        if out.message and self.api != "openai":
            for call in out.message.get("tool_calls") or ():
                if call.get("type") != "custom":  # free-form input is text, not JSON
                    call["arguments"] = canonical_arguments(call["arguments"])
        return out

    def _whole(self) -> None:
        if self._truncated:
            self.malformed = "reply body too large to record"
            return
        try:
            obj = orjson.loads(bytes(self.body))
        except orjson.JSONDecodeError as exc:
            self.malformed = f"reply body is not JSON ({exc})"
            return
        if not isinstance(obj, dict):
            self.malformed = "reply body is not a JSON object"
            return
        try:
            self.reader.body(obj)
        except (AttributeError, TypeError, KeyError, ValueError) as exc:
            self.malformed = f"reply body has an unexpected shape ({exc})"
