"""The cache model's mechanics: queueing, slots, prefill quanta, saves, restores, keys, shutdown."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.sim.model import events as ev
from replay.sim.model import policy
from replay.sim.model.checkpoint import stored_reply_key
from replay.sim.model.config import config_for
from replay.sim.model.disk import Checkpoint, DiskStore
from replay.sim.model.engine import CacheModel
from replay.sim.model.job import ContextTooLong, build_job, thinking_requested
from replay.sim.model.render import render
from replay.sim.model.seq import TokenSeq
from replay.trace.synth import synth_text
from tests.support.sim_workloads import TOOLS, Convo, of, run_turn, system_message

QWEN = config_for("qwen38-q2")
SYSTEM = system_message(2_000)


def user_job(job_id: int, tokens: int, seed: int, cfg=QWEN, max_tokens: int = 50):
    return build_job(
        job_id, [{"role": "user", "content": synth_text(tokens - 8, seed)}], None, max_tokens, cfg
    )


def finished(events: list[ev.Event]) -> dict[int, ev.Result]:
    return {e.job_id: e.result for e in of(events, ev.Finished)}


# --- queueing and slots ------------------------------------------------------------------------


def test_one_slot_serves_fifo_and_later_jobs_wait() -> None:
    model = CacheModel(QWEN.with_(disk=False))
    jobs = [user_job(i, 5_000, i) for i in (1, 2, 3)]
    for i, job in enumerate(jobs):
        model.submit(job, 0.1 * i)
    events = model.run_until_idle()
    assert [e.job_id for e in of(events, ev.Dispatched)] == [1, 2, 3]
    res = finished(events)
    assert res[1].queue_s == 0
    assert res[2].queue_s == pytest.approx(res[1].total_s - 0.1, abs=1e-6)
    assert res[3].queue_s > res[2].queue_s
    # each later job switched conversation: a live miss, no disk cache to fall back on
    assert len(of(events, ev.LiveMiss)) == 2 and all(r.cached_tokens == 0 for r in res.values())


def test_prefill_time_follows_the_rate_and_decode_follows_its_rate() -> None:
    model = CacheModel(QWEN.with_(disk=False))
    model.submit(user_job(1, 10_200, 1, max_tokens=120), 0.0)
    r = finished(model.run_until_idle())[1]
    assert r.prefill_s == pytest.approx(10_200 / QWEN.prefill_tps)
    assert r.decode_s == pytest.approx(120 / QWEN.decode_tps)


def test_decode_starves_while_another_slot_prefills() -> None:
    """A prefill yields to decoding only every 128 tokens: the decoding slot gets a few tok/s."""
    cfg = QWEN.with_(disk=False, batched_sessions=2)
    model = CacheModel(cfg)
    model.submit(user_job(1, 1_000, 1, max_tokens=200), 0.0)
    model.advance(3.0)  # job 1 is decoding
    model.submit(user_job(2, 40_000, 2, max_tokens=10), 3.0)
    res = finished(model.run_until_idle())
    assert res[2].slot == 1  # the second slot fills because two requests overlap
    rate = 200 / res[1].decode_s
    assert 2.0 < rate < 5.0  # seed figures: 2.3-3.3 tok/s instead of ~40
    alone = CacheModel(cfg)
    alone.submit(user_job(1, 1_000, 1, max_tokens=200), 0.0)
    assert 200 / finished(alone.run_until_idle())[1].decode_s == pytest.approx(QWEN.decode_tps)


@settings(max_examples=15, deadline=None)
@given(
    step=st.floats(0.05, 4.0),
    arrivals=st.lists(st.floats(0.0, 30.0), min_size=3, max_size=3),
    slots=st.sampled_from([None, 2]),
)
def test_bulk_and_step_by_step_runs_agree(step: float, arrivals: list[float], slots: int | None) -> None:
    """Advancing in small wall-clock steps (as the server does) gives the very same results."""
    cfg = QWEN.with_(batched_sessions=slots, kv_disk_space_mb=4096)
    jobs = [
        user_job(1, 3_000, 1, max_tokens=300),
        user_job(2, 12_000, 2, max_tokens=80),
        user_job(3, 2_000, 3),
    ]
    times = sorted(arrivals)

    def run(step: float | None) -> dict[int, ev.Result]:
        model = CacheModel(cfg, progress=step is not None)
        events: list[ev.Event] = []
        pending = list(zip(times, jobs, strict=True))
        t = 0.0
        while pending or model.busy:
            if pending and (step is None or pending[0][0] <= t):
                at, job = pending.pop(0)
                model.submit(job, max(at, model.now))
                continue
            if step is None:
                events += model.run_until_idle()
                continue
            t = min(t + step, pending[0][0]) if pending else t + step
            events += model.advance(t)
        return finished(events)

    def rounded(results: dict[int, ev.Result]) -> dict[int, tuple]:
        return {
            k: tuple(round(x, 6) if isinstance(x, float) else x for x in vars_of(r))
            for k, r in results.items()
        }

    assert rounded(run(None)) == rounded(run(step))


def vars_of(r: ev.Result) -> tuple:
    return tuple(getattr(r, f) for f in r.__dataclass_fields__)


def test_prompt_at_or_over_ctx_is_refused_and_replies_stop_at_ctx() -> None:
    cfg = QWEN.with_(ctx=4_096)
    with pytest.raises(ContextTooLong):
        user_job(1, 4_096, 1, cfg)
    job = user_job(1, 4_000, 1, cfg, max_tokens=500)
    assert job.reply.tokens == 96 and job.reply.finish == "length"


# --- live cache --------------------------------------------------------------------------------


def test_live_hit_when_the_client_resends_the_servers_reply() -> None:
    model = CacheModel(QWEN.with_(disk=False))
    convo = Convo("a", SYSTEM, 6_000, seed=1)
    first, _ = run_turn(model, convo, 1, QWEN, grow=500)
    second, events = run_turn(model, convo, 2, QWEN, grow=500)
    assert not of(events, ev.LiveMiss)
    assert second.cache_source == "memory-token"
    assert second.cached_tokens == first.prompt_tokens + first.completion_tokens


def test_recorded_history_misses_live_kv_after_each_reply() -> None:
    """The recorded reply is not what the server generated: the live KV diverges right there."""
    model = CacheModel(QWEN.with_(kv_disk_space_mb=4096))
    convo = Convo("a", SYSTEM, 6_000, seed=1, finish="stop")
    job = convo.job(1, QWEN)
    model.submit(job, 0.0)
    model.run_until_idle()
    recorded = {"role": "assistant", "content": "a different recorded answer"}
    messages = [*convo.messages, recorded, {"role": "user", "content": synth_text(300, 9)}]
    model.submit(build_job(2, messages, TOOLS, 50, QWEN), model.now + 1)
    events = model.run_until_idle()
    (miss,) = of(events, ev.LiveMiss)
    assert miss.reason == "token-mismatch"
    assert miss.common == job.prompt_tokens  # up to the assistant header: the reply differs
    stored = [e for e in of(events, ev.Stored) if e.reason == "evict"]
    assert stored and stored[0].checkpoint.tokens == job.prompt_tokens + job.reply.tokens


def test_a_resent_prompt_shorter_than_the_live_state_misses_with_its_own_reason() -> None:
    """No partial rewind of live KV: resending the same prompt after its reply is a miss."""
    model = CacheModel(QWEN.with_(disk=False))
    model.submit(user_job(1, 3_000, 1), 0.0)
    model.run_until_idle()
    model.submit(user_job(2, 3_000, 1), model.now)
    (miss,) = of(model.run_until_idle(), ev.LiveMiss)
    assert (miss.reason, miss.common, miss.prompt, miss.live) == (
        "incoming-prompt-shorter-than-live-checkpoint",
        3_000,
        3_000,
        3_050,
    )
    model.submit(user_job(3, 1_000, 7), model.now)
    (miss,) = of(model.run_until_idle(), ev.LiveMiss)
    assert miss.reason == "token-mismatch" and miss.common == 3  # only the user-turn header


# --- hidden reasoning and visible keys (ds4 issue 1053) ----------------------------------------


def test_hidden_reasoning_tool_conversation_misses_live_and_its_evict_file_never_matches() -> None:
    cfg = QWEN.with_(hidden_reasoning=True, visible_key="no-tools", kv_disk_space_mb=8192)
    model = CacheModel(cfg)
    convo = Convo("a", SYSTEM, 6_000, seed=1)
    first, _ = run_turn(model, convo, 1, cfg, grow=400)
    second, events = run_turn(model, convo, 2, cfg, grow=400)
    (miss,) = of(events, ev.LiveMiss)
    assert miss.common == first.prompt_tokens  # diverges at the <think> the client never resent
    evict = next(e for e in of(events, ev.Stored) if e.reason == "evict")
    assert evict.checkpoint.key == "token-text"
    assert second.cache_source == "disk-text" and second.cached_tokens < first.prompt_tokens
    _, later = run_turn(model, convo, 3, cfg, grow=400)
    assert all(h.checkpoint is not evict.checkpoint for h in of(later, ev.DiskHit))


def test_hidden_reasoning_text_reply_continues_on_the_visible_transcript() -> None:
    cfg = QWEN.with_(hidden_reasoning=True, visible_key="no-tools", kv_disk_space_mb=8192)
    model = CacheModel(cfg)
    convo = Convo("a", system_message(2_000, tools=None), 6_000, seed=1, tools=None, finish="stop")
    first, events = run_turn(model, convo, 1, cfg, grow=400)
    assert of(events, ev.ThinkingRemembered)
    second, events = run_turn(model, convo, 2, cfg, grow=400)
    (cont,) = of(events, ev.LiveContinuation)
    assert second.cache_source == "thinking-visible" and not of(events, ev.LiveMiss)
    assert cont.cached == second.cached_tokens > first.prompt_tokens
    # switching away saves the remembered visible state under the visible key, which restores later
    other = Convo("b", system_message(2_000, seed=3, tools=None), 5_000, seed=2, tools=None, finish="stop")
    _, events = run_turn(model, other, 3, cfg, grow=100)
    evict = next(e for e in of(events, ev.Stored) if e.reason == "evict")
    assert evict.checkpoint.key == "thinking-visible"
    third, events = run_turn(model, convo, 4, cfg, grow=100)
    assert third.cache_source == "disk-text" and of(events, ev.DiskHit)[0].checkpoint is evict.checkpoint


def test_field_build_keys_tool_calls_visibly_and_plain_text_misses() -> None:
    """visible_key=tool-calls (seed figures, three conversations overnight): C answered in text and missed."""
    cfg = QWEN.with_(hidden_reasoning=True, visible_key="tool-calls", kv_disk_space_mb=8192)
    tools_model, text_model = CacheModel(cfg), CacheModel(cfg)
    tool_convo = Convo("a", SYSTEM, 6_000, seed=1)
    text_convo = Convo("c", SYSTEM, 6_000, seed=1, finish="stop")
    run_turn(tools_model, tool_convo, 1, cfg, grow=300)
    run_turn(text_model, text_convo, 1, cfg, grow=300)
    r_tool, _ = run_turn(tools_model, tool_convo, 2, cfg, grow=300)
    r_text, events = run_turn(text_model, text_convo, 2, cfg, grow=300)
    assert r_tool.cache_source == "thinking-visible"
    assert of(events, ev.LiveMiss) and r_text.cache_source != "thinking-visible"


def _text_conversation_turns(cfg) -> list[ev.Result]:
    """One conversation with tools that answers in plain text, three turns of +11K each."""
    model = CacheModel(cfg)
    convo = Convo("c", SYSTEM, 6_000, seed=1, finish="stop")
    return [run_turn(model, convo, i, cfg, grow=11_000)[0] for i in (1, 2, 3)]


def test_field_build_stores_plain_text_replies_under_a_key_tool_requests_never_look_up() -> None:
    """Seed figures 1 overnight (ds4 issue 1053): C's files are on disk, stored under the
    plain-text key, and its requests (with tools) look up under the tool key: only the prefix
    holding no reply yet (system prompt + first user turn) comes back."""
    cfg = QWEN.with_(
        hidden_reasoning=True,
        visible_key="tool-calls",
        kv_disk_space_mb=64 * 1024,
        continued_trigger="crossed",
    )
    upstream = _text_conversation_turns(cfg)
    field = _text_conversation_turns(cfg.with_(tool_replay_key=True))
    assert [r.cache_source for r in field[1:]] == ["disk-text", "disk-text"]
    assert all(r.cached_tokens <= 6_000 for r in field)
    # the A/B source finds the same conversation's chain prefixes past its first reply (6,000)
    assert upstream[2].cached_tokens > 6_000


def test_stored_reply_key_is_the_kind_of_the_last_reply_in_the_text() -> None:
    first = [SYSTEM, {"role": "user", "content": "hi"}]
    text = [*first, {"role": "assistant", "content": "plain answer"}, {"role": "user", "content": "more"}]
    call = {"name": "bash", "arguments": "{}"}
    tool = [
        *text,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "ok"},
    ]
    p1, p2, p3 = (render(m, TOOLS).seq for m in (first, text, tool))
    assert stored_reply_key(p1) == "none"  # the generation prompt is not a reply
    assert stored_reply_key(p2) == "plain-text"
    assert stored_reply_key(p3) == "tool"
    assert stored_reply_key(p3.prefix(len(p2))) == "plain-text"
    assert stored_reply_key(p3.prefix(len(p2) + 2)) == "tool"  # inside the tool call
    assert policy.lookup_reply_key(True, QWEN) is None
    assert policy.lookup_reply_key(True, QWEN.with_(tool_replay_key=True)) == "tool"


# --- disk saves --------------------------------------------------------------------------------


def test_continued_saves_land_on_chunk_boundaries_only() -> None:
    """With 4096-token chunks after a 14,336-token restore only every other multiple is hit."""
    cfg = QWEN.with_(prefill_chunk=4_096, kv_disk_space_mb=64 * 1024)
    system = system_message(14_336)

    def continued(cfg) -> list[int]:
        model = CacheModel(cfg, progress=False)
        run_turn(model, Convo("warm", system, 15_000, seed=2), 1, cfg, grow=10)
        _, events = run_turn(model, Convo("main", system, 77_000, seed=3), 2, cfg, grow=10)
        return [e.checkpoint.tokens for e in of(events, ev.Stored) if e.reason == "continued"]

    assert continued(cfg) == [30_720, 51_200, 71_680]
    crossed = continued(cfg.with_(continued_trigger="crossed"))
    assert crossed[0] == 22_528 and len(crossed) == 6


def test_cold_save_at_the_chat_anchor_and_no_cold_save_past_cold_max() -> None:
    """A model with dedicated user/assistant tokens cuts at the chat anchor; Qwen has none
    (report 000: its cold save "always falls back" to the aligned cut)."""
    cfg = QWEN.with_(kv_disk_space_mb=8192, chat_anchor=True)
    model = CacheModel(cfg, progress=False)
    _, events = run_turn(model, Convo("a", SYSTEM, 6_000, seed=1), 1, cfg, grow=10)
    (cold,) = [e for e in of(events, ev.Stored) if e.reason == "cold"]
    assert cold.checkpoint.tokens == 2_000 and cold.checkpoint.trimmed > 0
    qwen = CacheModel(QWEN.with_(kv_disk_space_mb=8192), progress=False)
    result, events = run_turn(qwen, Convo("a", SYSTEM, 6_000, seed=1), 1, QWEN, grow=10)
    (cold,) = [e for e in of(events, ev.Stored) if e.reason == "cold"]
    assert cold.checkpoint.tokens == (result.prompt_tokens - 32) // 2048 * 2048 == 4_096
    model = CacheModel(cfg, progress=False)
    _, events = run_turn(model, Convo("b", SYSTEM, 31_000, seed=1), 1, cfg, grow=10)
    assert not [e for e in of(events, ev.Stored) if e.reason == "cold"]


def test_prefill_only_request_writes_the_cut_prefix_and_leaves_the_prompt_live() -> None:
    cfg = QWEN.with_(kv_disk_space_mb=8192)
    model = CacheModel(cfg)
    job = build_job(1, [{"role": "user", "content": synth_text(11_724, 1)}], None, 0, cfg)
    model.submit(job, 0.0)
    events = model.run_until_idle()
    r = finished(events)[1]
    assert (r.completion_tokens, r.finish, r.decode_s) == (0, "length", 0.0)
    assert [e.checkpoint.tokens for e in of(events, ev.Stored)] == [10_240]  # the cut, nothing else
    model.submit(build_job(2, [{"role": "user", "content": synth_text(11_724, 1)}], None, 10, cfg), model.now)
    assert finished(model.run_until_idle())[2].cached_tokens == 11_732


def test_restore_takes_the_longest_stored_prefix_and_honours_min_tokens() -> None:
    cfg = QWEN.with_(kv_disk_space_mb=64 * 1024)
    job = user_job(1, 20_000, 1)
    files = [
        Checkpoint(job.prompt.seq.prefix(n), "continued", "token-text", cfg.file_bytes(n), 0.0, 0.0)
        for n in (300, 4_000, 12_000)
    ]
    files.append(
        Checkpoint(user_job(9, 19_000, 2).prompt.seq, "evict", "token-text", cfg.file_bytes(19_000), 0.0, 0.0)
    )
    model = CacheModel(cfg, files, progress=False)
    model.submit(job, 0.0)
    assert finished(model.run_until_idle())[1].cached_tokens == 12_000
    strict = CacheModel(cfg.with_(kv_cache_min_tokens=16_000), files, progress=False)
    strict.submit(user_job(1, 20_000, 1), 0.0)
    assert finished(strict.run_until_idle())[1].cached_tokens == 0
    tiny = CacheModel(cfg, files[:1], progress=False)
    tiny.submit(user_job(1, 20_000, 1), 0.0)
    assert finished(tiny.run_until_idle())[1].cached_tokens == 0  # 300 < min 512


def test_may_build_consumes_deep_restored_checkpoints() -> None:
    cfg = QWEN.with_(kv_disk_space_mb=64 * 1024, consume_deep_hits=True)
    job = user_job(1, 40_000, 1)
    deep = Checkpoint(
        job.prompt.seq.prefix(35_000), "continued", "token-text", cfg.file_bytes(35_000), 0.0, 0.0
    )
    model = CacheModel(cfg, [deep], progress=False)
    model.submit(job, 0.0)
    events = model.run_until_idle()
    (hit,) = of(events, ev.DiskHit)
    assert hit.consumed and of(events, ev.Removed) and deep not in model.disk.files


# --- eviction ----------------------------------------------------------------------------------


def _file(
    tag: str, tokens: int, cfg, *, reason="evict", hits=0, t=0.0, seq: TokenSeq | None = None
) -> Checkpoint:
    seq = seq or TokenSeq(((tag,), ("~",) * (tokens - 1)))
    return Checkpoint(seq, reason, "token-text", cfg.file_bytes(tokens), created=t, last_used=t, hits=hits)


def test_base_eviction_keeps_restored_files_and_drops_the_oldest_never_restored() -> None:
    # No fixed part per file: every never-restored file scores the same, the tie-break decides.
    cfg = QWEN.with_(kv_disk_space_mb=1_000, fixed_bytes=0)  # fits two 10K-token files + change
    old_hit = _file("a", 10_000, cfg, hits=1, t=-100.0)
    older = _file("b", 10_000, cfg, t=-50.0)
    model = CacheModel(cfg, [old_hit, older], progress=False)
    model.submit(user_job(1, 10_200, 5, cfg), 0.0)
    events = model.run_until_idle()
    assert [e.checkpoint for e in of(events, ev.Evicted)] == [older]
    stored = [e.checkpoint for e in of(events, ev.Stored)]
    assert stored and all(cp in model.disk.files for cp in stored[-1:])  # the new file is protected
    idx = {type(e).__name__: i for i, e in enumerate(events) if isinstance(e, ev.Stored | ev.Evicted)}
    assert idx["Stored"] < idx["Evicted"]  # May build: evict after the store


def test_the_field_model_evicts_the_never_restored_file_that_waited_longest_however_long() -> None:
    # Seed figures 1: 34.5 KiB per token and nothing per file, so every never-restored file
    # scores the same and ds4's tie-break (older last use first) evicts the one that has waited
    # longest, even when it is the longest file: "the one the next switch was about to ask for".
    cfg = QWEN.with_(kv_disk_space_mb=1_000)
    assert cfg.fixed_bytes == 0
    old_long = _file("a", 12_000, cfg, t=-100.0)
    new_short = _file("b", 6_000, cfg, t=-1.0)
    model = CacheModel(cfg, [old_long, new_short], progress=False)
    model.submit(user_job(1, 10_200, 5, cfg), 0.0)
    evicted = [e.checkpoint for e in of(model.run_until_idle(), ev.Evicted)]
    assert evicted and evicted[0] is old_long and new_short not in evicted


def test_with_a_fixed_part_per_file_the_shortest_never_restored_file_goes_first() -> None:
    # ds4's score is tokens / file size: a part of a file that does not grow with its tokens
    # (DeepSeek's 22.9 MiB, ds4 4.3) makes a short file less dense, so among never-restored
    # files the shortest is evicted first, however recent (ds4 issue 444).
    cfg = QWEN.with_(kv_disk_space_mb=1_000, fixed_bytes=int(22.9 * 1024 * 1024))
    old_long = _file("a", 12_000, cfg, t=-100.0)
    new_short = _file("b", 6_000, cfg, t=-1.0)
    model = CacheModel(cfg, [old_long, new_short], progress=False)
    model.submit(user_job(1, 10_200, 5, cfg), 0.0)
    evicted = [e.checkpoint for e in of(model.run_until_idle(), ev.Evicted)]
    assert evicted and evicted[0] is new_short and old_long not in evicted


def test_hits_decay_with_a_six_hour_half_life() -> None:
    cfg = QWEN.with_(kv_disk_space_mb=1_000, fixed_bytes=0)  # equal density: only hits and age rank
    stale_hit = _file("a", 10_000, cfg, hits=1, t=-24 * 3600.0)  # 1 hit a day ago: 2^-4 = 0.06
    fresh = _file("b", 10_000, cfg, t=-10.0)
    model = CacheModel(cfg, [stale_hit, fresh], progress=False)
    model.submit(user_job(1, 10_200, 5, cfg), 0.0)
    assert [e.checkpoint for e in of(model.run_until_idle(), ev.Evicted)] == [fresh]
    very_stale = _file("c", 10_000, cfg, hits=1, t=-48 * 3600.0)  # 2^-8 < 0.01: counts as zero
    fresh2 = _file("d", 10_000, cfg, t=-10.0)
    model = CacheModel(cfg, [very_stale, fresh2], progress=False)
    model.submit(user_job(1, 10_200, 5, cfg), 0.0)
    assert [e.checkpoint for e in of(model.run_until_idle(), ev.Evicted)] == [very_stale]


@pytest.mark.parametrize("build", ["base", "aug"])
def test_august_eviction_makes_room_first_and_drops_superseded_continued_prefixes(build: str) -> None:
    cfg = QWEN.with_(kv_disk_space_mb=700, eviction=build)
    seq = user_job(1, 10_300, 5, cfg).prompt.seq
    prefix = _file("p", 8_192, cfg, reason="continued", t=-1.0, seq=seq.prefix(8_192))
    older_evict = _file("e", 8_000, cfg, t=-100.0)
    store = DiskStore(cfg, [older_evict, prefix])
    outcome = store.store(seq.prefix(10_240), "continued", "token-text", now=0.0)
    assert outcome.stored is not None
    if build == "aug":  # before the store; the superseded prefix is the cheap victim (x0.05)
        assert (outcome.evicted_before, outcome.evicted_after) == ([prefix], [])
    else:  # after the store; equal scores, so the older file goes
        assert (outcome.evicted_before, outcome.evicted_after) == ([], [older_evict])


def test_a_file_larger_than_the_budget_is_skipped() -> None:
    cfg = QWEN.with_(kv_disk_space_mb=100)
    model = CacheModel(cfg, progress=False)
    model.submit(user_job(1, 12_000, 1, cfg), 0.0)
    skipped = of(model.run_until_idle(), ev.Skipped)
    assert skipped and "exceeds budget 100 MiB" in skipped[0].because


def test_startup_pass_trims_to_the_budget() -> None:
    cfg = QWEN.with_(kv_disk_space_mb=500)
    files = [_file(str(i), 10_000, cfg, t=-float(i)) for i in range(3)]
    model = CacheModel(cfg, files, progress=False)
    assert len(of(model.startup(), ev.Evicted)) == 2 and model.disk.total <= model.disk.budget


# --- shutdown ----------------------------------------------------------------------------------


def test_shutdown_stops_decodes_drops_queued_and_persists_every_slot() -> None:
    cfg = QWEN.with_(batched_sessions=2, kv_disk_space_mb=8192)
    model = CacheModel(cfg)
    model.submit(user_job(1, 3_000, 1, cfg, max_tokens=400), 0.0)
    model.submit(user_job(2, 9_000, 2, cfg, max_tokens=400), 0.0)
    model.submit(user_job(3, 2_000, 3, cfg), 0.0)
    model.advance(15.0)  # 1 decoding, 2 prefilling, 3 queued
    model.shutdown(15.0)
    events = model.run_until_idle()
    res = finished(events)
    assert res[3].error == "shutdown requested" and res[3].slot == -1
    assert res[1].finish == "error" and 0 < res[1].completion_tokens < 400
    assert res[2].finish == "error" and res[2].completion_tokens == 0  # its prefill still completed
    persisted = of(events, ev.Persisting)
    assert [p.slot for p in persisted] == [0, 1]
    shut = [e for e in of(events, ev.Stored) if e.reason == "shutdown"]
    assert [s.checkpoint.tokens for s in shut] == [p.tokens for p in persisted]
    assert isinstance(events[-1], ev.ShutdownComplete) and model.done


def test_thinking_off_requests_generate_no_hidden_reasoning() -> None:
    cfg = QWEN.with_(hidden_reasoning=True)
    messages = [{"role": "user", "content": synth_text(600, 1)}]
    assert build_job(1, messages, None, 100, cfg).reply.hidden_tokens > 0
    assert build_job(1, messages, None, 100, cfg, thinking=False).reply.hidden_tokens == 0
    for off in (
        {"thinking": {"type": "disabled"}},
        {"think": False},
        {"reasoning_effort": "none"},
        {"model": "deepseek-chat"},
    ):
        assert not thinking_requested(off)
    assert thinking_requested({"model": "x", "thinking": {"type": "enabled"}})
