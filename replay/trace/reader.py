"""Streaming trace reader: validates line by line and stops at the first bad line.

`iter_records` never holds more than one line of the file plus the small index it needs to check
references (request ids and message counts, blob ids, session ids), so a 1 GB trace validates in
constant memory. `read_trace` builds the linked `Request` objects the engine replays in the same
pass, holding each repeated plain message once (sessions resend system prompts and restated
history), so a loaded trace's memory follows its distinct text, not its size. Equal synthetic
messages, equal `params` and the short words every line repeats (role, session, finish) are held
once too: a loaded trace's objects are read-only, never changed after loading.
"""

from __future__ import annotations

import gc
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import orjson

from replay.errors import TraceError
from replay.serving.counts import COUNT_MAX, COUNT_RULE, as_count
from replay.trace.model import APIS, FORMAT, READS, Request, Session, Trace, TraceHeader
from replay.trace.sniff import sniff

KINDS = ("trace", "session", "blob", "request", "unrecorded", "rejected")
_MESSAGE_ROLES = ("system", "developer", "user", "assistant", "tool")
_ROLE = {role: role for role in _MESSAGE_ROLES}  # the one string each role is held as
# Times in a trace: up to about 31 years, so an agent's store spanning years imports;
# still far inside a 64-bit nanosecond clock (10^18 of its 9.2 x 10^18) and whole microseconds.
MAX_SECONDS = 1e9
SYNTH_MAX_TOKENS = 10_000_000  # synthetic text is built in memory when sent: beyond any context
# `reply.status` values a recorder writes (FORMAT.md); `ok` when absent.
REPLY_STATUSES = (
    "ok",
    "http_error",
    "malformed",
    "server_error",
    "stream_broken",
    "client_disconnected",
    "connect_error",
    "timeout",
    "bad_payload",
    "cancelled",
)


