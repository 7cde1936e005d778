"""What every agent importer shares: options, the request model, time-ordered merging, writing.

An importer reads the agent's store one conversation at a time and yields `Step`s (one per API
call, with its full message list) in the conversation's own order. `merge_by_time` opens a
conversation only when the merged stream reaches its start time and lets it go when it ends, so
memory holds the conversations active at one moment, not the whole store. `Emitter` applies the
`--since/--until/--session` filters and writes the trace: sessions declared on first use, `after`
from the previous written request of the same session, and each request encoded against the
earlier request it extends (a fork or a rewind branches off an earlier request, so it is no
compaction unless the importer says so).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import heapq
import itertools
import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from replay.errors import TraceError, UsageError
from replay.record.tokens import count_tokens
from replay.sim.model.render import TOOLS_HEADER, Rendered, tools_block
from replay.sim.model.tokenizer import keep_new
from replay.trace.materialize import text_of
from replay.trace.model import Message
from replay.trace.synth import synth_text
from replay.trace.writer import Basis, TraceWriter

# Inputs at least this large (bytes) get a progress bar on stderr.
PROGRESS_MIN_BYTES = 64 << 20
# How many earlier requests of a session a rewind may branch off (newest first).
_BASES = 64
# A stand-in tool definition's size when the store gives only the tools' total: the agents'
# averages on the wire (traces/IMPORTERS.md: Hermes 0.19 28 tools ~14.3K tokens, Claude Code 2.1
# 22 ~17K, Codex 0.171 9 ~5.1K, OpenCode 1.18 10 ~5K) are 500-770 tokens a tool.
STAND_IN_TOOL_TOKENS = 550


@dataclass(slots=True)
class ImportOptions:
    """What `replay import` lets a user choose; every importer takes it."""

    since: float | None = None  # epoch seconds; requests sent before are left out
    until: float | None = None  # epoch seconds; requests sent at or after are left out
    sessions: tuple[str, ...] = ()  # keep only sessions whose agent id starts with one of these
    shared_system: bool = False  # Claude Code: one stand-in system prompt per kind, not per session
    progress: bool | None = None  # None: a bar when the input is large
    gap_cap: float | None = None  # public corpora: gaps between request starts capped at this (s)


@dataclass(slots=True)
class SessionInfo:
    """A trace session as the importer knows it; written when its first request is kept."""

    key: str  # unique trace session id
    role: str = "interactive"
    api: str = "openai"
    model: str = "default"
    labels: dict[str, Any] = field(default_factory=dict)
    agent_ids: tuple[str, ...] = ()  # the agent's own ids (matched by --session)


@dataclass(slots=True)
class Step:
    """One API call: the full message list sent, the reply the agent got, what it reported."""

    session: SessionInfo
    t: float  # epoch seconds when the request was sent
    messages: list[Message]
    reply: Message | None = None
    finish: str | None = None
    output_tokens: int | None = None
    usage: dict[str, Any] | None = None
    tag: str = "turn"
    done: float | None = None  # epoch seconds when the reply had arrived
    params: dict[str, Any] | None = None
    synthetic: list[int] | None = None  # indices of messages the importer made up
    fork_of: SessionInfo | None = None  # a concurrent turn branching off this session's history
    ends: tuple[SessionInfo, ...] = ()  # sessions that have no step after this one: let go of them
    # Subagents that fan out (format /2): `mark` names this step for later ones; `spawned_by` is
    # the mark of the step that spawned this (a subagent's first) step's session; `waits` the marks
    # of the steps (the subagents' last) whose replies this one waited for.
    mark: int | None = None
    spawned_by: int | None = None
    waits: tuple[int, ...] = ()


def parse_when(text: str | None) -> float | None:
    """`--since/--until`: ISO 8601 date/time (local time when no offset is given) or epoch seconds."""
    if text is None or text == "":
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"cannot read time {text!r}: use ISO 8601 such as 2026-11-30T06:45") from None
    return when.timestamp()  # naive: local time, as the user reads their clock


def iso_seconds(stamp: Any) -> float | None:
    """An ISO 8601 timestamp (as agents write them) as epoch seconds; None if it is not one."""
    if not isinstance(stamp, str):
        return None
    try:
        when = _dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.UTC)
    return when.timestamp()


def jsonl(path: Path, progress: Callable[[int], None] | None = None) -> Iterator[tuple[int, Any]]:
    """(line number, object) for each non-empty line; bad JSON is a `TraceError` at file:line."""
    with open(path, "rb") as handle:
        for n, raw in enumerate(handle, 1):
            if progress is not None:
                progress(len(raw))
            if not raw.strip():
                continue
            try:
                yield n, orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise TraceError(str(path), n, f"bad JSON: {exc}") from None


def open_sqlite_ro(path: Path, tables: tuple[str, ...], what: str) -> sqlite3.Connection:
    """Open a live agent's database read-only (`mode=ro`: no write, no lock a writer trips on)."""
    uri = f"file:{path.resolve().as_posix()}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True)
        conn.row_factory = sqlite3.Row
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:
        raise TraceError(str(path), 0, f"not a {what} database: {exc}") from None
    missing = [t for t in tables if t not in names]
    if missing:
        conn.close()
        raise TraceError(str(path), 0, f"not a {what} database: no table {', '.join(missing)}")
    return conn


