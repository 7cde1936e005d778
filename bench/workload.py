"""Synthetic traces the benchmark replays: the request shapes, written with the real TraceWriter.

Every shape is a trace file like any user's, so the benchmark exercises the same reader, plans,
engine and results path as `replay run`, and nothing is special-cased for speed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from replay.trace.synth import synth_text
from replay.trace.writer import TraceWriter

_SEEDS = 64  # distinct prompts: enough to look like traffic, few enough to stay cached


def stream_trace(
    path: Path,
    requests: int,
    prompt_tokens: int = 200,
    output_tokens: int = 64,
    rate: float | None = None,
    bench: dict[str, Any] | None = None,
) -> Path:
    """`requests` one-turn sessions, each one streamed chat request with a reply of `output_tokens`.

    One session per request, so an overlap plan keeps exactly K of them in flight; `rate` spaces
    the `t` stamps for timed (open-loop) plans; `bench` goes into the body as the reference
    server's per-request timing (`{"first_token_ms": 500}`).
    """
    params: dict[str, Any] = {"max_tokens": output_tokens, "stream": True}
    if bench:
        params["extra"] = {"bench": bench}
    reply = {
        "message": {"role": "assistant", "content": "ok"},
        "finish": "length",
        "output_tokens": output_tokens,
    }
    with TraceWriter(path, source="scenario:bench-stream", created="2026-01-01T00:00:00+00:00") as w:
        for i in range(requests):
            sid = f"s{i}"
            w.session(sid)
            msg = [{"role": "user", "content": {"synth": {"tokens": prompt_tokens, "seed": i % _SEEDS}}}]
            t = i / rate if rate else 0.0
            w.request(sid, t, msg, params=params, reply=reply)
    return path


def history_trace(
    path: Path,
    sessions: int = 1000,
    history_tokens: int = 130_000,
    system_tokens: int = 8_000,
    turns: int = 2,
    turn_tokens: int = 500,
    output_tokens: int = 16,
) -> Path:
    """`sessions` agent sessions whose every request carries ~`history_tokens` of history.

    Each session resumes with a shared system prompt and its own long synthetic history, then
    adds `turns` short turns: the trace stores each piece of content once (synth specs and
    deltas), and a replay materialises ~history_tokens per request.
    """
    body = history_tokens - system_tokens
    params = {"max_tokens": output_tokens, "stream": True, "extra": {"bench": {"first_token_ms": 0}}}
    with TraceWriter(path, source="scenario:bench-history", created="2026-01-01T00:00:00+00:00") as w:
        system = {"role": "system", "content": {"synth": {"tokens": system_tokens, "seed": 7}}}
        for s in range(sessions):
            sid = f"agent{s}"
            w.session(sid, role="interactive")
            msgs: list[dict[str, Any]] = [
                system,
                {"role": "user", "content": {"synth": {"tokens": body, "seed": 1_000_000 + s}}},
            ]
            for turn in range(turns):
                reply_msg = {"role": "assistant", "content": f"done {s}.{turn}"}
                reply = {"message": reply_msg, "finish": "length", "output_tokens": output_tokens}
                w.request(sid, float(s), list(msgs), params=params, reply=reply)
                msgs += [
                    reply_msg,
                    {"role": "user", "content": {"synth": {"tokens": turn_tokens, "seed": s * 100 + turn}}},
                ]
    return path


def big_trace(path: Path, target_bytes: int, message_tokens: int = 600) -> Path:
    """A trace of about `target_bytes` of literal text (no synth specs), for read throughput.

    Many sessions of many turns, each appended message literal, so the reader parses and
    validates real JSON text the way it would for a large recorded trace.
    """
    pool = [synth_text(message_tokens, seed) for seed in range(32)]
    written = 0
    turns_per_session = 40
    with TraceWriter(path, source="scenario:bench-big", created="2026-01-01T00:00:00+00:00") as w:
        s = 0
        while written < target_bytes:
            sid = f"big{s}"
            w.session(sid)
            msgs: list[dict[str, Any]] = [{"role": "system", "content": pool[s % 32]}]
            for turn in range(turns_per_session):
                msgs.append({"role": "user", "content": pool[(s + turn) % 32]})
                reply_msg = {"role": "assistant", "content": pool[(s + 2 * turn + 1) % 32]}
                w.request(
                    sid,
                    float(turn),
                    list(msgs),
                    params={"max_tokens": 64},
                    reply={"message": reply_msg, "output_tokens": 64},
                )
                msgs.append(reply_msg)
                written += 2 * len(pool[0]) + 200
            s += 1
    return path