class _Checker:
    """What has been seen so far, and the checks of one line against it."""

    def __init__(self, path: str, share: bool = False) -> None:
        self.path = path
        self.share = share
        self.line = 0
        self.blobs: dict[str, Any] = {}
        self.sessions: dict[str, Session] = {}
        # Each request's message count, by id, in two arrays (16 bytes a request; a dict took ~96,
        # which grew a 2 GB import's validation by ~100 MiB): ids only increase, see `_messages_of`.
        self.ids: array[int] = array("q")
        self.counts: array[int] = array("q")
        self.last_id: int | None = None
        self.header_seen = False
        self.version = FORMAT  # the header's format
        self.tool_lists: dict[int, Any] = {}  # tool lists checked already (kept alive: ids stay theirs)
        # With `share` (a whole trace being loaded), the plain messages read so far, so a repeated
        # one is held once (see `shared`); without it nothing outlives its line.
        self.plain: dict[str, dict[str, dict[str, Any]]] = {}  # by role, then text
        self.synth: dict[tuple[str, int, int], dict[str, Any]] = {}  # by role, tokens, seed
        self.params: dict[tuple[Any, ...], dict[str, Any]] = {}  # by their values (see `shared_params`)
        self.words: dict[str, str] = {}  # short repeated values (`reply.finish`), one object each
        self.blob_ids: set[int] = set()  # ids of the blobs' values: one object for every use
        self.empty_labels: dict[str, Any] = {}  # see `no_labels`
        self.held: set[int] = set()  # ids of the messages held once (`shared`, `shared_synth`)
        self.appends: dict[tuple[int, ...], tuple[dict[str, Any], ...]] = {}  # see `shared_append`

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

    def shared(self, role: str, content: str, msg: dict[str, Any]) -> dict[str, Any]:
        """`msg` (a checked `{"role", "content"}` of text), or the equal one read before.

        Sessions resend the same texts (a system prompt in every session, a compaction's restated
        history, a subagent's brief): a loaded trace holds each such message once. Message dicts
        are never changed once read (a blob's already are shared), so sharing is safe.
        """
        if not self.share:
            return msg
        by_text = self.plain.get(role)
        if by_text is None:
            by_text = self.plain[role] = {}
        found = by_text.get(content)
        if found is None:
            msg["role"] = _ROLE[role]  # one string for every message's role, not one a line
            by_text[content] = found = msg
            self.held.add(id(msg))
        return found

    def seen(self, role: str, content: str, msg: dict[str, Any]) -> dict[str, Any]:
        """`msg`, or the equal one read before; unlike `shared`, a new one is not kept for later
        lines. A loaded request holds its bare recorded reply as its values (`Request.reply`),
        not as this dict: keeping each reply's dict here until the whole trace is read would only
        raise the load's peak (the memory a process keeps) by ~250 bytes a request."""
        if not self.share:
            return msg
        by_text = self.plain.get(role)
        found = by_text.get(content) if by_text is not None else None
        return msg if found is None else found

    def shared_synth(self, role: str, msg: dict[str, Any]) -> dict[str, Any] | None:
        """`msg` if it is `{"role", "content": {"synth": {"tokens", "seed"}}}` with a valid spec,
        or the equal one read before; None for any other message (checked the long way).

        Generated traces (scenarios, the soak) resend the same synthetic texts by seed: three
        dicts a message that a loaded trace holds once."""
        content = msg["content"]
        if len(content) != 1:
            return None
        spec = content.get("synth")
        if type(spec) is not dict or len(spec) != 2:
            return None
        tokens, seed = spec.get("tokens"), spec.get("seed")
        if type(tokens) is not int or type(seed) is not int or not 0 <= tokens <= SYNTH_MAX_TOKENS:
            return None
        if not self.share:
            return msg
        key = (role, tokens, seed)
        found = self.synth.get(key)
        if found is None:
            msg["role"] = _ROLE[role]
            self.synth[key] = found = msg
            self.held.add(id(msg))
        return found

    def shared_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """`params` (checked), or the equal one read before: agents send the same settings on
        every request. Only values compared cheaply are keyed: scalars (by type and value, so 1,
        1.0 and true stay apart) and blob values (by identity); any other value keeps its own."""
        if not self.share:
            return params
        key: list[Any] = []
        for name, value in params.items():
            kind = type(value)
            if kind is str or kind is int or kind is float or kind is bool or value is None:
                key.append((name, kind, value))
            elif id(value) in self.blob_ids:
                key.append((name, id(value)))
            else:
                return params
        return self.params.setdefault(tuple(key), params)

    def no_labels(self) -> dict[str, Any]:
        """A session's empty `labels`: with `share`, one dict for every session that has none
        (read-only, as every loaded object is); a one-request session would otherwise hold its own."""
        if not self.share:
            return {}
        return self.empty_labels

    def shared_append(self, append: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
        """`append` as a tuple; with `share`, the equal tuple made before when each of its
        messages is one held once (shared plain or synthetic messages): one-request sessions
        of a generated trace resend the same system prompt and user texts."""
        out = tuple(append)
        if not self.share or len(out) > 8:
            return out
        key = tuple(id(m) for m in out)
        found = self.appends.get(key)
        if found is not None:
            return found
        if all(id(m) in self.held for m in out):
            self.appends[key] = out  # holds its messages: their ids stay theirs
        return out

    def word(self, value: str) -> str:
        """One object for a short value many lines repeat (a finish reason)."""
        if not self.share or len(value) > 32:
            return value
        return self.words.setdefault(value, value)

    def blob(self, ref: Any) -> Any:
        """Resolve `{"$blob": id}` to the blob's value (the same object every time), else return as is."""
        if isinstance(ref, dict) and "$blob" in ref:
            bid = ref["$blob"]
            value = self.blobs.get(bid) if type(bid) is str else None
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
                type(spec) is dict
                and type(spec.get("tokens")) is int
                and 0 <= spec["tokens"] <= SYNTH_MAX_TOKENS
                and type(spec.get("seed")) is int
            ):
                raise self.fail(
                    f"{where}: synth needs integer 'tokens' (0 to {SYNTH_MAX_TOKENS:,}) and integer 'seed'"
                )
            return value
        if isinstance(value, list):
            for part in value:  # text and plain synth parts stay as they are: an imported prompt
                # may hold a million of them (one per hashed block), checked here without a call each
                if type(part) is str:
                    continue
                if type(part) is dict and len(part) == 1:
                    spec = part.get("synth")
                    if (
                        type(spec) is dict
                        and type(spec.get("tokens")) is int
                        and 0 <= spec["tokens"] <= SYNTH_MAX_TOKENS
                        and type(spec.get("seed")) is int
                    ):
                        continue
                return [self.content(part, where) for part in value]  # blobs to resolve, or an error
            return value
        raise self.fail(f"{where}: content must be text, a synth object, a blob or a list of those")

    def message(self, msg: Any, index: int) -> dict[str, Any]:
        if type(msg) is dict and len(msg) == 2:
            content = msg.get("content")
            role = msg.get("role")
            if role == "user" or role == "system" or role == "assistant":
                if type(content) is str:
                    return self.shared(role, content, msg)  # plain text: nothing to check
                if type(content) is dict:
                    found = self.shared_synth(role, msg)
                    if found is not None:
                        return found
        msg = self.blob(msg)
        where = f"append[{index}]"
        if not isinstance(msg, dict):
            raise self.fail(f"{where} must be an object")
        if "$reply" in msg:
            ref = msg["$reply"]
            if _messages_of(self, ref) < 0:
                raise self.fail(f"{where}: $reply refers to request {ref!r}, not defined before this line")
            return msg
        return self.checked_message(msg, where, None)

    def checked_message(self, msg: dict[str, Any], where: str, only_role: str | None) -> dict[str, Any]:
        """A stored message well formed (FORMAT.md, Messages); its content blobs resolved."""
        role = msg.get("role")
        if only_role is not None and role != only_role:
            raise self.fail(f"{where}: role must be {only_role!r}")
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
        if "tool_call_id" in msg and not isinstance(msg["tool_call_id"], str):
            raise self.fail(f"{where}: 'tool_call_id' must be a string")
        calls = msg.get("tool_calls")
        if calls is not None:
            if role != "assistant":
                raise self.fail(f"{where}: only an assistant message carries 'tool_calls'")
            if not isinstance(calls, list):
                raise self.fail(f"{where}: 'tool_calls' must be a list")
            for call in calls:
                if not (
                    isinstance(call, dict)
                    and isinstance(call.get("id"), str)
                    and isinstance(call.get("name"), str)
                    and isinstance(call.get("arguments", ""), str)
                ):
                    raise self.fail(
                        f"{where}: each tool call needs string 'id', 'name' and 'arguments' (JSON text)"
                    )
        if msg.get("reasoning") is not None and not isinstance(msg["reasoning"], str):
            raise self.fail(f"{where}: 'reasoning' must be a string")
        return msg


