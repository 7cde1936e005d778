"""THE per-request record: every moment of a request's life as a named monotonic stamp, the
outcome, and every figure derived from them.

The engine makes one record per request (who, what, when it was due) and hands it to the API
function, whose exchange stamps each moment as it happens, in `replay.clock.now_ns()`
nanoseconds, and fills in the outcome; the record then goes to the sink as it is. Figures are
properties, so adding a metric never touches the hot path; JSON is made only by the results
writer (`replay.metrics.results`), and histograms take integer microseconds from the stamps.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson


def output_sha1(message: dict[str, Any] | None) -> str | None:
    """What the model said, as a digest: comparable across runs without keeping private text.

    Tool-call ids are left out: servers make them up per request.
    """
    if message is None:
        return None
    said = {
        "content": message.get("content") or "",
        "reasoning": message.get("reasoning") or "",
        "tool_calls": [[c.get("name"), c.get("arguments")] for c in message.get("tool_calls") or ()],
    }
    return hashlib.sha1(orjson.dumps(said)).hexdigest()


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one request; None means the server did not say (see `engine.usage`)."""

    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    cache_write_tokens: int | None = None
    output_tokens: int | None = None
    reprocessed_tokens: int | None = None
    reprocessed_source: Literal["server", "derived"] | None = None


NO_USAGE = Usage()  # the counts of a reply that said none: one shared value (a Usage never changes)


def span_ns(start: int | None, end: int | None) -> int | None:
    return None if start is None or end is None else end - start


def micros(ns: int | None) -> int | None:
    """Nanoseconds to whole microseconds, ties to even: what histograms record and results print."""
    if ns is None:
        return None
    whole, rest = divmod(ns, 1000)
    if rest > 500 or (rest == 500 and whole % 2):
        whole += 1
    return whole


def _seconds(ns: int | None) -> float | None:
    return None if ns is None else ns / 1e9


