"""OpenCode's stores -> a trace: the SQLite `opencode.db`, the older `storage/` folder of JSON files,
an `opencode export` file, or an `opencode run --format json` event stream.

OpenCode keeps sessions, messages (`role` user / assistant, `time`, `tokens`, `summary`) and parts
(`text`, `reasoning`, `tool` with `callID`, `tool`, `state.input/output`, `step-start`,
`step-finish` with `reason` and `tokens`, `compaction`, ...). One assistant message holds every
API call of one turn: each `step-start` ... `step-finish` span is one request. Mapping
(traces/IMPORTERS.md has the table):

- a step's request is the session's history (system prompt, earlier user and assistant messages,
  tool results) plus the earlier steps of the same assistant message with their tool results;
  its reply is the step's text and tool calls; `step-finish` tokens are the recorded usage
  (prompt = input + cache read + cache write, as OpenCode splits them);
- a `compaction` part starts a summary turn; the first request after the summary keeps only the
  summary and what follows it (OpenCode drops what was summarised) and is tagged `compaction`;
- a session with a `parentID` is a `subagent` session (the task tool's child);
- OpenCode stores neither its system prompt nor its tool definitions: a synthetic stand-in system
  prompt is sized from the first step's usage (one seed per kind, main or sub-agent, as OpenCode's
  prompt is the same for every session of an agent), tools are stand-ins named as used;
- an event stream carries no user prompts: each turn gets a one-line synthetic user message,
  listed in the request's `synthetic`;
- OpenCode names a new session with a call of its own that it does not store; the title it got is
  stored, so that call is made up from it (session `oc-<id>-title`, role and tag `title`: a stand-in
  system prompt of 525 tokens, an instruction, the first prompt quoted, the title as the reply, as
  1.18.33 sends it), sent with the first prompt.
- a step still in flight when OpenCode stopped (a `step-start` and nothing after) was sent: a
  request with no reply. The system stand-in is sized so the first step renders at its usage.
"""

from __future__ import annotations

import itertools
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
    columns,
    is_sqlite,
    merge_by_time,
    open_sqlite_ro,
    progress_bar,
    rendered_tokens,
    stand_in_tools,
    tree_size,
    write_trace,
)
from replay.record.tokens import count_tokens
from replay.record.wire import canonical_arguments
from replay.trace.model import Message

SYSTEM_SEEDS = {"interactive": 0x4F43_4D41_494E, "subagent": 0x4F43_5355_4241, "title": 0x4F43_5449_544C}
# The title call as OpenCode 1.18.33 sends it (measured, simulator tokens): its own system prompt,
# an instruction, then the first prompt in quotes.
TITLE_SYSTEM_TOKENS = 525
_DEFAULT_TITLES = ("New session - ", "Child session - ")  # what a session is called before it is named
_FINISH = {"tool-calls": "tool_calls", "tool_calls": "tool_calls", "stop": "stop", "length": "length"}
_NO_PROMPT = "(the user's prompt is not in an opencode event stream)"

Turn = tuple[dict[str, Any], list[dict[str, Any]]]  # (message info, its parts)


@dataclass(slots=True)
class _Session:
    id: str
    parent: str | None
    title: str
    created: float  # epoch seconds
    turns: Callable[[], Iterator[Turn]]
    labels: dict[str, Any] = field(default_factory=dict)


def _ms(value: Any) -> float | None:
    return float(value) / 1000.0 if isinstance(value, int | float) and value > 0 else None


def _load_json(path: Path) -> Any:
    try:
        return orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise TraceError(str(path), 1, f"bad JSON: {exc}") from None


def _by_time(turns: list[Turn]) -> list[Turn]:
    return sorted(
        turns, key=lambda t: ((t[0].get("time") or {}).get("created") or 0, str(t[0].get("id", "")))
    )


# ---- reading each store as sessions of turns -----------------------------------------------------


