"""Codex CLI rollouts (`~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl`) -> a trace.

A rollout line is `{"timestamp", "type", "payload"}`: `session_meta` (id, instructions, cwd ...),
`turn_context` (model, policies), `response_item` (what went to or came from the model, as
Responses API items: `message` with role user / assistant / developer, `reasoning`,
`function_call`, `function_call_output`, `custom_tool_call` ...), `event_msg` (UI events, among
them `token_count` with the last call's usage) and `compacted` (a summary replacing the history).
Early rollouts wrote the meta object and the items bare, without the wrapper; both are read.

Mapping (traces/IMPORTERS.md has the table): a run of model-produced items (reasoning, assistant
text, tool calls) is the reply to one API call, whose request is every item before it; a
`token_count` event after it is that call's recorded usage; `compacted` replaces the history
(with its `replacement_history` when present, else the summary as a user message) and the next
call is a `compaction`. Sessions replay with the Responses API (`openai-responses`), which Codex
speaks, stored as the trace stores Responses requests (FORMAT.md): `instructions` become a system
message, base instructions and developer items developer messages (as 0.171 sends them), function
calls tool calls, their outputs tool messages, the turn's reasoning settings `params.extra`. Each
call's usage comes from its `token_usage_record` (newer) or the `token_count` event after it; the
tool definitions, not stored, are stand-ins sized from the first call's usage (`_tools`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import orjson

from replay.errors import TraceError
from replay.importers.base import (
    ImportOptions,
    SessionInfo,
    Step,
    iso_seconds,
    jsonl,
    merge_by_time,
    progress_bar,
    rendered_tokens,
    sized_tools,
    stand_in_tools,
    tools_tokens,
    tree_size,
    write_trace,
)
from replay.record.wire import canonical_arguments
from replay.trace.model import Message

_LINE_TYPES = (
    "session_meta",
    "response_item",
    "event_msg",
    "turn_context",
    "compacted",
    "token_usage_record",
)
_TOOLS_SEED = 0x436F_6465_78  # one seed for Codex's stand-in tools: equal sizes, identical tools
_MODEL_ITEMS = ("reasoning", "function_call", "custom_tool_call", "local_shell_call")
_ITEM_TYPES = (
    "message",
    "reasoning",
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
    "local_shell_call",
    "web_search_call",
)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    out = []
    for part in content or ():
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            out.append(part["text"])
    return "\n".join(out)


def _output(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return _text(value.get("content")) if not isinstance(value.get("content"), str) else value["content"]
    if isinstance(value, list):
        return _text(value)
    return ""


@dataclass(slots=True)
class _Reply:
    t: float  # when the request went out: the last input item's time
    done: float = 0.0
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: list[dict[str, str]] = field(default_factory=list)
    usage: dict[str, Any] | None = None

    def message(self) -> Message:
        msg: Message = {"role": "assistant", "content": "".join(self.text)}
        if self.calls:
            msg["tool_calls"] = list(self.calls)
        if self.reasoning:
            msg["reasoning"] = "\n".join(self.reasoning)
        return msg


def _usage(info: Any, key: str = "last_token_usage") -> dict[str, Any] | None:
    last = (info or {}).get(key) if isinstance(info, dict) else None
    if not isinstance(last, dict):
        return None
    return {
        "prompt_tokens": int(last.get("input_tokens") or 0),
        "cached_tokens": int(last.get("cached_input_tokens") or 0),
        "output_tokens": int(last.get("output_tokens") or 0),
        "raw": last,
    }


def _lines(
    path: Path, advance: Callable[[int], None]
) -> Iterator[tuple[int, float | None, str, dict[str, Any]]]:
    """(line, time, kind, payload) in the wrapped form, whichever form the file has."""
    for n, obj in jsonl(path, advance):
        if not isinstance(obj, dict):
            raise TraceError(str(path), n, "not a Codex rollout line (not an object)")
        kind = obj.get("type")
        if isinstance(obj.get("payload"), dict) and "timestamp" in obj:
            if kind in _LINE_TYPES:
                yield n, iso_seconds(obj.get("timestamp")), kind, obj["payload"]
            # else a line kind of a newer Codex (e.g. `world_state`): nothing a request holds
        elif kind in _ITEM_TYPES:  # early rollouts: bare items
            yield n, iso_seconds(obj.get("timestamp")), "response_item", obj
        elif "record_type" in obj:
            continue  # early rollouts' state snapshots
        elif n == 1 and "id" in obj and "timestamp" in obj:
            yield n, iso_seconds(obj.get("timestamp")), "session_meta", obj
        else:
            raise TraceError(str(path), n, f"not a Codex rollout line (type {kind!r})")


def _start(path: Path) -> float:
    for _, when, _kind, payload in _lines(path, lambda n: None):
        return when or iso_seconds(payload.get("timestamp")) or 0.0
    return 0.0


def _session_steps(path: Path, advance: Callable[[int], None]) -> Iterator[Step]:
    info = SessionInfo(
        key=f"codex-{path.stem}", api="openai-responses", labels={"source": "codex", "file": path.name}
    )
    extra: dict[str, Any] = {}
    history: list[Message] = []
    reply: _Reply | None = None
    compaction = False
    last_t = 0.0
    names: set[str] = set()
    steps: list[Step] = []

    def close() -> None:
        nonlocal reply, compaction
        if reply is None:
            return
        msg = reply.message()
        steps.append(
            Step(
                session=info,
                t=reply.t,
                messages=list(history),
                reply=msg,
                finish="tool_calls" if reply.calls else "stop",
                output_tokens=(reply.usage or {}).get("output_tokens"),
                usage=reply.usage,
                tag="compaction" if compaction else "turn",
                done=max(reply.done, reply.t),
            )
        )
        compaction = False
        history.append(msg)
        reply = None

    for _n, when, kind, p in _lines(path, advance):
        when = when if when is not None else last_t
        if kind == "session_meta":
            sid = str(p.get("id") or path.stem)
            info.key = f"codex-{sid}"
            info.agent_ids = (sid,)
            base = (p.get("base_instructions") or {}).get("text")
            instructions = p.get("instructions") or base
            if instructions and not history:
                # newer Codex sends its base instructions as the first developer message
                role = "developer" if base and not p.get("instructions") else "system"
                history.append({"role": role, "content": str(instructions)})
            if p.get("cli_version"):
                info.labels["cli_version"] = p["cli_version"]
            last_t = last_t or when
        elif kind == "turn_context":
            if p.get("model") and info.model == "default":
                info.model = str(p["model"])
            reasoning = {k: p[k] for k in ("effort", "summary") if p.get(k)}
            if reasoning and not extra:
                extra["reasoning"] = reasoning  # sent back as Codex sent it (params.extra)
        elif kind == "token_usage_record":  # newer Codex: each call's own usage, right after it
            if reply is not None:
                reply.usage = _usage(p, "usage") or reply.usage
            elif steps and steps[-1].usage is None:
                steps[-1].usage = _usage(p, "usage")
        elif kind == "event_msg":
            if p.get("type") == "token_count":
                # after the call's reply, or after the tool output that closed it
                if reply is not None and reply.usage is None:
                    reply.usage = _usage(p.get("info"))
                elif reply is None and steps and steps[-1].usage is None:
                    steps[-1].usage = _usage(p.get("info"))
                    steps[-1].output_tokens = (steps[-1].usage or {}).get("output_tokens")
            elif p.get("type") == "context_compacted":
                compaction = True
        elif kind == "compacted":
            close()
            kept = [_item(it) for it in p.get("replacement_history") or () if isinstance(it, dict)]
            system = [m for m in history[:1] if m["role"] == "system"]
            history = [*system, *(m for m in kept if m is not None)] or system
            if not kept:
                history.append({"role": "user", "content": str(p.get("message") or "")})
            compaction = True
        elif kind == "response_item":
            item_type = p.get("type")
            produced = item_type in _MODEL_ITEMS or (item_type == "message" and p.get("role") == "assistant")
            if produced:
                if reply is None:
                    reply = _Reply(t=last_t or when)
                reply.done = when
                if item_type == "message":
                    reply.text.append(_text(p.get("content")))
                elif item_type == "reasoning":
                    reply.reasoning += [_text([s]) for s in p.get("summary") or () if isinstance(s, dict)]
                else:
                    call = _call(p)
                    names.add(call["name"])
                    reply.calls.append(call)
            else:
                msg = _item(p)
                if msg is None:
                    continue
                close()
                history.append(msg)
                last_t = when
    close()
    if not steps:
        return
    params: dict[str, Any] = {"stream": True}
    if extra:
        params["extra"] = extra
    tools, sized = _tools(steps, sorted(names))
    if tools:
        params["tools"] = tools
    if sized:
        info.labels["synthetic"] = ["tools"]  # their text is made up, their size is the usage's
    for s in steps:
        s.params = params
    steps[-1].ends = (info,)
    yield from steps


def _tools(steps: list[Step], names: list[str]) -> tuple[list[dict[str, Any]], bool]:
    """Stand-in tool definitions, sized from the first call whose usage the rollout kept: its prompt
    tokens minus its messages (rendered as the simulator renders them). Codex stores no tool
    definitions (0.171: 9 tools, ~5K tokens); its base instructions and context items are in the
    rollout. Also says whether they were sized."""
    bare = stand_in_tools(names) if names else []
    first = next((s for s in steps if s.usage and s.usage.get("prompt_tokens")), None)
    if first is None or first.usage is None:
        return bare, False
    want = int(first.usage["prompt_tokens"])
    size = want - rendered_tokens(first.messages)
    if size <= tools_tokens(bare):
        return bare, False
    tools = sized_tools(names, size, _TOOLS_SEED)
    # before a developer message (not a system one) tools get a system turn of their own: its frame
    off = rendered_tokens(first.messages, tools) - want
    return (sized_tools(names, size - off, _TOOLS_SEED) if off else tools), True


def _call(p: dict[str, Any]) -> dict[str, str]:
    cid = str(p.get("call_id") or p.get("id") or "")
    if p.get("type") == "function_call":
        return {
            "id": cid,
            "name": str(p.get("name") or ""),
            "arguments": canonical_arguments(p.get("arguments") or "{}"),
        }
    if p.get("type") == "custom_tool_call":
        return {
            "id": cid,
            "name": str(p.get("name") or ""),
            "arguments": orjson.dumps({"input": p.get("input")}).decode(),
        }
    return {"id": cid, "name": "local_shell", "arguments": orjson.dumps(p.get("action") or {}).decode()}


def _item(p: dict[str, Any]) -> Message | None:
    """An input item as a chat message (None for items that carry nothing a chat request holds)."""
    item_type = p.get("type")
    if item_type == "message":
        role = {"developer": "developer", "system": "system", "user": "user", "assistant": "assistant"}.get(
            str(p.get("role"))
        )
        return {"role": role, "content": _text(p.get("content"))} if role else None
    if item_type in ("function_call_output", "custom_tool_call_output", "local_shell_call_output"):
        return {
            "role": "tool",
            "tool_call_id": str(p.get("call_id") or ""),
            "content": _output(p.get("output")),
        }
    if item_type in ("function_call", "custom_tool_call", "local_shell_call"):
        return {"role": "assistant", "content": "", "tool_calls": [_call(p)]}
    return None


def _files(src: Path) -> list[Path]:
    if src.is_dir():
        found = sorted(src.rglob("rollout-*.jsonl")) or sorted(src.rglob("*.jsonl"))
        return [p for p in found if p.is_file()]
    return [src]


def import_codex(src: str | Path, out: str | Path, options: ImportOptions | None = None) -> dict[str, int]:
    """Convert a Codex CLI rollout, or every rollout under a folder, into a trace at `out`."""
    options = options or ImportOptions()
    files = _files(Path(src))
    if not files:
        raise TraceError(str(src), 0, "no Codex rollouts (rollout-*.jsonl) found")
    count = len(files)
    with progress_bar(tree_size(files), "codex", options) as advance:
        # each file's start and name, no more (a Path holds its parts too): kept to the end
        starts = [(t, str(f)) for t, f in sorted((_start(f), f) for f in files)]
        del files
        steps = merge_by_time((t, partial(_session_steps, Path(f), advance)) for t, f in starts)
        counts = write_trace(
            steps,
            Path(out),
            "import:codex",
            "imported from Codex CLI rollouts (Responses API calls); tools are synthetic stand-ins sized from the usage",
            options,
        )
    return {"files": count, **counts}
