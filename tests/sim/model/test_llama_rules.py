"""llama-server's cache rules one at a time, on the model: slot choice, the host prompt cache,
checkpoint positions and resumes, `--cache-reuse`, slot files, and which build has which rule."""

from __future__ import annotations

from replay.sim.model.llama import events as ev
from replay.sim.model.llama.build import rules_for
from replay.sim.model.llama.config import LlamaConfig, llama_config
from replay.sim.model.llama.engine import LlamaModel
from replay.sim.model.llama.prompt import ChatTokenizer, LlamaJob
from replay.sim.model.llama.sequential import LlamaWalker
from replay.trace.synth import synth_text
from tests.support.llama_jobs import chat_job

WORDS = ChatTokenizer(None, None)  # the simulator's word tokenizer: one token per word


def serve(cfg: LlamaConfig, jobs: list[LlamaJob]) -> tuple[list[ev.LlamaResult], list[ev.Event]]:
    walker = LlamaWalker(cfg)
    results = [walker.serve(j) for j in jobs]
    return results, walker.drain()


def doc(tokens: int, seed: int, question: int = 40, qseed: int = 1) -> list[dict[str, str]]:
    """A document and a question in one user message (field report 002's prompts)."""
    return [{"role": "user", "content": synth_text(tokens, seed) + "\n" + synth_text(question, 1000 + qseed)}]


def test_empty_slots_go_by_lru_and_ties_take_the_last_slot() -> None:
    cfg = llama_config("tiny-llama", n_parallel=3, cache_ram_mib=0)
    _, events = serve(cfg, [chat_job(1, "the cat")])
    selected = [e for e in events if isinstance(e, ev.SlotSelected)]
    assert [(e.by, e.slot) for e in selected] == [("lru", 2)]


def test_a_prompt_goes_back_to_the_slot_holding_it_and_id_slot_pins_another() -> None:
    cfg = llama_config("tiny-llama", n_parallel=2, cache_ram_mib=0)
    a, b = synth_text(300, 1), synth_text(300, 2)
    jobs = [chat_job(1, a), chat_job(2, b), chat_job(3, a), chat_job(4, b, id_slot=1)]
    results, _ = serve(cfg, jobs)
    assert [r.slot for r in results] == [1, 0, 1, 1]
    assert results[2].cache_n == results[2].prompt_tokens - 1  # all but the last token
    assert results[3].prompt_n > 300  # pinned to the slot holding the other prompt


def test_a_slot_that_changes_hands_stores_its_prompt_in_host_memory_and_gets_it_back() -> None:
    a, b = synth_text(1000, 1), synth_text(1000, 2)
    jobs = [chat_job(1, a), chat_job(2, b), chat_job(3, a)]
    results, events = serve(llama_config("tiny-llama", n_parallel=1), jobs)
    assert results[2].prompt_n == 1
    assert [e.tokens for e in events if isinstance(e, ev.PromptSaved)] == [
        len(jobs[0].full),
        len(jobs[1].full),
    ]
    off, _ = serve(llama_config("tiny-llama", n_parallel=1, cache_ram_mib=0), jobs)
    assert off[2].cache_n < 10


def test_a_small_host_cache_drops_its_oldest_prompt_first() -> None:
    # tiny-llama: 512 + 12 bytes per token; three ~1,000-token states do not fit in 1 MiB.
    texts = [synth_text(1000, s) for s in (1, 2, 3)]
    jobs = [chat_job(i + 1, t) for i, t in enumerate(texts)] + [chat_job(4, texts[0]), chat_job(5, texts[1])]
    results, events = serve(llama_config("tiny-llama", n_parallel=1, cache_ram_mib=1), jobs)
    dropped = [e for e in events if isinstance(e, ev.PromptDropped)]
    assert dropped and all(e.cause == "room" for e in dropped)
    assert results[3].prompt_n > 900  # the first prompt was dropped to make room
    assert results[4].prompt_n > 900