def _from_db(path: Path, advance: Callable[[int], None]) -> Iterator[_Session]:
    """The sessions in (created, id) order, one at a time as the merge reaches them: nothing of a
    session but its row is read before its turns are, and no list of them is kept."""
    conn = open_sqlite_ro(path, ("session", "message", "part"), "OpenCode")
    scols = columns(conn, "session")
    pick = [c for c in ("id", "parent_id", "title", "time_created", "directory") if c in scols]
    # the order `_ms` gives: a time that is not a positive number is 0
    created = (
        "CASE WHEN typeof(time_created) IN ('integer', 'real') AND time_created > 0"
        " THEN time_created ELSE 0 END, "
        if "time_created" in scols
        else ""
    )

    def turns(sid: str) -> Iterator[Turn]:
        rows = conn.execute(
            "SELECT id, data FROM message WHERE session_id = ? ORDER BY time_created, id", (sid,)
        ).fetchall()
        for mid, data in rows:
            advance(len(data or ""))
            info = orjson.loads(data or "{}")
            info.setdefault("id", mid)
            parts = []
            for pid, pdata in conn.execute(
                "SELECT id, data FROM part WHERE message_id = ? ORDER BY id", (mid,)
            ):
                advance(len(pdata or ""))
                part = orjson.loads(pdata or "{}")
                part.setdefault("id", pid)
                parts.append(part)
            yield info, parts

    for row in conn.execute(f"SELECT {', '.join(pick)} FROM session ORDER BY {created}id"):
        r = dict(row)
        yield _Session(
            id=str(r["id"]),
            parent=r.get("parent_id"),
            title=str(r.get("title") or ""),
            created=_ms(r.get("time_created")) or 0.0,
            turns=partial(turns, str(r["id"])),
        )


def _from_storage(root: Path, advance: Callable[[int], None]) -> list[_Session]:
    sessions = []
    for path in sorted((root / "session").rglob("*.json")):
        info = _load_json(path)
        if not isinstance(info, dict) or "id" not in info:
            raise TraceError(str(path), 1, "not an OpenCode session file (no 'id')")

        def turns(sid: str = str(info["id"])) -> Iterator[Turn]:
            out: list[Turn] = []
            for mpath in sorted((root / "message" / sid).glob("*.json")):
                advance(mpath.stat().st_size)
                msg = _load_json(mpath)
                parts = []
                for ppath in sorted((root / "part" / str(msg.get("id", mpath.stem))).glob("*.json")):
                    advance(ppath.stat().st_size)
                    parts.append(_load_json(ppath))
                out.append((msg, parts))
            yield from _by_time(out)

        sessions.append(
            _Session(
                id=str(info["id"]),
                parent=info.get("parentID"),
                title=str(info.get("title") or ""),
                created=_ms((info.get("time") or {}).get("created")) or 0.0,
                turns=turns,
            )
        )
    return sessions


def _from_export(path: Path, obj: dict[str, Any]) -> list[_Session]:
    info = obj.get("info") or {}
    messages = obj.get("messages")
    if not isinstance(messages, list):
        raise TraceError(str(path), 1, "not an opencode export (no 'messages' list)")
    turns = [(m.get("info") or {}, m.get("parts") or []) for m in messages if isinstance(m, dict)]
    sid = str(info.get("id") or path.stem)
    return [
        _Session(
            id=sid,
            parent=info.get("parentID"),
            title=str(info.get("title") or ""),
            created=_ms((info.get("time") or {}).get("created")) or 0.0,
            turns=lambda: iter(_by_time(turns)),
        )
    ]


def _from_events(path: Path, advance: Callable[[int], None]) -> list[_Session]:
    """`opencode run --format json`: events carry parts of assistant messages only. Read as it
    streams: a first pass checks every line and keeps per session only when it starts and where
    its lines are (the bytes from its first line to its last); a session's turns are read from
    there when the merge reaches it (a file of sessions one after another is read twice)."""
    spans: dict[str, list[Any]] = {}  # session id -> [first stamp or None, first byte, end byte]
    at = 0
    with open(path, "rb") as handle:
        for n, raw in enumerate(handle, 1):
            start, at = at, at + len(raw)
            advance(len(raw))
            if not raw.strip():
                continue
            sid, event = _event(path, n, raw)
            if sid is None:
                continue
            span = spans.get(sid)
            if span is None:
                spans[sid] = span = [None, start, at]
            span[2] = at
            if span[0] is None:
                span[0] = _ms(event.get("timestamp"))
    return [
        _Session(
            id=sid,
            parent=None,
            title="",
            created=created or 0.0,
            turns=partial(_event_turns, path, sid, start, end),
        )
        for sid, (created, start, end) in spans.items()
    ]


def _event(path: Path, n: int, raw: bytes) -> tuple[str | None, dict[str, Any]]:
    """An event line's session id (None when it carries no part) and the event."""
    try:
        event = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise TraceError(str(path), n, f"bad JSON: {exc}") from None
    kind = event.get("type") if isinstance(event, dict) else None
    if kind not in ("step_start", "step_finish", "text", "tool_use", "reasoning", "error"):
        raise TraceError(str(path), n, f"not an opencode event (type {kind!r})")
    part = event.get("part")
    sid = str(event.get("sessionID") or (part or {}).get("sessionID") or "")
    if not isinstance(part, dict) or not sid:
        return None, event  # an error event carries no part
    return sid, event


