"""Streaming trace reader: validates line by line and stops at the first bad line.

`iter_records` never holds more than one line of the file plus the small index it needs to check
references (request ids and message counts, blob ids, session ids), so a 1 GB trace validates in
constant memory. `read_trace` builds the linked `Request` objects the engine replays.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import orjson

from replay.errors import TraceError
from replay.trace.model import APIS, FORMAT, Request, Session, Trace, TraceHeader

KINDS = ("trace", "session", "blob", "request", "unrecorded")
_MESSAGE_ROLES = ("system", "developer", "user", "assistant", "tool")


class _Checker:
    """What has been seen so far, and the checks of one line against it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.line = 0
        self.blobs: dict[str, Any] = {}
        self.sessions: dict[str, Session] = {}
        self.n_messages: dict[int, int] = {}
        self.last_id: int | None = None
        self.header_seen = False

    def fail(self, problem: str) -> TraceError:
        return TraceError(self.path, self.line, problem)

    def need(self, obj: dict[str, Any], key: str, types: type | tuple[type, ...]) -> Any:
        value = obj.get(key)
        if type(value) is types or (type(types) is tuple and type(value) in types):
            return value  # the common case, without isinstance's subclass walk
        if key not in obj:
            raise self.fail(f"{obj.get('kind')} is missing field '{key}'")
        value = obj[key]
        if not isinstance(value, types) or isinstance(value, bool) and bool not in _tuple(types):
            raise self.fail(f"field '{key}' must be {_type_name(types)}, got {type(value).__name__}")
        return value

    def blob(self, ref: Any) -> Any:
        """Resolve `{"$blob": id}` to the blob's value (the same object every time), else return as is."""
        if isinstance(ref, dict) and "$blob" in ref:
            value = self.blobs.get(ref["$blob"])
            if value is None:
                raise self.fail(f"unknown blob {ref['$blob']!r} (blobs must be defined before use)")
            return value
        return ref

    def content(self, value: Any, where: str) -> Any:
        value = self.blob(value)
        if isinstance(value, str):
            return value
        if isinstance(value, dict) and "synth" in value:
            spec = value["synth"]
            if not (
                isinstance(spec, dict)
                and isinstance(spec.get("tokens"), int)
                and spec["tokens"] >= 0
                and isinstance(spec.get("seed"), int)
            ):
                raise self.fail(f"{where}: synth needs integer 'tokens' >= 0 and 'seed'")
            return value
        if isinstance(value, list):
            return [self.content(part, where) for part in value]
        raise self.fail(f"{where}: content must be text, a synth object, a blob or a list of those")

    def message(self, msg: Any, index: int) -> dict[str, Any]:
        if type(msg) is dict and type(msg.get("content")) is str:
            role = msg.get("role")
            if role == "user" or role == "system" or (role == "assistant" and "tool_calls" not in msg):
                return msg  # plain text from a user, a system prompt or a tool-less reply: nothing to check
        msg = self.blob(msg)
        where = f"append[{index}]"
        if not isinstance(msg, dict):
            raise self.fail(f"{where} must be an object")
        if "$reply" in msg:
            ref = msg["$reply"]
            if ref not in self.n_messages:
                raise self.fail(f"{where}: $reply refers to request {ref!r}, not defined before this line")
            return msg
        role = msg.get("role")
        if role not in _MESSAGE_ROLES:
            raise self.fail(f"{where}: role must be one of {', '.join(_MESSAGE_ROLES)}")
        if "content" not in msg and not msg.get("tool_calls"):
            raise self.fail(f"{where}: message is missing field 'content'")
        if "content" in msg and msg["content"] is not None:
            resolved = self.content(msg["content"], where)
            if resolved is not msg["content"]:
                msg = {**msg, "content": resolved}
        if role == "tool" and not isinstance(msg.get("tool_call_id"), str):
            raise self.fail(f"{where}: a tool message needs a string 'tool_call_id'")
        for call in msg.get("tool_calls") or ():
            if not (isinstance(call, dict) and isinstance(call.get("name"), str) and "id" in call):
                raise self.fail(f"{where}: each tool call needs 'id' and 'name'")
        return msg


