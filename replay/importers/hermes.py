"""Hermes Agent's SQLite store (`~/.hermes/state.db`) -> a trace.

Hermes writes every message it sends or receives to `messages` (one row each, `timestamp` in
epoch seconds), grouped by `sessions` (one row per session: `source` cli / cron / a messaging
platform, `parent_session_id`, `end_reason`, the system prompt inline in older stores or by
`system_prompt_hash` in `system_prompts`). It stores no tool definitions and no per-call prompt
usage, but its session sums of prompt tokens size stand-in tools (`_tools`). Mapping
(traces/IMPORTERS.md has the table):

- each assistant row is the reply to one API call; the request is every earlier message of the
  conversation (system prompt first); sent when its last input row was written, done when the
  reply row was;
- a session whose parent ended with `end_reason = 'compression'` continues the parent's
  conversation (same trace session): its first call is a `compaction`;
- other children (delegate/subagent runs, `source = 'tool'`) are `subagent` sessions; `/branch`
  and reset children are conversations of their own; `source = 'cron'` sessions have role `cron`;
- a background-review harness prompt ("Review the conversation above ...") written into a session
  starts a `review` turn: the conversation up to the last reply plus the prompt, sent while the
  main conversation goes on (a concurrent turn in a `review` session forked off the main one).

The database is opened read-only (`mode=ro`) and columns are selected by name, so an older store
with fewer columns imports too. Conversations are read one at a time (`merge_by_time`).
"""

from __future__ import annotations

import heapq
import itertools
import re
import sqlite3
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
    merge_by_time,
    open_sqlite_ro,
    progress_bar,
    sized_tools,
    stand_in_tools,
    tools_tokens,
    write_trace,
)
from replay.record.tokens import count_tokens
from replay.record.wire import canonical_arguments
from replay.sim.model.render import Rendered
from replay.trace.model import Message

REVIEW_PREFIXES = (
    "Review the conversation above and update the skill library",
    "Review the conversation above and consider saving to memory",
)
_RESET_REASONS = {"session_reset", "session_switch", "idle", "daily", "suspended", "new_session", "branched"}
_FINISH = {"tool_calls": "tool_calls", "stop": "stop", "length": "length", "end_turn": "stop"}
_CRON_ID = re.compile(r"^cron_(.+?)_\d{8}_\d{6}$")
_SESSION_COLS = (
    "id",
    "source",
    "model",
    "model_config",
    "system_prompt_hash",
    "parent_session_id",
    "started_at",
    "ended_at",
    "end_reason",
    "title",
    "tool_names",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "api_call_count",
)
_TOOLS_SEED = 0x4E6F7573  # one seed for Hermes' stand-in tools: equal sizes, identical tools
_MESSAGE_COLS = (
    "id",
    "role",
    "content",
    "api_content",
    "tool_call_id",
    "tool_calls",
    "tool_name",
    "timestamp",
    "token_count",
    "finish_reason",
    "reasoning",
    "_compressed_summary",
)


@dataclass(slots=True)
class _Session:
    row: dict[str, Any]
    children: list[_Session] = field(default_factory=list)
    continuation: _Session | None = None

    @property
    def id(self) -> str:
        return str(self.row["id"])

    @property
    def started(self) -> float:
        return float(self.row.get("started_at") or 0.0)


def _json(text: Any) -> Any:
    if not isinstance(text, str | bytes) or not text:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


def _marker(row: dict[str, Any], key: str) -> bool:
    config = _json(row.get("model_config"))
    return isinstance(config, dict) and config.get(key) is not None


def _tool_calls(raw: Any) -> list[dict[str, str]]:
    calls = _json(raw) if not isinstance(raw, list) else raw
    out = []
    for c in calls or ():
        if not isinstance(c, dict):
            continue
        fn: dict[str, Any] = c["function"] if isinstance(c.get("function"), dict) else c
        out.append(
            {
                "id": str(c.get("id") or c.get("call_id") or ""),
                "name": str(fn.get("name") or ""),
                "arguments": canonical_arguments(fn.get("arguments", "{}")),
            }
        )
    return out


def _text(content: Any) -> str:
    """Text of a stored content: text, or multimodal parts Hermes stores as JSON (text parts kept)."""
    if not isinstance(content, str):
        return ""
    if content.startswith("[{"):
        parts = _json(content)
        if isinstance(parts, list) and parts and all(isinstance(p, dict) and "type" in p for p in parts):
            return "\n".join(
                str(p.get("text") or "") for p in parts if p.get("type") in ("text", "input_text")
            )
    return content


