"""`replay size sweep TRACE --server llama`: the host prompt cache (`--cache-ram`) and slot count
(`-np`) a llama-server user needs, from the llama cache model walked over the trace.

Each setting walks the trace's requests one after another (as `replay run --plan alternate`
sends them) through `LlamaWalker`, the sequential walker of llama-server's rules; the event-loop
model (`LlamaModel`) gives the same results request by request (tests/sizing/test_size_llama.py
draws traces and settings and holds the two to each other). A switch is a request that comes back to a
session after another session's request (a session's first request is not one); the smallest host cache that keeps switches cheap is the smallest whose
worst switch re-processes no more than `--target` tokens, or, without one, no more than the
largest cache's worst switch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from replay.sim.model.llama import events as ev
from replay.sim.model.llama.config import PRESETS, LlamaConfig, llama_config
from replay.sim.model.llama.engine import LlamaModel
from replay.sim.model.llama.prompt import ChatTokenizer, LlamaJob, make_reply, render
from replay.sim.model.llama.sequential import LlamaWalker
from replay.trace.materialize import materialize, plain_message, recorded_message
from replay.trace.model import Request

Walk = Literal["walker", "loop"]


def llama_jobs(
    requests: Iterable[Request], cfg: LlamaConfig, tok: ChatTokenizer, history: str
) -> list[LlamaJob]:
    """The trace's requests as the llama model's tasks, in trace order: messages rendered as
    llama-server renders them; replies as recorded (`recorded`) or the model's own (`live`)."""
    replies: dict[int, dict[str, Any]] = {}
    jobs: list[LlamaJob] = []
    for i, req in enumerate(requests, 1):
        messages = [plain_message(m) for m in materialize(req, replies.__getitem__)]
        prompt = render(messages, req.params.get("tools"), tok)
        cap = (
            req.params.get("max_tokens")
            or req.params.get("max_completion_tokens")
            or cfg.default_reply_tokens
        )
        n = max(0, min(int(cap), cfg.n_ctx_slot - len(prompt)))
        reply = make_reply(prompt, n, tok)
        slot = req.params.get("id_slot")
        job = LlamaJob(
            i,
            prompt,
            reply,
            session=req.session,
            cache_prompt=req.params.get("cache_prompt", True) is not False,
            id_slot=slot if isinstance(slot, int) else -1,
            n_cache_reuse=cfg.cache_reuse_on,
        )
        jobs.append(job)
        replies[req.id] = (
            recorded_message(req)
            if history == "recorded"
            else {"role": "assistant", "content": reply.content}
        )
    return jobs


def walk(
    cfg: LlamaConfig, jobs: Sequence[LlamaJob], how: Walk = "walker"
) -> tuple[list[ev.LlamaResult], list[ev.Event]]:
    """Every job's result and the model's events, one job at a time: by the sequential walker, or
    by the event-loop model fed each job once the last is done."""
    if how == "walker":
        walker = LlamaWalker(cfg)
        results = [walker.serve(job) for job in jobs]
        return results, walker.drain()
    model = LlamaModel(cfg, progress=False)
    events: list[ev.Event] = []
    for job in jobs:
        model.submit(job, model.now)
        events += model.run_until_idle()
    return [e.result for e in events if isinstance(e, ev.Finished)], events


@dataclass(frozen=True, slots=True)
class LlamaRow:
    """One setting's walk of the trace."""

    n_parallel: int
    cache_ram_mib: int
    requests: int
    reprocessed: int  # tokens re-processed over the trace
    switches: int
    switch_reprocessed: int  # of them, on switches
    worst_switch: int  # the most one switch re-processed
    host_restores: int  # prompts found again in the host cache
    host_evictions: int  # prompts dropped from it to make room or over a limit
    prompt_s: float  # modelled prefill seconds over the trace

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


def row(
    cfg: LlamaConfig, jobs: Sequence[LlamaJob], results: Sequence[ev.LlamaResult], events: Sequence[ev.Event]
) -> LlamaRow:
    switches = []
    seen: set[str | None] = set()
    for i, (job, r) in enumerate(zip(jobs, results, strict=True)):
        if i > 0 and job.session != jobs[i - 1].session and job.session in seen:
            switches.append(r.prompt_n)
        seen.add(job.session)
    return LlamaRow(
        n_parallel=cfg.n_slots,
        cache_ram_mib=cfg.cache_ram_mib,
        requests=len(results),
        reprocessed=sum(r.prompt_n for r in results),
        switches=len(switches),
        switch_reprocessed=sum(switches),
        worst_switch=max(switches, default=0),
        host_restores=sum(1 for e in events if isinstance(e, ev.PromptLoaded)),
        host_evictions=sum(1 for e in events if isinstance(e, ev.PromptDropped) and e.cause != "obsolete"),
        prompt_s=round(sum(r.prompt_s for r in results), 6),
    )


def sweep_llama(
    requests: Sequence[Request],
    cache_rams: Sequence[int],
    n_parallels: Sequence[int],
    *,
    preset: str,
    history: str = "recorded",
    n_ctx: int | None = None,
    how: Walk = "walker",
) -> list[LlamaRow]:
    """One row per (-np, --cache-ram) setting."""
    rows = []
    for np_ in n_parallels:
        for mib in cache_rams:
            over: dict[str, object] = {"n_parallel": np_, "cache_ram_mib": mib}
            if n_ctx is not None:
                over["n_ctx"] = n_ctx * np_
            cfg = llama_config(preset, **over)
            jobs = llama_jobs(requests, cfg, tokenizer(preset), history)
            results, events = walk(cfg, jobs, how)
            rows.append(row(cfg, jobs, results, events))
    return rows


def tokenizer(preset: str) -> ChatTokenizer:
    """The preset's tokenizer: the simulator's own word-level one (a preset carries no vocabulary;
    `replay sim serve -m FILE` reads a model's)."""
    if preset not in PRESETS:
        raise KeyError(preset)
    return ChatTokenizer(None, None)


def smallest(rows: Sequence[LlamaRow], target: int | None = None) -> dict[int, LlamaRow | None]:
    """Per slot count, the smallest host cache whose worst switch re-processes at most `target`
    tokens (without one: at most the largest cache's worst switch)."""
    out: dict[int, LlamaRow | None] = {}
    for np_ in sorted({r.n_parallel for r in rows}):
        mine = sorted((r for r in rows if r.n_parallel == np_), key=lambda r: r.cache_ram_mib)
        goal = target if target is not None else mine[-1].worst_switch
        out[np_] = next((r for r in mine if r.worst_switch <= goal), None)
    return out
