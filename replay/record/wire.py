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

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson

from replay.engine.apis import APIS
from replay.engine.decode import BadPayload, ReplyFields
from replay.engine.exchange import Reader, error_text
from replay.engine.sse import SseParser
from replay.engine.usage import Usage
from replay.metrics.record import RequestRecord
from replay.serving.fields import FieldError, NotJson, RequestFields, join, load_body, snippet
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
_T = TypeVar("_T")
_ERROR_BODY_MAX = 64 * 1024
_REPLY_BODY_MAX = 256 * 1024 * 1024


class WireError(ValueError):
    """The body is not a request this module can express as neutral messages; the message names
    the field at fault (`messages[2].tool_calls[0].function must be an object, got "x"`)."""


def _checked(fn: Callable[..., _T]) -> Callable[..., _T]:
    """RequestFields read through `replay.serving.fields` raise FieldError; callers catch WireError."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> _T:
        try:
            return fn(*args, **kwargs)
        except FieldError as exc:
            raise WireError(str(exc)) from None

    return wrapper


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


def _text_parts(content: Any, counter: list[int], path: str = "content") -> str | list[str]:
    """OpenAI/Anthropic content (text or a list of parts) as neutral content."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise FieldError(path, "text or a list of parts", content)
    texts: list[str] = []
    for i, part in enumerate(content):
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
            texts.append(RequestFields(part, join(path, i)).text("text") or "")
        else:
            counter[0] += 1
    if len(texts) == 1:
        return texts[0]
    return texts if texts else ""


@_checked
def openai_to_neutral(messages: Any, counter: list[int] | None = None) -> list[Message]:
    """OpenAI chat messages -> neutral messages."""
    if not isinstance(messages, list):
        raise FieldError("messages", "a list", messages)
    counter = counter if counter is not None else [0]
    out: list[Message] = []
    for i, raw in enumerate(messages):
        m = RequestFields(raw, join("messages", i))
        role = m.text("role")
        if role == "developer":
            role = "system"
        if role in ("system", "user"):
            out.append({"role": role, "content": _text_parts(m.value("content"), counter, m.at("content"))})
        elif role == "assistant":
            msg: Message = {
                "role": "assistant",
                "content": _text_parts(m.value("content"), counter, m.at("content")),
            }
            calls = [_openai_call(tc) for tc in m.objects("tool_calls")]
            if calls:
                msg["tool_calls"] = calls
            reasoning = m.value("reasoning_content") or m.value("reasoning")
            if isinstance(reasoning, str) and reasoning:
                msg["reasoning"] = reasoning
            out.append(msg)
        elif role in ("tool", "function"):
            call_id = m.text("tool_call_id") if role == "tool" else m.text("name")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": call_id or "",
                    "content": _text_parts(m.value("content"), counter, m.at("content")),
                }
            )
        else:
            raise WireError(f"'{m.at('role')}' is an unknown message role: {role!r}")
    return out


def _openai_call(tc: RequestFields) -> dict[str, str]:
    fn = tc.obj("function") or RequestFields({}, tc.at("function"))
    args = fn.raw.get("arguments", "")
    return {
        "id": tc.text("id") or "",
        "name": fn.text("name") or "",
        "arguments": args if isinstance(args, str) else canonical_arguments(args),
    }


@_checked
def anthropic_to_neutral(system: Any, messages: Any, counter: list[int] | None = None) -> list[Message]:
    """Anthropic `system` + `messages` -> neutral messages (one system message per system block)."""
    if not isinstance(messages, list):
        raise FieldError("messages", "a list", messages)
    counter = counter if counter is not None else [0]
    out: list[Message] = []
    if isinstance(system, str):
        if system:
            out.append({"role": "system", "content": system})
    elif isinstance(system, list):
        for i, block in enumerate(system):
            if isinstance(block, dict) and block.get("type") == "text":
                sys_block = RequestFields(block, join("system", i))
                msg: Message = {"role": "system", "content": sys_block.text("text") or ""}
                if isinstance(block.get("cache_control"), dict):
                    msg[_CACHE] = block["cache_control"]
                out.append(msg)
            else:
                counter[0] += 1
    elif system is not None:
        raise FieldError("system", "text or a list of blocks", system)
    for i, raw in enumerate(messages):
        m = RequestFields(raw, join("messages", i))
        role = m.text("role")
        if role == "user":
            out.extend(anthropic_user_turn(m.value("content"), counter, path=m.at("content"), marks=True))
        elif role == "assistant":
            out.append(
                anthropic_assistant_turn(m.value("content"), counter, path=m.at("content"), marks=True)
            )
        elif role == "system":
            # Claude Code puts entries of its own (agent and skill lists) here: kept in place.
            for msg in anthropic_user_turn(m.value("content"), counter, path=m.at("content"), marks=True):
                out.append({**msg, "role": "system", "inline": True})
        else:
            raise WireError(f"'{m.at('role')}' is an unknown message role: {role!r}")
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


