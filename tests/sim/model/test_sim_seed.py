"""The field figures the simulator must reproduce (seed-figures.md), from the policy rules alone.

Each test sets up the workload the report describes and lets the cache model run; nothing in the
model knows about these scenarios. A change to a ds4 rule in `replay/sim/model/policy.py` breaks them.
"""

from __future__ import annotations

from replay.sim.model import events as ev
from replay.sim.model.config import GiB, config_for
from replay.sim.model.disk import Checkpoint
from replay.sim.model.engine import CacheModel
from replay.sim.model.job import build_job
from replay.sim.model.policy import fallback_cut
from replay.sim.model.seq import TokenSeq
from replay.sizing import budget_rule, chain, jobs_from_requests, sweep
from replay.trace.synth import synth_text
from tests.support.sim_workloads import Convo, of, run_turn, system_message

QWEN = config_for("qwen38-q2")


# --- chain sizes (section 1, "why it did not help") ------------------------------------------------


def test_chain_of_77k_read_after_restoring_the_system_prefix() -> None:
    c = chain(77_000, start=14_336, cfg=QWEN)
    assert [f.reason for f in c.files] == ["continued"] * 6 + ["evict"]
    assert c.files[0].tokens == 20_480  # "the first appeared at 20K"
    sizes = [f.bytes / GiB for f in c.files]
    assert 0.65 <= min(sizes) <= 0.75 and 2.5 <= max(sizes) <= 2.75  # "0.7-2.6 GB each"
    assert abs(c.total_bytes / GiB - 11.6) < 0.1  # "11.6 GiB in total"


def test_chain_from_the_engine_matches_the_arithmetic() -> None:
    """Run it for real: a short first request leaves the 14,336-token anchor, then a 77K read."""
    cfg = QWEN.with_(kv_disk_space_mb=64 * 1024)
    model = CacheModel(cfg, progress=False)
    system = system_message(14_336)
    first = Convo("warm", system, 15_000, seed=2)
    run_turn(model, first, 1, cfg, grow=10)
    big = Convo("main", system, 77_000, seed=3)
    result, events = run_turn(model, big, 2, cfg, grow=10)
    assert result.cache_source == "disk-text" and result.cached_tokens == 14_336
    other = Convo("other", system, 15_500, seed=4)
    _, switch = run_turn(model, other, 3, cfg, grow=10)  # the switch writes the final copy
    read = [e.checkpoint.tokens for e in of(events, ev.Stored) if e.job_id == 2 and e.reason == "continued"]
    final = [e.checkpoint.tokens for e in of(switch, ev.Stored) if e.reason == "evict"]
    expected = chain(result.prompt_tokens, start=14_336, cfg=cfg)
    assert read == [f.tokens for f in expected.files if f.reason == "continued"]
    assert final == [result.prompt_tokens + result.completion_tokens]


def test_chain_from_scratch_at_130k_and_one_copy() -> None:
    c = chain(130_000, cfg=QWEN)
    assert len(c.files) == 13 and c.files[0].tokens == 10_240
    assert 30e9 <= c.total_bytes <= 34e9  # "~32 GB at 130K"
    assert 4.3e9 <= QWEN.file_bytes(130_000) <= 4.7e9  # "4.5 GB each at 130K"


def test_budget_rule_for_the_slow_morning() -> None:
    """32 + 3 x 4.5 < 50, so 64 GB; 24 GB cannot hold it."""
    need = budget_rule(130_000, [130_000] * 3, cfg=QWEN)
    assert 40e9 < need < 50e9
    assert 24 * GiB < need < 64 * GiB


# --- cold cut (section 3) ----------------------------------------------------------------------


