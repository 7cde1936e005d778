"""Connections per target: kept open where the server keeps them, fresh where it closes them.

vLLM, SGLang and the bench's reference server keep a connection open after a response; a new
TCP connection per request there costs the client a connect, a close and their system calls.
llama-server closes after each stream while its headers say keep-alive, and ds4 after every
response: a connection kept for them would be dead when reused. So each target (host, port) is
judged by what its server does, unless `--connections` forces it:

- `fresh`: a new connection per request, closed after it (the behaviour before reuse).
- `reuse`: a connection whose response allowed it (HTTP/1.1, no `Connection: close`, a body framed
  by length or chunks and read to its end) is kept idle for the next request to the target.
- `auto` (default): requests open fresh connections while the target is unknown, and the first
  connections that allowed keep-alive are kept aside, unused, for `PROBE_S`. A response saying
  `Connection: close` or HTTP/1.0, or a kept connection the server closes within `PROBE_S`, makes
  the target `fresh` for the rest of the run; a kept connection still open after `PROBE_S` makes it
  `reuse`.

The rule that no request is ever sent twice: a request goes out on an idle connection only after
the socket itself says, just before, that the server has neither closed it nor written to it
(`Connection.alive`, a non-blocking peek) and it has been idle less than `IDLE_MAX_S` (servers close
idle connections after 5 s (uvicorn) or more). Should the socket still refuse the request's first
byte (`http1.NotSent`: nothing went out, so the server cannot have begun it), the request goes once
more on a fresh connection. Once any byte went out it is never re-sent: a reused connection that
fails after that is the request's error, which says the connection was reused.

Each target keeps at most `IDLE_PER_TARGET` idle connections, most recently used first (the ones
least likely to have timed out); the rest are closed.
"""

from __future__ import annotations

from collections import deque

from replay import clock
from replay.engine import http1

MODES = ("auto", "reuse", "fresh")
PROBE_S = 0.25  # a server that closes after each response does so at once
IDLE_MAX_S = 2.0  # well inside the shortest keep-alive timeout of the servers we target (5 s)
IDLE_PER_TARGET = 1024

_UNKNOWN, _REUSE, _FRESH = "unknown", "reuse", "fresh"


class Target:
    """What is known of one (host, port): whether it keeps connections, and its idle ones."""

    __slots__ = ("state", "idle", "probing")

    def __init__(self, state: str) -> None:
        self.state = state
        self.idle: deque[http1.Connection] = deque()  # most recent on the right
        self.probing: deque[http1.Connection] = deque()  # kept aside while the target is unknown


class Connections:
    """The connections of one run, per target; one per event loop (its sockets belong to it)."""

    __slots__ = ("mode", "targets", "idle_max", "opened", "reused")

    def __init__(self, mode: str = "auto", idle_max: int = IDLE_PER_TARGET) -> None:
        if mode not in MODES:
            raise ValueError(f"connections mode must be one of {', '.join(MODES)}, not {mode!r}")
        self.mode = mode
        self.targets: dict[tuple[str, int], Target] = {}
        self.idle_max = idle_max
        self.opened = 0  # fresh connections made
        self.reused = 0  # requests sent on a kept connection

    def _target(self, key: tuple[str, int]) -> Target:
        target = self.targets.get(key)
        if target is None:
            state = _UNKNOWN if self.mode == "auto" else self.mode
            target = self.targets[key] = Target(state)
        return target

    def keeps(self, host: str, port: int) -> bool:
        """Whether a request to the target asks for keep-alive (else it says `Connection: close`)."""
        return self._target((host, port)).state != _FRESH

    def state(self, host: str, port: int) -> str:
        """`unknown`, `reuse` or `fresh`: what the run does with this target's connections now."""
        return self._target((host, port)).state

    async def send(self, host: str, port: int, data: bytes, timeout: float | None) -> http1.Connection:
        """A connection to (host, port) that `data` (a whole request) went out on.

        Raises `http1.ConnectError` when no connection could be made and `http1.WriteError` when
        the request could not be written (after any byte of it went out, it is never re-sent).
        """
        key = (host, port)
        target = self._target(key)
        if target.state == _UNKNOWN:
            self._judge(target)
        if target.state == _REUSE:
            conn = self._take(target)
            if conn is not None:
                try:
                    await conn.send(data)
                except http1.NotSent:
                    conn.close()  # nothing went out: the server cannot have begun it
                except BaseException:
                    conn.close()  # some of it may have: never sent again
                    raise
                else:
                    self.reused += 1
                    return conn
        conn = await http1.connect(host, port, timeout)
        conn.key = key
        self.opened += 1
        try:
            await conn.send(data)
        except BaseException:
            conn.close()
            raise
        return conn

    def done(self, conn: http1.Connection) -> None:
        """The request on `conn` is over: keep the connection for the next one, or close it."""
        target = self.targets.get(conn.key)
        if target is None or target.state == _FRESH or not conn.reusable:
            if target is not None and target.state == _UNKNOWN and conn.says_close:
                self._give_up(target)  # the server said it: no keep-alive here
            conn.close()
            return
        now = clock.now_ns()
        conn.recycle(now)
        if target.state == _UNKNOWN:
            target.probing.append(conn)
            if len(target.probing) > self.idle_max:
                target.probing.popleft().close()
            return
        idle = target.idle
        idle.append(conn)
        if len(idle) > self.idle_max:
            idle.popleft().close()
        # The oldest are used last: close them once the server has, or they idled too long.
        oldest = now - int(IDLE_MAX_S * 1e9)
        while idle and (idle[0].t_gone is not None or idle[0].idle_since < oldest):
            idle.popleft().close()

    def _take(self, target: Target) -> http1.Connection | None:
        """The most recently used idle connection that is still open, or None."""
        idle = target.idle
        oldest = clock.now_ns() - int(IDLE_MAX_S * 1e9)
        while idle:
            conn = idle.pop()
            if conn.idle_since < oldest:  # this one and every one older: too long idle
                conn.close()
                while idle:
                    idle.pop().close()
                return None
            if conn.alive():
                return conn
            conn.close()
        return None

    def _judge(self, target: Target) -> None:
        """Decide an unknown target from its kept-aside connections, once `PROBE_S` has passed."""
        probing = target.probing
        if not probing:
            return
        now = clock.now_ns()
        probe_ns = int(PROBE_S * 1e9)
        while probing:
            conn = probing[0]
            if conn.t_gone is not None or not conn.alive():
                closed = conn.t_gone if conn.t_gone is not None else now
                if closed - conn.idle_since < probe_ns:
                    self._give_up(target)
                    return
                probing.popleft().close()
                continue
            if now - conn.idle_since < probe_ns:
                return  # the oldest has not been kept long enough yet
            target.state = _REUSE
            target.idle.extend(probing)
            probing.clear()
            return

    def _give_up(self, target: Target) -> None:
        target.state = _FRESH
        for conn in target.probing:
            conn.close()
        target.probing.clear()

    def close(self) -> None:
        """Close every idle connection (the run is over)."""
        for target in self.targets.values():
            for conn in (*target.idle, *target.probing):
                conn.close()
            target.idle.clear()
            target.probing.clear()


FRESH = Connections("fresh")  # for a call made outside a run: a connection per request
