"""The replay loop: sends a trace's requests as the plan says, one small task per request.

A dispatcher walks the plan's order and starts one small waiter task per request, at most
`lookahead` ahead of the oldest unfinished one (so a million-request trace never has a million
tasks). A waiter waits for the replies its request carries, then for its release time, then for a
place among the requests in flight, and only then stamps the send time and classifies the switch.
Every request's `RequestRecord` is made here (who, what, when it was due), filled by the API
function's exchange, and handed to `sink` as soon as it is finished; cancelled ones are handed over
too, marked, with the stamps they reached.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
import httpx

from replay import clock
from replay.engine.apis import APIS, ApiCall, make_client
from replay.engine.connections import MODES as CONNECTION_MODES
from replay.engine.connections import Connections
from replay.engine.defaults import CONNECTIONS, HISTORY, LOOP, THINK, TIMEOUT_S
from replay.engine.plans import Plan
from replay.engine.routing import DEFAULT_ROUTING, make_router, session_key
from replay.engine.session import HISTORY_MODES, LIVE, ReplaySession, ReplaySessions
from replay.errors import UsageError
from replay.metrics.held import ClientQueue, HeldLoad, LoopDelay
from replay.metrics.record import RequestRecord
from replay.metrics.switch import SwitchTracker
from replay.trace.model import Request, Trace

Sink = Callable[[RequestRecord], None]


@dataclass(slots=True)
class EngineConfig:
    base_url: str
    api: str | None = None
    model: str | None = None
    history: str = HISTORY
    think: str = THINK
    timeout_s: float | None = TIMEOUT_S
    default_max_tokens: int = 256
    stream: bool | None = None
    run_id: str = "run"
    lookahead: int = 4096
    loop: str = LOOP  # the event loop: uvloop when installed (auto), or asyncio's own
    connections: str = CONNECTIONS  # keep connections open per target: auto | reuse | fresh
    # Several targets (`--target URL1,URL2`): every request goes to one of `backends`, as `routing`
    # says (engine.routing); empty: all go to `base_url`.
    backends: tuple[str, ...] = ()
    routing: str = DEFAULT_ROUTING
    session_header: str | None = None  # a header carrying the session's affinity value
    session_field: str | None = None  # a body field carrying it (a router that reads the body)
    # The target is our simulator at the plan's speed (a scenario run): a reply is done when its
    # modelled seconds say, counted from when its request was due, not when this host read it
    # (the host's delay per call, times the speed, would pile up along each session's chain).
    modelled_done: bool = False


THINK_MODES = ("off", "on", "auto")
LOOPS = ("auto", "uvloop", "asyncio")


def loop_options(loop: str) -> dict[str, Any]:
    """anyio's backend options for `--loop`.

    `auto` is asyncio's own loop: under uvloop a socket watched with `add_reader` (how the
    stamped transport reads) never hears of a reset that comes before any data (libuv drops a poll
    error instead of calling the reader), so such a request would wait for its timeout. `uvloop`
    is there to measure with (the `fast` extra installs it), not yet the default.
    """
    if loop not in LOOPS:
        raise UsageError(f"--loop must be one of {', '.join(LOOPS)}")
    if loop != "uvloop":
        return {"use_uvloop": False}
    try:
        import uvloop  # noqa: F401
    except ImportError:
        raise UsageError(
            "--loop uvloop: uvloop is not installed (pip install 'agent-replay[fast]')"
        ) from None
    return {"use_uvloop": True}


def check_options(
    history: str,
    think: str,
    api: str | None,
    timeout: float | None = None,
    max_duration: float | None = None,
    loop: str = LOOP,
    connections: str = CONNECTIONS,
) -> None:
    """Refuse run options the engine does not know, before anything starts."""
    if connections not in CONNECTION_MODES:
        raise UsageError(f"--connections must be one of {', '.join(CONNECTION_MODES)}")
    if timeout is not None and not 0 < timeout < float("inf"):
        raise UsageError(f"--timeout must be a number of seconds greater than 0, not {timeout:g}")
    if max_duration is not None and not 0 < max_duration < float("inf"):
        raise UsageError(f"--max-duration must be a number of seconds greater than 0, not {max_duration:g}")
    if history not in HISTORY_MODES:
        raise UsageError(f"--history must be one of {', '.join(HISTORY_MODES)}")
    if think not in THINK_MODES:
        raise UsageError(f"--think must be one of {', '.join(THINK_MODES)}")
    if api is not None and api not in APIS:
        raise UsageError(f"--api must be one of {', '.join(APIS)}")
    loop_options(loop)


@dataclass(slots=True)
class Progress:
    """What the live display shows; the engine only assigns plain fields."""

    total: int = 0
    sent: int = 0
    done: int = 0
    errors: int = 0
    in_flight: int = 0  # as the client counts them (a saturated client counts its own queue too)
    held_mean: float | None = None  # mean requests at the server so far, from the stamps
    lag_ms: float | None = None  # the last request's schedule lag
    last_switch: str = ""
    waiting: int = 0  # requests dispatched and not finished (at most `lookahead`)
    waiting_max: int = 0  # the most at once: what the run's memory for them rose to
    sessions: dict[str, str] = field(default_factory=dict)


class Engine:
    """Sends `trace`'s requests as `plan` says and hands each finished record to `sink`.

    A run that restarts its server runs one engine per server process over the parts of one
    trace; each later engine carries the earlier ones' state over: `by_id` (every request of the
    trace, so replies of earlier parts are found), `tracker` (one switch classification across
    processes), `sessions` (their histories and live replies), and `release_replies=False` (the
    next part reads the replies this one would drop).
    """

    def __init__(
        self,
        trace: Trace,
        plan: Plan,
        config: EngineConfig,
        sink: Sink,
        *,
        by_id: dict[int, Request] | None = None,
        tracker: SwitchTracker | None = None,
        sessions: dict[str, ReplaySession] | None = None,
        release_replies: bool = True,
    ) -> None:
        self.trace = trace
        self.plan = plan
        self.config = config
        self.sink = sink
        self.by_id = trace.by_id() if by_id is None else by_id
        self.sessions: dict[str, ReplaySession] = (
            ReplaySessions(trace.sessions, config.history) if sessions is None else sessions
        )
        self.tracker = SwitchTracker(cold=set(trace.sessions)) if tracker is None else tracker
        self.progress = Progress(total=len(trace.requests))
        self.progress.sessions = dict.fromkeys(trace.sessions, "waiting")
        self._done_at: dict[int, int] = {}  # done stamps some later request still waits for
        self._modelled_end: dict[int, int] = {}  # request id -> its due plus its modelled seconds
        self._done_events: dict[int, anyio.Event] = {}
        self._waiters: dict[int, int] = {}  # request id -> requests yet to wait for it
        self._readers: dict[int, int] = {}  # request id -> requests yet to splice its reply in
        self._left: dict[str, int] = {}  # session -> its requests not yet materialised
        self.release_replies = release_replies  # False: a later engine reuses these sessions' replies
        self._counting = False
        self._seq = 0
        self._t0 = 0
        # A plain semaphore taken without a checkpoint when a place is free (`_one`): a
        # CapacityLimiter yields twice per request and tracks its borrowers.
        self._limiter = anyio.Semaphore(plan.capacity) if plan.capacity else None
        self.held = HeldLoad()  # the load the server actually saw, from each request's stamps
        self.loop_delay = LoopDelay()  # how far behind its timers the event loop runs
        self.client_queue = ClientQueue()  # how long first tokens waited in the client
        self.connections = Connections(config.connections)
        self._response_ids: dict[int, str] = {}  # request id -> the Responses API id its reply got
        self._chained: set[int] = set()  # requests some request names as `previous_response`
        self._order: list[Request] | None = None  # the dispatch order, once `prepare` has run
        self._router = make_router(config.routing, config.backends)  # None: one target
        self._affinity: dict[str, str] = {}  # session -> the value its header / body field carries

    def _rel(self) -> int:
        return clock.now_ns() - self._t0

    def prepare(self) -> None:
        """Build the run's tables (dispatch order, who waits for whom, who reads which reply), once.

        `run_engines` calls it before it freezes the collector's view of the heap: built inside
        the run, these million-entry tables are traversed by every full collection of it."""
        if self._order is not None:
            return
        order = self.plan.order(self.trace.requests)
        self._waiters = waiter_counts(self.plan, order)
        self._chained = {
            p for r in self.trace.requests if type(p := r.params.get("previous_response")) is int
        }  # only their response ids are kept
        self._counting = self.release_replies and self.config.history == LIVE
        if self._counting:
            self._readers = reply_readers(self.trace.requests)
            for r in self.trace.requests:
                self._left[r.session] = self._left.get(r.session, 0) + 1
        self._order = order

    async def run(self) -> None:
        """Send every request; returns when all are done, or raises cancellation through."""
        self.prepare()
        order = self._order or []
        self._order = None  # this run consumes the tables: another run prepares them afresh
        self._t0 = clock.now_ns()
        window = anyio.Semaphore(self.config.lookahead)
        try:
            async with make_client() as client, anyio.create_task_group() as watch:
                watch.start_soon(self._watch_loop)
                requests = RequestTasks(watch.cancel_scope)
                try:
                    prev: Request | None = None
                    for req in order:
                        try:
                            window.acquire_nowait()
                        except anyio.WouldBlock:
                            await window.acquire()
                        else:
                            await anyio.lowlevel.checkpoint()  # started requests run between starts
                        requests.start(self._one(client, req, prev, window))
                        prev = req
                    await requests.wait()
                finally:
                    await requests.close()
                watch.cancel_scope.cancel()
            requests.reraise()
        finally:
            self.connections.close()

    async def _watch_loop(self) -> None:
        delay, period = self.loop_delay, LoopDelay.PERIOD_S
        period_ns = int(period * 1e9)
        while True:
            t = clock.now_ns()
            await clock.sleep(period)
            delay.add(clock.now_ns() - t - period_ns)

    async def _wait_done(self, rid: int) -> int:
        if rid not in self._done_at:
            event = self._done_events.setdefault(rid, anyio.Event())
            await event.wait()
        done = self._done_at[rid]
        left = self._waiters.get(rid, 0) - 1
        if left > 0:
            self._waiters[rid] = left
        else:  # the last request to wait for it: forget its stamp
            self._waiters.pop(rid, None)
            del self._done_at[rid]
        return done

    def _mark_done(self, rid: int) -> None:
        event = self._done_events.pop(rid, None)
        modelled = self._modelled_end.pop(rid, None)
        if rid in self._waiters or event is not None:
            now = self._rel()
            self._done_at[rid] = now if modelled is None else min(now, modelled)
        if event is not None:
            event.set()

    def _release(self, req: Request, state: ReplaySession) -> None:
        """Count `req`'s history as sent: a live reply no later request splices in is dropped."""
        if not self._counting:
            return
        self._left[req.session] -= 1
        readers = self._readers
        r: Request | None = req
        while r is not None:
            for msg in r.append:
                ref = msg.get("$reply")
                if ref is not None and ref in readers:
                    left = readers[ref] - 1
                    if left > 0:
                        readers[ref] = left
                    else:
                        del readers[ref]
                        state.live_replies.pop(ref, None)
            r = r.parent

    async def _one(
        self, client: httpx.AsyncClient, req: Request, prev: Request | None, window: anyio.Semaphore
    ) -> None:
        progress = self.progress
        progress.waiting += 1
        progress.waiting_max = max(progress.waiting_max, progress.waiting)
        try:
            deps_done = 0
            for dep in self.plan.waits_for(req, prev):
                deps_done = max(deps_done, await self._wait_done(dep))
            due = self.plan.release_ns(req, deps_done)
            # Messages are materialised only when the request may go: thousands of waiting
            # requests must not each hold a 130K-token history. The time it takes counts as lag,
            # except on our simulator at the plan's speed (a scenario's few sessions), where it
            # would be modelled seconds: there they are built before the wait.
            early = self._call(req, self.sessions[req.session]) if self.config.modelled_done else None
            wait_ns = due - self._rel()
            if wait_ns > 0:
                await clock.sleep(wait_ns / 1e9)
            limiter = self._limiter
            if limiter is None:
                await self._send(client, req, early or self._call(req, self.sessions[req.session]), due)
                return
            try:
                limiter.acquire_nowait()  # a free place: no trip through the event loop
            except anyio.WouldBlock:
                await limiter.acquire()  # FIFO: a release hands its place to the oldest waiter
            try:
                await self._send(client, req, early or self._call(req, self.sessions[req.session]), due)
            finally:
                limiter.release()
        finally:
            progress.waiting -= 1
            self._mark_done(req.id)
            window.release()

    def _call(self, req: Request, state: ReplaySession) -> ApiCall:
        params = req.params
        reply = req.reply or {}
        headers = {"X-Request-ID": f"{self.config.run_id}-{req.id}"}
        # Hints for the simulator, from the trace's text: sent only when a header can carry them.
        finish = str(reply.get("finish") or "")
        if finish and finish.isprintable():
            headers["X-Replay-Finish"] = finish
        calls = (reply.get("message") or {}).get("tool_calls")
        if calls and str(calls[0].get("name", "")).isprintable():
            headers["X-Replay-Tool"] = str(calls[0].get("name", ""))
        max_tokens = reply.get("output_tokens")
        if max_tokens is None:
            max_tokens = params.get("max_tokens", self.config.default_max_tokens)
        elif params.get("max_tokens") is not None:
            max_tokens = min(max_tokens, params["max_tokens"])
        stream = self.config.stream if self.config.stream is not None else params.get("stream", True)
        extra_body = params.get("extra") or {}
        config = self.config
        if config.session_header is not None or config.session_field is not None:
            key = self._affinity.get(req.session)
            if key is None:
                key = self._affinity[req.session] = session_key(req.session)
            if config.session_header is not None:
                headers[config.session_header] = key
            if config.session_field is not None:
                extra_body = {**extra_body, config.session_field: key}
        messages = state.messages(req, self.by_id)
        self._release(req, state)
        previous_id, previous_n = self._previous(req, state)
        return ApiCall(
            base_url=self.config.base_url,
            model=self.config.model or state.session.model,
            messages=messages,
            tools=params.get("tools"),
            max_tokens=int(max_tokens),
            temperature=params.get("temperature", 0.0),
            stream=bool(stream),
            think=self.config.think,
            extra_body=extra_body,
            headers=headers,
            timeout_s=self.config.timeout_s,
            previous_response_id=previous_id,
            previous_messages=previous_n,
            cache_marks=cache_marks(params),
            connections=self.connections,
        )

    def _previous(self, req: Request, state: ReplaySession) -> tuple[str | None, int]:
        """A request the agent chained with `previous_response_id` is chained again to the id the
        server gave that reply this run; without one (a failed reply, another API) it goes whole."""
        prev = req.params.get("previous_response")
        api = self.config.api or state.session.api
        if type(prev) is not int or api != "openai-responses" or prev not in self._response_ids:
            return None, 0
        before = self.by_id[prev]
        # The server holds `before`'s messages and reply, never its instructions: a leading system
        # message counts on either side only where it is present.
        held = before.n_messages + 1 - _instructions(before) + _instructions(req)
        return self._response_ids[prev], held

    async def _send(self, client: httpx.AsyncClient, req: Request, call: ApiCall, due: int) -> None:
        state = self.sessions[req.session]
        self._seq += 1
        seq = self._seq
        switch = self.tracker.on_send(req.session, req.is_compaction)
        rec = RequestRecord(
            seq=seq,
            request_id=req.id,
            session=req.session,
            tag=req.tag,
            switch=switch.flags,
            from_session=switch.from_session,
            expected_output_tokens=call.max_tokens,
            t_origin=self._t0,
            t_scheduled=self._t0 + due,
        )
        progress = self.progress
        progress.sent += 1
        progress.in_flight += 1
        progress.last_switch = f"{req.session} ({'+'.join(switch.flags)})"
        api = APIS[self.config.api or state.session.api]

        def on_state(s: str) -> None:
            progress.sessions[req.session] = s

        router = self._router
        backend = 0
        if router is not None:  # chosen now, when it goes: `least` counts what is in flight
            backend = router.pick(req.session)
            call.base_url = router.urls[backend]
            rec.backend = call.base_url
            rec.backend_source = "client"
        held = self.held.open()
        try:
            await api.send(client, call, on_state, rec)
        except anyio.get_cancelled_exc_class():
            rec.status = "cancelled"
            rec.error = f"request {req.id} ({req.session}) cancelled in flight"
            self.sink(rec)
            raise
        finally:
            if router is not None:
                router.done(backend)
            self.tracker.on_done()
            progress.in_flight -= 1
            self.held.add(rec.t_sent, rec.t_end, held)
            self.client_queue.add(rec.t_first_token, rec.t_first_token_read)
            progress.held_mean = self.held.mean()
            if rec.t_scheduled is not None and rec.t_sent is not None:
                progress.lag_ms = (rec.t_sent - rec.t_scheduled) / 1e6
        progress.done += 1
        progress.sessions[req.session] = "waiting"
        speed = getattr(self.plan, "speed", None)
        total = (rec.x_sim or {}).get("total_s")
        if self.config.modelled_done and rec.status == "ok" and speed and isinstance(total, int | float):
            self._modelled_end[req.id] = due + int(total / speed * 1e9)
        if rec.status != "ok":
            progress.errors += 1
        else:
            if not self._counting or req.id in self._readers:  # else no later request splices it in
                state.on_reply(req, rec.message)
            if rec.response_id is not None and req.id in self._chained:
                self._response_ids[req.id] = rec.response_id
        if self._counting and not self._left[req.session]:
            # Every request of the session has been sent: its tool-call ids map nothing any more,
            # and no request will look its state up again (one still in flight holds it).
            state.tool_ids.clear()
            state.live_replies.clear()
            self.sessions.pop(req.session, None)
        self.sink(rec)