def columns(conn: sqlite3.Connection, table: str) -> set[str]:
    """Column names of `table`: older stores have fewer, so queries select only what exists."""
    return {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}


def is_sqlite(path: Path) -> bool:
    if not path.is_file():
        return False
    with open(path, "rb") as handle:
        return handle.read(16) == b"SQLite format 3\x00"


def merge_by_time(sources: Iterable[tuple[float, Callable[[], Iterator[Step]]]]) -> Iterator[Step]:
    """Merge per-conversation step streams into one in time order.

    `sources` is sorted by start time, a lower bound of each stream's first step: a stream is
    opened only when the merged output reaches its start, and dropped when it ends.
    """
    pending = iter(sources)
    upcoming = next(pending, None)
    heap: list[tuple[float, int, Step, Iterator[Step]]] = []
    seq = 0
    while heap or upcoming is not None:
        while upcoming is not None and (not heap or upcoming[0] <= heap[0][0]):
            stream = upcoming[1]()
            first = next(stream, None)
            if first is not None:
                heapq.heappush(heap, (first.t, seq, first, stream))
                seq += 1
            upcoming = next(pending, None)
        if not heap:
            continue
        _, _, step, stream = heapq.heappop(heap)
        yield step
        following = next(stream, None)
        if following is not None:
            heapq.heappush(heap, (max(following.t, step.t), seq, following, stream))
            seq += 1