@_checked
def anthropic_user_turn(
    content: Any, counter: list[int], path: str = "content", marks: bool = False
) -> list[Message]:
    """One user turn: tool results become tool messages, text blocks user messages, in order.

    With `marks`, a block's `cache_control` ends the message it is in and rides on it under
    `_CACHE` (see `take_cache_marks`)."""
    if content is None or isinstance(content, str):
        return [{"role": "user", "content": content or ""}]
    if not isinstance(content, list):
        raise FieldError(path, "text or a list of blocks", content)
    out: list[Message] = []
    texts: list[str] = []

    def flush() -> None:
        if texts:
            out.append({"role": "user", "content": texts[0] if len(texts) == 1 else list(texts)})
            texts.clear()

    for i, raw in enumerate(content):
        if isinstance(raw, str):
            texts.append(raw)
            continue
        if not isinstance(raw, dict):
            counter[0] += 1
            continue
        block = RequestFields(raw, join(path, i))
        btype = block.value("type")
        mark = raw.get("cache_control") if marks else None
        if btype == "text":
            texts.append(block.text("text") or "")
            if isinstance(mark, dict):
                flush()
                out[-1][_CACHE] = mark
        elif btype == "tool_result":
            flush()
            result = _text_parts(block.value("content"), counter, block.at("content"))
            out.append({"role": "tool", "tool_call_id": block.text("tool_use_id") or "", "content": result})
            if isinstance(mark, dict):
                out[-1][_CACHE] = mark
        else:
            counter[0] += 1
    flush()
    return out or [{"role": "user", "content": ""}]


@_checked
def anthropic_assistant_turn(
    content: Any, counter: list[int], path: str = "content", marks: bool = False
) -> Message:
    """Text blocks join with no separator, as the stream reader joins text deltas."""
    if content is None or isinstance(content, str):
        return {"role": "assistant", "content": content or ""}
    if not isinstance(content, list):
        raise FieldError(path, "text or a list of blocks", content)
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, str]] = []
    for i, raw in enumerate(content):
        if not isinstance(raw, dict):
            counter[0] += 1
            continue
        block = RequestFields(raw, join(path, i))
        btype = block.value("type")
        if btype == "text":
            texts.append(block.text("text") or "")
        elif btype == "thinking":
            reasoning.append(block.text("thinking") or "")
        elif btype == "tool_use":
            calls.append(
                {
                    "id": block.text("id") or "",
                    "name": block.text("name") or "",
                    "arguments": canonical_arguments(block.value("input")),
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
    if tools is not None and not isinstance(tools, list):
        raise WireError(f"'tools' must be a list, got {snippet(tools)}")
    for i, t in enumerate(tools or ()):
        if not isinstance(t, dict):
            continue
        tool = RequestFields(t, join("tools", i))
        fn: dict[str, Any] = {"name": tool.text("name") or str(t.get("type", ""))}
        if t.get("description"):
            fn["description"] = t["description"]
        fn["parameters"] = (
            tool.obj("input_schema") or RequestFields({"type": "object", "properties": {}})
        ).raw
        entry: dict[str, Any] = {"type": "function", "function": fn}
        if isinstance(t.get("cache_control"), dict):
            entry["cache_control"] = t["cache_control"]
        out.append(entry)
    return out


@_checked
def parse_chat_request(api: str, body: bytes) -> Parsed:
    """A chat-completions or messages body as neutral messages and trace params; raises WireError
    naming the field. (`record.requests.parse_request` picks the parser of each API.)"""
    try:
        f = load_body(body)
    except NotJson as exc:
        raise WireError(str(exc)) from None
    obj = f.raw
    counter = [0]
    cache_marks: list[dict[str, Any]] = []
    if api == "openai":
        messages = openai_to_neutral(f.value("messages"), counter)
        tools = f.items("tools") or None
        for i, tool in enumerate(tools or ()):
            RequestFields(tool, join("tools", i))
        max_tokens = f.count("max_tokens")
        if max_tokens is None:
            max_tokens = f.count("max_completion_tokens")
        user_id = None
    elif api == "anthropic":
        messages = anthropic_to_neutral(f.value("system"), f.value("messages"), counter)
        cache_marks = take_cache_marks(messages)
        tools = anthropic_tools_to_openai(f.value("tools")) or None
        max_tokens = f.count("max_tokens")
        meta = obj.get("metadata")
        user_id = (
            meta.get("user_id") if isinstance(meta, dict) and isinstance(meta.get("user_id"), str) else None
        )
    else:
        raise WireError(f"unknown api {api!r}")
    if not messages:
        raise WireError("'messages' is empty: the request has no messages")
    params: dict[str, Any] = {"stream": bool(f.boolean("stream"))}
    if max_tokens is not None:
        params["max_tokens"] = max_tokens
    temperature = f.number("temperature")
    if temperature is not None:
        params["temperature"] = temperature
    if tools:
        params["tools"] = tools
    if cache_marks:
        params["cache_control"] = cache_marks
    extra = {k: v for k, v in obj.items() if k not in _NOT_EXTRA}
    if extra:
        params["extra"] = extra
    model = f.value("model")
    return Parsed(
        api=api,
        model=model if isinstance(model, str) and model else "default",
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
            self.reader.body(ReplyFields(obj))
        except BadPayload as exc:
            self.malformed = f"reply body has an unexpected shape ({exc})"
        except (AttributeError, TypeError, KeyError, ValueError) as exc:
            self.malformed = f"reply body has an unexpected shape ({exc})"
