"""The llama model's two walkers give the same answers: the server loop (`LlamaModel`) fed one
request at a time and the sequential walker (`LlamaWalker`), on drawn settings (slots, unified KV,
host cache sizes down to a few MiB, checkpoint counts and spacing, similarity, cache reuse, idle
slots, builds before each rule change) and drawn conversations (growing, compacted, edited in the
middle, switching, pinned to a slot, without prompt caching): equal results, equal events, equal
slots and host cache at the end."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay.sim.model.llama import events as ev
from replay.sim.model.llama.config import LlamaConfig, llama_config
from replay.sim.model.llama.engine import LlamaModel
from replay.sim.model.llama.prompt import ChatTokenizer, LlamaJob
from replay.sim.model.llama.sequential import LlamaWalker
from replay.trace.synth import synth_text
from tests.support.llama_jobs import chat_job, tiny_tokenizer


@st.composite
def configs(draw: st.DrawFn) -> LlamaConfig:
    preset = draw(st.sampled_from(["tiny-llama", "tiny-gemma2", "report002-hybrid"]))
    n_ubatch = draw(st.sampled_from([32, 128, 512]))
    return llama_config(
        preset,
        n_ctx=draw(st.sampled_from([8192, 16384])),
        n_parallel=draw(st.sampled_from([1, 2, 3])),
        kv_unified=draw(st.booleans()),
        n_ubatch=n_ubatch,
        n_batch=draw(st.sampled_from([n_ubatch, 4 * n_ubatch, 2048])),
        cache_ram_mib=draw(
            st.sampled_from([0, 1, 2, 8192, -1])
            if preset != "report002-hybrid"
            else st.sampled_from([0, 200, 8192])
        ),
        ctx_checkpoints=draw(st.sampled_from([0, 1, 2, 32])),
        checkpoint_min_step=draw(st.sampled_from([64, 1024, 8192])),
        checkpoint_every_nt=draw(st.sampled_from([256, 8192])),
        slot_prompt_similarity=draw(st.sampled_from([0.0, 0.1, 0.5])),
        cache_reuse=draw(st.sampled_from([0, 16, 256])),
        cache_idle_slots=draw(st.booleans()),
        swa_full=draw(st.booleans()) if preset == "tiny-gemma2" else False,
        build=draw(st.sampled_from([None, 9294, 10068, 11063])),
    )


@st.composite
def workloads(draw: st.DrawFn, cfg: LlamaConfig) -> list[LlamaJob]:
    tok = tiny_tokenizer() if cfg.preset.startswith("tiny") else ChatTokenizer(None, None)
    n = draw(st.integers(1, 3))
    system = {"role": "system", "content": synth_text(draw(st.integers(5, 400)), 1)}
    convos = [[system] if draw(st.booleans()) else [] for _ in range(n)]
    jobs = []
    for job_id, who in enumerate(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=9)), 1):
        msgs = convos[who]
        op = draw(st.sampled_from(["turn", "turn", "turn", "compact", "edit"]))
        if op == "compact" and msgs:
            msgs[:] = msgs[:1]
        if op == "edit" and len(msgs) > 1:
            i = draw(st.integers(0, len(msgs) - 1))
            msgs[i] = {**msgs[i], "content": msgs[i]["content"] + " edited"}
        msgs.append({"role": "user", "content": synth_text(draw(st.integers(1, 1500)), job_id * 7 + who)})
        params: dict[str, Any] = {}
        if draw(st.integers(0, 9)) == 0:
            params["cache_prompt"] = False
        if cfg.n_slots > 1 and draw(st.integers(0, 9)) == 0:
            params["id_slot"] = draw(st.integers(0, cfg.n_slots - 1))
        job = chat_job(job_id, list(msgs), draw(st.sampled_from([1, 4, 40])), tok, **params)
        job.n_cache_reuse = cfg.cache_reuse_on
        jobs.append(job)
        msgs.append({"role": "assistant", "content": synth_text(draw(st.integers(1, 60)), job_id)})
    return jobs


def _state(slots: Any, cache: Any) -> Any:
    return (
        [
            (len(s.tokens), [(c.n_tokens, c.pos_min, c.pos_max, c.size) for c in s.checkpoints], s.t_last)
            for s in slots
        ],
        [(len(e.tokens), e.size) for e in cache.entries] if cache is not None else None,
    )


def by_loop(cfg: LlamaConfig, jobs: list[LlamaJob]) -> Any:
    model = LlamaModel(cfg, progress=False)
    events: list[ev.Event] = []
    for job in jobs:
        model.submit(job, model.now)
        events += model.run_until_idle()
    return events, model.now, _state(model.slots, model.ctx.cache)


def by_walker(cfg: LlamaConfig, jobs: list[LlamaJob]) -> Any:
    walker = LlamaWalker(cfg)
    for job in jobs:
        walker.serve(job)
    return walker.drain(), walker.now, _state(walker.ctx.slots, walker.ctx.cache)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(data=st.data())
def test_the_walker_equals_the_loop(data: st.DataObject) -> None:
    cfg = data.draw(configs())
    jobs = data.draw(workloads(cfg))
    loop_events, loop_now, loop_state = by_loop(cfg, jobs)
    walk_events, walk_now, walk_state = by_walker(cfg, jobs)
    loop_results = [e.result for e in loop_events if isinstance(e, ev.Finished)]
    walk_results = [e.result for e in walk_events if isinstance(e, ev.Finished)]
    assert walk_results == loop_results
    assert walk_events == loop_events
    assert (walk_now, walk_state) == (loop_now, loop_state)
