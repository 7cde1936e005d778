"""Claude Code session transcripts (`~/.claude/projects/<project>/*.jsonl`) -> a trace.

A transcript line is an entry (`type` user / assistant / system / summary / ...) linked to its
parent by `parentUuid`; one API reply is written as one assistant line per content block, all
sharing `message.id`. So each API call is the first line of an assistant message, and the request
it answered is the chain of entries from the root down to that line's parent (following the chain
rather than file order keeps abandoned branches out). Compaction starts a new root: a
`compact_boundary` system entry, then a user entry marked `isCompactSummary`; the first request
whose chain holds a new summary is tagged `compaction`. Sub-agents (`isSidechain`) become their
own sessions with role `subagent`: by `agentId` (newer versions, `agent-*.jsonl` files), else one
per sidechain root (older versions, inline).

Claude Code does not store its system prompt or tool definitions. Each session gets a synthetic
system message standing in for them, sized from its first call's usage (prompt tokens the API
reported minus what the messages count), with one seed per kind (main, sub-agent) so sessions of a
kind share it as a prefix, as they would on a server.
"""

from __future__ import annotations

import datetime as _dt
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from replay.errors import TraceError
from replay.record.tokens import count_tokens
from replay.record.wire import WireError, anthropic_assistant_turn, anthropic_user_turn
from replay.trace.materialize import text_of
from replay.trace.model import Message
from replay.trace.writer import TraceWriter

SYSTEM_SEEDS = {"interactive": 0x434C_4D41_494E, "subagent": 0x434C_5355_4241}
_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls"}


@dataclass(slots=True)
class _Entry:
    obj: dict[str, Any]
    pos: int  # position across all files read, in reading order
    group: tuple[str, ...] = ()

    @property
    def uuid(self) -> str | None:
        return self.obj.get("uuid")

    @property
    def parent(self) -> str | None:
        return self.obj.get("parentUuid")

    @property
    def type(self) -> str:
        return str(self.obj.get("type", ""))

    @property
    def message(self) -> dict[str, Any]:
        msg = self.obj.get("message")
        return msg if isinstance(msg, dict) else {}

    @property
    def time(self) -> float | None:
        stamp = self.obj.get("timestamp")
        if not isinstance(stamp, str):
            return None
        try:
            return _dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None


@dataclass(slots=True)
class _Call:
    group: tuple[str, ...]
    first: _Entry  # first line of the assistant message
    lines: list[_Entry]  # every line of it
    t: float = 0.0
    messages: list[Message] = field(default_factory=list)
    reply: Message | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    finish: str | None = None
    compaction: bool = False


def _files(src: Path) -> list[Path]:
    if src.is_dir():
        return sorted(p for p in src.rglob("*.jsonl") if p.is_file())
    return [src]


def _read(files: Iterable[Path]) -> tuple[list[_Entry], int]:
    """Entries with a uuid, first copy of each (resumed sessions repeat history); bad lines counted."""
    entries: list[_Entry] = []
    seen: set[str] = set()
    bad = 0
    for path in files:
        with open(path, "rb") as handle:
            for raw in handle:
                if not raw.strip():
                    continue
                try:
                    obj = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    bad += 1  # Claude Code may leave a half-written last line
                    continue
                if not isinstance(obj, dict) or not isinstance(obj.get("uuid"), str) or obj["uuid"] in seen:
                    continue
                seen.add(obj["uuid"])
                entries.append(_Entry(obj, len(entries)))
    return entries, bad


def _group(entries: list[_Entry], by_uuid: dict[str, _Entry]) -> None:
    """Main conversation per sessionId; sub-agents per agentId, else per sidechain root."""
    for e in entries:
        sid = str(e.obj.get("sessionId", ""))
        if not e.obj.get("isSidechain"):
            e.group = ("main", sid)
        elif e.obj.get("agentId"):
            e.group = ("agent", sid, str(e.obj["agentId"]))
        else:
            parent = by_uuid.get(e.parent or "")
            if parent is not None and parent.group and parent.group[0] == "side":
                e.group = parent.group
            else:
                e.group = ("side", sid, e.uuid or str(e.pos))


