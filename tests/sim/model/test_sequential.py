"""The sequential path gives `CacheModel`'s results to the last bit, on generated workloads.

`replay.sim.model.sequential` re-walks a job's life without the event loop; these tests run both on the
same jobs, one request at a time, across the settings that change the walk (interval and its
trigger, chunk, cold max, eviction build, consumed hits, hidden reasoning and its key, slots and
routing, tiny and roomy budgets, stale files) and require equal results, request by request.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from replay.metrics.switch import SwitchTracker
from replay.sim.model import events as ev
from replay.sim.model.config import MiB, SimConfig, config_for
from replay.sim.model.engine import CacheModel
from replay.sim.model.job import Job, build_job
from replay.sim.model.render import Rendered, render
from replay.sim.model.reply import TABLE_WORDS, reply_text
from replay.sim.model.sequential import DiskLane, LiveSlots
from replay.sim.model.tokenizer import _TOKEN, tokenize
from replay.sizing import StaleFile, SweepRow, jobs_from_trace, sweep
from replay.sizing.rows import stale_checkpoints
from replay.sizing.sweep import _Tally
from replay.sizing.timeline import Scheduled, Sent
from replay.trace import TraceWriter, materialize, read_trace, recorded_reply
from replay.trace.synth import synth_text

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


@st.composite
def configs(draw: st.DrawFn) -> SimConfig:
    align = draw(st.sampled_from([0, 256, 1024]))
    return config_for(
        draw(st.sampled_from(["qwen38-q2", "deepseek-v4-flash"])),
        ctx=200_000,
        disk=True,
        kv_disk_space_mb=draw(st.integers(40, 3_000)),
        kv_cache_min_tokens=draw(st.sampled_from([64, 512])),
        kv_cache_cold_max_tokens=draw(st.sampled_from([0, 3_000, 30_000])),
        kv_cache_continued_interval_tokens=draw(st.sampled_from([0, 700, 2_048, 5_000])),
        kv_cache_boundary_align_tokens=align,
        prefill_chunk=draw(st.sampled_from([256, 1_000, 2_048])),
        continued_trigger=draw(st.sampled_from(["exact", "crossed"])),
        eviction=draw(st.sampled_from(["base", "aug"])),
        consume_deep_hits=draw(st.booleans()),
        hidden_reasoning=draw(st.booleans()),
        visible_key=draw(st.sampled_from(["no-tools", "tool-calls", "all", "none"])),
        tool_replay_key=draw(st.booleans()),
        batched_sessions=draw(st.sampled_from([None, None, 2, 3])),
        routing=draw(st.sampled_from(["upstream", "reuse-aware"])),
    )


@st.composite
def workloads(draw: st.DrawFn, cfg: SimConfig) -> list[Job]:
    """Up to four conversations taking turns in a drawn order, live history (the server's own
    replies resent, reasoning dropped), sometimes with tools, sometimes restarted (compaction)."""
    n = draw(st.integers(1, 4))
    shared = {"role": "system", "content": synth_text(draw(st.integers(50, 3_000)), 1)}
    convos: list[dict[str, Any]] = []
    for i in range(n):
        own = draw(st.booleans())
        system = (
            {"role": "system", "content": synth_text(draw(st.integers(50, 2_000)), 10 + i)} if own else shared
        )
        convos.append({"system": system, "tools": TOOLS if draw(st.booleans()) else None, "msgs": [system]})
    jobs = []
    for job_id, who in enumerate(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=14)), 1):
        c = convos[who]
        if draw(st.integers(0, 9)) == 0:
            c["msgs"] = [c["system"]]  # compaction: the conversation starts over from its system prompt
        c["msgs"].append({"role": "user", "content": synth_text(draw(st.integers(1, 6_000)), job_id)})
        finish = "tool_calls" if c["tools"] and draw(st.booleans()) else "stop"
        job = build_job(
            job_id,
            list(c["msgs"]),
            c["tools"],
            draw(st.sampled_from([0, 1, 30, 900])),
            cfg,
            finish=finish,
            session=f"s{who}",
        )
        jobs.append(job)
        reply = job.reply.message()
        reply.pop("reasoning", None)
        c["msgs"].append(reply)
        if reply.get("tool_calls"):
            c["msgs"].append({"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "ok"})
    return jobs


def _stale(cfg: SimConfig, count: int) -> list[StaleFile]:
    return [StaleFile(3_000 + 500 * i, hits=i % 3, age_s=3_600.0 * i) for i in range(count)]


def _by_event_loop(cfg: SimConfig, jobs: list[Job], stale: list[StaleFile]) -> dict[str, Any]:
    model = CacheModel(cfg, stale_checkpoints(stale, cfg), progress=False)
    events = model.startup()
    for job in jobs:
        events += model.run_until_idle()
        model.submit(job, model.now)
        events += model.drain()
    events += model.run_until_idle()
    # The most the directory held, the moment between a May-build write and its eviction included.
    peak = model.disk.peak if model.disk else 0
    evicted = [e.checkpoint for e in events if isinstance(e, ev.Evicted)]
    return {
        "results": [e.result for e in events if isinstance(e, ev.Finished)],
        "restores": sum(isinstance(e, ev.DiskHit) for e in events),
        "stores": Counter(e.reason for e in events if isinstance(e, ev.Stored)),
        "evictions": (len(evicted), sum(cp.hits == 0 for cp in evicted)),
        "peak": peak,
        "now": model.now,
        "files": sorted((cp.tokens, cp.reason, cp.hits) for cp in model.disk.files) if model.disk else [],
    }


def _sequentially(cfg: SimConfig, jobs: list[Job], stale: list[StaleFile]) -> dict[str, Any]:
    slots, lane = LiveSlots(cfg), DiskLane(cfg, stale_checkpoints(stale, cfg))
    results = [lane.serve(job, slots.admit(job)) for job in jobs]
    return {
        "results": results,
        "restores": lane.restores,
        "stores": lane.stores,
        "evictions": (lane.evictions, lane.evictions_zero_hits),
        "peak": lane.peak_disk_bytes,
        "now": lane.now,
        "files": sorted((cp.tokens, cp.reason, cp.hits) for cp in lane.disk.files) if lane.disk else [],
    }


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_sequential_path_equals_the_event_loop(data: st.DataObject) -> None:
    cfg = data.draw(configs())
    jobs = data.draw(workloads(cfg))
    stale = _stale(cfg, data.draw(st.integers(0, 3)))
    expected, got = _by_event_loop(cfg, jobs, stale), _sequentially(cfg, jobs, stale)
    for want, have in zip(expected["results"], got["results"], strict=True):
        assert have == want
    assert got == expected


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_lane_copy_goes_on_exactly_as_the_lane_and_on_its_own(data: st.DataObject) -> None:
    cfg = data.draw(configs())
    jobs = data.draw(workloads(cfg))
    cut = data.draw(st.integers(0, len(jobs)))
    slots, lane = LiveSlots(cfg), DiskLane(cfg, stale_checkpoints(_stale(cfg, 2), cfg))
    lives = [slots.admit(job) for job in jobs]
    for job, live in zip(jobs[:cut], lives, strict=False):
        lane.serve(job, live)
    twin = lane.copy(cfg)
    # Every field of the lane is carried over, so a field added to DiskLane must be copied too.
    fields = [name for name in dir(lane) if not name.startswith("__") and not callable(getattr(lane, name))]
    assert {name for name in fields if name not in ("cfg", "disk", "walk")} == _COPIED
    for name in _COPIED:
        assert getattr(twin, name) == getattr(lane, name), name
    rest = list(zip(jobs[cut:], lives[cut:], strict=True))
    assert [twin.serve(j, live) for j, live in rest] == [lane.serve(j, live) for j, live in rest]
    assert _counts(twin) == _counts(lane)
    if twin.disk is not None and lane.disk is not None:
        assert not {id(cp) for cp in twin.disk.files} & {id(cp) for cp in lane.disk.files}  # nothing shared
        assert [(cp.tokens, cp.hits) for cp in twin.disk.files] == [
            (cp.tokens, cp.hits) for cp in lane.disk.files
        ]


_COPIED = {
    "now",
    "last_store",
    "restores",
    "stores",
    "evictions",
    "evictions_zero_hits",
    "peak_disk_bytes",
    "saves",
    "_prefill_s",
    "_dt",
}


def _counts(lane: DiskLane) -> tuple[Any, ...]:
    return (
        lane.now,
        lane.restores,
        lane.evictions,
        lane.evictions_zero_hits,
        lane.stores,
        lane.peak_disk_bytes,
    )


def _event_loop_row(cfg: SimConfig, jobs: list[Job], budget: int, stale: list[StaleFile]) -> SweepRow:
    """A sweep row as one event-loop model, fed one request at a time, gives it."""
    model = CacheModel(
        cfg.with_(kv_disk_space_mb=budget // MiB), stale_checkpoints(stale, cfg), progress=False
    )
    tally = _Tally(SweepRow(budget, cfg.slots, cfg.routing))
    tracker = SwitchTracker()
    for e in model.startup():
        tally.add(e)
    for job in jobs:
        for e in model.run_until_idle():
            tally.add(e)
        tally.add(Sent(model.now, Scheduled(0.0, job), tracker.on_send(job.session, False)))
        model.submit(job, model.now)
        for e in model.drain():
            tally.add(e)
    for e in model.run_until_idle():
        tally.add(e)
    assert model.disk is not None
    tally.row.peak_disk_bytes = model.disk.peak
    return tally.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_sweep_rows_equal_one_event_loop_per_budget(data: st.DataObject) -> None:
    """Budgets share the live slots and replay each other's walks; every row is still exact."""
    cfg = data.draw(configs())
    jobs = data.draw(workloads(cfg))
    stale = _stale(cfg, data.draw(st.integers(0, 2)))
    budgets = sorted(data.draw(st.sets(st.integers(40, 3_000), min_size=2, max_size=4)))
    report = sweep([(0.0, j) for j in jobs], [b * MiB for b in budgets], cfg=cfg, stale=stale)
    for row in report.rows:
        assert row == _event_loop_row(cfg, jobs, row.budget_bytes, stale)