def test_cold_cut_rule_numbers() -> None:
    for prompt, cut, coverage in ((11_732, 10_240, 87.3), (6_655, 6_144, 92.3), (5_822, 4_096, 70.4)):
        assert fallback_cut(prompt, QWEN) == cut
        assert round(100 * cut / prompt, 1) == coverage
    # the 32-token trim comes first: 16 tokens past a multiple of 2048 cut a whole block back
    assert fallback_cut(6_160, QWEN) == 4_096 and fallback_cut(6_176, QWEN) == 6_144
    # too short for the fallback: the whole prompt (reference 4.2: P = 1695 saved after prefill)
    assert fallback_cut(1_695, QWEN) == 1_695 and fallback_cut(540, QWEN) == 540


def test_cold_saves_cut_there_in_the_engine() -> None:
    """Prompts without a usable chat anchor (a bare user turn: anchor 0 < min) take the fallback cut."""
    for prompt, cut in ((11_732, 10_240), (6_655, 6_144), (5_822, 4_096)):
        model = CacheModel(QWEN.with_(kv_disk_space_mb=8192), progress=False)
        job = build_job(1, [{"role": "user", "content": synth_text(prompt - 8, prompt)}], None, 0, QWEN)
        assert job.prompt_tokens == prompt
        model.submit(job, 0.0)
        cold = [e for e in of(model.run_until_idle(), ev.Stored) if e.reason == "cold"]
        assert [(e.checkpoint.tokens, e.checkpoint.trimmed) for e in cold] == [(cut, prompt - cut)]


# --- two resident slots (section 2, ds4 issue 1069 / PR 765) -----------------------------------


def _alternate(routing: str) -> tuple[CacheModel, list[ev.Event]]:
    cfg = QWEN.with_(batched_sessions=2, routing=routing, kv_disk_space_mb=16 * 1024)
    model = CacheModel(cfg, progress=False)
    system = system_message(11_151)  # shared prefix incl. the next user-turn header: 11,154 tokens
    convos = {"A": Convo("A", system, 13_000, seed=5), "B": Convo("B", system, 12_500, seed=6)}
    events: list[ev.Event] = []
    for i, name in enumerate("ABABABABA", 1):
        _, evs = run_turn(model, convos[name], i, cfg, grow=300)
        events += evs
    return model, events


def test_upstream_routing_never_uses_the_second_slot() -> None:
    model, events = _alternate("upstream")
    assert {e.slot for e in of(events, ev.Dispatched)} == {0}
    assert not model.slots[1].seq  # "the second slot stays empty"
    misses = of(events, ev.LiveMiss)
    assert len(misses) == 8  # every switch
    assert {m.common for m in misses} == {11_154}  # common = the shared system prompt
    assert len(of(events, ev.DiskHit)) == 8
    assert all(
        e.reason == "evict"
        for e in of(events, ev.Stored)
        if e.job_id and e.job_id > 2 and e.reason != "continued"
    )


def test_reuse_aware_routing_keeps_each_conversation_live() -> None:
    model, events = _alternate("reuse-aware")
    assert [e.slot for e in of(events, ev.Dispatched)] == [0, 1] * 4 + [0]
    assert not of(events, ev.LiveMiss)
    later = [e for e in events if getattr(e, "job_id", 0) > 2]
    assert not of(later, ev.DiskHit) and not of(later, ev.Evicted)
    results = [e.result for e in of(later, ev.Finished)]
    assert all(r.cache_source == "memory-token" and r.reprocessed_tokens < 400 for r in results)


# --- the disk budget (section 1): 24 GB vs 64 GB ------------------------------------------------


def _switching(budget_gib: int) -> tuple[list[ev.Result], list[ev.Event], CacheModel]:
    """Two tool-heavy sessions at 70K and 80K, one 10K tool result per turn, alternating 8 turns."""
    cfg = QWEN.with_(kv_disk_space_mb=budget_gib * 1024)
    model = CacheModel(cfg, progress=False)
    system = system_message(14_336)
    a, b = Convo("A", system, 70_000, seed=7), Convo("B", system, 80_000, seed=8)
    results, events = [], []
    for i, convo in enumerate([a, b] * 5, 1):
        result, evs = run_turn(model, convo, i, cfg, grow=10_000)
        results.append(result)
        events += evs
    return results, events, model