def _common(a: list[Message], b: list[Message]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x is not y and not all(
            x.get(k) == y.get(k) for k in ("role", "content", "tool_calls", "tool_call_id")
        ):
            break
        n += 1
    return n


@dataclass(slots=True)
class _Written:
    rid: int
    messages: list[Message]
    reply: Message | None
    done: float


class Emitter:
    """Writes steps (in time order) to a trace, with the user's filters applied."""

    def __init__(self, open_writer: Callable[[float], TraceWriter], options: ImportOptions) -> None:
        self.open_writer = open_writer  # called with the first kept request's time
        self.writer: TraceWriter | None = None
        self.options = options
        self.t0: float | None = None
        self.declared: set[str] = set()
        self.history: dict[str, list[_Written]] = {}
        self.counts: dict[str, int] = {"sessions": 0, "requests": 0, "compactions": 0, "filtered": 0}
        self.marks: dict[int, tuple[int, float]] = {}  # Step.mark -> (request id, reply time)

    def wanted(self, info: SessionInfo) -> bool:
        want = self.options.sessions
        if not want:
            return True
        ids = (info.key, *info.agent_ids)
        return any(i.startswith(w) for i in ids for w in want)

    def emit(self, step: Step) -> int | None:
        """Write one step; None when a filter left it out."""
        o = self.options
        info = step.session
        if (o.since is not None and step.t < o.since) or (o.until is not None and step.t >= o.until):
            self._end(step)
            self.counts["filtered"] += 1
            return None
        if not self.wanted(info):
            self._end(step)
            self.counts["filtered"] += 1
            return None
        if self.writer is None:
            self.writer = self.open_writer(step.t)
        if self.t0 is None:
            self.t0 = step.t
        writer = self.writer
        if info.key not in self.declared:
            writer.session(info.key, role=info.role, api=info.api, model=info.model, labels=info.labels)
            self.declared.add(info.key)
            self.counts["sessions"] += 1
        mine = self.history.setdefault(info.key, [])
        base = self._base(step, mine)
        tag = step.tag
        prev = mine[-1] if mine else None
        # Messages known equal to the session's last request's (the writer's own basis for it):
        # the writer reuses their keys instead of hashing the whole history again.
        same = 0
        if prev is not None and base is prev:  # extends it fully (`_base`)
            same = len(prev.messages)
        elif prev is not None and base is None:
            same = _common(prev.messages, step.messages)
        if (
            tag == "turn"
            and prev is not None
            and prev.messages
            and step.messages
            and prev.messages[0].get("role") == "system"
            and _common(prev.messages[:1], step.messages[:1]) == 0
        ):
            tag = "compaction"  # the system prompt changed: nothing cached survives
        waited = base if base is not None and (step.fork_of is not None or prev is None) else prev
        after = None
        if waited is not None:
            delay = round(max(0.0, step.t - waited.done), 3)
            if o.gap_cap is not None:
                delay = min(delay, int(o.gap_cap * 1000) / 1000)  # --gap-cap, never above it
            after = {"request": waited.rid, "delay_s": delay}
        after = self._fan_out(step, after)
        params = step.params or {"stream": True}
        tools = params.get("tools")
        if isinstance(tools, list):
            key = hashlib.blake2b(orjson.dumps(tools, option=orjson.OPT_SORT_KEYS), digest_size=6).hexdigest()
            params = {**params, "tools": writer.blob(f"tools-{key}", tools)}
        reply: dict[str, Any] | None = None
        if step.reply is not None or step.output_tokens is not None:
            reply = {}
            if step.reply is not None:
                reply["message"] = step.reply
            if step.finish:
                reply["finish"] = step.finish
            if step.output_tokens is not None:
                reply["output_tokens"] = step.output_tokens
        rid = writer.request(
            info.key,
            round(max(0.0, step.t - self.t0), 3),
            step.messages,
            params=params,
            reply=reply,
            usage=step.usage or None,
            after=after,
            tag=tag,
            base=None if base is None or base is prev else Basis.of(base.rid, base.messages, base.reply),
            synthetic=step.synthetic or None,
            same=same,
        )
        done = step.done if step.done is not None else step.t
        if step.mark is not None:
            self.marks[step.mark] = (rid, max(done, step.t))
        mine.append(_Written(rid, step.messages, step.reply, max(done, step.t)))
        del mine[:-_BASES]
        self.counts["requests"] += 1
        self.counts["compactions"] += tag == "compaction"
        self._end(step)
        return rid

    def _fan_out(self, step: Step, after: dict[str, Any] | None) -> dict[str, Any] | None:
        """`after` with the subagent links (format /2): a spawned session's first request follows
        the request that spawned it; a request that waited for subagents lists their last
        requests, and its delay runs from the latest reply it waited for."""
        o = self.options
        spawner = self.marks.get(step.spawned_by) if step.spawned_by is not None else None
        if spawner is not None and after is None:
            rid, done = spawner
            after = {"request": rid, "delay_s": round(max(0.0, step.t - done), 3), "spawn": True}
        waited = [self.marks[m] for m in step.waits if m in self.marks]
        if waited and after is not None:
            latest = max(done for _, done in waited)
            prev_done = step.t - after["delay_s"]
            delay = round(max(0.0, step.t - max(latest, prev_done)), 3)
            after = {**after, "delay_s": delay, "waits": sorted({rid for rid, _ in waited})}
        if after is not None and o.gap_cap is not None:
            after["delay_s"] = min(after["delay_s"], int(o.gap_cap * 1000) / 1000)
        return after

    def _base(self, step: Step, mine: list[_Written]) -> _Written | None:
        """The earlier request this one extends: the session's last, unless it branches off an
        earlier one (a rewind) or off another session (a concurrent fork)."""
        if step.tag == "compaction":
            return None
        candidates: list[_Written] = list(reversed(mine))
        if step.fork_of is not None:
            candidates = list(reversed(self.history.get(step.fork_of.key, []))) + candidates
        best: _Written | None = None
        best_keep = -1
        for w in candidates:
            keep = _common(w.messages, step.messages)
            if keep == len(w.messages):
                return w  # extends it fully: the newest such is the one it came from
            if keep > best_keep:
                best, best_keep = w, keep
        if best is None or (mine and best is mine[-1]) or best_keep == 0:
            return None
        return best

    def _end(self, step: Step) -> None:
        for info in step.ends:
            self.history.pop(info.key, None)
            if self.writer is not None:
                self.writer.forget(info.key)


_MARKS = itertools.count(1)


def link_subagents(steps: list[Step]) -> int:
    """Mark fan-out among one conversation's steps (a main session and its subagent sessions):
    a subagent's first step was spawned by the latest main step whose reply had arrived by then,
    and the first main step sent after the subagent's last reply waited for it. Returns how many
    subagents were linked."""
    main = sorted((s for s in steps if s.session.role != "subagent"), key=lambda s: s.t)
    subs: dict[str, list[Step]] = {}
    for s in steps:
        if s.session.role == "subagent":
            subs.setdefault(s.session.key, []).append(s)
    linked = 0
    for group in subs.values():
        group.sort(key=lambda s: s.t)
        first, last = group[0], group[-1]
        before = [m for m in main if (m.done if m.done is not None else m.t) <= first.t]
        if not before:
            continue
        spawner = before[-1]
        back = last.done if last.done is not None else last.t
        joiner = next((m for m in main if m.t >= back and m.t > spawner.t), None)
        if spawner.mark is None:
            spawner.mark = next(_MARKS)
        first.spawned_by = spawner.mark
        if joiner is not None:
            if last.mark is None:
                last.mark = next(_MARKS)
            joiner.waits = (*joiner.waits, last.mark)
        linked += 1
    return linked


def write_trace(
    steps: Iterable[Step], out: Path, source: str, notes: str, options: ImportOptions
) -> dict[str, int]:
    """Write `steps` to `out`; the counts say what was written and what the filters left out.

    The header's `start` is the first kept request's wall-clock time (local time, as the user
    reads their clock), so reports show 06:45 rather than 0 s."""

    def open_writer(t0: float) -> TraceWriter:
        start = _dt.datetime.fromtimestamp(t0).isoformat(timespec="seconds")
        return TraceWriter(out, source=source, notes=notes, start=start)

    emitter = Emitter(open_writer, options)
    kept = keep_new(False)  # texts are tokenized once each, to be counted: none is kept
    try:
        for step in steps:
            emitter.emit(step)
    finally:
        keep_new(kept)
        if emitter.writer is not None:
            emitter.writer.close()
    if emitter.counts["requests"] == 0:
        raise UsageError(
            f"nothing to import: {emitter.counts['filtered']} requests, all left out by --since/--until/--session"
            if emitter.counts["filtered"]
            else "nothing to import: no API calls found"
        )
    return emitter.counts


def progress_bar(
    total: int, label: str, options: ImportOptions
) -> AbstractContextManager[Callable[[int], None]]:
    """A context giving `advance(n)`; shows a bar on stderr for large inputs (or when asked)."""
    show = options.progress if options.progress is not None else total >= PROGRESS_MIN_BYTES
    if not show:
        return nullcontext(lambda n: None)
    return _Bar(total, label)


class _Bar(AbstractContextManager[Callable[[int], None]]):
    def __init__(self, total: int, label: str) -> None:
        self.progress = Progress(
            TextColumn(label),
            BarColumn(),
            DownloadColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self.task = self.progress.add_task(label, total=total)

    def __enter__(self) -> Callable[[int], None]:
        self.progress.start()
        return lambda n: self.progress.advance(self.task, n)

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()


def tree_size(paths: Iterable[Path]) -> int:
    total = 0
    for p in paths:
        with contextlib.suppress(OSError):
            total += os.stat(p).st_size
    return total


def estimate_tokens(messages: Iterable[Message]) -> int:
    """Token count of messages by the simulator's tokenizer (where the agent stored none)."""
    n = 0
    for m in messages:
        n += count_tokens(text_of(m.get("content")))
        for c in m.get("tool_calls") or ():
            n += count_tokens(c.get("name", "")) + count_tokens(c.get("arguments", ""))
    return n


def stand_in_tools(names: Iterable[str]) -> list[dict[str, Any]]:
    """OpenAI function tools for names an agent used but whose definitions it did not store."""
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": f"{name} (stand-in: the agent does not store its tool definitions)",
                "parameters": {"type": "object", "properties": {}, "additionalProperties": True},
            },
        }
        for name in sorted(set(names))
    ]


