"""Attach llama-server log events to the requests of a run, as `server` records like ds4's.

llama-server logs per *task*: `slot launch_slot_: id S | task T | new prompt ...` opens it, the
host-RAM prompt cache (`--cache-ram`, printed with `-lv 4`) speaks just before that in `srv` lines
(`prompt_save` when the slot's old prompt is stored, `found better prompt` when a stored one is
loaded back), context checkpoints are created, restored or erased inside the task, `prompt eval
time = X ms / N tokens` gives its prefill, and `release` closes it. So events are grouped by task
id; slot-less host-cache lines go to the next task that opens. Tasks are matched to run requests
the way ds4 requests are (``ds4.match_requests``): in order, by the prompt length and the
cached prefix the client got back (llama's `prompt_n` = tokens re-processed).

Record names follow ds4's: `request`, `restore` (source `host_cache`, `checkpoint`, `slot_file`,
`cache_reuse`), `store` (reason `host_cache`, `checkpoint`, `slot_file`), `evict` (reason
`host_cache_size|tokens|room|obsolete`, `checkpoint`, `checkpoint_invalidated`,
`checkpoint_too_close`, `context_shift`, `slot_cleared`, `slot_purged`), and `live_miss` with reason
`full_reprocess` for "forcing full prompt re-processing" or `lora_change`. The host cache is
followed entry by entry (``llamacpp_host_cache``): a save the server skipped is a `store_skipped`, a
save carries the size of the entry it made (`entry_mib`: its state, `mib`, and the slot's
checkpoints), a host-cache restore the `mib` it took out of the cache (`taken`), and every `cache state`
line is a `host_cache_state` with the server's figure and the ledger's. Numbers only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from drivers.logs import llamacpp as ll
from replay.serverside.ds4 import match_requests
from replay.serverside.llamacpp_host_cache import Effect, replay_host_cache


@dataclass(slots=True)
class LlamaTask:
    """One task of the log: what `match_requests` needs (index, prompt, cached) and its events."""

    index: int
    task: int
    slot: int | None
    line: int
    t: float | None
    prompt: int | None
    cached: int | None = None
    prefill: int | None = None
    prompt_ms: float | None = None
    decode_tps: float | None = None
    gen: int | None = None
    selected_by: str | None = None
    sim: float | None = None
    events: list[ll.Event] = field(default_factory=list)


def assemble(events: Sequence[ll.Event]) -> tuple[list[LlamaTask], list[ll.Event]]:
    """Tasks in the order they opened, and the cache events no task owns (e.g. after the last)."""
    tasks: list[LlamaTask] = []
    open_by_id: dict[int, LlamaTask] = {}
    pending: list[ll.Event] = []
    orphans: list[ll.Event] = []
    closed: set[int] = set()
    selected: dict[int | None, ll.SlotSelected] = {}
    for ev in events:
        if isinstance(ev, ll.SlotSelected):
            selected[ev.slot] = ev
            continue
        if isinstance(ev, ll.NewPrompt) and ev.task is not None:
            opened = open_by_id.get(ev.task)
            if opened is not None and opened.prompt is None:
                opened.prompt = ev.n_tokens  # a line of the task came first (a LoRA change, say)
                continue
            sel = selected.pop(ev.slot, None)
            task = LlamaTask(
                index=len(tasks),
                task=ev.task,
                slot=ev.slot,
                line=ev.line,
                t=ev.t,
                prompt=ev.n_tokens,
                selected_by=sel.by if sel else None,
                sim=sel.sim if sel else None,
                events=pending,
            )
            pending = []
            tasks.append(task)
            open_by_id[ev.task] = task
            closed.discard(ev.task)
            continue
        if isinstance(ev, ll.SlotFileCheckpoints | ll.SlotFileCheckpointFault):
            orphans.append(ev)  # a /slots save or restore: no request of the run owns it
            continue
        if isinstance(ev, ll.SlotEvent):
            owner = open_by_id.get(ev.task) if ev.task is not None else None
            if owner is None and ev.task is not None and ev.task >= 0 and ev.task not in closed:
                # Below -lv 4 there is no `new prompt` line: the task's first line opens it.
                sel = selected.pop(ev.slot, None)
                owner = LlamaTask(
                    index=len(tasks),
                    task=ev.task,
                    slot=ev.slot,
                    line=ev.line,
                    t=ev.t,
                    prompt=None,
                    selected_by=sel.by if sel else None,
                    sim=sel.sim if sel else None,
                    events=pending,
                )
                pending = []
                tasks.append(owner)
                open_by_id[ev.task] = owner
            if owner is None:
                pending.append(ev)
                continue
            if isinstance(ev, ll.PromptTiming):
                owner.prefill, owner.prompt_ms = ev.tokens, ev.ms
                if owner.prompt is not None:
                    owner.cached = owner.prompt - ev.tokens
            elif isinstance(ev, ll.EvalTiming):
                owner.gen, owner.decode_tps = ev.tokens, ev.tps
            elif isinstance(ev, ll.Release):
                open_by_id.pop(ev.task, None)
                closed.add(ev.task)
                if owner.prompt is None and ev.n_tokens is not None and owner.gen is not None:
                    # The slot holds the prompt and every generated token but the last.
                    owner.prompt = ev.n_tokens - owner.gen + 1
                    if owner.prefill is not None:
                        owner.cached = owner.prompt - owner.prefill
            else:
                owner.events.append(ev)
            continue
        pending.append(ev)
    return tasks, orphans + pending


def _record(seq: int | None, event: str, ev: ll.Event, **fields: object) -> dict[str, object]:
    return {"kind": "server", "request_seq": seq, "event": event, "line": ev.line, "log_t": ev.t, **fields}


def _cache_record(
    seq: int | None, ev: ll.Event, task: LlamaTask | None, effect: Effect | None
) -> dict[str, object] | None:
    effect = effect or Effect()
    if isinstance(ev, ll.PromptCacheLoad):
        tokens = task.cached if task else None
        return _record(
            seq,
            "restore",
            ev,
            source="host_cache",
            tokens=tokens,
            f_keep=ev.f_keep,
            sim=ev.sim,
            mib=effect.mib,
            entry_tokens=effect.entry_tokens,
            taken=True,  # `load` erases the entry it restores
        )
    if isinstance(ev, ll.PromptCacheSave):
        if effect.saved is False:
            return _record(
                seq,
                "store_skipped",
                ev,
                reason="host_cache",
                cause=effect.skipped,
                tokens=ev.tokens,
                mib=ev.mib,
            )
        # `mib` is the save line's state; the entry the cache holds also counts the slot's checkpoints.
        return _record(
            seq, "store", ev, reason="host_cache", tokens=ev.tokens, mib=ev.mib, entry_mib=effect.mib
        )
    if isinstance(ev, ll.PromptCacheEvict):
        return _record(seq, "evict", ev, reason=f"host_cache_{ev.cause}", mib=ev.mib)
    if isinstance(ev, ll.PromptCacheObsolete):
        return _record(seq, "evict", ev, reason="host_cache_obsolete", tokens=ev.tokens, mib=effect.mib)
    if isinstance(ev, ll.PromptCacheState):
        return _record(
            seq,
            "host_cache_state",
            ev,
            prompts=ev.prompts,
            mib=ev.mib,
            limit_mib=ev.limit_mib,
            ledger_mib=effect.ledger_mib,
        )
    if isinstance(ev, ll.PromptCacheLoadFailed):
        return _record(seq, "restore_failed", ev, source="host_cache")
    if isinstance(ev, ll.CheckpointCreated):
        return _record(seq, "store", ev, reason="checkpoint", tokens=ev.n_tokens, mib=ev.mib)
    if isinstance(ev, ll.CheckpointRestored):
        return _record(seq, "restore", ev, source="checkpoint", tokens=ev.n_past, mib=ev.mib)
    if isinstance(ev, ll.CheckpointEvicted):
        return _record(seq, "evict", ev, reason="checkpoint", tokens=ev.n_tokens, mib=ev.mib)
    if isinstance(ev, ll.CheckpointErased):
        return _record(seq, "evict", ev, reason="checkpoint_invalidated", tokens=ev.n_tokens, mib=ev.mib)
    if isinstance(ev, ll.CheckpointPruned):
        return _record(seq, "evict", ev, reason="checkpoint_too_close", tokens=ev.n_tokens, mib=ev.mib)
    if isinstance(ev, ll.CacheReuseChunk):
        return _record(seq, "restore", ev, source="cache_reuse", tokens=ev.n_tokens)
    if isinstance(ev, ll.ContextShift):
        return _record(seq, "evict", ev, reason="context_shift", tokens=ev.n_discard)
    if isinstance(ev, ll.SlotCleared):
        if ev.lora:
            return _record(seq, "live_miss", ev, reason="lora_change", prompt=task.prompt if task else None)
        return _record(seq, "evict", ev, reason="slot_cleared", tokens=ev.n_tokens)
    if isinstance(ev, ll.SlotPurged):
        return _record(seq, "evict", ev, reason="slot_purged", tokens=ev.n_tokens)
    if isinstance(ev, ll.SlotFileCheckpoints):
        name = "restore" if ev.action == "restore" else "store"
        key = "source" if name == "restore" else "reason"
        return _record(seq, name, ev, **{key: "slot_file"}, checkpoints=ev.count, mib=ev.mib)
    if isinstance(ev, ll.FullReprocess):
        return _record(seq, "live_miss", ev, reason="full_reprocess", prompt=task.prompt if task else None)
    return None


def correlate(requests: Sequence[Mapping[str, Any]], events: Sequence[ll.Event]) -> list[dict[str, object]]:
    """`server` records in log order: one `request` per task (prompt, cached, prefill tokens, prefill
    seconds from `prompt eval time`, decode rate) and one per cache event it owns."""
    tasks, orphans = assemble(events)
    seq_of = match_requests(requests, tasks)  # type: ignore[arg-type]  # LlamaTask has the fields it reads
    effects = replay_host_cache(events).effects
    out: list[dict[str, object]] = []
    for task in tasks:
        seq = seq_of.get(task.index)
        out.append(
            {
                "kind": "server",
                "request_seq": seq,
                "event": "request",
                "line": task.line,
                "log_t": task.t,
                "slot": task.slot,
                "task": task.task,
                "selected_by": task.selected_by,
                "sim": task.sim,
                "cached": task.cached,
                "prompt": task.prompt,
                "prefill": task.prefill,
                "prompt_done_s": None if task.prompt_ms is None else round(task.prompt_ms / 1000, 6),
                "decode_tps": task.decode_tps,
                "gen": task.gen,
            }
        )
        for ev in task.events:
            rec = _cache_record(seq, ev, task, effects.get(ev.line))
            if rec is not None:
                out.append(rec)
    for ev in orphans:
        rec = _cache_record(None, ev, None, effects.get(ev.line))
        if rec is not None:
            out.append(rec)
    out.sort(key=lambda r: r["line"])  # type: ignore[arg-type, return-value]
    return out
