"""Write the llama-server logs of this folder: cache paths the captured logs (one folder up) do not
reach in a short run, in the server's own shape (llama_logtext's printf formats, the
`M.SS.mmm.uuu L` prefix xllamacpp and the second A/B build print), with sizes that add up the way
`server_prompt_cache` adds them (tools/server/server-task.cpp).

    python -m tests.data.llama.written.write

`idle_slots_obsolete.log`: two slots, `--cache-ram 2 -ctxcp 4`, idle slots saved on every new task:
a saved prompt that contains a cached one removes it (`removing obsolete cached prompt`), a slot
already cached is skipped, room is made, and a prompt loaded back leaves the cache with its
checkpoints. Each entry's size is its state plus its checkpoints, as the listing after each
`cache state` line shows.

`reuse_and_shift.log`: one slot, `--cache-reuse 64 --context-shift --cache-ram 0`: chunks of the old
prompt shifted into place, the context shifted when full, a LoRA change clearing the slot.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.llama_logtext import (
    CACHE_ENTRY,
    CACHE_OBSOLETE,
    CACHE_PRESENT,
    CACHE_ROOM,
    CKPT_ERASED,
    CKPT_NEW,
    CLEAR_LORA,
    CONTEXT_SHIFT,
    NEW_PROMPT,
    PROMPT_EVAL,
    RELEASE,
    REUSE_CHUNK,
    REUSE_DONE,
    REUSE_START,
    SEQ_RM,
    TOTAL,
    c_format,
    prefixed,
    slot,
    srv,
)

HERE = Path(__file__).resolve().parent

EVAL = "       eval time = %10.2f ms / %5d tokens (%8.2f ms per token, %8.2f tokens per second)"


class Log:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.us = 1000

    def add(self, line: str, level: str = "I") -> None:
        self.us += 731
        self.lines.append(prefixed(line, self.us, level))

    def write(self, name: str) -> None:
        (HERE / name).write_text("\n".join(self.lines) + "\n")


def startup(log: Log, *, n_slots: int, cache_ram: int, ctxcp: int, extra: list[str]) -> None:
    log.add("cmn  common_param: common_params_print_info: verbosity = 4 (adjust with the `-lv N` CLI arg)")
    log.add(
        srv(
            "load_model",
            "initializing, n_slots = %d, n_ctx_slot = %d, kv_unified = '%s'",
            n_slots,
            8192,
            "false",
        )
    )
    for i in range(n_slots):
        log.add(slot("load_model", i, -1, "new slot, n_ctx = %d", 8192))
    if cache_ram:
        log.add(srv("load_model", "prompt cache is enabled, size limit: %d MiB", cache_ram))
    else:
        log.add(srv("load_model", "%s", "prompt cache is disabled - use `--cache-ram N` to enable it"))
    log.add(srv("load_model", "context checkpoints enabled, max = %d, min spacing = %d", ctxcp, 64))
    for line in extra:
        log.add(line)
    log.add(srv("llama_server", "listening on http://127.0.0.1:%d", 8080))


def state(log: Log, entries: list[tuple[int, int, float]], limit: float) -> None:
    """`cache state` and one listing line per entry: (tokens, checkpoints, MiB), oldest first."""
    total = sum(m for _, _, m in entries)
    est = int(limit * 1024 * 1024 / max(1.0, total * 1024 * 1024 / max(1, sum(t for t, _, _ in entries))))
    log.add(
        srv(
            "update",
            " - cache state: %d prompts, %.3f MiB (limits: %.3f MiB, %d tokens, %d est)",
            len(entries),
            total,
            limit,
            8192,
            est,
        )
    )
    for i, (tokens, ckpts, mib) in enumerate(entries):
        log.add(srv("update", "%s", c_format(CACHE_ENTRY, 0x55AA0000 + 0x1000 * i, tokens, ckpts, mib)))


def task(
    log: Log,
    sid: int,
    task_id: int,
    n_tokens: int,
    cached: int,
    ckpts: list[tuple[int, float]],
    erased: tuple[tuple[int, float], ...] = (),
    gen: int = 9,
) -> None:
    """One request's lines: its prompt, the checkpoints its new prefix invalidates (n_tokens, MiB),
    those it creates, its timings and its release."""
    log.add(slot("operator()", sid, task_id, NEW_PROMPT, 8192, 0, n_tokens))
    for at, mib in erased:
        log.add(slot("operator()", sid, task_id, CKPT_ERASED, max(0, at - 256), at - 1, at, 256, cached, mib))
    log.add(slot("operator()", sid, task_id, "cached " + SEQ_RM, cached, cached))
    for i, (at, mib) in enumerate(ckpts, 1):
        log.add(slot("create_check", sid, task_id, CKPT_NEW, i, 4, max(0, at - 256), at - 1, at, mib))
    n = n_tokens - cached
    log.add(slot("print_timing", sid, task_id, PROMPT_EVAL, n * 0.5, n, 0.5, 2000.0))
    log.add(slot("print_timing", sid, task_id, EVAL, gen * 10.0, gen, 10.0, 100.0))
    log.add(slot("print_timing", sid, task_id, TOTAL, n * 0.5 + gen * 10.0, n + gen))
    log.add(slot("release", sid, task_id, RELEASE, n_tokens + gen - 1, 0))


def save(log: Log, tokens: int, state_mib: float) -> None:
    log.add(
        srv(
            "prompt_save",
            " - saving prompt with length %d, total state size = %.3f MiB (draft: %.3f MiB)",
            tokens,
            state_mib,
            0.0,
        )
    )


def idle_slots_obsolete() -> None:
    log = Log()
    startup(
        log,
        n_slots=2,
        cache_ram=2,
        ctxcp=4,
        extra=[srv("init", "%s", "idle slots will be saved to prompt cache upon starting a new task")],
    )
    limit = 2.0
    # A on slot 0; slot 1 is empty, so its idle save writes nothing.
    log.add(slot("get_availabl", 0, -1, "selected slot by LRU, t_last = %d", -1))
    log.add(srv("get_availabl", "%s", "updating prompt cache"))
    log.add(srv("load", " - looking for better prompt, base f_keep = %.3f, f_sim = %.3f", -1.0, 0.0))
    state(log, [], limit)
    log.add(slot("launch_slot_", 0, 0, "processing task, is_child = %d", 0))
    log.add(slot("process_sing", 1, -1, "%s", "saving idle slot to prompt cache"))
    task(log, 0, 0, 1000, 0, [(500, 0.1)])  # slot 0: A, 1009 tokens, one checkpoint
    # B on slot 1; slot 0 (A) is idle: saved, with its checkpoint.
    log.add(slot("get_availabl", 0, -1, " - checking sim = %.3f (%d/%d) > %.3f", 0.005, 5, 1000, 0.1))
    log.add(slot("get_availabl", 1, -1, "selected slot by LRU, t_last = %d", -1))
    log.add(srv("get_availabl", "%s", "updating prompt cache"))
    log.add(srv("load", " - looking for better prompt, base f_keep = %.3f, f_sim = %.3f", -1.0, 0.0))
    state(log, [], limit)
    log.add(slot("launch_slot_", 1, 9, "processing task, is_child = %d", 0))
    log.add(slot("process_sing", 0, -1, "%s", "saving idle slot to prompt cache"))
    save(log, 1009, 0.505)
    state(log, [(1009, 1, 0.605)], limit)
    task(log, 1, 9, 1000, 0, [(500, 0.1)])  # slot 1: B
    # A + 200 words back on slot 0 (it holds A: no cache update); B idle: saved.
    log.add(slot("get_availabl", 0, -1, " - checking sim = %.3f (%d/%d) > %.3f", 0.841, 1009, 1200, 0.1))
    log.add(slot("get_availabl", 1, -1, " - checking sim = %.3f (%d/%d) > %.3f", 0.004, 5, 1200, 0.1))
    log.add(
        slot(
            "get_availabl",
            0,
            -1,
            "selected slot by LCP similarity, f_sim_best = %.3f (> %.3f thold), f_keep = %.3f",
            0.841,
            0.1,
            1.0,
        )
    )
    log.add(slot("launch_slot_", 0, 18, "processing task, is_child = %d", 0))
    log.add(slot("process_sing", 1, -1, "%s", "saving idle slot to prompt cache"))
    save(log, 1009, 0.505)
    state(log, [(1009, 1, 0.605), (1009, 1, 0.605)], limit)
    task(log, 0, 18, 1200, 1009, [(1100, 0.1)])  # slot 0: A+, checkpoints at 500 and 1100
    # C on slot 1 (LRU); slot 1's B is cached already; slot 0's A+ contains A: A goes, A+ is saved.
    log.add(slot("get_availabl", 1, -1, "selected slot by LRU, t_last = %d", 1000))
    log.add(srv("get_availabl", "%s", "updating prompt cache"))
    save(log, 1009, 0.505)
    log.add(srv("alloc", "%s", CACHE_PRESENT))
    log.add(srv("load", " - looking for better prompt, base f_keep = %.3f, f_sim = %.3f", 0.005, 0.003))
    for _ in range(2):
        log.add(
            srv(
                "load",
                "   - prompt with length %7d, lcp = %7d, f_keep = %.3f, f_sim = %.3f",
                1009,
                5,
                0.005,
                0.003,
            )
        )
    state(log, [(1009, 1, 0.605), (1009, 1, 0.605)], limit)
    log.add(slot("launch_slot_", 1, 27, "processing task, is_child = %d", 0))
    log.add(slot("process_sing", 0, -1, "%s", "saving idle slot to prompt cache"))
    save(log, 1209, 0.605)
    log.add(srv("alloc", "%s", c_format(CACHE_OBSOLETE, 1009)))
    state(log, [(1009, 1, 0.605), (1209, 2, 0.805)], limit)
    task(log, 1, 27, 1500, 5, [(1000, 0.1)], erased=((500, 0.1),))  # slot 1: C
    # D on slot 0 (LRU): A+ is cached already; slot 1's C is saved and room is made (B goes).
    log.add(slot("get_availabl", 0, -1, "selected slot by LRU, t_last = %d", 2000))
    log.add(srv("get_availabl", "%s", "updating prompt cache"))
    save(log, 1209, 0.605)
    log.add(srv("alloc", "%s", CACHE_PRESENT))
    log.add(srv("load", " - looking for better prompt, base f_keep = %.3f, f_sim = %.3f", 0.004, 0.003))
    log.add(
        srv(
            "load",
            "   - prompt with length %7d, lcp = %7d, f_keep = %.3f, f_sim = %.3f",
            1009,
            5,
            0.005,
            0.003,
        )
    )
    log.add(
        srv(
            "load",
            "   - prompt with length %7d, lcp = %7d, f_keep = %.3f, f_sim = %.3f",
            1209,
            5,
            0.004,
            0.003,
        )
    )
    state(log, [(1009, 1, 0.605), (1209, 2, 0.805)], limit)
    log.add(slot("launch_slot_", 0, 36, "processing task, is_child = %d", 0))
    log.add(slot("process_sing", 1, -1, "%s", "saving idle slot to prompt cache"))
    save(log, 1509, 0.755)
    log.add(srv("alloc", "%s", c_format(CACHE_ROOM, 0.605)), "W")
    state(log, [(1209, 2, 0.805), (1509, 1, 0.855)], limit)
    task(log, 0, 36, 2000, 5, [(1500, 0.1)], erased=((500, 0.1), (1100, 0.1)))  # slot 0: D
    # A+ back on slot 1 (LRU): C there is cached already; A+ is loaded and leaves the cache with its
    # two checkpoints; slot 0's D is saved.
    log.add(slot("get_availabl", 1, -1, "selected slot by LRU, t_last = %d", 3000))
    log.add(srv("get_availabl", "%s", "updating prompt cache"))
    save(log, 1509, 0.755)
    log.add(srv("alloc", "%s", CACHE_PRESENT))
    log.add(srv("load", " - looking for better prompt, base f_keep = %.3f, f_sim = %.3f", 0.003, 0.004))
    log.add(
        srv(
            "load",
            "   - prompt with length %7d, lcp = %7d, f_keep = %.3f, f_sim = %.3f",
            1209,
            1209,
            1.0,
            0.93,
        )
    )
    log.add(
        srv(
            "load",
            "   - prompt with length %7d, lcp = %7d, f_keep = %.3f, f_sim = %.3f",
            1509,
            5,
            0.003,
            0.004,
        )
    )
    log.add(srv("load", " - found better prompt with f_keep = %.3f, f_sim = %.3f", 1.0, 0.93))
    state(log, [(1509, 1, 0.855)], limit)
    log.add(slot("launch_slot_", 1, 45, "processing task, is_child = %d", 0))
    log.add(slot("process_sing", 0, -1, "%s", "saving idle slot to prompt cache"))
    save(log, 2009, 1.005)
    state(log, [(1509, 1, 0.855), (2009, 1, 1.105)], limit)
    task(log, 1, 45, 1300, 1209, [])  # slot 1: A+ + 100 words, from the loaded entry
    log.write("idle_slots_obsolete.log")


def reuse_and_shift() -> None:
    log = Log()
    startup(log, n_slots=1, cache_ram=0, ctxcp=4, extra=[])
    log.add(slot("get_availabl", 0, -1, "selected slot by LRU, t_last = %d", -1))
    task(log, 0, 0, 4000, 0, [])
    # The same document with its first 300 tokens edited: two chunks shifted into place.
    log.add(
        slot(
            "get_availabl",
            0,
            -1,
            "selected slot by LCP similarity, f_sim_best = %.3f (> %.3f thold), f_keep = %.3f",
            0.1,
            0.1,
            0.1,
        )
    )
    log.add(slot("operator()", 0, 9, NEW_PROMPT, 8192, 0, 3950))
    log.add(slot("operator()", 0, 9, REUSE_START, 64, 400))
    log.add(slot("operator()", 0, 9, "%s", c_format(REUSE_CHUNK, 1500, 700, 2200, 650, 2150)))
    log.add(slot("operator()", 0, 9, "%s", c_format(REUSE_CHUNK, 1700, 2300, 4000, 2250, 3950)))
    log.add(slot("operator()", 0, 9, REUSE_DONE, 3600))
    log.add(slot("operator()", 0, 9, "cached " + SEQ_RM, 3600, 3600))
    log.add(slot("print_timing", 0, 9, PROMPT_EVAL, 175.0, 350, 0.5, 2000.0))
    log.add(slot("print_timing", 0, 9, EVAL, 4000.0, 4300, 0.93, 1075.0))
    log.add(slot("update_slots", 0, 9, CONTEXT_SHIFT, 0, 8191, 4095), "W")
    log.add(slot("release", 0, 9, RELEASE, 4154, 1))
    # A LoRA change: the slot's cache goes.
    log.add(
        slot(
            "get_availabl",
            0,
            -1,
            "selected slot by LCP similarity, f_sim_best = %.3f (> %.3f thold), f_keep = %.3f",
            0.9,
            0.1,
            0.96,
        )
    )
    log.add(slot("launch_slot_", 0, 18, "%s", c_format(CLEAR_LORA, 0, 1)))
    task(log, 0, 18, 4000, 0, [])
    log.write("reuse_and_shift.log")


if __name__ == "__main__":
    idle_slots_obsolete()
    reuse_and_shift()