def _chain(entry: _Entry, by_uuid: dict[str, _Entry]) -> list[_Entry]:
    out: list[_Entry] = []
    node = by_uuid.get(entry.parent or "")
    guard: set[str] = set()
    while node is not None and node.uuid not in guard:
        guard.add(node.uuid or "")
        out.append(node)
        node = by_uuid.get(node.parent or "")
    out.reverse()
    return out


def _assistant(lines: list[_Entry]) -> Message:
    blocks: list[Any] = []
    for line in lines:
        content = line.message.get("content")
        if isinstance(content, list):
            blocks.extend(content)
        elif isinstance(content, str):
            blocks.append({"type": "text", "text": content})
    return anthropic_assistant_turn(blocks, [0])


def _messages(chain: list[_Entry]) -> list[Message]:
    out: list[Message] = []
    i = 0
    while i < len(chain):
        e = chain[i]
        if e.type == "assistant":
            mid = e.message.get("id")
            j = i + 1
            while (
                j < len(chain) and chain[j].type == "assistant" and mid and chain[j].message.get("id") == mid
            ):
                j += 1
            out.append(_assistant(chain[i:j]))
            i = j
            continue
        if e.type == "user" and e.message:
            out.extend(anthropic_user_turn(e.message.get("content"), [0]))
        i += 1
    return out


def _fill_tool_results(messages: list[Message], results: dict[str, Message]) -> list[Message]:
    """Parallel tool results are sibling entries, so one chain may hold only some: add the others."""
    answered = {m.get("tool_call_id") for m in messages if m.get("role") == "tool"}
    out: list[Message] = []
    pending: list[str] = []
    for m in messages:
        if pending and m.get("role") != "tool":
            out.extend(results[c] for c in pending if c not in answered and c in results)
            pending = []
        out.append(m)
        if m.get("role") == "assistant":
            pending = [c["id"] for c in m.get("tool_calls") or ()]
    if pending:
        out.extend(results[c] for c in pending if c not in answered and c in results)
    return out


def _calls(entries: list[_Entry], by_uuid: dict[str, _Entry]) -> list[_Call]:
    calls: list[_Call] = []
    by_message: dict[tuple[tuple[str, ...], str], _Call] = {}
    for e in entries:
        if e.type != "assistant" or not e.message:
            continue
        mid = str(e.message.get("id") or e.uuid)
        key = (e.group, mid)
        if key in by_message:
            by_message[key].lines.append(e)
            continue
        if e.message.get("model") == "<synthetic>":
            continue  # written by Claude Code itself, never an API reply
        call = _Call(group=e.group, first=e, lines=[e])
        by_message[key] = call
        calls.append(call)
    return calls


def _usage(usage: dict[str, Any]) -> dict[str, Any]:
    if not usage:
        return {}
    read = int(usage.get("cache_read_input_tokens") or 0)
    prompt = int(usage.get("input_tokens") or 0) + read + int(usage.get("cache_creation_input_tokens") or 0)
    out = {"prompt_tokens": prompt, "cached_tokens": read}
    if usage.get("output_tokens") is not None:
        out["output_tokens"] = int(usage["output_tokens"])
    return out


def _tokens(messages: list[Message]) -> int:
    n = 0
    for m in messages:
        n += count_tokens(text_of(m.get("content")))
        for c in m.get("tool_calls") or ():
            n += count_tokens(c.get("name", "")) + count_tokens(c.get("arguments", ""))
    return n


