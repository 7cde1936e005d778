"""What a sweep replays: a trace's requests (or already-materialised ones) as the cache model's jobs,
rendered and with their replies planned, read as the trace is read (compiled: the per-request path)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from replay.errors import UsageError
from replay.sim.model.config import SimConfig
from replay.sim.model.job import ContextTooLong, Job, build_job, plan_job, thinking_requested
from replay.sim.model.render import Rendered
from replay.sizing.timeline import Scheduled
from replay.trace import iter_requests, last_references, materialize
from replay.trace.materialize import plain_message, recorded_message
from replay.trace.model import Request

HISTORIES: tuple[str, ...] = ("live", "recorded")
History = Literal["live", "recorded"]
Message = dict[str, Any]


@dataclass(frozen=True, slots=True)
class SweepRequest:
    """One request to replay offline: messages already materialised (recorded history)."""

    session: str
    messages: list[Message]
    max_tokens: int
    t: float = 0.0
    tools: list[dict[str, Any]] | None = None
    finish: str = "stop"
    tool_name: str | None = None


def jobs_from_requests(
    requests: Iterable[SweepRequest | tuple[str, list[Message], int]], cfg: SimConfig
) -> Iterator[tuple[float, Job]]:
    """(send time, job) for already-materialised requests; tuples are (session, messages, max_tokens)."""
    for i, req in enumerate(requests, 1):
        if not isinstance(req, SweepRequest):
            session, messages, max_tokens = req
            req = SweepRequest(session, messages, max_tokens)
        yield (
            req.t,
            build_job(
                i,
                req.messages,
                req.tools,
                req.max_tokens,
                cfg,
                finish=req.finish,
                tool_name=req.tool_name,
                session=req.session,
            ),
        )


def jobs_from_trace(
    requests: Iterable[Request], cfg: SimConfig, history: History = "live", think: str = "auto"
) -> Iterator[tuple[float, Job]]:
    """(send time, job) for each of a trace's requests (in trace order, as `replay.trace` reads
    them), replies spliced as the engine does: the simulator's own reply in `live` history, the
    recorded one in `recorded` history.

    A request that keeps all its parent's messages is rendered as the parent's rendering plus its
    new messages (what `render` would give for the whole list), so a turn costs what it adds.
    `think` is the run's `--think`: `off` asks the server not to think (the engine sends ds4's
    `thinking: disabled`), `on` and `auto` leave it to the request (ds4 thinks by default).
    """
    for req, job in _planned(requests, cfg, history, think):
        yield req.t, job


def scheduled_from_trace(
    requests: Iterable[Request], cfg: SimConfig, history: History = "live", think: str = "auto"
) -> Iterator[Scheduled]:
    """`jobs_from_trace` with what a replay plan needs to send each job: the replies its history
    carries and its recorded `after` (`replay.engine.plans.reply_deps`), the tool time after
    them, and whether it rewrites its history (a compaction)."""
    for req, job in _planned(requests, cfg, history, think):
        deps = [m["$reply"] for m in req.append if "$reply" in m]
        after = req.after or {}
        if after.get("request") is not None and after["request"] not in deps:
            deps.append(after["request"])
        delay = float(after.get("delay_s") or 0.0)
        yield Scheduled(req.t, job, tuple(deps), delay, req.is_compaction, req.tag)


def _planned(
    requests: Iterable[Request], cfg: SimConfig, history: History, think: str
) -> Iterator[tuple[Request, Job]]:
    """Each request with its job, rendered turn by turn (see `jobs_from_trace`)."""
    replies: dict[int, Message] = {}  # the reply each request got, for the requests that resend it
    reply_for = replies.__getitem__
    rendered: OrderedDict[int, Rendered] = OrderedDict()  # recent requests' renderings, by id

    for req in requests:
        if history == "recorded":
            replies[req.id] = recorded_message(req)
        tools = req.params.get("tools")
        parent = req.parent
        base = None
        if parent is not None and req.keep == parent.n_messages:
            base = rendered.get(parent.id)
        if base is not None and base.tools == tools:
            new = [
                plain_message(m if m.get("$reply") is None else reply_for(m["$reply"])) for m in req.append
            ]
            done = base.add(new)
        else:
            done = Rendered(tools).add(materialize(req, reply_for))
        rendered[req.id] = done
        if len(rendered) > _RENDERINGS_KEPT:
            rendered.popitem(last=False)
        reply = req.reply or {}
        finish = reply.get("finish") or "stop"
        calls = (reply.get("message") or {}).get("tool_calls") or []
        try:
            job = plan_job(
                req.id,
                done.prompt(),
                tools,
                _max_tokens(req),
                cfg,
                finish=finish,
                tool_name=calls[0].get("name") if calls else None,
                session=req.session,
                thinking=think != "off" and thinking_requested(req.params),
            )
        except ContextTooLong as exc:
            raise UsageError(f"request {req.id}: {exc}; give a larger one with --ctx") from None
        if history == "live":
            replies[req.id] = job.reply.message()
        yield req, job


def _max_tokens(req: Request) -> int | None:
    """What the engine asks for (`Engine._call`): the recorded reply's length, capped by the
    request's own `max_tokens`; else that; else None (the server's default)."""
    recorded = (req.reply or {}).get("output_tokens")
    asked = req.params.get("max_tokens")
    if recorded is None:
        return asked
    return recorded if asked is None else min(recorded, asked)


# Renderings kept for requests still to come to extend: a trace's next turn usually follows its
# parent closely; one further away is rendered from its messages (same result, more work).
_RENDERINGS_KEPT = 4096


def read_requests(
    path: str | Path, progress: Callable[[int, int], None] | None = None, every: int = 20_000
) -> Iterator[Request]:
    """A trace's requests as they are read (a sweep starts long before the whole trace is in),
    each let go once no later line names it; `progress(line, lines)` hears how far into the
    file reading has got, every `every` lines."""
    found = last_references(path)
    requests = iter_requests(path, found.last)  # a window of the trace in memory
    if progress is None:
        yield from requests
        return
    total = found.lines
    progress(0, total)
    told = 0
    for req in requests:
        yield req
        if req.line - told >= every:
            told = req.line
            progress(told, total)
    progress(total, total)
