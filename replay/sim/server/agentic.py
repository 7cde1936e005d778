"""Tool calls an agent can act on: when a request offers tools, the simulator sometimes calls one.

Whether a request gets a tool call is a pure function of the seed and the conversation so far
(hash of the seed, the number of messages and the last message's text), drawn against
`tool_call_rate`; after `tool_call_max` tool rounds since the last user message it answers in
text, so an agent's loop always ends. The arguments are built from the tool's JSON schema (every
required property, of its type; enums take their first value), so an agent that validates them
runs the tool instead of looping on a refusal. A request header (`X-Replay-Finish`) still decides
when present: replays keep their recorded finish.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

Message = dict[str, Any]
_MAX_DEPTH = 4


@dataclass(frozen=True, slots=True)
class AgentOptions:
    tool_call_rate: float = 0.0  # share of requests with tools answered by a tool call
    tool_call_max: int = 3  # tool rounds in a row before a text answer
    seed: int = 0
    tool_names: tuple[str, ...] = ()  # call only these tools (when offered); empty: any


def _draw(seed: int, messages: list[Message]) -> float:
    """A number in [0, 1) fixed by the seed and the conversation's shape and last words."""
    last = messages[-1] if messages else {}
    content = last.get("content")
    text = content if isinstance(content, str) else orjson.dumps(content).decode()
    digest = hashlib.blake2b(f"{seed}|{len(messages)}|{last.get('role')}|{text}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big") / 2**64


def tool_rounds(messages: list[Message]) -> int:
    """Assistant tool calls since the last user message."""
    n = 0
    for m in reversed(messages):
        role = m.get("role")
        if role == "user":
            break
        if role == "assistant" and m.get("tool_calls"):
            n += 1
    return n


def _name(tool: dict[str, Any]) -> str:
    fn = tool.get("function")
    return str((fn if isinstance(fn, dict) else tool).get("name", ""))


def _schema(tool: dict[str, Any]) -> dict[str, Any]:
    fn = tool.get("function")
    params = (fn if isinstance(fn, dict) else tool).get("parameters")
    return params if isinstance(params, dict) else {"type": "object", "properties": {}}


def tool_choice(
    options: AgentOptions, messages: list[Message], tools: list[dict[str, Any]] | None
) -> tuple[str, str] | None:
    """(tool name, JSON arguments) when this request is answered by a tool call, else None."""
    named = [t for t in tools or () if isinstance(t, dict) and _name(t)]
    if options.tool_names:
        named = [t for t in named if _name(t) in options.tool_names]
    if not named or options.tool_call_rate <= 0 or tool_rounds(messages) >= options.tool_call_max:
        return None
    draw = _draw(options.seed, messages)
    if draw >= options.tool_call_rate:
        return None
    tool = named[int(draw / options.tool_call_rate * len(named)) % len(named)]
    return _name(tool), orjson.dumps(example(_schema(tool))).decode()


def example(schema: Any, key: str = "", depth: int = 0) -> Any:
    """A value valid for `schema` (the JSON Schema subset tool definitions use)."""
    if not isinstance(schema, dict):
        return "x"
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    for combo in ("anyOf", "oneOf", "allOf"):
        options = schema.get(combo)
        if isinstance(options, list) and options:
            if combo == "allOf":
                merged: dict[str, Any] = {}
                for part in options:
                    if isinstance(part, dict):
                        merged.update(part)
                return example(merged, key, depth)
            return example(
                next((o for o in options if isinstance(o, dict) and o.get("type") != "null"), options[0]),
                key,
                depth,
            )
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    if kind == "object":
        if depth >= _MAX_DEPTH:
            return {}
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        required = [r for r in schema.get("required") or () if isinstance(r, str)]
        return {name: example(props.get(name, {}), name, depth + 1) for name in required}
    if kind == "array":
        # One item unless the schema forbids it: `command: ["ls"]` runs, `command: []` is refused.
        low, high = schema.get("minItems"), schema.get("maxItems")
        n = low if isinstance(low, int) and 1 < low < 8 else 1
        if high == 0:
            n = 0
        return [example(schema.get("items", {}), key, depth + 1) for _ in range(n)]
    if kind == "integer":
        return _bounded(schema, 1)
    if kind == "number":
        return float(_bounded(schema, 1))
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    return _string(schema, key)


def _bounded(schema: dict[str, Any], value: int) -> int:
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    high = schema.get("maximum", schema.get("exclusiveMaximum"))
    if isinstance(low, int | float) and value < low:
        value = int(low) + (1 if "exclusiveMinimum" in schema else 0)
    if isinstance(high, int | float) and value > high:
        value = int(high) - (1 if "exclusiveMaximum" in schema else 0)
    return value


def _string(schema: dict[str, Any], key: str) -> str:
    """Text a tool can act on harmlessly: a path in the working folder, a command that lists it."""
    name = key.lower()
    if "path" in name or "file" in name or name in ("dir", "directory", "cwd"):
        text = "README.md"
    elif name in ("command", "cmd", "script"):
        text = "ls"
    elif "pattern" in name or "glob" in name or "query" in name:
        text = "*.md"
    else:
        text = "ok"
    low = schema.get("minLength")
    if isinstance(low, int) and len(text) < low:
        text = text + "x" * (low - len(text))
    high = schema.get("maxLength")
    if isinstance(high, int) and 0 < high < len(text):
        text = text[:high]
    return text
