"""Claude Code session transcripts (`~/.claude/projects/<project>/*.jsonl`) -> a trace.

A transcript line is an entry (`type` user / assistant / system / summary / ...) linked to its
parent by `parentUuid`; one API reply is written as one assistant line per content block, all
sharing `message.id`. So each API call is the first line of an assistant message, and the request
it answered is the chain of entries from the root down to that line's parent (following the chain
rather than file order keeps abandoned branches out; a rewind is a branch, encoded against the
request it branches off, not a compaction). Compaction starts a new root: a `compact_boundary`
system entry, then a user entry marked `isCompactSummary`; the first request whose chain holds a
new summary is tagged `compaction`. Sub-agents (`isSidechain`) become their own sessions with role
`subagent`: by `agentId` (newer versions, `<session>/subagents/agent-*.jsonl` files), else one per
sidechain root (older versions, inline). A folder is read one session at a time (its main file and
its sub-agents' files), merged in time order.

A file may start mid-session (resumed, a sidechain) with an assistant record or a tool result; the
API needs a user message first and a tool call before each result, so the least that satisfies it
is made up and listed in the request's `synthetic`.

Claude Code does not store its system prompt or tool definitions. Each session gets synthetic
system blocks standing in for them, as the wire has them (a billing line, an identity line, the
prompt), sized from its first call's usage (prompt tokens the API reported minus what the messages,
the stand-in tools and the reminder count), the billing line seeded per session (it is per session
on the wire) or, with `shared_system`, per kind (main, sub-agent). What the wire adds to the
messages is rebuilt too: the `<system-reminder>` before the first prompt (a stand-in of the
measured size) and the agent and skill listings (from `attachment` entries) as a system entry. A
call that re-read its prefix (its usage says so) gets new system blocks: a prefix rewrite. Tools are
stand-ins named as the session used them; `max_tokens` is what the reply used.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import orjson

from replay.errors import TraceError, UsageError
from replay.importers.base import (
    ImportOptions,
    SessionInfo,
    Step,
    estimate_tokens,
    link_subagents,
    merge_by_time,
    progress_bar,
    stand_in_tools,
    tree_size,
    write_trace,
)
from replay.record.tokens import count_tokens
from replay.record.wire import WireError, anthropic_assistant_turn, anthropic_user_turn
from replay.trace.materialize import text_of
from replay.trace.model import Message
from replay.trace.synth import synth_text

SYSTEM_SEEDS = {"interactive": 0x434C_4D41_494E, "subagent": 0x434C_5355_4241}
# What Claude Code sends but does not store, sized as measured on the wire (2.1.197, simulator
# tokens): its system blocks (a per-session billing line, an identity line, the prompt) and the
# `<system-reminder>` (context such as the date) at the head of the first user message.
BILLING_TOKENS = 30
IDENTITY_TOKENS = 15
REMINDER_TOKENS = 77
# A call whose cache read is under half the previous call's prompt, sent within the cache's life
# (Anthropic keeps a prefix 5 minutes), re-read its prefix: the system prompt changed.
CACHE_TTL_S = 300.0
_REMINDER_FRAME = count_tokens("<system-reminder>\n\n</system-reminder>\n\n\n")
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
    listing = -1  # index of the last listing's system entry
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
        elif e.type == "attachment":
            text = _listing(e.obj.get("attachment"))
            if text and listing == len(out) - 1:  # consecutive listings: one system entry
                out[-1] = {"role": "system", "content": f"{out[-1]['content']}\n\n{text}"}
            elif text:
                out.append({"role": "system", "content": text})
                listing = len(out) - 1
        i += 1
    return out


def _listing(attachment: Any) -> str:
    """The text of an agent or skill listing Claude Code sends as a `role: system` entry of
    `messages` (its stored `attachment` entries hold the lines; the sentences around them are
    ours, a few tokens)."""
    if not isinstance(attachment, dict):
        return ""
    kind = attachment.get("type")
    if kind == "agent_listing_delta":
        lines = [str(x) for x in attachment.get("addedLines") or () if x]
        if not lines:
            return ""
        text = "Agent types the Agent tool can launch:\n" + "\n".join(lines)
        if attachment.get("showConcurrencyNote"):
            text += "\n\nLaunch independent agents together, in one message with several tool uses."
        return text
    if kind == "skill_listing" and attachment.get("content"):
        return "Skills the Skill tool can use:\n\n" + str(attachment["content"])
    return ""


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


def _session_of(path: Path) -> str:
    """The session a file belongs to (its first `sessionId`), read from its first lines only."""
    with open(path, "rb") as handle:
        for raw in handle:
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            if isinstance(obj, dict) and isinstance(obj.get("sessionId"), str):
                return obj["sessionId"]
    return path.stem


def _first_time(path: Path) -> float:
    with open(path, "rb") as handle:
        for raw in handle:
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            if isinstance(obj, dict) and obj.get("timestamp"):
                return _Entry(obj, 0).time or 0.0
    return 0.0


def _build(src: Path, files: list[Path], seen_calls: set[str]) -> tuple[list[_Call], int]:
    """The API calls of one session's files (the main transcript and its sub-agents')."""
    entries, bad = _read(files)
    by_uuid = {e.uuid: e for e in entries if e.uuid}
    _group(entries, by_uuid)
    calls = [
        c
        for c in _calls(entries, by_uuid)
        if str(c.first.message.get("id") or c.first.uuid) not in seen_calls
    ]
    seen_calls.update(str(c.first.message.get("id") or c.first.uuid) for c in calls)  # resumed copies
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
    return calls, bad


def _valid_start(messages: list[Message]) -> tuple[list[Message], list[int]]:
    """A transcript that starts mid-session (resumed, or a sidechain) may begin with a reply or a
    tool result; the API needs a user message first and a tool call before each result. Make up
    the least that satisfies it, and say which messages were made up."""
    orphans: list[str] = []
    for m in messages:
        if m.get("role") != "tool":
            break
        orphans.append(str(m.get("tool_call_id")))
    if messages and messages[0].get("role") == "user":
        return messages, []
    made: list[Message] = [{"role": "user", "content": "(the conversation before this transcript)"}]
    if orphans:
        made.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": c, "name": "earlier_tool", "arguments": "{}"} for c in orphans],
            }
        )
    return [*made, *messages], list(range(len(made)))


def _steps(
    src: Path,
    files: list[Path],
    seen_calls: set[str],
    options: ImportOptions,
    counts: dict[str, int],
    system_tokens: int | None,
    short: dict[str, str],
) -> Iterator[Step]:
    calls, bad = _build(src, files, seen_calls)
    counts["bad_lines"] += bad
    groups: dict[tuple[str, ...], list[_Call]] = defaultdict(list)
    for call in calls:
        groups[call.group].append(call)
    out: list[Step] = []
    side = 0
    for group, group_calls in groups.items():
        sid8 = short.get(group[1], group[1][:8]) or "session"
        role = "interactive" if group[0] == "main" else "subagent"
        if group[0] == "main":
            key = f"cc-{sid8}"
        elif group[0] == "agent":
            key = f"cc-{sid8}-agent-{group[2][:8]}"
        else:
            side += 1
            key = f"cc-{sid8}-side-{side}"
        model = str(group_calls[0].lines[0].message.get("model") or "default")
        info = SessionInfo(
            key=key,
            role=role,
            api="anthropic",
            model=model,
            labels={"source": "claude-code"},
            agent_ids=(group[1],),
        )
        names = {c["name"] for call in group_calls for c in (call.reply or {}).get("tool_calls") or ()}
        tools = stand_in_tools(names)
        first = group_calls[0]
        size = system_tokens
        tool_tokens = (
            estimate_tokens([{"role": "system", "content": orjson.dumps(tools).decode()}]) if tools else 0
        )
        if size is None:
            reminder = (
                REMINDER_TOKENS
                if role == "interactive" and first.messages[:1] and first.messages[0].get("role") == "user"
                else 0
            )
            size = max(
                0, (first.usage.get("prompt_tokens") or 0) - _tokens(first.messages) - tool_tokens - reminder
            )
        seed = SYSTEM_SEEDS[role] if options.shared_system else _seed(key)
        system = _system(size, seed, SYSTEM_SEEDS[role])
        prev = 0.0
        before: _Call | None = None
        rewrites = 0
        # a server that caches says so on some call; one that never does reads 0 on every call
        caches = any((c.usage.get("cached_tokens") or 0) > 0 for c in group_calls)
        for call in group_calls:  # keep each session's order even if clocks stepped back
            call.t = max(call.t, prev)
            prev = call.t
            if before is not None and system_tokens is None and caches and _rewrote_prefix(before, call):
                rewrites += 1  # re-read in full: a new system prompt from here on
                size = max(0, (call.usage.get("prompt_tokens") or 0) - _tokens(call.messages) - tool_tokens)
                system = _system(size, seed ^ rewrites, SYSTEM_SEEDS[role] ^ rewrites)
            before = call
            messages, made = _valid_start(call.messages)
            if not made and role == "interactive":
                messages = _with_reminder(messages, call.t)
            params: dict[str, Any] = {"stream": True}
            if "output_tokens" in call.usage:
                params["max_tokens"] = call.usage["output_tokens"]
            if tools:
                params["tools"] = tools
            out.append(
                Step(
                    session=info,
                    t=call.t,
                    messages=[*system, *messages],
                    reply=call.reply,
                    finish=call.finish,
                    output_tokens=call.usage.get("output_tokens"),
                    usage=call.usage or None,
                    tag="compaction" if call.compaction else "turn",
                    done=max((x.time or call.t) for x in call.lines),
                    params=params,
                    synthetic=[i + len(system) for i in made] or None,
                )
            )
        out[-1].ends = (info,)
    link_subagents(out)  # format /2: who spawned each subagent, which request waited for it
    out.sort(key=lambda st: st.t)
    yield from out


def _system(size: int, seed: int, shared: int) -> list[Message]:
    """The stand-in system blocks: the billing line (`seed`: per session unless shared), then the
    identity line and the prompt (one seed per kind), `size` tokens in all."""
    if size <= 0:
        return []
    if size <= BILLING_TOKENS + IDENTITY_TOKENS:
        return [{"role": "system", "content": {"synth": {"tokens": size, "seed": seed}}}]
    return [
        {"role": "system", "content": {"synth": {"tokens": BILLING_TOKENS, "seed": seed}}},
        {"role": "system", "content": {"synth": {"tokens": IDENTITY_TOKENS, "seed": shared + 1}}},
        {
            "role": "system",
            "content": {"synth": {"tokens": size - BILLING_TOKENS - IDENTITY_TOKENS, "seed": shared}},
        },
    ]


def _with_reminder(messages: list[Message], t: float) -> list[Message]:
    """The `<system-reminder>` Claude Code puts before the first prompt (not in its transcript): a
    stand-in of the measured size, the same for every session of a day (it carries the date)."""
    if not messages or messages[0].get("role") != "user" or not isinstance(messages[0].get("content"), str):
        return messages
    day = int(_dt.datetime.fromtimestamp(t, _dt.UTC).strftime("%Y%m%d"))
    filler = synth_text(REMINDER_TOKENS - _REMINDER_FRAME, day)
    first = {
        **messages[0],
        "content": f"<system-reminder>\n{filler}\n</system-reminder>\n\n\n{messages[0]['content']}",
    }
    return [first, *messages[1:]]


def _rewrote_prefix(before: _Call, call: _Call) -> bool:
    """The call re-read a prefix the previous call had cached: its cache read is under half of the
    previous prompt, within the cache's life, and it extends the previous call's messages."""
    cached = call.usage.get("cached_tokens")
    prompt = before.usage.get("prompt_tokens") or 0
    if cached is None or not prompt or call.compaction or cached >= prompt // 2:
        return False
    done = max((x.time or before.t) for x in before.lines)
    if call.t - done > CACHE_TTL_S:
        return False
    n = len(before.messages)
    return len(call.messages) > n and call.messages[:n] == before.messages


def _seed(key: str) -> int:
    """A stand-in system prompt of its own per session: Claude Code's first system block is a
    per-session billing line, so two sessions share no cached prefix."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=6).digest(), "big")