def test_a_hybrid_model_checkpoints_only_near_the_end_of_a_single_message_prompt() -> None:
    """Field report 002: "末尾の 512 トークン手前と、4 トークン手前" (n_ubatch 512: 4 + 512 and 4)."""
    cfg = llama_config("report002-hybrid", n_parallel=1)
    job = LlamaJob(1, *_prompt_and_reply(doc(31_000, 1), 8))
    _, events = serve(cfg, [job])
    made = [e.checkpoint.n_tokens for e in events if isinstance(e, ev.CheckpointCreated)]
    assert made == [job.n_tokens - 516, job.n_tokens - 4]


def _prompt_and_reply(messages: list[dict[str, str]], n: int) -> tuple[object, object]:
    from replay.sim.model.llama.prompt import make_reply, render

    prompt = render(messages, None, WORDS)
    return prompt, make_reply(prompt, n, WORDS)


def _job(job_id: int, messages: list[dict[str, str]], n: int = 8) -> LlamaJob:
    prompt, reply = _prompt_and_reply(messages, n)
    return LlamaJob(job_id, prompt, reply)  # type: ignore[arg-type]


def test_the_hybrid_model_resumes_only_at_a_checkpoint_before_the_change() -> None:
    """E1 resends: resumes 4 before the end. E2 another question: resumes at end - 516. E3 a line
    inserted in the middle: no checkpoint before it, everything again."""
    cfg = llama_config("report002-hybrid", n_parallel=1)
    first = doc(8_000, 1)
    other_question = doc(8_000, 1, question=39, qseed=2)
    edited = [{"role": "user", "content": first[0]["content"].replace(" ", " inserted line of text ", 1)}]
    results, events = serve(cfg, [_job(1, first), _job(2, first), _job(3, other_question), _job(4, edited)])
    p = results[0].prompt_tokens
    assert results[1].prompt_n == 4
    assert results[2].prompt_n == results[2].prompt_tokens - (p - 516)
    assert results[3].cache_n == 0
    assert any(isinstance(e, ev.FullReprocess) for e in events)


def test_the_hybrid_model_comes_back_from_host_memory_with_its_checkpoints() -> None:
    """E4: another document in between; the first comes back from `--cache-ram` and resumes 4
    tokens before its end. Without a host cache it is read again."""
    jobs = [_job(1, doc(8_000, 1)), _job(2, doc(8_000, 2)), _job(3, doc(8_000, 1))]
    on, _ = serve(llama_config("report002-hybrid", n_parallel=1), jobs)
    assert on[2].prompt_n == 4
    off, _ = serve(llama_config("report002-hybrid", n_parallel=1, cache_ram_mib=0), jobs)
    assert off[2].cache_n == 0


def test_a_slot_file_brings_back_checkpoints_only_from_b11549_on() -> None:
    """E5: save the slot, a new server, restore it, resend. b11063's file holds KV only: "forcing
    full prompt re-processing"; b11549 appends the checkpoints, so the resend resumes at end - 4."""
    for build, want_cached in ((11063, 0), (11549, None)):
        cfg = llama_config("report002-hybrid", n_parallel=1, build=build)
        first = _job(1, doc(8_000, 1))
        old = LlamaWalker(cfg)
        old.serve(first)
        file = old.save(0)
        new = LlamaWalker(cfg)
        new.restore(0, file)
        again = new.serve(_job(2, doc(8_000, 1)))
        expected = first.n_tokens - 4 if want_cached is None else want_cached
        assert again.cache_n == expected, build
        assert bool(file.checkpoints) == (build >= 11549)