def rendered_tokens(messages: list[Message], tools: list[dict[str, Any]] | None = None) -> int:
    """Prompt tokens of a request as the simulator renders it (its chat template and tokenizer)."""
    return len(Rendered(tools).add(messages).prompt())


def tools_tokens(tools: list[dict[str, Any]] | None) -> int:
    """What a tool list adds to a rendered prompt that has a system message (header and tools)."""
    return len(TOOLS_HEADER) + len(tools_block(tools)) if tools else 0


def sized_tools(names: Iterable[str], tokens: int, seed: int) -> list[dict[str, Any]]:
    """Stand-in tool definitions that add `tokens` to each rendered prompt (simulator tokenizer),
    for an agent whose store gives the tools' size but not their text.

    The names the agent used come first; more stand-ins (`stand_in_tool_N`) are added so that no
    definition is much over `STAND_IN_TOOL_TOKENS`; descriptions are synthetic text (seeded, so two
    sessions with equal sizes send identical tools). Fewer tokens than the bare definitions take:
    the bare definitions."""
    known = sorted(set(names))
    extra = max(0, -(-tokens // STAND_IN_TOOL_TOKENS) - len(known))
    all_names = [*known, *(f"stand_in_tool_{i + 1}" for i in range(extra))]
    if not all_names:
        return []
    fill = [0] * len(all_names)

    def build() -> list[dict[str, Any]]:
        return [
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": synth_text(fill[i], seed + i)
                    if fill[i]
                    else f"{name} (synthetic stand-in)",
                    "parameters": {"type": "object", "properties": {}},
                },
            }
            for i, name in enumerate(all_names)
        ]

    tools = build()
    for _ in range(4):  # word counts and token counts differ by the JSON around them: converge
        missing = tokens - tools_tokens(tools)
        if missing == 0:
            break
        share, rest = divmod(missing, len(all_names))
        for i in range(len(all_names)):
            fill[i] = max(0, fill[i] + share + (1 if i < rest else 0))
        tools = build()
    return tools