def _event_turns(path: Path, sid: str, start: int, end: int) -> Iterator[Turn]:
    """One session's turns: its events between its first and last line (another session's lines
    between them are passed over), each assistant message after a synthetic user prompt."""
    turns: dict[str, Turn] = {}
    with open(path, "rb") as handle:
        handle.seek(start)
        at = start
        for raw in handle:
            if at >= end:
                break
            at += len(raw)
            if not raw.strip():
                continue
            mine, event = _event(path, 0, raw)
            if mine != sid:
                continue
            part = event["part"]
            mid = str(part.get("messageID") or "")
            stamp = _ms(event.get("timestamp"))
            if mid not in turns:
                turns[mid] = (
                    {"id": mid, "role": "assistant", "time": {"created": event.get("timestamp")}},
                    [],
                )
            if stamp is not None:
                part = {**part, "_at": stamp}
            turns[mid][1].append(part)
    for info, parts in turns.values():
        user = {"id": f"{info['id']}-prompt", "role": "user", "time": info["time"], "_synthetic": True}
        yield user, [{"type": "text", "text": _NO_PROMPT}]
        yield info, parts


def _one_document(path: Path) -> Any:
    """The file's JSON value if it holds exactly one (an export), else None (an event stream, one
    event a line, is read as it streams: never whole in memory)."""
    with open(path, "rb") as handle:
        first = handle.readline()
        while first and not first.strip():
            first = handle.readline()
        try:
            obj = orjson.loads(first)
        except orjson.JSONDecodeError:
            obj = None  # an export written over many lines
        else:
            if any(raw.strip() for raw in handle):
                return None  # more than one object: an event stream
            return obj
    try:
        return orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError:
        return None  # more than one object: an event stream


def _sources(src: Path, advance: Callable[[int], None]) -> Iterator[_Session]:
    """The store's sessions in (created, id) order (a database's read one at a time)."""
    found = _stores(src, advance)
    if isinstance(found, list):
        return iter(sorted(found, key=lambda x: (x.created, x.id)))
    return found


def _stores(src: Path, advance: Callable[[int], None]) -> list[_Session] | Iterator[_Session]:
    if src.is_dir():
        if (src / "opencode.db").is_file():
            return _from_db(src / "opencode.db", advance)
        root = src if (src / "session").is_dir() else src / "storage"
        if not (root / "session").is_dir():
            raise TraceError(str(src), 0, "no opencode.db and no storage/session folder here")
        return _from_storage(root, advance)
    if is_sqlite(src):
        return _from_db(src, advance)
    with open(src, "rb") as handle:
        head = handle.read(1)
    if head == b"{":
        obj = _one_document(src)
        if isinstance(obj, dict) and "messages" in obj:
            return _from_export(src, obj)
        if isinstance(obj, dict) and "type" not in obj:
            raise TraceError(str(src), 1, "not an opencode export or event stream")
    return _from_events(src, advance)


# ---- turns -> steps --------------------------------------------------------------------------------


def _usage(tokens: Any) -> dict[str, Any] | None:
    if not isinstance(tokens, dict) or not any(tokens.get(k) for k in ("input", "output")):
        return None
    cache = tokens.get("cache") or {}
    read, write = int(cache.get("read") or 0), int(cache.get("write") or 0)
    out = {
        "prompt_tokens": int(tokens.get("input") or 0) + read + write,
        "cached_tokens": read,
        "output_tokens": int(tokens.get("output") or 0),
        "raw": tokens,
    }
    if write:
        out["cache_write_tokens"] = write
    return out


def _tool_result(part: dict[str, Any]) -> Message:
    state = part.get("state") or {}
    status = state.get("status")
    if status == "completed":
        text = state.get("output")
    elif status == "error":
        text = state.get("error")
    else:
        text = "Tool execution was interrupted"
    return {
        "role": "tool",
        "tool_call_id": str(part.get("callID") or part.get("id")),
        "content": str(text or ""),
    }


@dataclass(slots=True)
class _StepParts:
    parts: list[dict[str, Any]] = field(default_factory=list)
    finish: dict[str, Any] | None = None


