"""TraceLab round traces (uw-syfi/TraceLab: real Claude Code and Codex sessions, as the project
publishes them and AIPerf replays them) to our trace format (`replay import tracelab`).

SRC is the corpus as released (`syfi_coding_trace.jsonl`, or `.jsonl.gz` as downloaded), a file of
the same rows (`scripts/sanitize_round_trace.py`'s output), or a folder of them. A row is one LLM
invocation (a *round*): `provider` (`claude` | `codex`), `session_id`, `round_index`, `model`,
`input_tokens_total`, `prefix_tokens` (the cache read the provider reported), `newly_append_tokens`,
`output_tokens`, the Claude cache fields, `timing_events` (`user_message`, `tool_result`,
`reasoning`, `text`, `tool_call`, ... each with an ISO `timestamp`) and `tools` (names, sizes and
latencies; no text). Each `session_id` is a session; each row a request.

The text is gone, so each session's requests are rebuilt at their sizes from synthetic text: the
first request is one user message of `input_tokens_total` tokens (as the simulator renders and
counts it); every later one extends the previous: its reply (`output_tokens` long) and one user
message holding the rest of `input_tokens_total` (the tool results or the user's next message).
Where a round's input is smaller than the previous prompt and reply together (the agent compacted
or cleared its context), the request starts over with one message of its size and is tagged
`compaction`. A request is sent when its input was ready (the last `user_message` or
`tool_result` event before the model's first one, else its first event) and its reply is in at
its last event, so `after.delay_s` is the tool and human time between rounds (`--gap-cap` caps
it). `usage` keeps the provider's own accounting (prompt, cached = `prefix_tokens`, cache writes,
output).

Streaming: a `.gz` file is first inflated into a temporary file beside OUT; a first pass keeps, per
row, only its time, session and byte offset (in arrays: some 40 bytes a row); the second pass, in
time order, re-reads each row and lets a session go after its last one.

What the format loses: all text (prompts, replies, tool calls and results are sizes only); the
split of the first prompt between system prompt, tool definitions and the user's message (one
message of the whole size), so sessions share no system prompt with each other as the agents'
real ones do; roles of the later input (tool results become user text); thinking kept out of the
resent history (the reply is resent at its full output size and the new input makes up the
difference, so sizes are exact but the split is not); subagents: session ids are pseudonymised
one by one, so a subagent's session is not linked to its parent (no `after.spawn` or `waits`);
rounds that failed (only completed invocations are rows).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import shutil
import tempfile
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from replay.errors import TraceError, UsageError
from replay.importers.base import (
    ImportOptions,
    SessionInfo,
    Step,
    iso_seconds,
    progress_bar,
    rendered_tokens,
    tree_size,
    write_trace,
)
from replay.importers.swe import cap_gaps
from replay.trace.model import Message
from replay.trace.synth import synth_text

_INPUT_EVENTS = ("user_message", "tool_result")
_API = {"claude": "anthropic", "codex": "openai-responses"}
SEED_BASE = 0x544C_0000_0000  # keeps TraceLab seeds apart from other synthetic seeds


def _sizes() -> tuple[int, int]:
    """(tokens the first message adds beyond its content, tokens each later one adds), as the
    simulator renders a chat prompt (its template and tokenizer): measured, not assumed."""
    one = rendered_tokens([{"role": "user", "content": synth_text(100, 1)}])
    two = rendered_tokens(
        [{"role": "user", "content": synth_text(100, 1)}, {"role": "assistant", "content": synth_text(50, 2)}]
    )
    return one - 100, two - one - 50


def _seed(*key: object) -> int:
    digest = hashlib.blake2b(repr(key).encode(), digest_size=5).digest()
    return SEED_BASE + int.from_bytes(digest, "big")


def _synth(role: str, tokens: int, seed: int) -> Message:
    return {"role": role, "content": {"synth": {"tokens": max(0, tokens), "seed": seed}}}


def _int(row: dict[str, Any], key: str) -> int | None:
    value = row.get(key)
    return value if type(value) is int and value >= 0 else None


def times(row: dict[str, Any]) -> tuple[float | None, float | None]:
    """(when the request was sent, when its reply was in) from the round's timing events."""
    events = row.get("timing_events")
    if not isinstance(events, list):
        return None, None
    stamped = [
        (e.get("event_type"), t)
        for e in events
        if isinstance(e, dict) and (t := iso_seconds(e.get("timestamp"))) is not None
    ]
    if not stamped:
        return None, None
    first_model = next((i for i, (kind, _) in enumerate(stamped) if kind not in _INPUT_EVENTS), len(stamped))
    inputs = [t for kind, t in stamped[:first_model] if kind in _INPUT_EVENTS]
    sent = inputs[-1] if inputs else stamped[0][1]
    return sent, max(sent, max(t for _, t in stamped))