class RequestTasks:
    """The run's per-request tasks: plain asyncio tasks, held to a task group's rules.

    `anyio`'s task group costs ~20 us per task started (a cancel scope and a wrapper per task),
    a tenth of the client's CPU per streamed request (the rate target). These are kept and awaited as
    one would be: the run waits for every one; the first to fail cancels the run's `scope` and
    the rest, and its error is raised once all have ended; when the run is cancelled (Ctrl-C,
    --max-duration), each request still running is cancelled and waited for (shielded), so its
    record is handed over marked, and no task outlives the run.
    """

    __slots__ = ("_scope", "_tasks", "_error", "_idle", "_loop")

    def __init__(self, scope: anyio.CancelScope) -> None:
        self._scope = scope  # cancelled when a request task fails
        self._tasks: set[asyncio.Task[None]] = set()
        self._error: BaseException | None = None
        self._idle: asyncio.Future[None] | None = None  # `wait`'s, resolved when none is left
        self._loop = asyncio.get_running_loop()

    def __len__(self) -> int:
        return len(self._tasks)

    def start(self, coro: Coroutine[Any, Any, None]) -> None:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            error = task.exception()
            if error is not None and self._error is None:
                self._error = error
                self._scope.cancel()
                for other in self._tasks:
                    other.cancel()
        if not self._tasks and self._idle is not None and not self._idle.done():
            self._idle.set_result(None)

    async def wait(self) -> None:
        """Until every task started has ended."""
        while self._tasks:
            self._idle = self._loop.create_future()
            try:
                await self._idle
            finally:
                self._idle = None

    async def close(self) -> None:
        """Cancel the tasks still running and wait for them, whatever cancels the caller."""
        if not self._tasks:
            return
        for task in self._tasks:
            task.cancel()
        with anyio.CancelScope(shield=True):
            await self.wait()

    def reraise(self) -> None:
        """Raise the first request task's failure, if one failed."""
        if self._error is not None:
            raise self._error