def _tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _type_name(types: type | tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", dict: "an object", list: "a list"}
    return " or ".join(names.get(t, t.__name__) for t in _tuple(types))


def _lines(handle: BinaryIO, block: int = 16 << 20) -> Iterator[bytes]:
    """The file's lines, read in large blocks (measurably faster than line-by-line reads)."""
    rest = b""
    while chunk := handle.read(block):
        lines = chunk.split(b"\n")
        lines[0] = rest + lines[0]  # the line the last block cut, whole (the block is not copied)
        rest = lines.pop()
        yield from lines
    if rest:
        yield rest


def _open(path: str | Path) -> BinaryIO:
    """The trace file for reading; a file that cannot be opened is a `TraceError`."""
    try:
        return open(path, "rb")  # noqa: SIM115 - the callers close it
    except OSError as exc:
        raise TraceError(str(path), 0, f"cannot open: {exc.strerror}") from None


def iter_records(path: str | Path) -> Iterator[tuple[_Checker, dict[str, Any]]]:
    """Yield (checker, record) for each valid line; raise TraceError at the first bad one."""
    path = str(path)
    check = _Checker(path)
    handle = _open(path)
    try:
        for raw in _lines(handle):
            check.line += 1
            if not raw.strip():
                continue
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise check.fail(f"bad JSON: {exc}") from None
            if not isinstance(obj, dict):
                raise check.fail("each line must be a JSON object")
            kind = obj.get("kind")
            if kind not in KINDS:
                raise check.fail(f"unknown kind {kind!r} (expected one of {', '.join(KINDS)})")
            if not check.header_seen and kind != "trace":
                raise check.fail("the first line must be the 'trace' header")
            yield check, _validate(check, kind, obj)
    finally:
        handle.close()
    if check.line == 0 or not check.header_seen:
        raise TraceError(path, check.line, "empty trace: no 'trace' header")


def _check_start(check: _Checker, start: Any) -> None:
    """`start`: the wall-clock time of t=0, ISO 8601 or HH:MM (FORMAT.md)."""
    if not isinstance(start, str):
        raise check.fail(f"field 'start' must be a string, got {type(start).__name__}")
    try:
        if "T" in start:
            datetime.fromisoformat(start)
        else:
            datetime.strptime(start, "%H:%M")
    except ValueError:
        raise check.fail(f"field 'start' must be an ISO 8601 time or HH:MM, not {start!r}") from None


def _validate(check: _Checker, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    if kind == "trace":
        if check.header_seen:
            raise check.fail("a second 'trace' header")
        fmt = check.need(obj, "format", str)
        if fmt != FORMAT:
            raise check.fail(f"unsupported format {fmt!r} (this tool reads {FORMAT})")
        if "start" in obj:
            _check_start(check, obj["start"])
        check.header_seen = True
    elif kind == "session":
        sid = check.need(obj, "id", str)
        if sid in check.sessions:
            raise check.fail(f"session {sid!r} defined twice")
        api = obj.get("api", "openai")
        if api not in APIS:
            raise check.fail(f"session api must be one of {', '.join(APIS)}")
        check.sessions[sid] = Session(
            id=sid,
            role=obj.get("role", "interactive"),
            api=api,
            model=obj.get("model", "default"),
            labels=obj.get("labels") or {},
        )
    elif kind == "blob":
        bid = check.need(obj, "id", str)
        if "value" not in obj:
            raise check.fail("blob is missing field 'value'")
        if bid in check.blobs:
            raise check.fail(f"blob {bid!r} defined twice")
        check.blobs[bid] = obj["value"]
    elif kind == "unrecorded":
        check.need(obj, "method", str)
        check.need(obj, "path", str)
        count = check.need(obj, "count", int)
        if count < 1:
            raise check.fail("unrecorded: count must be >= 1")
    else:
        _validate_request(check, obj)
    return obj


def _validate_request(check: _Checker, obj: dict[str, Any]) -> None:
    rid = check.need(obj, "id", int)
    if check.last_id is not None and rid <= check.last_id:
        raise check.fail(f"request id {rid} is not greater than the previous id {check.last_id}")
    session = check.need(obj, "session", str)
    if session not in check.sessions:
        raise check.fail(f"request {rid} names session {session!r}, not defined before this line")
    t = check.need(obj, "t", (int, float))
    if t < 0:
        raise check.fail(f"request {rid}: t must be >= 0")
    parent = obj.get("parent")
    keep = obj.get("keep", 0)
    if not isinstance(keep, int) or keep < 0:
        raise check.fail(f"request {rid}: keep must be an integer >= 0")
    if parent is None:
        if keep:
            raise check.fail(f"request {rid}: keep without a parent")
    else:
        if parent not in check.n_messages:
            raise check.fail(f"request {rid}: parent {parent!r} is not a request defined before this line")
        if keep > check.n_messages[parent]:
            raise check.fail(
                f"request {rid}: keep {keep} is larger than parent {parent}'s {check.n_messages[parent]} messages"
            )
    append = obj.get("append", [])
    if not isinstance(append, list):
        raise check.fail(f"request {rid}: append must be a list")
    obj["append"] = [check.message(m, i) for i, m in enumerate(append)]
    if keep + len(append) == 0:
        raise check.fail(f"request {rid} has no messages")
    params = obj.get("params") or {}
    if not isinstance(params, dict):
        raise check.fail(f"request {rid}: params must be an object")
    if any(type(v) is dict and "$blob" in v for v in params.values()):
        params = {k: check.blob(v) for k, v in params.items()}
    obj["params"] = params
    previous = params.get("previous_response")
    if previous is not None and (type(previous) is not int or previous not in check.n_messages):
        raise check.fail(
            f"request {rid}: params.previous_response {previous!r} is not a request defined before this line"
        )
    for key in ("reply", "usage", "after"):
        if obj.get(key) is not None and not isinstance(obj[key], dict):
            raise check.fail(f"request {rid}: {key} must be an object")
    after = obj.get("after")
    if after and after.get("request") is not None and after["request"] not in check.n_messages:
        raise check.fail(f"request {rid}: after.request {after['request']!r} is not defined before this line")
    check.n_messages[rid] = keep + len(append)
    check.last_id = rid


def validate(path: str | Path) -> dict[str, int]:
    """Check a whole trace; return counts of what it holds."""
    counts = {"sessions": 0, "requests": 0, "blobs": 0, "lines": 0, "unrecorded": 0}
    for check, obj in iter_records(path):
        counts["lines"] = check.line
        kind = obj["kind"]
        if kind in ("session", "blob", "request"):
            counts[kind + "s"] += 1
        elif kind == "unrecorded":
            counts["unrecorded"] += obj["count"]
    return counts


def read_trace(path: str | Path) -> Trace:
    """Load a trace into linked requests, validating as it goes."""
    # Every object built here lives as long as the trace: the cyclic collector would only re-scan them.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _read_trace(path)
    finally:
        if enabled:
            gc.enable()


def _read_trace(path: str | Path) -> Trace:
    header = TraceHeader()
    requests: list[Request] = []
    unrecorded: list[dict[str, Any]] = []
    by_id: dict[int, Request] = {}
    check: _Checker | None = None
    for check, obj in iter_records(path):
        kind = obj["kind"]
        if kind == "unrecorded":
            unrecorded.append(obj)
        if kind == "trace":
            header = TraceHeader(
                format=obj["format"],
                created=obj.get("created", ""),
                source=obj.get("source", ""),
                notes=obj.get("notes", ""),
                start=obj.get("start", ""),
            )
        elif kind == "request":
            requests.append(_request(obj, by_id, check.line))
    sessions = check.sessions if check else {}
    return Trace(path=str(path), header=header, sessions=sessions, requests=requests, unrecorded=unrecorded)


def iter_requests(path: str | Path, last_named: dict[int, int] | None = None) -> Iterator[Request]:
    """Each request as soon as its line is read and checked, linked to its parent: for work that
    can start before the whole trace is read (a sizing sweep).

    With `last_named` (`last_references(path).last`) a request is let go once no later line
    names it, so a trace of many conversations is never all in memory at once.
    """
    by_id: dict[int, Request] = {}
    done_at: dict[int, list[int]] = {}  # line -> the requests last named on it
    for check, obj in iter_records(path):
        if obj["kind"] != "request":
            continue
        req = _request(obj, by_id, check.line)
        if last_named is not None:
            last = last_named.get(req.id, 0)
            if last > check.line:
                done_at.setdefault(last, []).append(req.id)
            else:
                del by_id[req.id]
            for rid in done_at.pop(check.line, ()):
                del by_id[rid]
        yield req


class References(NamedTuple):
    """What `last_references` finds: for each request a later line names, the last such line;
    and how many lines the file has."""

    last: dict[int, int]
    lines: int


def last_references(path: str | Path) -> References:
    """For each request that a later line names (as its parent, in a `$reply` or as
    `after.request`), the line of the last one that does. One quick pass that checks nothing:
    `iter_records` does, and stops at the first bad line, as ever."""
    last: dict[int, int] = {}
    reply_blobs: dict[Any, Any] = {}  # blobs holding a `$reply` message, by id
    line = 0
    with _open(path) as handle:
        for line, raw in enumerate(_lines(handle), 1):
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            if type(obj) is not dict:
                continue
            kind = obj.get("kind")
            if kind == "blob" and type(obj.get("value")) is dict and "$reply" in obj["value"]:
                reply_blobs[str(obj.get("id"))] = obj["value"]["$reply"]
            elif kind == "request":
                after = obj.get("after")
                named = [obj.get("parent"), after.get("request") if type(after) is dict else None]
                for msg in obj.get("append") or ():
                    if type(msg) is dict:
                        ref = msg.get("$reply")
                        named.append(ref if ref is not None else reply_blobs.get(str(msg.get("$blob", ""))))
                for rid in named:
                    if type(rid) is int:
                        last[rid] = line
    return References(last, line)


def _request(obj: dict[str, Any], by_id: dict[int, Request], line: int) -> Request:
    """A checked request line as a `Request`, linked to its parent and indexed in `by_id`."""
    parent = by_id.get(obj["parent"]) if obj.get("parent") is not None else None
    req = Request(
        id=obj["id"],
        session=obj["session"],
        t=float(obj["t"]),
        parent=parent,
        keep=obj.get("keep", 0),
        append=tuple(obj["append"]),
        params=obj["params"],
        reply=obj.get("reply"),
        usage=obj.get("usage"),
        after=obj.get("after"),
        tag=obj.get("tag", "turn"),
        line=line,
    )
    by_id[req.id] = req
    return req