def _message(row: sqlite3.Row, cols: set[str]) -> Message | None:
    role = row["role"]
    if role not in ("system", "user", "assistant", "tool"):
        return None  # Hermes' own bookkeeping rows
    content = (
        row["api_content"] if "api_content" in cols and row["api_content"] is not None else row["content"]
    )
    msg: Message = {"role": role, "content": _text(content)}
    if role == "assistant":
        calls = _tool_calls(row["tool_calls"]) if "tool_calls" in cols else []
        if calls:
            msg["tool_calls"] = calls
        if "reasoning" in cols and row["reasoning"]:
            msg["reasoning"] = row["reasoning"]
    elif role == "tool":
        msg["tool_call_id"] = str(row["tool_call_id"] if "tool_call_id" in cols else "") or ""
    return msg


class _Store:
    """The open database and what it holds about sessions (one small row each)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.conn = open_sqlite_ro(path, ("sessions", "messages"), "Hermes state")
        self.scols = columns(self.conn, "sessions")
        self.mcols = columns(self.conn, "messages")
        for need, have, table in (
            (("id", "source"), self.scols, "sessions"),
            (("session_id", "role", "content", "timestamp"), self.mcols, "messages"),
        ):
            missing = [c for c in need if c not in have]
            if missing:
                raise TraceError(
                    str(path), 0, f"not a Hermes state database: {table} has no {', '.join(missing)}"
                )
        names = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        self.prompts = "system_prompts" in names
        wanted = [c for c in _SESSION_COLS if c in self.scols]
        rows = self.conn.execute(f"SELECT {', '.join(wanted)} FROM sessions")
        self.sessions = {str(r["id"]): _Session(dict(r)) for r in rows}
        firsts = self.conn.execute("SELECT session_id, MIN(timestamp) FROM messages GROUP BY session_id")
        for sid, first in firsts:
            s = self.sessions.get(str(sid))
            if s is not None and first is not None:
                s.row["started_at"] = min(float(first), s.started or float(first))
        self.select = ", ".join(c for c in _MESSAGE_COLS if c in self.mcols)
        self.order = "timestamp, id" if "id" in self.mcols else "timestamp"

    def system_prompt(self, s: _Session) -> str | None:
        digest = s.row.get("system_prompt_hash")
        if digest and self.prompts:
            pcols = columns(self.conn, "system_prompts")
            text_col = "prompt" if "prompt" in pcols else "content"
            key_col = "hash" if "hash" in pcols else "id"
            found = self.conn.execute(
                f"SELECT {text_col} FROM system_prompts WHERE {key_col} = ?", (digest,)
            ).fetchone()
            if found and found[0]:
                return str(found[0])
        if "system_prompt" in self.scols:
            found = self.conn.execute("SELECT system_prompt FROM sessions WHERE id = ?", (s.id,)).fetchone()
            if found and found[0]:
                return str(found[0])
        return None

    def tool_names(self, s: _Session) -> list[str]:
        names: list[str] = []
        listed = s.row.get("tool_names")
        parsed = _json(listed)
        if isinstance(parsed, list):
            names += [str(n) for n in parsed]
        elif isinstance(listed, str) and listed:
            names += [n.strip() for n in listed.split(",") if n.strip()]
        if "tool_name" in self.mcols:
            rows = self.conn.execute(
                "SELECT DISTINCT tool_name FROM messages WHERE session_id = ? AND tool_name IS NOT NULL",
                (s.id,),
            )
            names += [str(r[0]) for r in rows if r[0]]
        return names

    def rows(self, s: _Session) -> Iterator[sqlite3.Row]:
        yield from self.conn.execute(
            f"SELECT {self.select} FROM messages WHERE session_id = ? ORDER BY {self.order}", (s.id,)
        )


def _link(store: _Store) -> list[tuple[_Session, str]]:
    """Conversations to import: (first session of the chain, role); continuations hang off it."""
    roots: list[tuple[_Session, str]] = []
    for s in store.sessions.values():
        parent = store.sessions.get(str(s.row.get("parent_session_id") or ""))
        source = str(s.row.get("source") or "")
        forked = any(_marker(s.row, k) for k in ("_branched_from", "_delegate_from", "_reset_from"))
        if (
            parent is not None
            and parent.row.get("end_reason") == "compression"
            and not forked
            and source != "tool"
        ):
            parent.continuation = s
            continue
        if source == "cron":
            role = "cron"
        elif parent is not None and (
            _marker(s.row, "_delegate_from")
            or source == "tool"
            or not (
                _marker(s.row, "_branched_from")
                or _marker(s.row, "_reset_from")
                or parent.row.get("end_reason") in _RESET_REASONS
            )
        ):
            role = "subagent"
        else:
            role = "interactive"
        roots.append((s, role))
    roots.sort(key=lambda x: (x[0].started, x[0].id))
    return roots


def _info(s: _Session, role: str) -> SessionInfo:
    labels: dict[str, Any] = {"source": "hermes", "hermes_source": s.row.get("source"), "hermes_id": s.id}
    if s.row.get("title"):
        labels["title"] = s.row["title"]
    job = _CRON_ID.match(s.id)
    if role == "cron" and job:
        labels["job"] = job.group(1)
    totals = {
        k: s.row[k]
        for k in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
        if s.row.get(k)
    }
    if totals:
        labels["recorded_totals"] = totals  # the session's own usage sums, as Hermes kept them
    return SessionInfo(
        key=f"hermes-{s.id}",
        role=role,
        api="openai",
        model=str(s.row.get("model") or "default"),
        labels=labels,
        agent_ids=(s.id,),
    )


@dataclass(slots=True)
class _Review:
    info: SessionInfo
    history: list[Message]
    sent: float
    first: bool = True
    calls: set[str] = field(default_factory=set)


def _conversation(store: _Store, root: _Session, role: str, advance: Callable[[int], None]) -> Iterator[Step]:
    """The steps of one conversation (a session and its compression continuations), by send time."""
    info = _info(root, role)
    review_info: SessionInfo | None = None
    chain = [root]
    while chain[-1].continuation is not None:
        chain.append(chain[-1].continuation)
    info.agent_ids = tuple(s.id for s in chain)
    history: list[Message] = []
    ready: list[tuple[float, int, Step]] = []  # steps not yet yielded, by send time
    order = itertools.count()
    compaction = False
    for index, s in enumerate(chain):
        prompt = store.system_prompt(s)
        system = [{"role": "system", "content": prompt}] if prompt else []
        names = store.tool_names(s)
        params: dict[str, Any] = {"stream": True}
        tools, sized = _tools(store, s, system, names)
        if tools:
            params["tools"] = tools
        if sized:
            info.labels["synthetic"] = ["tools"]  # their text is made up, their size is Hermes'
        history = list(system)
        compaction = compaction or index > 0  # a compression continuation: what it keeps, read anew
        sent = s.started
        review: _Review | None = None
        last_reply = -1  # index in history of the last reply that ended a turn
        last_reply_t = sent
        for row in store.rows(s):
            advance(len(row["content"] or "") + 64)
            msg = _message(row, store.mcols)
            if msg is None:
                continue
            when = float(row["timestamp"] or sent)
            if "_compressed_summary" in store.mcols and row["_compressed_summary"]:
                history = [*system, msg]  # an in-place compaction: the summary replaces what was before
                compaction = True
                last_reply, sent = -1, when
                continue
            if msg["role"] == "user" and str(msg["content"]).lstrip().startswith(REVIEW_PREFIXES):
                if review_info is None:
                    review_info = SessionInfo(
                        key=f"{info.key}-review",
                        role="review",
                        api=info.api,
                        model=info.model,
                        labels={**info.labels, "job": "background review"},
                        agent_ids=info.agent_ids,
                    )
                # forked when the turn it reviews ended, written when it finished
                fork = history[: last_reply + 1] if last_reply >= 0 else list(history)
                review = _Review(review_info, [*fork, msg], last_reply_t if last_reply >= 0 else when)
                continue
            if review is not None and (
                msg["role"] == "assistant" or (msg["role"] == "tool" and msg["tool_call_id"] in review.calls)
            ):
                if msg["role"] == "tool":
                    review.history.append(msg)
                    review.sent = when
                    continue
                step = Step(
                    session=review.info,
                    t=review.sent,
                    messages=list(review.history),
                    reply=msg,
                    finish="tool_calls" if msg.get("tool_calls") else "stop",
                    output_tokens=_output_tokens(row, msg),
                    tag="review",
                    done=when,
                    params=params,
                    fork_of=info if review.first else None,
                )
                heapq.heappush(ready, (step.t, next(order), step))
                review.first = False
                review.history.append(msg)
                review.calls.update(c["id"] for c in msg.get("tool_calls") or ())
                review.sent = when
                if not msg.get("tool_calls"):
                    review = None
                continue
            review = None  # the review's rows are contiguous: the main conversation goes on
            if msg["role"] == "assistant":
                step = Step(
                    session=info,
                    t=sent,
                    messages=list(history),
                    reply=msg,
                    finish=_FINISH.get(str(row["finish_reason"]) if "finish_reason" in store.mcols else "")
                    or ("tool_calls" if msg.get("tool_calls") else "stop"),
                    output_tokens=_output_tokens(row, msg),
                    tag="compaction" if compaction else "turn",
                    done=when,
                    params=params,
                )
                compaction = False
                heapq.heappush(ready, (step.t, next(order), step))
                history.append(msg)
                if not msg.get("tool_calls"):
                    last_reply, last_reply_t = len(history) - 1, when
            else:
                history.append(msg)
            sent = when
            # no later step is sent before the last input, nor a later review before the turn it forks
            bound = min(sent, last_reply_t, review.sent if review is not None else sent)
            while len(ready) > 1 and ready[0][0] <= bound:
                yield heapq.heappop(ready)[2]
    while ready:
        step = heapq.heappop(ready)[2]
        if not ready:
            step.ends = tuple(i for i in (info, review_info) if i is not None)
        yield step


def _prompt_total(s: _Session) -> int:
    """The session's prompt tokens over all its calls, as Hermes summed them (uncached input,
    cache reads and cache writes are disjoint: together they are every call's prompt)."""
    return sum(int(s.row.get(k) or 0) for k in ("input_tokens", "cache_read_tokens", "cache_write_tokens"))