def waiter_counts(plan: Plan, order: list[Request]) -> dict[int, int]:
    """For each request some later one waits for, how many do: its done stamp is kept until then."""
    counts: dict[int, int] = {}
    prev: Request | None = None
    for req in order:
        for dep in plan.waits_for(req, prev):
            counts[dep] = counts.get(dep, 0) + 1
        prev = req
    return counts


def reply_readers(requests: list[Request]) -> dict[int, int]:
    """For each request whose reply is spliced in as `$reply`, how many requests of `requests`
    carry it in their history: the one that names it and every descendant of that one.

    Counted the way `Engine._release` counts down (every ancestor, `keep` aside), so a live reply
    is dropped exactly when the last request that may resend it has been materialised."""
    below: dict[int, int] = {}  # request id -> requests of `requests` at or below it
    depth: dict[int, int] = {}
    nodes: dict[int, Request] = {}
    for req in requests:
        below[req.id] = below.get(req.id, 0) + 1
        chain = []
        r: Request | None = req
        while r is not None and r.id not in depth:
            chain.append(r)
            r = r.parent
        d = depth[r.id] if r is not None else -1
        for node in reversed(chain):
            d += 1
            depth[node.id] = d
            nodes[node.id] = node
    readers: dict[int, int] = {}
    for rid in sorted(nodes, key=depth.__getitem__, reverse=True):  # children before parents
        node, n = nodes[rid], below.get(rid, 0)
        if not n:
            continue
        if node.parent is not None:
            below[node.parent.id] = below.get(node.parent.id, 0) + n
        for msg in node.append:
            ref = msg.get("$reply")
            if ref is not None:
                readers[ref] = readers.get(ref, 0) + n
    return readers


def _instructions(req: Request) -> int:
    """1 when the request's first message is sent as Responses `instructions`, else 0."""
    node: Request | None = req
    while node is not None and node.keep:  # the first message lives in the oldest link
        node = node.parent
    first = node.append[0] if node is not None and node.append else {}
    return int(first.get("role") == "system" and not first.get("inline"))


def cache_marks(params: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """`params.cache_control` (`[{"message": i, "value": {...}}]`) as the client's marks."""
    marks = params.get("cache_control")
    if not isinstance(marks, list):
        return []
    return [
        (m["message"], m["value"])
        for m in marks
        if isinstance(m, dict) and type(m.get("message")) is int and isinstance(m.get("value"), dict)
    ]