def check_row(path: Path, line: int, row: Any) -> dict[str, Any]:
    """A TraceLab row, checked; a bad one is a `TraceError` at file:line."""
    if not isinstance(row, dict):
        raise TraceError(str(path), line, "a TraceLab row must be a JSON object")
    if not isinstance(row.get("session_id"), str) or not row["session_id"]:
        raise TraceError(str(path), line, "not a TraceLab round: no 'session_id' string")
    if _int(row, "input_tokens_total") is None:
        raise TraceError(str(path), line, "'input_tokens_total' must be an integer >= 0")
    if row.get("output_tokens") is not None and _int(row, "output_tokens") is None:
        raise TraceError(str(path), line, "'output_tokens' must be an integer >= 0 (or null)")
    if row.get("round_index") is not None and _int(row, "round_index") is None:
        raise TraceError(str(path), line, "'round_index' must be an integer >= 0")
    if not isinstance(row.get("timing_events", []), list):
        raise TraceError(str(path), line, "'timing_events' must be a list")
    return row


def _files(src: Path) -> list[Path]:
    if src.is_dir():
        found = sorted(
            p for p in src.rglob("*") if p.is_file() and p.name.endswith((".jsonl", ".jsonl.gz", ".json"))
        )
        if not found:
            raise UsageError(f"{src}: no .jsonl or .jsonl.gz TraceLab files in this folder")
        return found
    return [src]


@dataclass(slots=True)
class _Rows:
    """The first pass: per row, its send time, session, file and place in it; nothing else."""

    t: array[float] = field(default_factory=lambda: array("d"))
    done: array[float] = field(default_factory=lambda: array("d"))
    offset: array[int] = field(default_factory=lambda: array("q"))
    line: array[int] = field(default_factory=lambda: array("q"))
    file: array[int] = field(default_factory=lambda: array("i"))
    session: array[int] = field(default_factory=lambda: array("i"))
    sessions: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _State:
    info: SessionInfo
    messages: list[Message] = field(default_factory=list)
    reply: Message | None = None
    size: int = 0  # the prompt tokens of `messages` as the simulator renders them
    rounds: int = 0


def _index(paths: list[Path], advance: Any, counts: dict[str, int]) -> _Rows:
    rows = _Rows()
    ids: dict[str, int] = {}
    for k, path in enumerate(paths):
        with open(path, "rb") as handle:
            offset = 0
            for n, raw in enumerate(handle, 1):
                advance(len(raw))
                here, offset = offset, offset + len(raw)
                if not raw.strip():
                    continue
                row = check_row(path, n, _loads(path, n, raw))
                sent, done = times(row)
                if sent is None or done is None:
                    counts["untimed"] += 1
                    continue
                sid = ids.get(row["session_id"])
                if sid is None:
                    sid = ids[row["session_id"]] = len(rows.sessions)
                    rows.sessions.append(row["session_id"])
                rows.t.append(sent)
                rows.done.append(done)
                rows.offset.append(here)
                rows.line.append(n)
                rows.file.append(k)
                rows.session.append(sid)
    return rows