def _tools(
    store: _Store, s: _Session, system: list[Message], names: list[str]
) -> tuple[list[dict[str, Any]], bool]:
    """Stand-in tool definitions for a session, sized from its usage sums where Hermes kept them.

    Hermes sends its tool definitions (0.19: 28 of them, ~14K tokens) with every call but stores
    neither them nor per-call prompt sizes; its session sums are every call's prompt added up. So
    the tools' size is the mean prompt minus the mean of what the store does hold (system prompt and
    messages, rendered as the simulator renders them). Without sums: stand-ins named as used.
    Also says whether they were sized (synthetic text)."""
    bare = stand_in_tools(names) if names else []
    total = _prompt_total(s)
    if total <= 0:
        return bare, False
    held, calls = _held_tokens(store, s, system)
    if calls == 0:
        return bare, False
    api_calls = int(s.row.get("api_call_count") or 0) or calls
    size = round(total / api_calls - held / calls)
    if size <= tools_tokens(bare):
        return bare, False
    return sized_tools(names, size, _TOOLS_SEED), True


def _held_tokens(store: _Store, s: _Session, system: list[Message]) -> tuple[int, int]:
    """(prompt tokens without tools summed over the session's calls, how many calls): a pass over
    its rows that keeps only the rendered history, not the messages."""
    empty = Rendered()
    history = empty.add(system)
    held = calls = 0
    for row in store.rows(s):
        msg = _message(row, store.mcols)
        if msg is None:
            continue
        if "_compressed_summary" in store.mcols and row["_compressed_summary"]:
            history = empty.add([*system, msg])
            continue
        if msg["role"] == "assistant":
            held += len(history.prompt())
            calls += 1
        history = history.add([msg])
    return held, calls