def import_claude_code(src: str | Path, out: str | Path, system_tokens: int | None = None) -> dict[str, int]:
    """Convert a transcript file, or every transcript under a directory, into a trace at `out`.

    `system_tokens`: size of the stand-in system prompt; None sizes it from each session's first
    reported usage, 0 leaves it out.
    """
    src = Path(src)
    files = _files(src)
    if not files:
        raise TraceError(str(src), 0, "no Claude Code transcripts (*.jsonl) found")
    entries, bad = _read(files)
    by_uuid = {e.uuid: e for e in entries if e.uuid}
    _group(entries, by_uuid)
    calls = _calls(entries, by_uuid)
    if not calls:
        raise TraceError(str(src), 0, "no assistant replies found: is this a Claude Code transcript?")
    results: dict[tuple[str, ...], dict[str, tuple[int, Message]]] = defaultdict(dict)
    for e in entries:
        if e.type == "user" and isinstance(e.message.get("content"), list):
            try:
                turn = anthropic_user_turn(e.message["content"], [0])
            except WireError:
                continue
            for m in turn:
                if m["role"] == "tool":
                    results[e.group].setdefault(m["tool_call_id"], (e.pos, m))
    summaries: dict[tuple[str, ...], str | None] = {}
    for call in calls:
        chain = _chain(call.first, by_uuid)
        known = {cid: m for cid, (pos, m) in results[call.group].items() if pos < call.first.pos}
        try:
            call.messages = _fill_tool_results(_messages(chain), known)
            call.reply = _assistant(call.lines)
        except WireError as exc:
            raise TraceError(str(src), 0, f"entry {call.first.uuid}: {exc}") from None
        summary = next((e.uuid for e in reversed(chain) if e.obj.get("isCompactSummary")), None)
        call.compaction = summary is not None and summaries.get(call.group) != summary
        summaries[call.group] = summary
        times = [e.time for e in chain if e.time is not None]
        call.t = times[-1] if times else (call.first.time or 0.0)
        last = call.lines[-1].message
        call.usage = _usage(last.get("usage") or {})
        reason = last.get("stop_reason") or next(
            (x.message.get("stop_reason") for x in call.lines if x.message.get("stop_reason")), None
        )
        call.finish = (
            _FINISH.get(reason, reason)
            if reason
            else ("tool_calls" if call.reply.get("tool_calls") else "stop")
        )
    return _write(calls, Path(out), system_tokens, len(files), bad)


def _write(
    calls: list[_Call], out: Path, system_tokens: int | None, n_files: int, bad: int
) -> dict[str, int]:
    groups: dict[tuple[str, ...], list[_Call]] = defaultdict(list)
    for call in calls:
        groups[call.group].append(call)
    names: dict[tuple[str, ...], str] = {}
    side = 0
    for group in groups:
        sid8 = group[1][:8] or "session"
        if group[0] == "main":
            names[group] = f"cc-{sid8}"
        elif group[0] == "agent":
            names[group] = f"cc-{sid8}-agent-{group[2][:8]}"
        else:
            side += 1
            names[group] = f"cc-{sid8}-side-{side}"
    t0 = min(c.t for c in calls)
    for group_calls in groups.values():
        prev = t0
        for call in group_calls:  # keep each session's order even if clocks stepped back
            call.t = max(call.t, prev)
            prev = call.t
    order = sorted(calls, key=lambda c: (c.t, c.first.pos))
    counts = {"files": n_files, "bad_lines": bad, "sessions": 0, "requests": 0, "compactions": 0}
    notes = f"imported from {n_files} Claude Code transcript file(s); system prompt and tools are synthetic stand-ins"
    with TraceWriter(out, source="import:claude-code", notes=notes) as writer:
        system: dict[tuple[str, ...], Message | None] = {}
        last: dict[tuple[str, ...], tuple[int, float]] = {}
        for call in order:
            group = call.group
            role = "interactive" if group[0] == "main" else "subagent"
            if group not in system:
                model = str(call.lines[0].message.get("model") or "default")
                writer.session(
                    names[group], role=role, api="anthropic", model=model, labels={"source": "claude-code"}
                )
                counts["sessions"] += 1
                size = system_tokens
                if size is None:
                    size = max(0, (call.usage.get("prompt_tokens") or 0) - _tokens(call.messages))
                system[group] = (
                    {"role": "system", "content": {"synth": {"tokens": size, "seed": SYSTEM_SEEDS[role]}}}
                    if size
                    else None
                )
            head = [system[group]] if system[group] is not None else []
            after = None
            if group in last:
                prev_id, prev_done = last[group]
                after = {"request": prev_id, "delay_s": round(max(0.0, call.t - prev_done), 3)}
            reply = {"message": call.reply, "finish": call.finish}
            if "output_tokens" in call.usage:
                reply["output_tokens"] = call.usage["output_tokens"]
            rid = writer.request(
                names[group],
                round(call.t - t0, 3),
                [*head, *call.messages],
                params={"stream": True},
                reply=reply,
                usage=call.usage or None,
                after=after,
                tag="compaction" if call.compaction else "turn",
            )
            done = max((x.time or call.t) for x in call.lines)
            last[group] = (rid, done)
            counts["requests"] += 1
            counts["compactions"] += call.compaction
    return counts