def test_cache_reuse_moves_a_shifted_chunk_on_a_plain_model_and_is_off_for_a_windowed_one() -> None:
    """The second prompt drops 50 words from the first's middle: after the common prefix, the
    rest is further on in the slot (the greedy scan moves chunks of at least 256 tokens)."""
    keep, cut, body = synth_text(30, 5), synth_text(50, 3), synth_text(600, 4)
    first = [{"role": "user", "content": keep + " " + cut + " " + body}]
    second = [{"role": "user", "content": keep + " " + body}]
    for preset, reused in (("tiny-llama", True), ("tiny-gemma2", False)):
        cfg = llama_config(preset, n_parallel=1, cache_reuse=256)
        a, b = chat_job(1, first), chat_job(2, second)
        a.n_cache_reuse = b.n_cache_reuse = 256
        results, events = serve(cfg, [a, b])
        chunks = [e for e in events if isinstance(e, ev.CacheReuseChunk)]
        assert bool(chunks) == reused, preset
        assert (results[1].cache_n > 500) == reused, preset


def test_checkpoint_rules_follow_the_build() -> None:
    """b9294: a checkpoint every 8192 prompt tokens; b10068 on: at the last user message's start
    instead, and the end ones."""
    system = {"role": "system", "content": synth_text(200, 9)}
    msgs = [system, {"role": "user", "content": synth_text(20_000, 1)}]
    made = {}
    for build in (9294, 11549):
        cfg = llama_config("report002-hybrid", n_parallel=1, build=build)
        job = _job(1, msgs)
        _, events = serve(cfg, [job])
        made[build] = [e.checkpoint.n_tokens for e in events if isinstance(e, ev.CheckpointCreated)]
        end = [job.n_tokens - 516, job.n_tokens - 4]
        assert made[build][-2:] == end
    assert made[9294][:-2] == [8192, 16384]
    assert made[11549][:-2] == [job.prompt.last_user]
    assert not rules_for(11063).slot_file_checkpoints and rules_for(11549).slot_file_checkpoints


def test_idle_slots_are_stored_and_with_a_unified_cache_cleared_when_a_task_starts() -> None:
    a, b = synth_text(500, 1), synth_text(500, 2)
    for unified in (False, True):
        cfg = llama_config("tiny-llama", n_parallel=2, kv_unified=unified)
        model = LlamaModel(cfg, progress=False)
        events: list[ev.Event] = []
        for job in (chat_job(1, a), chat_job(2, b)):
            model.submit(job, model.now)
            events += model.run_until_idle()
        idle = [e for e in events if isinstance(e, ev.IdleSlotSaved)]
        assert idle and all(e.cleared == unified for e in idle)
        held = [len(s.tokens) for s in model.slots]
        assert (0 in held) == unified


def test_a_prompt_over_the_slot_context_fails_after_its_slot_was_chosen() -> None:
    cfg = llama_config("tiny-llama", n_parallel=1, n_ctx=1024)
    results, events = serve(cfg, [chat_job(1, synth_text(300, 1)), chat_job(2, synth_text(2000, 2))])
    assert (
        results[1].error is not None
        and "exceeds the available context size (1024 tokens)" in results[1].error
    )
    assert any(isinstance(e, ev.PromptSaved) for e in events)  # the slot changed hands first


def test_the_model_takes_the_settings_a_servers_startup_log_shows() -> None:
    """`from_settings` with what `llamacpp_settings` reads from a real startup log (the captured
    np2 session: two slots, 8192 each, no host cache) and a build number."""
    from pathlib import Path

    from drivers.logs import llamacpp as ll
    from drivers.logs.effective import llamacpp_settings
    from replay.sim.model.llama.config import from_settings

    log = Path(__file__).resolve().parents[2] / "data" / "llama" / "llama_server_np2.log"
    settings = llamacpp_settings(ll.parse_files([log]).events)
    cfg = from_settings(llama_config("tiny-llama"), dict(settings))
    assert (cfg.n_slots, cfg.unified, cfg.n_ctx_slot, cfg.prompt_cache_on) == (2, False, 8192, False)
    assert cfg.rules.build == 11549  # the log says b0-unknown: the wheel's build stands
    old = from_settings(cfg, {"build": 11063, "cache_ram_mib": 4096})
    assert old.rules.build == 11063 and not old.rules.slot_file_checkpoints and old.cache_ram_mib == 4096