@dataclass(slots=True, init=False)
class RequestRecord:
    """One request: fields stay None for moments that were never reached.

    Its `__init__` is written out (see `replay._compiled`): the engine makes one per request."""

    # Who and what, set by the engine before the call (a call made outside a run keeps the defaults).
    seq: int = 0  # order of sending within the run
    request_id: int = 0
    session: str = ""
    tag: str = ""
    switch: tuple[str, ...] = ()
    from_session: str | None = None
    expected_output_tokens: int | None = None  # the cap sent (the recorded length)
    # Moments, replay.clock.now_ns(). Results report them relative to `t_origin`, the run's start.
    t_origin: int = 0
    t_scheduled: int | None = None  # when the plan wanted it sent
    t_start: int | None = None  # the call began: before connecting
    t_connected: int | None = None  # TCP connection open (== t_start on a kept connection)
    # TTFT's zero: when the request's last byte left (the kernel's send stamp on Linux, else when
    # send() took it) on plain http; when its headers started going out on https.
    t_sent: int | None = None
    t_headers: int | None = None  # response headers received
    t_first_byte: int | None = None  # first body chunk (may be a keep-alive or role chunk)
    t_first_token: int | None = None  # first content / reasoning / tool-call event
    t_first_token_read: int | None = None  # when the client got round to that event (not a stamp)
    t_last_token: int | None = None
    t_end: int | None = None  # terminal event / last body byte arrived; else when we gave up
    # Outcome.
    status: str = "ok"  # engine.exchange.Status, or "cancelled"
    http_status: int | None = None
    error: str | None = None  # one line, names the request
    finish: str | None = None  # OpenAI vocabulary: stop | length | tool_calls | ...
    message: dict[str, Any] | None = None  # neutral assistant message; results keep its digest only
    usage: Usage = field(default_factory=Usage)
    raw_usage: dict[str, Any] | None = None  # usage object as the server sent it
    timings: dict[str, Any] | None = None  # llama.cpp `timings`
    x_sim: dict[str, Any] | None = None  # the simulator's modelled times (results: `modelled`)
    response_id: str | None = None  # Responses API: what a later `previous_response_id` names
    reused: bool | None = None  # sent on a connection kept from an earlier request (None: not known)
    # Which backend served it, of several (`--target URL1,URL2`, a router): None with one target.
    backend: str | None = None
    backend_source: str | None = None  # "client": the client chose it; "router": the router said
    n_events: int = 0  # SSE events dispatched
    n_token_events: int = 0  # of which carried a token
    n_comments: int = 0  # keep-alive comment lines
    evidence: bytes | None = None  # the bytes at fault when status is bad_payload / stream_broken
    extra: dict[str, Any] = field(default_factory=dict)  # fields a caller adds to the results line

    def __init__(
        self,
        seq: int = 0,
        request_id: int = 0,
        session: str = "",
        tag: str = "",
        switch: tuple[str, ...] = (),
        from_session: str | None = None,
        expected_output_tokens: int | None = None,
        t_origin: int = 0,
        t_scheduled: int | None = None,
        t_start: int | None = None,
        t_connected: int | None = None,
        t_sent: int | None = None,
        t_headers: int | None = None,
        t_first_byte: int | None = None,
        t_first_token: int | None = None,
        t_first_token_read: int | None = None,
        t_last_token: int | None = None,
        t_end: int | None = None,
        status: str = "ok",
        http_status: int | None = None,
        error: str | None = None,
        finish: str | None = None,
        message: dict[str, Any] | None = None,
        usage: Usage | None = None,
        raw_usage: dict[str, Any] | None = None,
        timings: dict[str, Any] | None = None,
        x_sim: dict[str, Any] | None = None,
        response_id: str | None = None,
        reused: bool | None = None,
        backend: str | None = None,
        backend_source: str | None = None,
        n_events: int = 0,
        n_token_events: int = 0,
        n_comments: int = 0,
        evidence: bytes | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.seq = seq
        self.request_id = request_id
        self.session = session
        self.tag = tag
        self.switch = switch
        self.from_session = from_session
        self.expected_output_tokens = expected_output_tokens
        self.t_origin = t_origin
        self.t_scheduled = t_scheduled
        self.t_start = t_start
        self.t_connected = t_connected
        self.t_sent = t_sent
        self.t_headers = t_headers
        self.t_first_byte = t_first_byte
        self.t_first_token = t_first_token
        self.t_first_token_read = t_first_token_read
        self.t_last_token = t_last_token
        self.t_end = t_end
        self.status = status
        self.http_status = http_status
        self.error = error
        self.finish = finish
        self.message = message
        self.usage = NO_USAGE if usage is None else usage
        self.raw_usage = raw_usage
        self.timings = timings
        self.x_sim = x_sim
        self.response_id = response_id
        self.reused = reused
        self.backend = backend
        self.backend_source = backend_source
        self.n_events = n_events
        self.n_token_events = n_token_events
        self.n_comments = n_comments
        self.evidence = evidence
        self.extra = {} if extra is None else extra

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def lag_s(self) -> float | None:
        """How late the request went out compared with its plan (the client's own queueing)."""
        return _seconds(span_ns(self.t_scheduled, self.t_sent))

    @property
    def connect_s(self) -> float | None:
        return _seconds(span_ns(self.t_start, self.t_connected))

    @property
    def client_queue_s(self) -> float | None:
        """How long the first token waited in the client between its kernel arrival stamp and
        the client reading it: near zero unless the client is saturated (then TTFT is still the
        stamp's, but everything the client does after it runs late)."""
        return _seconds(span_ns(self.t_first_token, self.t_first_token_read))

    @property
    def ttft_s(self) -> float | None:
        return _seconds(span_ns(self.t_sent, self.t_first_token))

    @property
    def headers_s(self) -> float | None:
        return _seconds(span_ns(self.t_sent, self.t_headers))

    @property
    def first_byte_s(self) -> float | None:
        return _seconds(span_ns(self.t_sent, self.t_first_byte))

    @property
    def latency_s(self) -> float | None:
        return _seconds(span_ns(self.t_sent, self.t_end))

    @property
    def ttft_sched_s(self) -> float | None:
        """TTFT counted from the intended send time, so a slow client or server cannot hide queueing."""
        return _seconds(span_ns(self.t_scheduled, self.t_first_token))

    @property
    def latency_sched_s(self) -> float | None:
        return _seconds(span_ns(self.t_scheduled, self.t_end))

    @property
    def decode_s(self) -> float | None:
        return _seconds(span_ns(self.t_first_token, self.t_last_token))

    @property
    def decode_tps(self) -> float | None:
        """Tokens per second after the first token (the first one is prefill's)."""
        n = self.usage.output_tokens
        span = self.decode_s
        if n is None or n < 2 or not span:
            return None
        return (n - 1) / span

    @property
    def ttft_us(self) -> int | None:
        return micros(span_ns(self.t_sent, self.t_first_token))

    @property
    def latency_us(self) -> int | None:
        return micros(span_ns(self.t_sent, self.t_end))

    @property
    def output_sha1(self) -> str | None:
        return output_sha1(self.message) if self.ok else None