def _tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _type_name(types: type | tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", dict: "an object", list: "a list"}
    return " or ".join(names.get(t, t.__name__) for t in _tuple(types))


def _lines(handle: BinaryIO, block: int = 1 << 20) -> Iterator[bytes | memoryview]:
    """The file's lines, read in blocks: views into the block, not copies (a line the block cuts
    is joined whole). Splitting into `bytes` would copy the whole file once more, a third of the
    time a large trace takes to validate."""
    cut: list[bytes] = []  # the start of a line the last block(s) cut
    while chunk := handle.read(block):
        view = memoryview(chunk)
        start = 0
        end = chunk.find(b"\n")
        if cut and end >= 0:
            cut.append(chunk[:end])
            yield b"".join(cut)
            cut = []
            start = end + 1
            end = chunk.find(b"\n", start)
        while end >= 0:
            yield view[start:end]
            start = end + 1
            end = chunk.find(b"\n", start)
        if start < len(chunk):
            cut.append(chunk[start:])
    if cut:
        yield b"".join(cut)


def _open(path: str | Path) -> BinaryIO:
    """The trace file for reading; a file that cannot be opened is a `TraceError`."""
    try:
        return open(path, "rb")  # noqa: SIM115 - the callers close it
    except OSError as exc:
        raise TraceError(str(path), 0, sniff(path) or f"cannot open: {exc.strerror}") from None


def _refuse(check: _Checker, problem: str) -> TraceError:
    """`problem` at the current line; before the `trace` header, a file of another tool gets the
    command that takes it instead (`replay import sharegpt`, `replay report`)."""
    return check.fail((None if check.header_seen else sniff(check.path)) or problem)


def iter_records(path: str | Path, share: bool = False) -> Iterator[tuple[_Checker, dict[str, Any]]]:
    """Yield (checker, record) for each valid line; raise TraceError at the first bad one.

    `share`: repeated plain messages come out as one object (for a caller that keeps them all)."""
    path = str(path)
    check = _Checker(path, share)
    handle = _open(path)
    try:
        for raw in _lines(handle):
            check.line += 1
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                if not bytes(raw).strip():
                    continue  # a blank line
                raise _refuse(check, f"bad JSON: {exc}") from None
            if not isinstance(obj, dict):
                raise _refuse(check, "each line must be a JSON object")
            kind = obj.get("kind")
            if kind not in KINDS:
                raise _refuse(check, f"unknown kind {kind!r} (expected one of {', '.join(KINDS)})")
            if not check.header_seen and kind != "trace":
                raise _refuse(check, "the first line must be the 'trace' header")
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
        if fmt not in READS:
            raise check.fail(f"unsupported format {fmt!r} (this tool reads {' and '.join(READS)})")
        check.version = fmt
        for key in ("created", "source", "notes"):
            value = obj.get(key)
            if value is not None and type(value) is not str:
                raise check.fail(f"trace: field '{key}' must be a string, got {_json_type(value)}")
        if obj.get("start") is not None:
            _check_start(check, obj["start"])
        check.header_seen = True
    elif kind == "session":
        sid = check.need(obj, "id", str)
        if sid in check.sessions:
            raise check.fail(f"session {sid!r} defined twice")
        api = obj.get("api", "openai")
        if api not in APIS:
            raise check.fail(f"session api must be one of {', '.join(APIS)}")
        for key, kind_of in (("role", str), ("model", str), ("labels", dict)):
            value = obj.get(key)
            if value is not None and type(value) is not kind_of:
                raise check.fail(
                    f"session {sid!r}: field '{key}' must be {_type_name(kind_of)}, got {_json_type(value)}"
                )
        # Only a trace being loaded (`share`) keeps a session's labels; a check that streams
        # (`validate`, `iter_requests`) needs the session's id: labels held ~1 KB a session, 33 MiB
        # in validating a 2 GB Codex import's 33,736 sessions.
        labels = (obj.get("labels") or check.no_labels()) if check.share else check.empty_labels
        check.sessions[sid] = Session(
            id=sid,
            role=check.word(obj.get("role") or "interactive"),
            api=check.word(api),
            model=check.word(obj.get("model") or "default"),
            labels=labels,
        )
    elif kind == "blob":
        bid = check.need(obj, "id", str)
        if "value" not in obj:
            raise check.fail("blob is missing field 'value'")
        if bid in check.blobs:
            raise check.fail(f"blob {bid!r} defined twice")
        check.blobs[bid] = obj["value"]
        check.blob_ids.add(id(obj["value"]))
    elif kind == "unrecorded":
        check.need(obj, "method", str)
        check.need(obj, "path", str)
        count = check.need(obj, "count", int)
        if count < 1:
            raise check.fail("unrecorded: count must be >= 1")
    elif kind == "rejected":
        _validate_rejected(check, obj)
    else:
        _validate_request(check, obj)
    return obj


def _where(rid: int, section: str) -> str:
    """How a message names the field's place: `request 7` or `request 7: params` (built on failure)."""
    return f"request {rid}: {section}" if section else f"request {rid}"


def _optional(check: _Checker, obj: dict[str, Any], key: str, types: type, rid: int, section: str) -> Any:
    """`obj[key]` when present and not null: it must be of `types` (a bool is never an int)."""
    value = obj.get(key)
    if value is None or type(value) is types:
        return value
    if not isinstance(value, types) or (isinstance(value, bool) and types is not bool):
        raise check.fail(
            f"{_where(rid, section)}: field '{key}' must be {_type_name(types)}, got {_json_type(value)}"
        )
    return value


def _json_type(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", dict: "an object"}
    return names.get(type(value), "a list" if isinstance(value, list) else type(value).__name__)


def _count(check: _Checker, obj: dict[str, Any], key: str, rid: int, section: str) -> int | None:
    """A count by the one rule of `serving.counts` (an integral float like 5.0 is accepted), or absent."""
    value = obj.get(key)
    if value is None:
        return None
    n = as_count(value)
    if n is not None:
        return n
    raise check.fail(f"{_where(rid, section)}: field '{key}' must be {COUNT_RULE}, got {_short(value)}")


def _seconds(check: _Checker, obj: dict[str, Any], key: str, rid: int, section: str) -> None:
    """A time in seconds: a finite number >= 0 (below 10^9), or absent."""
    value = obj.get(key)
    if value is None:
        return
    if (type(value) is float or type(value) is int) and 0 <= value < MAX_SECONDS:
        return
    raise check.fail(
        f"{_where(rid, section)}: field '{key}' must be seconds (a number from 0 to 1e9), got {_short(value)}"
    )


def _short(value: Any) -> str:
    try:
        text = orjson.dumps(value).decode()
    except TypeError:  # an integer beyond 64 bits
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_fan_out(check: _Checker, after: dict[str, Any], rid: int) -> None:
    """`after.spawn` (this request's session is a subagent spawned by `after.request`) and
    `after.waits` (earlier requests, the subagents' last, whose replies this one also waited for):
    format /2 only."""
    spawn, waits = after.get("spawn"), after.get("waits")
    if (spawn is not None or waits is not None) and check.version == READS[0]:
        raise check.fail(
            f"request {rid}: after.spawn and after.waits need format {FORMAT}, not {check.version}"
        )
    if spawn is not None and (type(spawn) is not bool or after.get("request") is None):
        raise check.fail(
            f"request {rid}: after.spawn must be true or false, with after.request the spawning request"
        )
    if waits is not None:
        if type(waits) is not list or not waits:
            raise check.fail(f"request {rid}: after.waits must be a non-empty list of request ids")
        for ref in waits:
            if not _request_id(check, ref):
                raise check.fail(f"request {rid}: after.waits {_short(ref)} is not defined before this line")


def _request_id(check: _Checker, value: Any) -> bool:
    """An earlier request's id (a bool is never one, though `True == 1`)."""
    return _messages_of(check, value) >= 0


def _messages_of(check: _Checker, rid: Any) -> int:
    """How many messages the earlier request `rid` has; -1 when no request has that id (a bool
    is never one, though `True == 1`). Ids only increase: consecutive ones (as writers number
    them) are found at their place, others by bisection."""
    ids = check.ids
    n = len(ids)
    if n == 0 or type(rid) is not int:
        return -1
    first = ids[0]
    if ids[n - 1] - first == n - 1:
        i = rid - first
        return check.counts[i] if 0 <= i < n else -1
    i = bisect_left(ids, rid)
    return check.counts[i] if i < n and ids[i] == rid else -1


def _validate_rejected(check: _Checker, obj: dict[str, Any]) -> None:
    """A request the upstream refused, kept as its size and hash only: nothing to replay."""
    status = check.need(obj, "status", int)
    if not 100 <= status <= 599:
        raise check.fail(f"rejected: status {status} is not an HTTP status")
    if check.need(obj, "bytes", int) < 0:
        raise check.fail("rejected: bytes must be >= 0")
    check.need(obj, "sha256", str)
    check.need(obj, "t", (int, float))


def _validate_request(check: _Checker, obj: dict[str, Any]) -> None:
    rid = check.need(obj, "id", int)
    if rid < 0 or rid > COUNT_MAX:
        raise check.fail(f"request id must be {COUNT_RULE}, got {rid}")
    if check.last_id is not None and rid <= check.last_id:
        raise check.fail(f"request id {rid} is not greater than the previous id {check.last_id}")
    session = check.need(obj, "session", str)
    known = check.sessions.get(session)
    if known is None:
        raise check.fail(f"request {rid} names session {session!r}, not defined before this line")
    obj["session"] = known.id  # the session's own string, not one a line
    if "t" not in obj:
        raise check.fail("request is missing field 't'")
    if obj["t"] is None:
        raise check.fail(f"request {rid}: field 't' must be seconds (a number from 0 to 1e9), got null")
    _seconds(check, obj, "t", rid, "")
    parent = obj.get("parent")
    keep = obj.get("keep", 0)
    if type(keep) is not int or keep < 0:
        raise check.fail(f"request {rid}: keep must be an integer >= 0, got {_short(keep)}")
    if parent is None:
        if keep:
            raise check.fail(f"request {rid}: keep without a parent")
    else:
        if not _request_id(check, parent):
            raise check.fail(
                f"request {rid}: parent {_short(parent)} is not a request defined before this line"
            )
        held = _messages_of(check, parent)
        if keep > held:
            raise check.fail(f"request {rid}: keep {keep} is larger than parent {parent}'s {held} messages")
    append = obj.get("append", [])
    if not isinstance(append, list):
        raise check.fail(f"request {rid}: append must be a list")
    obj["append"] = [check.message(m, i) for i, m in enumerate(append)]
    if keep + len(append) == 0:
        raise check.fail(f"request {rid} has no messages")
    params = obj.get("params", {})
    if not isinstance(params, dict):
        raise check.fail(f"request {rid}: params must be an object")
    if any(type(v) is dict and "$blob" in v for v in params.values()):
        params = {k: check.blob(v) for k, v in params.items()}
    if params:
        _check_params(check, params, rid)
    obj["params"] = check.shared_params(params)
    previous = params.get("previous_response")
    if previous is not None and _messages_of(check, previous) < 0:
        raise check.fail(
            f"request {rid}: params.previous_response {previous!r} is not a request defined before this line"
        )
    reply = obj.get("reply")
    if reply is not None:
        if type(reply) is not dict:
            raise check.fail(f"request {rid}: reply must be an object")
        _check_reply(check, reply, rid)
    usage = obj.get("usage")
    if usage is not None:
        if type(usage) is not dict:
            raise check.fail(f"request {rid}: usage must be an object")
        for key in ("prompt_tokens", "cached_tokens", "cache_write_tokens", "output_tokens"):
            _count(check, usage, key, rid, "usage")
        _optional(check, usage, "raw", dict, rid, "usage")
    synthetic = obj.get("synthetic")
    if synthetic is not None and not (
        isinstance(synthetic, list) and all(type(i) is int and 0 <= i < keep + len(append) for i in synthetic)
    ):
        raise check.fail(f"request {rid}: synthetic must list indices of its messages")
    after = obj.get("after")
    if after is not None:
        if type(after) is not dict:
            raise check.fail(f"request {rid}: after must be an object")
        ref = after.get("request")
        if ref is not None and not _request_id(check, ref):
            raise check.fail(f"request {rid}: after.request {_short(ref)} is not defined before this line")
        _seconds(check, after, "delay_s", rid, "after")
        _check_fan_out(check, after, rid)
    tag = obj.get("tag")
    if tag is not None:
        if type(tag) is not str:
            raise check.fail(f"request {rid}: field 'tag' must be a string, got {_json_type(tag)}")
        obj["tag"] = check.word(tag)
    check.ids.append(rid)
    check.counts.append(keep + len(append))
    check.last_id = rid


def _check_params(check: _Checker, params: dict[str, Any], rid: int) -> None:
    _count(check, params, "max_tokens", rid, "params")  # 0 is a pre-warm: prefill only (ds4 PR 956)
    temperature = params.get("temperature")
    if temperature is not None and (
        (type(temperature) is not int and type(temperature) is not float) or temperature < 0
    ):
        raise check.fail(
            f"request {rid}: params: 'temperature' must be a number >= 0, got {_short(temperature)}"
        )
    _optional(check, params, "stream", bool, rid, "params")
    _optional(check, params, "extra", dict, rid, "params")
    tools = _optional(check, params, "tools", list, rid, "params")
    if tools is not None and id(tools) not in check.tool_lists:
        for i, tool in enumerate(tools):
            tool = check.blob(tool)
            if not isinstance(tool, dict):
                raise check.fail(f"request {rid}: params: tools[{i}] must be an object")
            if tool.get("type", "function") != "function":
                continue  # a Responses tool of another kind (web_search, custom, ...): sent as it is
            fn = tool.get("function", tool)
            if not (isinstance(fn, dict) and isinstance(fn.get("name"), str)):
                raise check.fail(
                    f"request {rid}: params: tools[{i}] must be a function tool with a string 'name'"
                )
            if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
                raise check.fail(f"request {rid}: params: tools[{i}] 'parameters' must be an object")
            if fn.get("description") is not None and not isinstance(fn["description"], str):
                raise check.fail(f"request {rid}: params: tools[{i}] 'description' must be a string")
        if len(check.tool_lists) < 1024:  # a blob's list is one object, shared by every use: once
            check.tool_lists[id(tools)] = tools


def params_problem(params: dict[str, Any]) -> str | None:
    """Why a trace could not hold a request with these params, by this reader's own rules, or None.

    The recorder asks before it keeps a request, so it never writes a trace the reader refuses
    (a server may accept a tool with no name; a trace cannot replay it).
    """
    try:
        _check_params(_Checker("<request>"), params, 0)
    except TraceError as exc:
        return exc.problem.removeprefix("request 0: ")
    return None


def _check_reply(check: _Checker, reply: dict[str, Any], rid: int) -> None:
    message = reply.get("message")
    if message is not None:
        if type(message) is dict and message.get("role") == "assistant" and len(message) == 2:
            content = message.get("content")
            if type(content) is str:  # the common bare reply: nothing to check
                reply["message"] = check.seen("assistant", content, message)
            else:
                reply["message"] = check.checked_message(
                    message, f"request {rid}: reply.message", "assistant"
                )
        else:
            message = check.blob(message)
            if not isinstance(message, dict):
                raise check.fail(f"request {rid}: reply: 'message' must be an assistant message object")
            reply["message"] = check.checked_message(message, f"request {rid}: reply.message", "assistant")
    finish = _optional(check, reply, "finish", str, rid, "reply")
    if finish is not None:
        reply["finish"] = check.word(finish)
    _count(check, reply, "output_tokens", rid, "reply")
    if len(reply) == ("message" in reply) + ("finish" in reply) + ("output_tokens" in reply):
        return  # message, finish, output_tokens only: nothing a recorder adds
    status = reply.get("status")
    if status is not None and status not in REPLY_STATUSES:
        raise check.fail(f"request {rid}: reply: 'status' must be one of {', '.join(REPLY_STATUSES)}")
    http_status = _count(check, reply, "http_status", rid, "reply")
    if http_status is not None and not 100 <= http_status <= 599:
        raise check.fail(f"request {rid}: reply: 'http_status' must be an HTTP status (100 to 599)")
    _optional(check, reply, "error", str, rid, "reply")
    for key in ("first_byte_s", "first_token_s", "last_byte_s"):
        _seconds(check, reply, key, rid, "reply")


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


def read_trace(path: str | Path, freeze: bool = False) -> Trace:
    """Load a trace into linked requests, validating as it goes.

    `freeze`: for a process that keeps the trace until it exits (`replay run`): what is loaded
    goes to the collector's permanent generation (`gc.freeze`), so the collections before the
    run (its setup) do not scan millions of trace objects again and again."""
    # Every object built here lives as long as the trace: the cyclic collector would only re-scan them.
    enabled = gc.isenabled()
    gc.disable()
    try:
        trace = _read_trace(path)
        if freeze:
            gc.freeze()
        return trace
    finally:
        if enabled:
            gc.enable()


def _read_trace(path: str | Path) -> Trace:
    header = TraceHeader()
    requests: list[Request] = []
    unrecorded: list[dict[str, Any]] = []
    by_id: dict[int, Request] = {}
    check: _Checker | None = None
    for check, obj in iter_records(path, share=True):
        kind = obj["kind"]
        if kind == "unrecorded":
            unrecorded.append(obj)
        if kind == "trace":
            header = TraceHeader(
                format=obj["format"],
                created=obj.get("created") or "",  # null is absent (FORMAT.md)
                source=obj.get("source") or "",
                notes=obj.get("notes") or "",
                start=obj.get("start") or "",
            )
        elif kind == "request":
            obj["append"] = check.shared_append(obj["append"])
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
                if type(after) is dict and type(after.get("waits")) is list:
                    named.extend(after["waits"])
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
        tag=obj.get("tag") or "turn",
        line=line,
    )
    by_id[req.id] = req
    return req
