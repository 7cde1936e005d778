"""OpenAI Responses API bodies (`POST /v1/responses`) as neutral messages.

The inverse of `replay.engine.responses`: `instructions` becomes a leading system message, input
items become messages (an input item with role system first in the list is marked `inline`, so it
is not sent back as `instructions`), and the items of one model turn (reasoning, an output message,
function calls) merge into one assistant message, the shape the stream reader gives the reply, so
an agent resending its reply is recognised as doing so. `previous_response_id` is left for the
recorder to resolve: only it knows what the earlier response held.
"""

from __future__ import annotations

from typing import Any

from replay.record.wire import Parsed, WireError, _text_parts, canonical_arguments
from replay.trace.model import Message

API = "openai-responses"

# Body fields stored in their own place; everything else (reasoning, include, store,
# prompt_cache_key, tool_choice, text, client_metadata ...) goes to `params.extra` as it was.
_NOT_EXTRA = {
    "model",
    "input",
    "instructions",
    "max_output_tokens",
    "temperature",
    "stream",
    "tools",
    "previous_response_id",
    "user",
}


def _assistant(out: list[Message]) -> Message:
    """The assistant message the current model turn's items go into."""
    if out and out[-1].get("role") == "assistant":
        return out[-1]
    msg: Message = {"role": "assistant", "content": ""}
    out.append(msg)
    return msg


def input_to_neutral(items: Any, counter: list[int]) -> list[Message]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise WireError("'input' must be text or a list of items")
    out: list[Message] = []
    for item in items:
        if not isinstance(item, dict):
            raise WireError("each input item must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise WireError(f"unknown input message role {role!r}")
            text = _text_parts(item.get("content"), counter)
            if role == "assistant":
                msg = _assistant(out)
                prev = msg["content"]
                msg["content"] = (prev if isinstance(prev, str) else "".join(prev)) + (
                    text if isinstance(text, str) else "".join(text)
                )
                continue
            new: Message = {"role": role, "content": text}
            if role == "system" and not out:
                new["inline"] = True
            out.append(new)
        elif kind in ("function_call", "custom_tool_call"):
            msg = _assistant(out)
            call = {
                "id": str(item.get("call_id", "")),
                "name": str(item.get("name", "")),
                "arguments": canonical_arguments(item.get("arguments", ""))
                if kind == "function_call"
                else str(item.get("input", "")),
            }
            if kind == "custom_tool_call":
                call["type"] = "custom"
            msg.setdefault("tool_calls", []).append(call)
        elif kind == "reasoning":
            msg = _assistant(out)
            parts: list[Any] = []
            for key in ("content", "summary"):
                value = item.get(key)
                if value is not None and not isinstance(value, list):
                    raise WireError(f"a reasoning item's '{key}' must be a list")
                parts += value or []
            texts = [str(p.get("text", "")) for p in parts if isinstance(p, dict)]
            if any(texts):
                msg["reasoning"] = msg.get("reasoning", "") + "".join(texts)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": str(item.get("call_id", "")),
                    "content": _text_parts(output, counter) if not isinstance(output, str) else output,
                }
            )
        else:
            counter[0] += 1  # web search calls, item references, images: no place in a trace
    return out


def tools_to_chat(tools: Any) -> list[dict[str, Any]] | None:
    """Responses function tools as the chat-style tools a trace stores; other types as they are."""
    if not isinstance(tools, list) or not tools:
        return None
    out = []
    for t in tools:
        if isinstance(t, dict) and t.get("type") == "function":
            fn = {k: v for k, v in t.items() if k != "type"}
            out.append({"type": "function", "function": fn})
        else:
            out.append(t)
    return out


def parse_responses(obj: dict[str, Any]) -> tuple[Parsed, str | None]:
    """A Responses body as neutral form, and the `previous_response_id` it names (if any)."""
    counter = [0]
    messages = input_to_neutral(obj.get("input"), counter)
    instructions = obj.get("instructions")
    if isinstance(instructions, str):
        messages.insert(0, {"role": "system", "content": instructions})
    previous = obj.get("previous_response_id")
    if not messages and not previous:
        raise WireError("request has no input")
    params: dict[str, Any] = {"stream": bool(obj.get("stream", False))}
    max_tokens = obj.get("max_output_tokens")
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool):
        params["max_tokens"] = max_tokens
    if isinstance(obj.get("temperature"), int | float):
        params["temperature"] = obj["temperature"]
    tools = tools_to_chat(obj.get("tools"))
    if tools:
        params["tools"] = tools
    extra = {k: v for k, v in obj.items() if k not in _NOT_EXTRA}
    if extra:
        params["extra"] = extra
    parsed = Parsed(
        api=API,
        model=str(obj.get("model") or "default"),
        messages=messages,
        params=params,
        dropped_parts=counter[0],
        has_instructions=isinstance(instructions, str),
    )
    return parsed, previous if isinstance(previous, str) and previous else None
