"""Client-side routing over several targets (`--target URL1,URL2,...`), and the session affinity a
server-side router reads (`--session-header`, `--session-field`).

One small class per policy, each answering two questions: which backend does this request go to
(`pick`, at the moment it is sent), and which backend has one request fewer in flight (`done`).
A run with one target has no router at all: the hot path does not pay for this.
"""

from __future__ import annotations

import hashlib

from replay.errors import UsageError

ROUTINGS = ("sticky", "round-robin", "least")
DEFAULT_ROUTING = "sticky"


def session_key(session: str) -> str:
    """The affinity value sent for a session: derived from its id alone, so the same session carries
    the same value in every run (a router keyed on it places it the same way), and no trace text
    goes into a header."""
    return hashlib.blake2b(session.encode(), digest_size=8).hexdigest()


class Router:
    """Which backend each request goes to; `in_flight[i]` counts what backend i holds now."""

    __slots__ = ("urls", "in_flight")

    def __init__(self, urls: tuple[str, ...]) -> None:
        self.urls = urls
        self.in_flight = [0] * len(urls)

    def choose(self, session: str) -> int:
        raise NotImplementedError

    def pick(self, session: str) -> int:
        i = self.choose(session)
        self.in_flight[i] += 1
        return i

    def done(self, i: int) -> None:
        self.in_flight[i] -= 1


class RoundRobin(Router):
    """Each request to the next backend, whoever sent it: what a router without affinity does."""

    __slots__ = ("_next",)

    def __init__(self, urls: tuple[str, ...]) -> None:
        super().__init__(urls)
        self._next = 0

    def choose(self, session: str) -> int:
        i = self._next
        self._next = (i + 1) % len(self.urls)
        return i


class Sticky(Router):
    """A session always to the same backend: a stable hash of its id (the same in every run, and
    the same in every worker process of a spread run, which a counter would not be)."""

    __slots__ = ("_placed",)

    def __init__(self, urls: tuple[str, ...]) -> None:
        super().__init__(urls)
        self._placed: dict[str, int] = {}

    def choose(self, session: str) -> int:
        i = self._placed.get(session)
        if i is None:
            i = self._placed[session] = int(session_key(session), 16) % len(self.urls)
        return i


class Least(Router):
    """The backend with the fewest requests in flight; ties go round the backends in turn, so a
    run of one request at a time still spreads."""

    __slots__ = ("_next",)

    def __init__(self, urls: tuple[str, ...]) -> None:
        super().__init__(urls)
        self._next = 0

    def choose(self, session: str) -> int:
        n = len(self.urls)
        held = self.in_flight
        best, start = -1, self._next
        for k in range(n):
            i = (start + k) % n
            if best < 0 or held[i] < held[best]:
                best = i
        self._next = (best + 1) % n
        return best


_POLICIES: dict[str, type[Router]] = {"sticky": Sticky, "round-robin": RoundRobin, "least": Least}


def check_routing(routing: str, session_header: str | None, session_field: str | None) -> None:
    """Refuse routing options the engine does not know, before anything starts."""
    if routing not in _POLICIES:
        raise UsageError(f"--routing must be one of {', '.join(ROUTINGS)}, not {routing!r}")
    if session_header is not None and not _token(session_header):
        raise UsageError(
            f"--session-header must be an HTTP header name (letters, digits, '-'), not {session_header!r}"
        )
    if session_field is not None and not session_field.isidentifier():
        raise UsageError(
            f"--session-field must be a JSON field name (letters, digits, '_'), not {session_field!r}"
        )


def _token(name: str) -> bool:
    return bool(name) and all(c.isascii() and (c.isalnum() or c in "-_") for c in name)


def make_router(routing: str, urls: tuple[str, ...]) -> Router | None:
    """The router over `urls`; None for one target (nothing to choose)."""
    if routing not in _POLICIES:
        raise UsageError(f"--routing must be one of {', '.join(ROUTINGS)}, not {routing!r}")
    if len(urls) < 2:
        return None
    return _POLICIES[routing](urls)


def split_targets(spec: str) -> tuple[str, ...]:
    """`URL1,URL2,...` as its URLs, each without a trailing slash; a repeated one is refused (it
    would count as two backends)."""
    urls = tuple(part.strip().rstrip("/") for part in spec.split(","))
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise UsageError(
                f"--target {spec}: every target of a list must be a URL (http://HOST:PORT), not {url!r}"
            )
    if len(set(urls)) != len(urls):
        raise UsageError(f"--target {spec}: a URL is named twice")
    return urls