def _loads(path: Path, line: int, raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise TraceError(str(path), line, f"bad JSON: {exc}") from None


def _steps(
    rows: _Rows, paths: list[Path], names: list[Path], advance: Any, counts: dict[str, int]
) -> Iterator[Step]:
    first_extra, each_extra = _sizes()
    order = sorted(range(len(rows.t)), key=rows.t.__getitem__)  # stable: file order breaks ties
    last: dict[int, int] = {}
    for place, i in enumerate(order):
        last[rows.session[i]] = place
    states: dict[int, _State] = {}
    handles: dict[int, Any] = {}
    try:
        for place, i in enumerate(order):
            k = rows.file[i]
            handle = handles.get(k)
            if handle is None:
                handle = handles[k] = open(paths[k], "rb")  # noqa: SIM115 - closed below
            handle.seek(rows.offset[i])
            raw = handle.readline()
            advance(len(raw))
            row = check_row(names[k], rows.line[i], _loads(names[k], rows.line[i], raw))
            sid = rows.session[i]
            state = states.get(sid)
            if state is None:
                provider = str(row.get("provider") or "")
                key = rows.sessions[sid]
                state = states[sid] = _State(
                    SessionInfo(
                        key=key,
                        api=_API.get(provider, "openai"),
                        model=str(row.get("model") or "default"),
                        labels={
                            "source": "tracelab",
                            "provider": provider,
                            "project": str(row.get("project") or ""),
                        },
                        agent_ids=(key,),
                    )
                )
            size, out = row["input_tokens_total"], _int(row, "output_tokens") or 0
            name, n = rows.sessions[sid], state.rounds
            tag = "turn"
            new = -1
            if state.reply is not None:  # the previous prompt with its reply, then the new input
                new = size - (state.size + each_extra + _tokens(state.reply)) - each_extra
            if new >= 1:
                messages = [*state.messages, state.reply, _synth("user", new, _seed(name, n, "in"))]
                state.size = size
            else:
                if state.reply is not None:
                    tag = "compaction"
                    counts["compactions"] += 1
                messages = [_synth("user", size - first_extra, _seed(name, n, "first"))]
                state.size = first_extra + max(0, size - first_extra)
            state.messages = messages
            state.reply = _synth("assistant", out, _seed(name, n, "out"))
            state.rounds += 1
            usage = {"prompt_tokens": size, "output_tokens": out}
            for name, key in (
                ("cached_tokens", "prefix_tokens"),
                ("cache_write_tokens", "claude_cache_creation_input_tokens"),
            ):
                if _int(row, key) is not None:
                    usage[name] = row[key]
            ends = ()
            if last[sid] == place:
                ends = (states.pop(sid).info,)
            counts["rounds"] += 1
            yield Step(
                session=state.info,
                t=rows.t[i],
                messages=messages,
                reply=state.reply,
                output_tokens=out,
                usage=usage,
                tag=tag,
                done=rows.done[i],
                ends=ends,
            )
    finally:
        for handle in handles.values():
            handle.close()


def _tokens(msg: Message) -> int:
    return int(msg["content"]["synth"]["tokens"])


def import_tracelab(src: str | Path, out: str | Path, options: ImportOptions | None = None) -> dict[str, int]:
    """Convert TraceLab round traces at `src` into a trace at `out` (see the module docstring)."""
    options = options or ImportOptions()
    src, out = Path(src), Path(out)
    files = _files(src)
    counts = {"files": len(files), "rounds": 0, "compactions": 0, "untimed": 0}
    with contextlib.ExitStack() as stack:
        paths: list[Path] = []
        for path in files:
            if path.name.endswith(".gz"):  # inflated once beside OUT, so rows can be re-read by offset
                spill = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=out.parent))) / "rows.jsonl"
                try:
                    with gzip.open(path, "rb") as inflated, open(spill, "wb") as sink:
                        shutil.copyfileobj(inflated, sink, 1 << 20)
                except (OSError, EOFError) as exc:
                    raise TraceError(str(path), 1, f"cannot inflate: {exc}") from None
                paths.append(spill)
            else:
                paths.append(path)
        with progress_bar(2 * tree_size(paths), "tracelab", options) as advance:
            rows = _index_named(paths, files, advance, counts)
            if not rows.t:
                raise UsageError(f"nothing to import: no timed TraceLab rounds in {src}")
            result = write_trace(
                cap_gaps(_steps(rows, paths, files, advance, counts), options.gap_cap),
                out,
                "import:tracelab",
                f"imported from TraceLab round traces {src.name}; text as synthetic stand-ins of the recorded sizes",
                options,
            )
    return {**counts, **result}


def _index_named(paths: list[Path], names: list[Path], advance: Any, counts: dict[str, int]) -> _Rows:
    """`_index`, with errors naming the file the user gave (not an inflated copy)."""
    try:
        return _index(paths, advance, counts)
    except TraceError as exc:
        for real, shown in zip(paths, names, strict=True):
            if exc.path == str(real) and real != shown:
                raise TraceError(str(shown), exc.line, exc.problem) from None
        raise