def test_sweep_rows_equal_the_event_loop_per_layout() -> None:
    """Budgets and slot layouts in one sequential sweep, each row as a lone event-loop run gives it."""
    cfg = config_for(kv_cache_continued_interval_tokens=2_048, prefill_chunk=1_024)
    convos = {name: [{"role": "system", "content": synth_text(1_500, 1)}] for name in "abc"}
    jobs = []
    for job_id, name in enumerate("abcabcaabbcabc", 1):
        convos[name].append({"role": "user", "content": synth_text(2_500 + 300 * job_id, job_id)})
        job = build_job(job_id, list(convos[name]), None, 60, cfg, session=name)
        convos[name].append(job.reply.message())
        jobs.append(job)
    budgets = [150 * MiB, 600 * MiB, 4_000 * MiB]
    report = sweep(
        [(0.0, j) for j in jobs], budgets, cfg=cfg, slots=[None, 2], routings=["upstream", "reuse-aware"]
    )
    assert len(report.rows) == 12
    for row in report.rows:
        layout = cfg.with_(routing=row.routing, batched_sessions=None if row.slots == 1 else row.slots)
        assert row == _event_loop_row(layout, jobs, row.budget_bytes, [])
    assert len({(r.restores, r.evictions) for r in report.rows}) > 1  # the budgets do differ


