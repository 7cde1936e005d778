"""The router model (sgl-model-gateway's cache_aware and round_robin policies, sglang-router 0.3.2)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.sim.router import (
    ApproxTree,
    CacheAware,
    RoundRobin,
    Routed,
    RouterConfig,
    predict,
    routing_text,
)

CA = RouterConfig("cache_aware")
RR = RouterConfig("round_robin")


def test_routing_text_joins_the_messages_text_with_a_space_and_skips_empty_ones() -> None:
    assert routing_text(["sys", "", "hello", "reply"]) == "sys hello reply"


def test_the_tree_matches_the_longest_prefix_and_names_the_worker_that_sent_it() -> None:
    tree = ApproxTree()
    tree.insert("abcdef", 0)
    tree.insert("abxyz", 1)
    assert tree.prefix_match("abcdzz") == (4, 0)
    assert tree.prefix_match("abxy") == (4, 1)
    assert tree.prefix_match("q")[0] == 0


def test_a_text_that_extends_one_it_sent_goes_back_to_that_worker_in_balance() -> None:
    p = CacheAware(2, CA)
    assert p.select("aaaa", [0, 0]) == 0  # nothing matched: least load, first of equals
    assert p.select("bbbb", [1, 0]) == 1  # nothing matched: least load
    assert p.select("bbbb more", [0, 0]) == 1  # 4/9 > 0.3: the worker of the match
    assert p.select("aaaa and more", [0, 0]) == 0  # 4/13 = 0.31 > 0.3


def test_a_match_at_or_below_the_threshold_falls_back_to_the_least_loaded_worker() -> None:
    p = CacheAware(2, CA)
    p.select("abc", [0, 0])  # worker 0
    # 3 of 10 characters = 0.3, not above the threshold: least load wins, not the match
    assert p.select("abcdefghij", [5, 0]) == 1


def test_an_imbalanced_fleet_goes_to_the_least_loaded_worker_whatever_matched() -> None:
    p = CacheAware(2, CA)
    p.select("session text", [0, 0])  # worker 0
    # 100 - 10 > 64 and 100 > 1.5 * 10: imbalanced
    assert p.select("session text again", [100, 10]) == 1
    # 60 - 0 is not > 64: balanced, so the longest match wins (worker 1 sent the longer prefix)
    assert p.select("session text again and again", [0, 60]) == 1
    assert p.select("session text again and again!", [60, 0]) == 1


def test_round_robin_cycles_from_the_first_worker_whatever_the_text() -> None:
    p = RoundRobin(3, RR)
    assert [p.select("same", [0, 0, 0]) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def _sessions(turns: int, sessions: int, grow: int = 100) -> list[Routed]:
    out = []
    for t in range(turns):
        for s in range(sessions):
            text = " ".join(f"s{s}t{k}" + "x" * 20 for k in range(t + 1))
            out.append(Routed(f"s{s}", text, prompt_tokens=grow * (t + 1), output_tokens=10))
    return out


def test_round_robin_moves_each_turn_of_three_sessions_over_two_workers_and_rereads_two_turns() -> None:
    placed = predict(_sessions(turns=4, sessions=3), RR, workers=2)
    continuing = placed[3:]
    assert all(p.moved for p in continuing)
    # The worker last saw the session two turns back (prompt 100 * t + its reply of 10).
    assert [p.reread for p in placed[6:9]] == [300 - 110] * 3
    assert [p.reread for p in placed[3:6]] == [200, 200, 200]  # never saw the session: all of it


def test_cache_aware_one_request_at_a_time_keeps_every_session_on_its_worker() -> None:
    placed = predict(_sessions(turns=4, sessions=3), CA, workers=2)
    assert not any(p.moved for p in placed)
    assert [p.reread for p in placed[3:]] == [200 - 110] * 3 + [300 - 210] * 3 + [400 - 310] * 3


@settings(max_examples=60, deadline=None)
@given(
    workers=st.integers(1, 4),
    sessions=st.integers(1, 5),
    turns=st.integers(2, 5),
    loads=st.lists(st.integers(0, 3), min_size=4, max_size=4),
)
def test_in_balance_cache_aware_never_moves_a_session_whose_text_only_grows(
    workers: int, sessions: int, turns: int, loads: list[int]
) -> None:
    """The promise: a continuing request whose text extends its previous one by less than its
    own length stays (match rate > 0.3), whatever the loads, while the fleet is in balance."""
    reqs = _sessions(turns, sessions)
    load = [loads[:workers]] * len(reqs)
    placed = predict(reqs, CA, workers, loads=load)
    assert not any(p.moved for p in placed)
    assert all(p.reread <= 100 for i, p in enumerate(placed) if i >= sessions)


@settings(max_examples=60, deadline=None)
@given(workers=st.integers(1, 4), n=st.integers(1, 30))
def test_round_robin_spreads_requests_evenly(workers: int, n: int) -> None:
    placed = predict([Routed("s", "t", 10)] * n, RR, workers)
    counts = [sum(1 for p in placed if p.worker == w) for w in range(workers)]
    assert max(counts) - min(counts) <= 1


def test_a_policy_the_model_does_not_have_is_refused() -> None:
    with pytest.raises(ValueError, match="policy"):
        RouterConfig("power_of_two")


def test_agreement_renames_the_workers_before_the_walk_so_loads_break_ties_in_the_routers_order() -> None:
    from replay.sim.router import agreement

    reqs = [Routed("s0", "aaaa", 10), Routed("s1", "bbbb", 10)]
    # The router numbers its workers the other way round; s0 is still in flight on its worker 1
    # when s1 arrives, so s1 (no match) goes to the least loaded: its worker 0.
    observed, loads = [1, 0], [[0, 0], [0, 1]]
    assert agreement(reqs, observed, CA, 2, loads) == 2
    assert agreement(reqs, [0, 0], CA, 2, [[0, 0], [0, 0]]) == 2  # nothing in flight: both to the first


def test_one_decision_read_otherwise_costs_that_placement_not_the_rest_of_its_session() -> None:
    """B's first request reaches the router after A's ended, but the client's clock still has A
    in flight: the model sends B to the other (least loaded) worker. Judged on the router's own
    history (B's text in the tree where the router put it), B's next turns agree again; a free
    walk of the model would lose them too (1 of 4: a busy host failed a fleet test that way)."""
    from replay.sim.router import agreement

    reqs = [
        Routed("a", "aaaa", 10),
        Routed("b", "bbbb", 10),
        Routed("b", "bbbb cc", 12),
        Routed("b", "bbbb cc dd", 14),
    ]
    loads = [[0, 0], [1, 0], [0, 0], [0, 0]]
    assert agreement(reqs, [0, 0, 0, 0], CA, 2, loads) == 3
