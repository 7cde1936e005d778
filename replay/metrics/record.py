"""The per-request record: named monotonic timestamps, and every metric derived from them.

Timestamps are nanoseconds on the run's monotonic clock, relative to the run's start. Adding a
metric means adding a property here; the engine's hot path only stamps times.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import orjson

_NS = 1e-9


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


def _seconds(a: int | None, b: int | None) -> float | None:
    return None if a is None or b is None else round((b - a) * _NS, 6)


@dataclass(slots=True)
class RequestRecord:
    seq: int
    request_id: int
    session: str
    tag: str
    switch: tuple[str, ...]
    from_session: str | None
    t_scheduled: int
    t_sent: int | None = None
    t_first_token: int | None = None
    t_last_token: int | None = None
    t_done: int | None = None
    status: str = "ok"
    http_status: int | None = None
    error: str | None = None
    finish: str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    cache_write_tokens: int | None = None
    reprocessed_tokens: int | None = None
    reprocessed_source: str | None = None
    output_tokens: int | None = None
    expected_output_tokens: int | None = None
    output_sha1: str | None = None
    modelled: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def lag_s(self) -> float | None:
        """How late the request went out compared with its plan (the client's own queueing)."""
        return _seconds(self.t_scheduled, self.t_sent)

    @property
    def ttft_s(self) -> float | None:
        return _seconds(self.t_sent, self.t_first_token)

    @property
    def latency_s(self) -> float | None:
        return _seconds(self.t_sent, self.t_done)

    @property
    def ttft_sched_s(self) -> float | None:
        """TTFT counted from the intended send time, so a slow client or server cannot hide queueing."""
        return _seconds(self.t_scheduled, self.t_first_token)

    @property
    def latency_sched_s(self) -> float | None:
        return _seconds(self.t_scheduled, self.t_done)

    @property
    def decode_tps(self) -> float | None:
        if not self.output_tokens or self.output_tokens < 2:
            return None
        span = _seconds(self.t_first_token, self.t_last_token)
        return round((self.output_tokens - 1) / span, 3) if span else None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "request",
            "seq": self.seq,
            "id": self.request_id,
            "session": self.session,
            "tag": self.tag,
            "switch": list(self.switch),
            "from_session": self.from_session,
            "scheduled_s": round(self.t_scheduled * _NS, 6),
            "sent_s": None if self.t_sent is None else round(self.t_sent * _NS, 6),
            "lag_s": self.lag_s,
            "ttft_s": self.ttft_s,
            "latency_s": self.latency_s,
            "ttft_sched_s": self.ttft_sched_s,
            "latency_sched_s": self.latency_sched_s,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "reprocessed_tokens": self.reprocessed_tokens,
            "reprocessed_source": self.reprocessed_source,
            "output_tokens": self.output_tokens,
            "expected_output_tokens": self.expected_output_tokens,
            "decode_tps": self.decode_tps,
            "finish": self.finish,
            "output_sha1": self.output_sha1,
            "status": self.status,
            "http_status": self.http_status,
            "error": self.error,
        }
        if self.modelled is not None:
            out["modelled"] = self.modelled
        out.update(self.extra)
        return out
