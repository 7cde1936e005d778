"""ShareGPT conversations -> multi-turn sessions, every turn a request (not just the first).

Input is a JSON array or JSONL of conversations, each with `conversations` (or `conversation`,
`messages`, `items`) holding `{"from": "human"|"gpt"|"system"|..., "value": text}` or
`{"role", "content"}` turns. Each user turn followed by an assistant turn is a request whose reply
is that assistant turn; a last user turn with no answer is a request without one. ShareGPT has no
timestamps: conversations run one after the other, `session_gap_s` apart, and within one each turn
waits `turn_gap_s` after the previous reply (`after`), so `closed-loop` and `timed` plans have
something to follow.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ijson
import orjson

from replay.errors import TraceError
from replay.record.tokens import count_tokens
from replay.sim.model.tokenizer import keep_new
from replay.trace.model import Message
from replay.trace.writer import TraceWriter

_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "system": "system",
}
_ID_OK = re.compile(r"[^A-Za-z0-9_.-]+")


# A first line longer than this is read as part of one JSON document, never parsed alone.
_LINE_CAP = 1 << 20


def _items(src: Path) -> Iterator[tuple[Any, int | None]]:
    """The file's items one at a time, each with the line it came from (None for one JSON
    document). Streamed: a JSON array is read item by item (ijson), JSON Lines line by line, so a
    corpus of any size is never whole in memory (a multi-line document of one object is read whole:
    it is one conversation)."""
    with open(src, "rb") as handle:
        first, n1 = b"", 0
        for n, raw in enumerate(iter(lambda: handle.readline(_LINE_CAP), b""), 1):
            if raw.strip():
                first, n1 = raw, n
                break
        if not first:
            return
        head = first.lstrip()[:1]
        if head == b"[" and not first.endswith(b"\n") and len(first) == _LINE_CAP:
            obj, parsed, more = None, False, False  # an array on one long line: streamed below
        else:
            if not first.endswith(b"\n"):
                first += handle.readline()  # the rest of a long line: one object
            try:
                obj, parsed = orjson.loads(first), True
            except orjson.JSONDecodeError:
                obj, parsed = None, False
            more = any(raw.strip() for raw in _peek(handle))
    if parsed and not more and isinstance(obj, list):
        yield from ((item, None) for item in obj)
    elif parsed and not more and isinstance(obj, dict):
        yield obj, None
    elif not parsed and head == b"[":
        yield from _array(src, n1)
    elif not parsed and head == b"{":
        try:
            doc = orjson.loads(src.read_bytes())  # one object over many lines: one conversation
        except orjson.JSONDecodeError:
            doc = None
        if isinstance(doc, dict):
            yield doc, None
        else:
            yield from _lines(src)
    else:
        yield from _lines(src)


def _peek(handle: Any) -> Iterator[bytes]:
    """The lines after the first non-empty one, up to the next non-empty one."""
    for raw in iter(lambda: handle.readline(_LINE_CAP), b""):
        yield raw
        if raw.strip():
            return


def _array(src: Path, first_line: int) -> Iterator[tuple[Any, int | None]]:
    """A JSON array's items streamed; a document that is not valid JSON is the error the file
    read as JSON Lines gives (its first line's)."""
    try:
        with open(src, "rb") as handle:
            for item in ijson.items(handle, "item", use_float=True):
                yield item, None
    except (ijson.JSONError, ijson.IncompleteJSONError):
        yield from _lines(src)  # raises at the first line that is not JSON
        raise TraceError(str(src), first_line, "bad JSON: not one JSON array") from None


def _lines(src: Path) -> Iterator[tuple[Any, int | None]]:
    with open(src, "rb") as handle:
        for n, raw in enumerate(handle, 1):
            if raw.strip():
                try:
                    yield orjson.loads(raw.removesuffix(b"\n").removesuffix(b"\r")), n
                except orjson.JSONDecodeError as exc:
                    raise TraceError(str(src), n, f"bad JSON: {exc}") from None


_TURN_KEYS = ("conversations", "conversation", "messages", "items")


def _shape_problem(item: Any) -> str | None:
    """Why `item` is not a ShareGPT conversation at all (as opposed to one with nothing to replay)."""
    if not isinstance(item, dict):
        return f"expected a conversation object, got {type(item).__name__}"
    raw = next((item[k] for k in _TURN_KEYS if k in item), None)
    if not isinstance(raw, list):
        return "expected an object with a 'conversations' list of {from, value} turns"
    if raw and not any(isinstance(t, dict) and ("from" in t or "role" in t) for t in raw):
        return "its turns have neither 'from' nor 'role'"
    return None


def _turns(item: Any) -> list[Message]:
    if not isinstance(item, dict):
        return []
    raw = (
        item.get("conversations")
        or item.get("conversation")
        or item.get("messages")
        or item.get("items")
        or []
    )
    out: list[Message] = []
    for turn in raw if isinstance(raw, list) else ():
        if not isinstance(turn, dict):
            continue
        role = _ROLES.get(str(turn.get("from", turn.get("role", ""))).lower())
        text = turn.get("value", turn.get("content"))
        if role is None or not isinstance(text, str):
            continue
        out.append({"role": role, "content": text})
    return out


def import_sharegpt(
    src: str | Path,
    out: str | Path,
    api: str = "openai",
    model: str = "default",
    session_gap_s: float = 1.0,
    turn_gap_s: float = 2.0,
    limit: int | None = None,
) -> dict[str, int]:
    """Convert a ShareGPT file into a trace at `out`; `limit` caps the number of conversations."""
    src = Path(src)
    counts = {"conversations": 0, "skipped": 0, "requests": 0}
    kept = keep_new(False)  # each answer is tokenized once, to be counted: none is kept
    try:
        _write(src, out, api, model, session_gap_s, turn_gap_s, limit, counts)
    finally:
        keep_new(kept)
    return counts


def _write(
    src: Path,
    out: str | Path,
    api: str,
    model: str,
    session_gap_s: float,
    turn_gap_s: float,
    limit: int | None,
    counts: dict[str, int],
) -> None:
    used: set[str] = set()
    t = 0.0
    with TraceWriter(
        out, source="import:sharegpt", notes=f"imported from ShareGPT file {src.name}"
    ) as writer:
        for index, (item, line_no) in enumerate(_items(src)):
            if limit is not None and counts["conversations"] >= limit:
                break
            problem = _shape_problem(item)
            if problem is not None:
                # A file in another format would otherwise import as an empty trace, exit 0.
                line = line_no if line_no is not None else 1
                where = f"item {index}: " if line_no is None else ""
                raise TraceError(str(src), line, f"not a ShareGPT file: {where}{problem}")
            turns = _turns(item)
            if not any(m["role"] == "user" for m in turns):
                counts["skipped"] += 1
                continue
            raw_id = str(item.get("id") or index) if isinstance(item, dict) else str(index)
            sid = "sg-" + (_ID_OK.sub("-", raw_id)[:48] or str(index))
            if sid in used:
                sid = f"{sid}-{index}"
            used.add(sid)
            writer.session(sid, api=api, model=model, labels={"source": "sharegpt"})
            counts["conversations"] += 1
            history: list[Message] = []
            prev: int | None = None
            for i, msg in enumerate(turns):
                if msg["role"] != "user" or (i + 1 < len(turns) and turns[i + 1]["role"] == "user"):
                    history.append(msg)
                    continue
                history.append(msg)
                answer = turns[i + 1] if i + 1 < len(turns) and turns[i + 1]["role"] == "assistant" else None
                reply = None
                if answer is not None:
                    reply = {
                        "message": answer,
                        "finish": "stop",
                        "output_tokens": max(1, count_tokens(answer["content"])),
                    }
                after = {"request": prev, "delay_s": turn_gap_s} if prev is not None else None
                prev = writer.request(
                    sid, round(t, 3), list(history), params={"stream": True}, reply=reply, after=after
                )
                counts["requests"] += 1
                t += turn_gap_s
            writer.forget(sid)  # a conversation has no request after its last: let go of it
            t += session_gap_s
