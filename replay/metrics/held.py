"""The load the client actually held, and the warning when it is not what was asked.

A CPU-bound client quietly holds fewer requests at the server than `--concurrency` asks: the
requests it counts as in flight are really waiting in its own event loop. So the held load is
taken from the stamps, not from a counter: a request is at the server from `t_sent` to `t_end`
(the last byte's arrival, stamped by the kernel). Mean in flight is the sum of those spans over
the load window; the maximum is a sweep over the same spans in time order, as far as no request
still in flight can change it (so it keeps only the stamps of the spans around those in flight).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

from hdrh.histogram import HdrHistogram

from replay import clock
from replay.metrics.hist import new_histogram

CLIENT_BOUND_CPU = 0.9  # of one core: above it the client, not the trace, sets the pace
HELD_SHORTFALL = 0.9  # held below this share of what was asked is reported
CLIENT_QUEUE_MS = 5.0  # first tokens waiting this long in the client (median): it cannot keep up
LOOP_LATE_MS = 5.0  # the event loop waking its timers this late on average cannot keep up
LAG_GROWTH_S = 0.010  # schedule lag growing by more than this from the run's start to its end
TIMED_PLANS = ("timed", "closed-loop")  # plans whose requests are due at a time (so lag means late)


class HeldLoad:
    """Spans of requests at the server, added as each finishes (in any order).

    The most held at once is a sweep over the spans' sends and ends in time order. Its memory stays
    with the requests in flight: a request is `open()`ed before it is sent (so its send stamp is no
    earlier) and its span `add`ed with that token; every stamp older than the oldest request still
    open is final (nothing sent later can start before it) and is swept at once. Spans added
    without a token wait for `max()`.
    """

    __slots__ = (
        "_best",
        "_ends",
        "_first",
        "_gone",
        "_held",
        "_last",
        "_open",
        "_sends",
        "_total_ns",
        "count",
    )

    def __init__(self) -> None:
        self._sends: list[int] = []  # heaps of stamps not yet swept
        self._ends: list[int] = []
        self._open: list[int] = []  # heap of the open requests' tokens (some already gone)
        self._gone: dict[int, int] = {}  # tokens closed but still in `_open`
        self._held = 0  # the sweep so far: requests held after the last swept stamp
        self._best = 0
        self._total_ns = 0
        self._first: int | None = None
        self._last: int | None = None
        self.count = 0

    def open(self, now: int | None = None) -> int:
        """A request about to be sent (`now`: the monotonic clock, read here if not given); pass
        the token to `add` when it is finished."""
        token = clock.now_ns() if now is None else now
        heapq.heappush(self._open, token)
        return token

    def add(self, t_sent: int | None, t_end: int | None, token: int | None = None) -> None:
        if t_sent is not None and t_end is not None and t_end >= t_sent:
            heapq.heappush(self._sends, t_sent)
            heapq.heappush(self._ends, t_end)
            self.count += 1
            self._total_ns += t_end - t_sent
            if self._first is None or t_sent < self._first:
                self._first = t_sent
            if self._last is None or t_end > self._last:
                self._last = t_end
        if token is None:
            return
        self._gone[token] = self._gone.get(token, 0) + 1
        opened, gone = self._open, self._gone
        while opened and opened[0] in gone:
            token = heapq.heappop(opened)
            if gone[token] > 1:
                gone[token] -= 1
            else:
                del gone[token]
        # Nothing open: every later request is opened (and sent) after every stamp taken so far.
        self._sweep(opened[0] if opened else None)

    def _sweep(self, before: int | None) -> None:
        """Sweep the stamps earlier than `before` (all of them for None); an end before a send
        at the same instant (a reply ending as another request is sent frees its place)."""
        sends, ends = self._sends, self._ends
        held, best = self._held, self._best
        while sends and (before is None or sends[0] < before):
            t = heapq.heappop(sends)
            while ends and ends[0] <= t:
                heapq.heappop(ends)
                held -= 1
            held += 1
            best = max(best, held)
        while ends and (before is None or ends[0] < before) and (not sends or ends[0] <= sends[0]):
            heapq.heappop(ends)
            held -= 1
        self._held, self._best = held, best

    @property
    def pending(self) -> int:
        """Stamps kept for the sweep (what memory this holds): bounded by the spans in flight."""
        return len(self._sends) + len(self._ends) + len(self._open) + len(self._gone)

    def mean(self) -> float | None:
        """Mean requests at the server over the window from the first send to the last reply."""
        if self._first is None or self._last is None or self._last <= self._first:
            return None
        return self._total_ns / (self._last - self._first)

    def max(self) -> int:
        """Most requests at the server at one moment (a reply ending as another is sent counts once)."""
        sends, ends, held, best = list(self._sends), list(self._ends), self._held, self._best
        sends.sort()
        ends.sort()
        j = 0
        for t in sends:
            while j < len(ends) and ends[j] <= t:
                j += 1
                held -= 1
            held += 1
            best = max(best, held)
        return best


class LoopDelay:
    """How late the client's event loop wakes a timer: near zero when it keeps up, the length of
    its busy stretches when it does not (its own CPU, a slow results sink, or a busy host)."""

    __slots__ = ("count", "max_ns", "total_ns")

    PERIOD_S = 0.010

    def __init__(self) -> None:
        self.count = 0
        self.total_ns = 0
        self.max_ns = 0

    def add(self, late_ns: int) -> None:
        late = max(0, late_ns)
        self.count += 1
        self.total_ns += late
        self.max_ns = max(self.max_ns, late)

    def mean_ms(self) -> float | None:
        return None if not self.count else self.total_ns / self.count / 1e6


class ClientQueue:
    """How long first tokens waited in the client: from the kernel's arrival stamp (what TTFT
    ends at) to the client reading the event. TTFT stays honest when the client is saturated;
    this says it was, and by how much everything after the stamp ran late."""

    __slots__ = ("hist",)

    MAX_US = 60_000_000

    def __init__(self) -> None:
        self.hist = HdrHistogram(1, self.MAX_US, 3)

    def add(self, stamped: int | None, read: int | None) -> None:
        if stamped is None or read is None:
            return
        self.hist.record_value(min(max(1, (read - stamped + 500) // 1000), self.MAX_US))

    def percentile_ms(self, pct: float) -> float | None:
        hist = self.hist
        return hist.get_value_at_percentile(pct) / 1e3 if hist.get_total_count() else None


class LagTrend:
    """Median schedule lag of the first and of the last quarter of a run's requests, in bounded
    memory: two HDR histograms (3 significant figures), fed in the order the requests finish."""

    MAX_US = 10_800_000_000  # 3 h

    def __init__(self, total: int) -> None:
        self.total = total
        self.quarter = total // 4
        self.n = 0
        self.head = new_histogram("latency_us")
        self.tail = new_histogram("latency_us")

    def add(self, lag_s: float) -> None:
        i, self.n = self.n, self.n + 1
        us = min(max(0, round(lag_s * 1e6)), self.MAX_US)
        if i < self.quarter:
            self.head.record_value(us)
        elif i >= self.total - self.quarter:
            self.tail.record_value(us)

    def growth(self) -> tuple[float, float] | None:
        if self.total < 8 or not self.head.get_total_count() or not self.tail.get_total_count():
            return None
        return self.head.get_value_at_percentile(50) / 1e6, self.tail.get_value_at_percentile(50) / 1e6


@dataclass(slots=True)
class LoadFacts:
    """What the run's summary says about the load it held, and why it fell short."""

    plan: str
    asked: int | None  # requests in flight the plan asked for (a target, not just a cap)
    cap: int | None  # the plan's limit on requests in flight, if any
    held_mean: float | None
    held_max: int
    loop_delay_ms: float | None  # how late the client's event loop ran its timers, on average
    client_cpu: float | None  # fraction of one core the client process used over the run
    lag_start_s: float | None = None
    lag_end_s: float | None = None
    waiting_max: int | None = None  # the most requests dispatched and not finished at once
    client_queue_p50_ms: float | None = None  # first tokens' wait in the client (see ClientQueue)
    client_queue_p99_ms: float | None = None

    def fields(self) -> dict[str, Any]:
        """The summary line's optional fields."""
        out: dict[str, Any] = {
            "in_flight_asked": self.asked,
            "in_flight_mean": None if self.held_mean is None else round(self.held_mean, 2),
            "in_flight_max": self.held_max,
            "loop_delay_ms": None if self.loop_delay_ms is None else round(self.loop_delay_ms, 3),
            "client_cpu": None if self.client_cpu is None else round(self.client_cpu, 3),
        }
        if self.waiting_max is not None:
            out["waiting_max"] = self.waiting_max
        if self.client_queue_p99_ms is not None:
            out["client_queue_p50_ms"] = self.client_queue_p50_ms
            out["client_queue_p99_ms"] = self.client_queue_p99_ms
        if self.lag_start_s is not None and self.lag_end_s is not None:
            out["lag_start_p50_s"] = round(self.lag_start_s, 6)
            out["lag_end_p50_s"] = round(self.lag_end_s, 6)
        return out

    def warnings(self) -> list[str]:
        """One line per shortfall, naming its cause."""
        out = []
        cpu = self.client_cpu or 0.0
        core = f"one core at {cpu:.0%}"
        short = (
            self.asked is not None
            and self.held_mean is not None
            and self.held_mean < HELD_SHORTFALL * self.asked
        )
        if short:
            held = f"asked {self.asked} in flight, held {self.held_mean:.0f} (max {self.held_max})"
            if cpu >= CLIENT_BOUND_CPU:
                out.append(f"client-bound: {held}, {core}: add --workers")
            elif self.loop_late():
                out.append(f"client-bound: {held}, {self.late_text()}")
            else:
                out.append(
                    f"trace-bound: {held} with the client at {cpu:.0%} of a core: too few requests "
                    "are ready at once (they wait for replies they carry, or there are too few sessions)"
                )
        median, queue = self.client_queue_p50_ms, self.client_queue_p99_ms
        if median is not None and median >= CLIENT_QUEUE_MS and not out:  # else the cause is named
            waited = (
                f"first tokens waited {median:.1f} ms (median; p99 {queue or 0:.1f} ms) in the client "
                "before it read them"
            )
            exact = "TTFT is the kernel's stamp and stays exact; what follows it runs late"
            if cpu >= CLIENT_BOUND_CPU:
                out.append(f"client-bound: {waited}, {core} ({exact}): add --workers")
            else:
                out.append(
                    f"client-bound: {waited} with the client at {cpu:.0%} of a core ({exact}; "
                    "a slow results sink, or a busy host)"
                )
        if self.plan in TIMED_PLANS and self.lag_start_s is not None and self.lag_end_s is not None:
            growth = self.lag_end_s - self.lag_start_s
            if growth > LAG_GROWTH_S:
                lag = (
                    f"schedule lag grew from {self.lag_start_s * 1e3:.1f} ms to "
                    f"{self.lag_end_s * 1e3:.1f} ms (median, first and last quarter)"
                )
                if cpu >= CLIENT_BOUND_CPU:
                    out.append(f"client-bound: {lag}, {core}: add --workers")
                elif self.loop_late():
                    out.append(f"client-bound: {lag}, {self.late_text()}")
                elif self.cap is not None and self.held_max >= self.cap:
                    out.append(f"cap-bound: {lag} at --concurrency {self.cap}: raise it")
                else:
                    out.append(f"falling behind: {lag} with the client at {cpu:.0%} of a core")
        return out

    def loop_late(self) -> bool:
        return self.loop_delay_ms is not None and self.loop_delay_ms >= LOOP_LATE_MS

    def late_text(self) -> str:
        cpu = self.client_cpu or 0.0
        return (
            f"its event loop ran {self.loop_delay_ms:.1f} ms late on average with the client at "
            f"{cpu:.0%} of a core (a slow results sink, or a busy host)"
        )