# --- turn-by-turn rendering (what lets a sweep read a long trace quickly) ----------------------

ROLES = st.sampled_from(["system", "user", "assistant", "tool"])


@st.composite
def messages(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(0, 8))):
        msg: dict[str, Any] = {"role": draw(ROLES), "content": synth_text(draw(st.integers(0, 30)), i)}
        if msg["role"] == "assistant" and draw(st.booleans()):
            msg["tool_calls"] = [{"id": f"c{i}", "name": "bash", "arguments": '{"x": 1}'}]
        out.append(msg)
    return out


@given(msgs=messages(), cuts=st.lists(st.integers(0, 8), max_size=3), tools=st.sampled_from([None, TOOLS]))
def test_rendering_turn_by_turn_equals_rendering_at_once(msgs, cuts, tools) -> None:
    whole = render(msgs, tools)
    done, start = Rendered(tools), 0
    for cut in sorted(min(c, len(msgs)) for c in cuts):
        done, start = done.add(msgs[start:cut]), cut
    part = done.add(msgs[start:]).prompt()
    assert (part.seq.tokens(), part.anchor, part.has_tools) == (
        whole.seq.tokens(),
        whole.anchor,
        whole.has_tools,
    )


def test_sweep_jobs_from_a_trace_equal_jobs_rendered_whole(tmp_path) -> None:
    """Turn-by-turn rendering in `jobs_from_trace` (live and recorded history, a compaction, a
    change of tools) gives the prompts and replies of rendering each request whole."""
    path = tmp_path / "t.jsonl"
    system = {"role": "system", "content": synth_text(300, 1)}
    with TraceWriter(path, source="test") as w:
        w.session("a")
        msgs: list[dict[str, Any]] = [system]
        for turn in range(6):
            tools = TOOLS if turn < 4 else None
            if turn == 3:
                msgs = [system, {"role": "user", "content": "summary " + synth_text(50, 9)}]  # compaction
            msgs.append({"role": "user", "content": {"synth": {"tokens": 40 + turn, "seed": turn}}})
            reply = {"message": {"role": "assistant", "content": f"recorded {turn}"}, "output_tokens": 12}
            w.request("a", float(turn), list(msgs), {"max_tokens": 12, "tools": tools}, reply=reply)
            msgs.append(reply["message"])
    for history in ("live", "recorded"):
        cfg = config_for()
        trace = read_trace(path)
        fast = list(jobs_from_trace(trace.requests, cfg, history))
        replies: dict[int, dict[str, Any]] = {}
        recorded = recorded_reply(trace.by_id())
        for (_, job), req in zip(fast, trace.requests, strict=True):
            reply_for = recorded if history == "recorded" else replies.__getitem__
            whole = build_job(
                req.id, materialize(req, reply_for), req.params.get("tools"), 12, cfg, session="a"
            )
            replies[req.id] = whole.reply.message()
            assert job.prompt.seq.tokens() == whole.prompt.seq.tokens()
            assert (job.prompt.anchor, job.prompt.has_tools) == (whole.prompt.anchor, whole.prompt.has_tools)
            assert job.reply == whole.reply


@given(tokens=st.integers(0, 400), seed=st.integers(0, 2**40))
@example(tokens=300, seed=TABLE_WORDS - 7)  # runs past the word table's end
@example(tokens=1, seed=TABLE_WORDS - 1)
def test_reply_text_puts_exactly_its_tokens_in_the_cache(tokens: int, seed: int) -> None:
    """Generated replies skip the tokenizer's regex: what they remember must be what it finds."""
    text = reply_text(tokens, seed)
    assert text == reply_text(tokens, seed)
    assert tokenize(text) == tuple(_TOKEN.findall(text)) and len(tokenize(text)) == tokens