def _output_tokens(row: sqlite3.Row, msg: Message) -> int:
    """Hermes' own count of the reply where it kept one, else the simulator tokenizer's."""
    if "token_count" in row.keys() and row["token_count"]:  # noqa: SIM118 - a sqlite3.Row
        return int(row["token_count"])
    text = str(msg.get("content") or "") + "".join(c["arguments"] for c in msg.get("tool_calls") or ())
    return max(1, count_tokens(text))


def _db_path(src: Path) -> Path:
    return src / "state.db" if src.is_dir() else src


def import_hermes(src: str | Path, out: str | Path, options: ImportOptions | None = None) -> dict[str, int]:
    """Convert a Hermes `state.db` (or the HERMES_HOME folder holding it) into a trace at `out`."""
    options = options or ImportOptions()
    path = _db_path(Path(src))
    if not path.exists():
        raise TraceError(str(path), 0, "no Hermes state.db here")
    store = _Store(path)
    try:
        roots = _link(store)
        size = path.stat().st_size
        with progress_bar(size, "hermes", options) as advance:
            steps = merge_by_time(
                (root.started, partial(_conversation, store, root, role, advance)) for root, role in roots
            )
            counts = write_trace(
                steps,
                Path(out),
                "import:hermes",
                f"imported from Hermes store {path.name}; tool definitions are synthetic stand-ins sized from the session's usage sums",
                options,
            )
    finally:
        store.conn.close()
    return {"conversations": len(roots), **counts}