def import_claude_code(
    src: str | Path, out: str | Path, system_tokens: int | None = None, options: ImportOptions | None = None
) -> dict[str, int]:
    """Convert a transcript file, or every transcript under a folder (a project, or all of them),
    into a trace at `out`.

    `system_tokens`: size of the stand-in system prompt; None sizes it from each session's first
    reported usage, 0 leaves it out.
    """
    options = options or ImportOptions()
    src = Path(src)
    files = _files(src)
    if not files:
        raise TraceError(str(src), 0, "no Claude Code transcripts (*.jsonl) found")
    by_session: dict[str, list[Path]] = defaultdict(list)
    for f in files:
        by_session[_session_of(f)].append(f)
    starts = sorted((min(_first_time(f) for f in fs), sid) for sid, fs in by_session.items())
    counts = {"files": len(files), "bad_lines": 0}
    prefixes = [sid[:8] for sid in by_session]
    short = {sid: sid[:8] if prefixes.count(sid[:8]) == 1 else sid for sid in by_session}
    seen_calls: set[str] = set()
    with progress_bar(tree_size(files), "claude-code", options) as advance:

        def session(sid: str) -> Iterator[Step]:
            advance(tree_size(by_session[sid]))
            return _steps(src, by_session[sid], seen_calls, options, counts, system_tokens, short)

        steps = merge_by_time((t, partial(session, sid)) for t, sid in starts)
        try:
            written = write_trace(
                steps,
                Path(out),
                "import:claude-code",
                f"imported from {len(files)} Claude Code transcript file(s); system prompt and tools are synthetic stand-ins",
                options,
            )
        except UsageError as exc:
            if "no API calls" in str(exc):
                raise TraceError(
                    str(src), 0, "no assistant replies found: is this a Claude Code transcript?"
                ) from None
            raise
    return {**counts, **written}