def _steps_of(parts: list[dict[str, Any]]) -> list[_StepParts]:
    """Split an assistant message's parts at step boundaries (a message without them is one step)."""
    steps: list[_StepParts] = []
    current: _StepParts | None = None
    for p in parts:
        kind = p.get("type")
        if kind == "step-start":
            current = _StepParts()
            steps.append(current)
        elif kind == "step-finish":
            if current is None:
                current = _StepParts()
                steps.append(current)
            current.finish = p
            current = None
        else:
            if current is None:
                current = _StepParts()
                steps.append(current)
            current.parts.append(p)
    # a step that has nothing yet and is the message's last was in flight when the agent stopped
    return [s for i, s in enumerate(steps) if s.parts or s.finish or i == len(steps) - 1]


def _reply(step: _StepParts) -> Message:
    text = "".join(str(p.get("text") or "") for p in step.parts if p.get("type") == "text")
    reasoning = "".join(str(p.get("text") or "") for p in step.parts if p.get("type") == "reasoning")
    msg: Message = {"role": "assistant", "content": text}
    calls = [
        {
            "id": str(p.get("callID") or p.get("id")),
            "name": str(p.get("tool") or ""),
            "arguments": canonical_arguments((p.get("state") or {}).get("input") or {}),
        }
        for p in step.parts
        if p.get("type") == "tool"
    ]
    if calls:
        msg["tool_calls"] = calls
    if reasoning:
        msg["reasoning"] = reasoning
    return msg


def _times(step: _StepParts, sent: float) -> tuple[float, float]:
    """When a step was sent and done: done when its first tool started (the reply had ended), else
    when its last part ended (the message's creation if no part carries a time)."""
    tool_starts: list[float] = []
    ends: list[float] = []
    for p in step.parts:
        t = ((p.get("state") or {}).get("time") if p.get("type") == "tool" else p.get("time")) or {}
        start, end = _ms(t.get("start")), _ms(t.get("end"))
        if p.get("type") == "tool":
            if start is not None:
                tool_starts.append(start)
            continue
        if end is not None:
            ends.append(end)
        if p.get("_at"):
            ends.append(float(p["_at"]))
    done = min(tool_starts) if tool_starts else (max(ends) if ends else sent)
    return sent, max(done, sent)


def _session_steps(s: _Session, role: str) -> Iterator[Step]:
    turns = list(s.turns())
    names = {
        str(p.get("tool")) for _, parts in turns for p in parts if p.get("type") == "tool" and p.get("tool")
    }
    params: dict[str, Any] = {"stream": True}
    if names:
        params["tools"] = stand_in_tools(names)
    model = next(
        (str(i.get("modelID")) for i, _ in turns if i.get("role") == "assistant" and i.get("modelID")),
        "default",
    )
    info = SessionInfo(
        key=f"oc-{s.id}",
        role=role,
        api="openai",
        model=model,
        labels={"source": "opencode", "opencode_id": s.id, **({"title": s.title} if s.title else {})},
        agent_ids=(s.id,),
    )
    system: Message | None = None
    history: list[Message] = []
    synthetic: set[int] = set()  # ids of synthetic messages
    compaction = False
    out: list[Step] = []
    for msg_info, parts in turns:
        created = _ms((msg_info.get("time") or {}).get("created")) or s.created
        if msg_info.get("role") == "user":
            if any(p.get("type") == "compaction" for p in parts):
                compaction = True  # the summary turn: the next request after it keeps only the summary
            text = "\n".join(
                str(p.get("text") or "") for p in parts if p.get("type") == "text" and not p.get("ignored")
            )
            if any(p.get("type") == "compaction" for p in parts) and not text:
                text = "What did we do so far?"  # what OpenCode asks the model to summarise
            m: Message = {"role": "user", "content": text}
            if msg_info.get("_synthetic"):
                synthetic.add(id(m))
            history.append(m)
            continue
        if msg_info.get("role") != "assistant":
            continue
        sent = created
        steps = _steps_of(parts)
        if not steps and (not (msg_info.get("time") or {}).get("completed") or msg_info.get("error")):
            steps = [_StepParts()]  # created, never answered: the call was sent all the same
        for step in steps:
            if system is None:
                declared = msg_info.get("system")
                if isinstance(declared, list) and declared:
                    system = {"role": "system", "content": "\n".join(str(x) for x in declared)}
                else:  # sized so this request renders at its recorded prompt tokens
                    first = _usage((step.finish or {}).get("tokens")) or {}
                    held = rendered_tokens([{"role": "system", "content": ""}, *history], params.get("tools"))
                    size = max(0, int(first.get("prompt_tokens") or 0) - held) if first else 0
                    system = {
                        "role": "system",
                        "content": {"synth": {"tokens": size, "seed": SYSTEM_SEEDS[role]}},
                    }
            messages = [system, *history]
            t, done = _times(step, sent)
            if not step.parts and step.finish is None:  # in flight: sent, no reply recorded
                out.append(Step(session=info, t=t, messages=messages, tag="turn", done=t, params=params,
                                synthetic=[i for i, m in enumerate(messages) if id(m) in synthetic] or None))  # fmt: skip
                break
            reply = _reply(step)
            usage = _usage((step.finish or {}).get("tokens"))
            reason = str((step.finish or {}).get("reason") or "")
            out.append(
                Step(
                    session=info,
                    t=t,
                    messages=messages,
                    reply=reply,
                    finish=_FINISH.get(reason) or ("tool_calls" if reply.get("tool_calls") else "stop"),
                    output_tokens=(usage or {}).get("output_tokens"),
                    usage=usage,
                    tag="compaction" if compaction and not msg_info.get("summary") else "turn",
                    done=done,
                    params=params,
                    synthetic=[i for i, m in enumerate(messages) if id(m) in synthetic] or None,
                )
            )
            if not msg_info.get("summary"):
                compaction = False
            history.append(reply)
            results = [_tool_result(p) for p in step.parts if p.get("type") == "tool"]
            history.extend(results)
            ends = [
                _ms(((p.get("state") or {}).get("time") or {}).get("end"))
                for p in step.parts
                if p.get("type") == "tool"
            ]
            sent = max([done, *(e for e in ends if e)])
        if msg_info.get("summary"):
            # OpenCode sends only what follows the last summary: the compaction prompt and the summary
            start = max(i for i, m in enumerate(history) if m["role"] == "user")
            history = history[start:]
    title = _title_step(s, info, turns)
    if title is not None:
        out.append(title)
    out.sort(key=lambda st: st.t)
    if out:
        out[-1].ends = (info, *((title.session,) if title is not None else ()))
    yield from out


