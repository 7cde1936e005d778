"""SGLang's router (the PyPI package ``sglang-router`` 0.3.2, whose Rust core is the
``sgl-model-gateway`` crate ``smg``) as a pure model: which worker each request goes to, and what
the worker it lands on re-reads.

Every rule names the source it models, in sgl-project/sglang's ``sgl-model-gateway/src/``; the
version read is the one the 0.3.2 wheel was built from (its binary carries the symbols
``smg::policies::tree::Tree::prefix_match_with_counts`` and
``CacheAwarePolicy::select_worker_min_load``, and the defaults are the wheel's own
``sglang_router/router_args.py``). Nothing here is the router's code: the rules are restated.

What the model leaves out, and why that is safe for the scenarios it judges:
- the tree's background LRU eviction (``eviction_interval_secs`` = 60, ``max_tree_size`` = 2**26
  characters): a scenario's few sessions stay far below the size;
- health checks and circuit breakers: every worker is healthy;
- the order of the router's workers is the order they finished registering (its job queue adds
  them side by side), which a run does not fix: the model numbers workers 0..N-1 and a check
  compares placements up to a renaming of the workers (`agreement`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

POLICIES = ("cache_aware", "round_robin")

# sglang_router/router_args.py (0.3.2): RouterArgs' defaults.
CACHE_THRESHOLD = 0.3
BALANCE_ABS_THRESHOLD = 64
BALANCE_REL_THRESHOLD = 1.5


@dataclass(frozen=True, slots=True)
class RouterConfig:
    policy: str = "cache_aware"
    cache_threshold: float = CACHE_THRESHOLD
    balance_abs_threshold: int = BALANCE_ABS_THRESHOLD
    balance_rel_threshold: float = BALANCE_REL_THRESHOLD

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {self.policy!r}")


def routing_text(contents: Sequence[str]) -> str:
    """The text the router matches for a chat request: protocols/chat.rs,
    `ChatCompletionRequest::extract_text_for_routing` joins the text of the messages (system,
    user, assistant content, tool results) with one space, skipping empty ones. Tool
    definitions and tool-call arguments are not part of it."""
    return " ".join(c for c in contents if c)


class ApproxTree:
    """policies/tree.rs: one character radix tree shared by the workers, each node remembering
    which workers (tenants) sent text through it. Kept here as the texts themselves: the longest
    prefix a text shares with the tree is its longest common prefix with any text inserted."""

    __slots__ = ("_texts", "_clock")

    def __init__(self) -> None:
        self._texts: list[tuple[str, int, int]] = []  # (text, worker, when inserted)
        self._clock = 0

    def insert(self, text: str, worker: int) -> None:
        """cache_aware.rs: after every choice the request's text is inserted for the chosen
        worker, in balance and out of it alike."""
        self._clock += 1
        self._texts.append((text, worker, self._clock))

    def prefix_match(self, text: str) -> tuple[int, int | None]:
        """tree.rs `prefix_match_with_counts`: the characters matched and the tenant of the
        deepest matched node. Several tenants at that node: the source takes the first of a
        concurrent map; the model takes the one that touched it last (assumed)."""
        best, tenant, when = 0, None, -1
        for stored, worker, t in self._texts:
            n = _common(stored, text)
            if n > best or (n == best and n > 0 and t > when):
                best, tenant, when = n, worker, t
        return best, tenant


def _common(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Policy:
    """Which worker a request goes to, given the text it carries and the requests each worker
    has in flight (the router's own count: a request counts from its send to its end)."""

    def __init__(self, workers: int, config: RouterConfig) -> None:
        if workers < 1:
            raise ValueError("a router needs at least one worker")
        self.workers = workers
        self.config = config

    def choose(self, text: str, loads: Sequence[int]) -> int:
        """The worker the policy picks, its state unchanged."""
        raise NotImplementedError

    def record(self, text: str, worker: int) -> None:
        """What the router keeps of a request it sent to `worker`."""
        raise NotImplementedError

    def select(self, text: str, loads: Sequence[int]) -> int:
        worker = self.choose(text, loads)
        self.record(text, worker)
        return worker


class RoundRobin(Policy):
    """policies/round_robin.rs: an atomic counter, starting at 0, taken modulo the healthy
    workers; the request's text plays no part."""

    def __init__(self, workers: int, config: RouterConfig) -> None:
        super().__init__(workers, config)
        self._counter = 0

    def choose(self, text: str, loads: Sequence[int]) -> int:
        return self._counter % self.workers

    def record(self, text: str, worker: int) -> None:
        self._counter += 1


class CacheAware(Policy):
    """policies/cache_aware.rs, `select_worker`:
    1. imbalanced when max load - min load > balance_abs_threshold AND max > min *
       balance_rel_threshold: the worker with the least load (`select_worker_min_load`), and the
       text still goes into the tree for it;
    2. else the tree's longest prefix match: match rate = matched characters / the text's
       characters; above cache_threshold, the worker of the deepest match;
    3. else (a match rate at or below the threshold) the worker with the least load; ties go to
       the first worker (Rust's `min_by_key` keeps the first of equal minima).
    """

    def __init__(self, workers: int, config: RouterConfig) -> None:
        super().__init__(workers, config)
        self.tree = ApproxTree()

    def imbalanced(self, loads: Sequence[int]) -> bool:
        lo, hi = min(loads), max(loads)
        c = self.config
        return hi - lo > c.balance_abs_threshold and hi > lo * c.balance_rel_threshold

    def choose(self, text: str, loads: Sequence[int]) -> int:
        if len(loads) != self.workers:
            raise ValueError("one load per worker")
        least = min(range(self.workers), key=lambda i: loads[i])
        if self.imbalanced(loads):
            return least
        matched, tenant = self.tree.prefix_match(text)
        rate = matched / len(text) if text else 0.0
        return tenant if rate > self.config.cache_threshold and tenant is not None else least

    def record(self, text: str, worker: int) -> None:
        """cache_aware.rs: the chosen worker's text goes into the tree, in balance or not."""
        self.tree.insert(text, worker)


def make_policy(config: RouterConfig, workers: int) -> Policy:
    return CacheAware(workers, config) if config.policy == "cache_aware" else RoundRobin(workers, config)


# --- what the worker re-reads --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Routed:
    """One request as the fleet sees it: its session, its routing text, its prompt and reply."""

    session: str
    text: str
    prompt_tokens: int
    output_tokens: int = 0


def routed_from(session: str, text: str, rec: dict[str, int | str | None]) -> Routed:
    """A results line (prompt and output tokens) with the text the router matched."""
    return Routed(session, text, int(rec.get("prompt_tokens") or 0), int(rec.get("output_tokens") or 0))


@dataclass(frozen=True, slots=True)
class Placement:
    worker: int
    reread: int  # prompt tokens the worker processes again (not in its cache)
    moved: bool  # the session's previous request went to another worker


@dataclass(slots=True)
class FleetCache:
    """Each worker's prefix cache as the model holds it: per session, the prompt and reply of the
    last request of that session the worker served (a worker with enough slots for the sessions
    it holds keeps them all: llama-server's -np 4 for a few sessions); `shared` is what every
    prompt starts with (the system prompt) once a worker has served anything."""

    workers: int
    shared: int = 0
    held: list[dict[str, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.held = [{} for _ in range(self.workers)]

    def reread(self, worker: int, r: Routed) -> int:
        mine = self.held[worker]
        cached = mine.get(r.session)
        if cached is None:
            cached = self.shared if mine else 0
        return max(0, r.prompt_tokens - min(cached, r.prompt_tokens))

    def serve(self, worker: int, r: Routed) -> None:
        self.held[worker][r.session] = r.prompt_tokens + r.output_tokens


def predict(
    requests: Sequence[Routed],
    config: RouterConfig,
    workers: int,
    shared_tokens: int = 0,
    loads: Sequence[Sequence[int]] | None = None,
) -> list[Placement]:
    """Each request, in the order the router received them, placed by the policy and costed on
    the worker it lands on. `loads[i]`: the workers' in-flight counts when request i arrived
    (default: none in flight, one request at a time)."""
    policy = make_policy(config, workers)
    cache = FleetCache(workers, shared_tokens)
    last: dict[str, int] = {}
    out = []
    for i, r in enumerate(requests):
        w = policy.select(r.text, loads[i] if loads is not None else [0] * workers)
        out.append(Placement(w, cache.reread(w, r), r.session in last and last[r.session] != w))
        cache.serve(w, r)
        last[r.session] = w
    return out


def agreement(
    requests: Sequence[Routed],
    observed: Sequence[int],
    config: RouterConfig,
    workers: int,
    loads: Sequence[Sequence[int]] | None = None,
) -> int:
    """How many of the run's placements (`observed`: the worker of each request, in the run's
    own numbering; `loads`: each worker's requests in flight when it arrived, the same
    numbering) the policy makes itself, decision by decision, under the best renaming of its
    workers. Each request is judged on the router's own history: the policy's state holds every
    earlier request where the router sent it, not where the model would have, so a decision
    the model makes otherwise (a least-loaded tie read from the client's clock, which a busy
    host moves) costs that placement alone, not every later one of its session. The renaming
    is tried before the walk, not after it: the least-loaded rule breaks ties by the router's
    own order, so the loads must reach the model in that order."""
    best = 0
    for perm in itertools.permutations(range(workers)):
        mine = {o: m for m, o in enumerate(perm)}  # the run's worker o is the model's mine[o]
        policy = make_policy(config, workers)
        agrees = 0
        for i, (r, o) in enumerate(zip(requests, observed, strict=True)):
            held = [0] * workers if loads is None else [loads[i][perm[m]] for m in range(workers)]
            agrees += perm[policy.choose(r.text, held)] == o
            policy.record(r.text, mine[o])
        best = max(best, agrees)
    return best
