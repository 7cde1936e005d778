"""What the proxy calls at each request's arrival and end: session inference plus the trace writer.

One trace `request` line is appended and flushed per completed request (ids in completion order,
`t` the arrival), so a crash loses only the requests in flight. A request the upstream refused
(HTTP status >= 400) is not a request of the workload: it is counted per status and written as a
short `rejected` line (status, size, sha256; never the body) unless `keep_rejected`, and its
session inference is withdrawn, as if it had never arrived. Each request is delta-encoded
against the request it extends (its inferred `base`), not merely the session's last written one,
so a concurrent turn does not make its neighbours look like compactions.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import orjson

from replay.record.anonymize import Anonymizer
from replay.record.requests import parse_request
from replay.record.sessions import Assignment, Label, RecordedSession, SessionInference, user_id_scope
from replay.record.wire import Parsed, TapResult, WireError
from replay.trace.model import Message
from replay.trace.reader import params_problem
from replay.trace.writer import Basis, TraceWriter

_WRITTEN_MAX = 1024
_RESPONSES_MAX = 256  # Responses API ids kept for `previous_response_id` chains


@dataclass(slots=True)
class Pending:
    """A recordable request between its arrival and its end."""

    parsed: Parsed
    assignment: Assignment
    arrived_ns: int
    body: bytes = b""  # the raw body, hashed only if the upstream rejects it


@dataclass(slots=True)
class Outcome:
    """How the exchange ended, as the proxy saw it; the tap says what the bytes were."""

    tap: TapResult
    status: str | None = None  # client_disconnected | connect_error | stream_broken; None: the tap's
    error: str | None = None
    t_first_byte: int | None = None
    t_last_byte: int | None = None
    t_done: int = 0


@dataclass(slots=True)
class RecorderStats:
    recorded: int = 0
    errors: int = 0
    unrecorded: int = 0  # bodies on recorded routes that could not be read as requests
    dropped_parts: int = 0  # images, documents: content the trace format cannot hold
    write_errors: int = 0
    last_problem: str = ""
    statuses: dict[str, int] = field(default_factory=dict)
    rejected: dict[int, int] = field(default_factory=dict)  # HTTP status -> requests the upstream refused


class Recorder:
    def __init__(
        self,
        writer: TraceWriter,
        inference: SessionInference | None = None,
        anonymizer: Anonymizer | None = None,
        t0_ns: int | None = None,
        keep_rejected: bool = False,
    ) -> None:
        self.writer = writer
        self.keep_rejected = keep_rejected
        self.inference = inference or SessionInference()
        self.anonymizer = anonymizer
        self.t0_ns = t0_ns  # the first request's arrival unless given: the trace starts there
        self.stats = RecorderStats()
        self._written: OrderedDict[int, Basis] = OrderedDict()  # recent requests, as keys only
        # Responses API id -> (trace id, the messages the server holds under it: request + reply)
        self._responses: OrderedDict[str, tuple[int, list[Message]]] = OrderedDict()
        self.inference.on_idle = self._idle

    def _idle(self, session: RecordedSession) -> None:
        """An idle session's text goes: the writer's copy of its last request (a resumed
        conversation is then written whole, and still inferred from the prefix hashes)."""
        if session.declared is not None:
            self.writer.forget(session.declared)

    def begin(
        self, api: str, body: bytes, label: Label | None, role_hint: str | None, now_ns: int
    ) -> Pending | None:
        """Read the body and assign a session; None when the body is not a request we can record."""
        try:
            parsed = parse_request(api, body)
            problem = params_problem(parsed.params)
            if problem is not None:
                raise WireError(problem)
        except WireError as exc:
            self.stats.unrecorded += 1
            self.stats.last_problem = f"not recorded: {exc}"
            return None
        self.stats.dropped_parts += parsed.dropped_parts
        if parsed.previous_response_id is not None:
            self._chain(parsed)
        if label is None and parsed.user_id:
            label = Label(user_id_scope(parsed.user_id), "user_id")
        if self.t0_ns is None:
            self.t0_ns = now_ns
        tools = parsed.params.get("tools")
        assignment = self.inference.arrive(
            parsed.messages, api, parsed.model, now_ns, tools=tools, label=label, role_hint=role_hint
        )
        return Pending(parsed, assignment, now_ns, body)

    def _chain(self, parsed: Parsed) -> None:
        """A request sent with `previous_response_id` carries only its new input: the trace gets
        the whole conversation, and `params.previous_response` names the request it chained to."""
        known = self._responses.get(parsed.previous_response_id or "")
        if known is None:
            self.stats.last_problem = (
                f"previous_response_id {parsed.previous_response_id!r} was not recorded: "
                "the request is recorded with only the input it sent"
            )
            return
        rid, held = known
        # The earlier response's instructions are not inherited: this request's go first.
        head = parsed.messages[:1] if parsed.has_instructions else []
        parsed.messages = [*head, *held, *parsed.messages[len(head) :]]
        parsed.params["previous_response"] = rid

    def finish(self, pending: Pending, outcome: Outcome) -> int:
        """Append the request's trace line; returns its id (-1 when none was written)."""
        tap = outcome.tap
        if tap.http_status is not None and tap.http_status >= 400 and not self.keep_rejected:
            self._reject(pending, tap.http_status, tap.error)
            return -1
        status = outcome.status or tap.status
        error = outcome.error if outcome.status else tap.error
        a = pending.assignment
        try:
            rid = self._write(pending, outcome, status, error)
        except OSError as exc:
            self.stats.write_errors += 1
            self.stats.last_problem = f"trace write failed: {exc}"
            rid = None
        if rid is not None:
            self.stats.recorded += 1
            if tap.response_id is not None and tap.message is not None and status == "ok":
                parsed = pending.parsed
                held = parsed.messages[1:] if parsed.has_instructions else parsed.messages
                self._responses[tap.response_id] = (rid, [*held, tap.message])
                if len(self._responses) > _RESPONSES_MAX:
                    self._responses.popitem(last=False)
        self.stats.statuses[status] = self.stats.statuses.get(status, 0) + 1
        if status != "ok":
            self.stats.errors += 1
            self.stats.last_problem = f"{a.session.id}: {status}: {error or ''}"[:200]
        self.inference.done(a, outcome.t_done, rid, tap.message, status, tap.usage.prompt_tokens)
        return rid if rid is not None else -1

    def _reject(self, pending: Pending, http_status: int, error: str | None) -> None:
        self.inference.withdraw(pending.assignment)
        self._rejected_line(pending.parsed.api, pending.body, http_status, pending.arrived_ns)
        self.stats.last_problem = f"upstream rejected a request: {error or f'HTTP {http_status}'}"[:200]

    def refused_unread(self, api: str, body: bytes, http_status: int, arrived_ns: int) -> bool:
        """A body `begin` could not read (counted as not recordable) that the upstream refused as
        well: a rejection, not a gap in the recording. False with `keep_rejected` (it stays a
        call the trace misses: there is no request line to keep it in)."""
        if self.keep_rejected:
            return False
        self.stats.unrecorded -= 1
        self._rejected_line(api, body, http_status, arrived_ns)
        return True

    def _rejected_line(self, api: str, body: bytes, http_status: int, arrived_ns: int) -> None:
        self.stats.rejected[http_status] = self.stats.rejected.get(http_status, 0) + 1
        digest = hashlib.sha256(body).hexdigest()
        if self.anonymizer is not None:  # a bare hash would let anyone confirm a guessed prompt
            digest = self.anonymizer.name(digest)
        if self.t0_ns is None:
            self.t0_ns = arrived_ns
        t = max(0, arrived_ns - self.t0_ns) / 1e9
        try:
            self.writer.rejected(t, api, http_status, len(body), digest)
        except OSError as exc:
            self.stats.write_errors += 1
            self.stats.last_problem = f"trace write failed: {exc}"

    def _write(self, pending: Pending, outcome: Outcome, status: str, error: str | None) -> int:
        parsed, a = pending.parsed, pending.assignment
        anon = self.anonymizer
        messages = parsed.messages if anon is None else anon.messages(parsed.messages)
        params = dict(parsed.params) if anon is None else anon.params(parsed.params)
        tools = params.get("tools")
        if tools:
            digest = hashlib.blake2b(
                orjson.dumps(tools, option=orjson.OPT_SORT_KEYS), digest_size=6
            ).hexdigest()
            params["tools"] = self.writer.blob(f"tools-{digest}", tools)
        reply = self._reply(pending, outcome, status, error)
        if anon is not None:
            reply = anon.reply(reply)
        sid = self._declare(a)
        after = None
        if a.after is not None and a.after.rid is not None:
            after = {"request": a.after.rid, "delay_s": round(a.delay_s or 0.0, 6)}
        rid = self.writer.request(
            sid,
            max(0, pending.arrived_ns - (self.t0_ns or pending.arrived_ns)) / 1e9,
            messages,
            params=params,
            reply=reply,
            usage=_usage(outcome.tap),
            after=after,
            tag=a.tag,
            base=self._base(a),
        )
        basis = self.writer.last(sid)
        if basis is not None:
            self._written[rid] = basis
        if len(self._written) > _WRITTEN_MAX:
            self._written.popitem(last=False)
        return rid

    def _declare(self, a: Assignment) -> str:
        s = a.session
        sid = s.declared
        if sid is None:
            sid = s.id if self.anonymizer is None else self.anonymizer.name(s.id)
            labels = s.labels if self.anonymizer is None else self.anonymizer.labels(s.labels)
            self.writer.session(sid, role=s.role, api=s.api, model=s.model, labels=labels)
            s.declared = sid
        return sid

    def _base(self, a: Assignment) -> Basis | None:
        """The request this one extends (with concurrent turns, not always the session's last)."""
        base = a.base
        if base is None or base.rid is None:
            return None
        return self._written.get(base.rid)

    def _reply(self, pending: Pending, outcome: Outcome, status: str, error: str | None) -> dict[str, Any]:
        tap = outcome.tap
        reply: dict[str, Any] = {}
        if tap.message is not None:
            reply["message"] = tap.message
        if tap.finish is not None:
            reply["finish"] = tap.finish
        if tap.usage.output_tokens is not None:
            reply["output_tokens"] = tap.usage.output_tokens
        reply["status"] = status
        if tap.http_status is not None and tap.http_status != 200:
            reply["http_status"] = tap.http_status
        if error:
            reply["error"] = error
        t0 = pending.arrived_ns
        for key, stamp in (
            ("first_byte_s", outcome.t_first_byte),
            ("first_token_s", tap.t_first_token),
            ("last_byte_s", outcome.t_last_byte),
        ):
            if stamp is not None:
                reply[key] = round((stamp - t0) / 1e9, 6)
        return reply


def _usage(tap: TapResult) -> dict[str, Any] | None:
    u = tap.usage
    out: dict[str, Any] = {}
    for key in ("prompt_tokens", "cached_tokens", "cache_write_tokens", "output_tokens"):
        value = getattr(u, key)
        if value is not None:
            out[key] = value
    if tap.raw_usage:
        out["raw"] = tap.raw_usage
    return out or None