def test_64gb_restores_the_whole_conversation_every_switch() -> None:
    results, events, model = _switching(64)
    assert not of(events, ev.Evicted)
    turns = results[2:]  # after both sessions were read once
    for prev, r in zip(results, turns, strict=False):
        assert r.cache_source == "disk-text"
        assert r.cached_tokens == prev.prompt_tokens + prev.completion_tokens  # the whole conversation
        assert 10_000 <= r.reprocessed_tokens <= 10_100  # only its own new 10K tokens
        assert 0.5 < r.restore_s < 1.5  # "in about a second"
        assert 20 < r.total_s < 30  # "23-26 s"
    assert round(results[-2].prompt_tokens, -4) == 110_000 and round(results[-1].prompt_tokens, -4) == 120_000


def _morning(budget_gib: int) -> tuple[list[tuple[int, ev.Result]], list[ev.Event]]:
    """The slow morning in small: yesterday's files, three conversations, compaction, then main
    alternating with a review turn."""
    cfg = QWEN.with_(kv_disk_space_mb=budget_gib * 1024)
    yesterday = []
    for i in range(3):  # 8.6 GB restored a couple of times yesterday
        seq = TokenSeq(((f"<old-{i}>",), ("~",) * 81_000))
        size = cfg.file_bytes(len(seq))
        yesterday.append(
            Checkpoint(seq, "evict", "token-text", size, created=-72_000.0, last_used=-72_000.0, hits=2)
        )
    model = CacheModel(cfg, yesterday, progress=False)
    events = model.startup()
    system = system_message(14_336)
    convos = {"main": Convo("main", system, 87_000, 9), "cron1": Convo("cron1", system, 16_000, 10)}
    convos["cron2"] = Convo("cron2", system, 17_000, 11)
    grow = {"main": 3_000, "cron1": 6_000, "cron2": 6_000, "review": 2_000}
    results: list[tuple[int, ev.Result]] = []
    jid = 0
    for phase, names in ((1, ("main", "cron1", "cron2") * 6), (2, ("main", "review") * 6)):
        if phase == 2:  # compaction: the main session is rewritten to ~70K; a review turn joins
            convos["main"] = Convo("main", system, 70_000, 12)
            convos["review"] = Convo("review", system, 62_000, 13)
        for name in names:
            jid += 1
            result, evs = run_turn(model, convos[name], jid, cfg, grow=grow[name])
            results.append((phase, result))
            events += evs
    return results, events


def test_24gb_evicts_only_never_restored_files_and_switches_reread_most() -> None:
    results, events = _morning(24)
    evicted = of(events, ev.Evicted)
    assert len(evicted) > 30 and all(e.checkpoint.hits == 0 for e in evicted)
    for phase, r in results:
        if phase == 2:
            assert r.reprocessed_tokens > 0.75 * r.prompt_tokens
            assert r.total_s > 90  # "95-120 s" re-reading at ~510 tok/s


def test_64gb_same_morning_restores_after_compaction() -> None:
    results, _ = _morning(64)
    after = [r for phase, r in results if phase == 2][2:]
    assert all(r.cache_source == "disk-text" and r.reprocessed_tokens < 0.1 * r.prompt_tokens for r in after)


def test_offline_sweep_shows_the_same_shape() -> None:
    """`replay size sweep` runs the same model: zero evictions at 64 GB, only zero-hit ones at 24 GB."""
    system = system_message(14_336)
    a, b = Convo("A", system, 70_000, seed=7), Convo("B", system, 80_000, seed=8)
    requests = []
    for i, convo in enumerate([a, b] * 5, 1):
        requests.append(convo.request())
        convo.answer(convo.job(i, QWEN).reply, 10_000)
    report = sweep(jobs_from_requests(requests, QWEN), [24 * GiB, 64 * GiB], cfg=QWEN, target_reread=11_000)
    small, large = report.rows
    assert large.evictions == 0 and small.evictions > 0 and small.evictions_zero_hits == small.evictions
    assert large.restores == small.restores == 9
    assert large.reread_p50 < 10_100