def _title_step(s: _Session, info: SessionInfo, turns: list[Turn]) -> Step | None:
    """OpenCode names a new session with a call of its own (a small model, its own system prompt,
    the first prompt), which it does not store; the title it got is stored, so the call is made
    up from it: its own session, role `title`, sent with the first prompt."""
    if info.role != "interactive" or not s.title or s.title.startswith(_DEFAULT_TITLES):
        return None
    first = next((t for t in turns if t[0].get("role") == "user" and not t[0].get("_synthetic")), None)
    if first is None:
        return None
    text = "\n".join(str(p.get("text") or "") for p in first[1] if p.get("type") == "text")
    when = _ms((first[0].get("time") or {}).get("created")) or s.created
    key = SessionInfo(
        key=f"{info.key}-title",
        role="title",
        api=info.api,
        model=info.model,
        labels={**info.labels, "job": "title"},
        agent_ids=info.agent_ids,
    )
    system = {
        "role": "system",
        "content": {"synth": {"tokens": TITLE_SYSTEM_TOKENS, "seed": SYSTEM_SEEDS["title"]}},
    }
    ask = {"role": "user", "content": "Write a short title for this conversation:\n"}
    reply = {"role": "assistant", "content": s.title}
    return Step(
        session=key,
        t=when,
        messages=[system, ask, {"role": "user", "content": f'"{text}"'}],
        reply=reply,
        finish="stop",
        output_tokens=max(1, count_tokens(s.title)),
        tag="title",
        done=when,
        synthetic=[1],
    )


def import_opencode(src: str | Path, out: str | Path, options: ImportOptions | None = None) -> dict[str, int]:
    """Convert an OpenCode store (database, storage folder, export or event stream) into a trace."""
    options = options or ImportOptions()
    src = Path(src)
    size = tree_size(src.rglob("*")) if src.is_dir() else src.stat().st_size
    with progress_bar(size, "opencode", options) as advance:
        sessions = _sources(src, advance)
        first = next(sessions, None)
        if first is None:
            raise TraceError(str(src), 0, "no OpenCode sessions found")
        sessions = itertools.chain((first,), sessions)
        del first
        seen = [0]

        def sources() -> Iterator[tuple[float, Callable[[], Iterator[Step]]]]:
            for s in sessions:
                seen[0] += 1
                yield s.created, partial(_session_steps, s, "subagent" if s.parent else "interactive")

        steps = merge_by_time(sources())
        counts = write_trace(
            steps,
            Path(out),
            "import:opencode",
            "imported from OpenCode; system prompt and tools are stand-ins (OpenCode stores neither)",
            options,
        )
    return {"conversations": seen[0], **counts}
