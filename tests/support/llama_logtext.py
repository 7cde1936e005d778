"""Writes llama-server log lines with llama.cpp's own printf formats.

The format strings are copied from tools/server/server-context.cpp, server-task.cpp,
server-common.h (SLT_*/SRV_* prefixes) and common/log.cpp (timestamp and level prefix), so tests
built on them break if the parser drifts from what the server prints.
"""

from __future__ import annotations

import re

SLT = "slot %12.*s: id %2d | task %d | "
SRV = "srv  %12.*s: "


def slot(func: str, sid: int, task: int, fmt: str, *args: object) -> str:
    return (SLT % (12, func, sid, task)) + (fmt % args if args else fmt)


def srv(func: str, fmt: str, *args: object) -> str:
    return (SRV % (12, func)) + (fmt % args if args else fmt)


def prefixed(line: str, us: int, level: str = "I", colour: bool = False) -> str:
    """common/log.cpp with --log-prefix --log-timestamps: `M.SS.mmm.uuu L msg`."""
    blue, green, default = ("\x1b[34m", "\x1b[32m", "\x1b[0m") if colour else ("", "", "")
    ts = TS % (blue, us // 1_000_000 // 60, us // 1_000_000 % 60, us // 1000 % 1000, us % 1000, default)
    return ts + f"{green}{level} {default}" + line


TS = "%s%d.%02d.%03d.%03d%s "
EVAL_OLD = "%s:        eval time = %10.2f ms / %5d runs   (%8.2f ms per token, %8.2f tokens per second)"
SEL_LCP = "selected slot by LCP similarity, sim_best = %.3f (> %.3f thold), f_keep = %.3f"
SEL_LCP_OLD = "selected slot by LCP similarity, f_sim_best = %.3f (> %.3f thold), f_keep = %.3f"
NEW_PROMPT = "new prompt, n_ctx_slot = %d, n_keep = %d, task.n_tokens = %d"
SEQ_RM = "n_tokens = %d, memory_seq_rm [%d, end)"
PROGRESS = "prompt processing progress, n_tokens = %d, batch.n_tokens = %d, progress = %f"
PROGRESS_PP = "prompt processing, n_tokens = %6d, progress = %.2f, t = %6.2f s / %.2f tokens per second"
DONE = "prompt processing done, n_tokens = %d, batch.n_tokens = %d"
CKPT_NEW = "created context checkpoint %d of %d (pos_min = %d, pos_max = %d, n_tokens = %d, size = %.3f MiB)"
CKPT_RESTORED = (
    "restored context checkpoint (pos_min = %d, pos_max = %d, n_tokens = %d, n_past = %d, size = %.3f MiB)"
)
CKPT_ERASED = (
    "erased invalidated context checkpoint (pos_min = %d, pos_max = %d, n_tokens = %d, n_swa = %d, "
    "pos_next = %d, size = %.3f MiB)"
)
FULL = "forcing full prompt re-processing due to lack of cache data (likely due to SWA or hybrid/recurrent memory, see %s)"
PR_LINK = "https://github.com/ggml-org/llama.cpp/pull/13194#issuecomment-2868343055"
PROMPT_EVAL = "prompt eval time = %10.2f ms / %5d tokens (%8.2f ms per token, %8.2f tokens per second)"
EVAL = "       eval time = %10.2f ms / %5d tokens (%8.2f ms per token, %8.2f tokens per second)"
TOTAL = "      total time = %10.2f ms / %5d tokens"
RELEASE = "stop processing: n_tokens = %d, truncated = %d"


def timing(sid: int, task: int, p_ms: float, p_n: int, e_ms: float, e_n: int) -> list[str]:
    return [
        slot("print_timing", sid, task, PROMPT_EVAL, p_ms, p_n, p_ms / p_n, 1e3 * p_n / p_ms),
        slot("print_timing", sid, task, EVAL, e_ms, e_n, e_ms / e_n, 1e3 * e_n / e_ms),
        slot("print_timing", sid, task, TOTAL, p_ms + e_ms, p_n + e_n),
    ]


def startup(
    *, n_slots: int = 1, n_ctx: int = 4096, reuse_disabled: str | None = None, cache_ram: int = 8192
) -> list[str]:
    out = [
        "build: 6970 (abcdef12) with cc (Debian 12.2.0-14) 12.2.0 for x86_64-linux-gnu",
        srv("load_model", "loading model '%s'", "/models/private-model.gguf"),
    ]
    if reuse_disabled:
        out.append(
            srv("load_model", "%s", f"cache_reuse is not supported by {reuse_disabled}, it will be disabled")
        )
    out.append(
        srv(
            "load_model",
            "initializing, n_slots = %d, n_ctx_slot = %d, kv_unified = '%s'",
            n_slots,
            n_ctx,
            "false",
        )
    )
    out += [slot("load_model", i, -1, "new slot, n_ctx = %d", n_ctx) for i in range(n_slots)]
    if cache_ram:
        out.append(srv("init", "prompt cache is enabled, size limit: %d MiB", cache_ram))
        out.append(srv("init", "%s", "use `--cache-ram 0` to disable the prompt cache"))
    else:
        out.append(srv("init", "%s", "prompt cache is disabled - use `--cache-ram N` to enable it"))
    out.append(srv("init", "context checkpoints enabled, max = %d, min spacing = %d", 32, 8192))
    out.append("main: server is listening on http://127.0.0.1:8080 - starting the main loop")
    return out


def request(sid: int, task: int, n_tokens: int, kept: int, eval_n: int, eval_ms: float) -> list[str]:
    out = [
        slot("get_availabl", sid, -1, SEL_LCP, kept / n_tokens, 0.1, 1.0),
        slot("launch_slot_", sid, task, "processing task, is_child = %d", 0),
        slot("update_slots", sid, task, NEW_PROMPT, 4096, 0, n_tokens),
        slot("update_slots", sid, task, SEQ_RM, kept, kept),
    ]
    if n_tokens - kept > 512:
        out.append(slot("update_slots", sid, task, PROGRESS, kept + 512, 512, (kept + 512) / n_tokens))
        out.append(slot("update_slots", sid, task, SEQ_RM, kept + 512, kept + 512))
    out.append(slot("update_slots", sid, task, DONE, n_tokens, n_tokens - kept))
    todo = n_tokens - kept
    out += timing(sid, task, max(1.0, todo * 0.05), max(1, todo), eval_ms, eval_n)
    out.append(slot("release", sid, task, RELEASE, n_tokens + eval_n, 0))
    return out


# Cache messages of newer builds (tools/server/server-context.cpp `create_checkpoint`,
# `update_slots`, `try_clear_idle_slots`; server-task.cpp `server_prompt_cache::alloc/load/update`),
# as both builds of the A/B tests print them (their binaries hold these format strings).
CKPT_TOO_CLOSE = (
    "erasing context checkpoint too close to an earlier one (pos_min = %d, pos_max = %d, "
    "n_tokens = %ld, size = %.3f MiB)"
)
CKPT_DECISION = "main/do_checkpoint = %s, pos_min = %d, pos_max = %d"
SPEC_CKPT_NEW = "created speculative checkpoint (pos_min = %d, pos_max = %d, n_tokens = %d, size = %.3f MiB, draft = %.3f MiB)"
SPEC_CKPT_RESTORE = "restoring speculative checkpoint (pos_min = %d, pos_max = %d, size = %zu)"
REUSE_START = "trying to reuse chunks with size > %d, n_past = %d"
REUSE_CHUNK = "reusing chunk with size %zu, shifting KV cache [%zu, %zu) -> [%zu, %zu)"
REUSE_DONE = "after context reuse, new n_past = %d"
CONTEXT_SHIFT = "slot context shift, n_keep = %d, n_left = %d, n_discard = %d"
CLEAR_PROMPT = "clearing prompt with %zu tokens"
CLEAR_LORA = "clearing cache for lora change. %zu loras -> %zu loras"
POS_ERROR = "n_past = %d, slot.prompt.tokens.size() = %d, seq_id = %d, pos_min = %d"
APPEND_FAILED = "failed to append context checkpoints to '%s'"
APPEND_INCOMPLETE = "failed to append context checkpoints to '%s' - the appendix is incomplete"
APPENDIX_INVALID = "invalid context checkpoint appendix in '%s' - ignored"
APPENDIX_TRUNCATED = "truncated context checkpoint appendix in '%s' - ignored"
DRAFT_DROPPED = "draft context checkpoint data in '%s' does not match the draft context - dropped"
CACHE_PRESENT = " - prompt is already in the cache, skipping"
CACHE_TOO_BIG = " - prompt state size %.3f MiB exceeds cache size limit %.3f MiB, skipping"
CACHE_ROOM = " - making room for prompt cache entry, removing oldest entry (size = %.3f MiB)"
CACHE_NO_MEMORY = "failed to allocate memory for prompt cache state: %s"
CACHE_LIMIT = " - cache size limit reduced to %.3f MiB"
CACHE_OBSOLETE = " - removing obsolete cached prompt with length %d"
CACHE_ENTRY = "   - prompt %p: %7d tokens, checkpoints: %2zu, %9.3f MiB"
RESTORE_FAILED = "failed to restore state with size %zu"
LOAD_FAILED = "failed to load prompt from cache"
PURGE = "purging slot %d with %zu tokens"
KV_FULL = "failed to find free space in the KV cache, retrying with smaller batch size, off = %d, n_batch = %d, ret = %d"


def c_format(fmt: str, *args: object) -> str:
    """A C format string with Python's `%`: the length modifiers (`%ld`, `%zu`) and `%p` mapped."""
    py = re.sub(r"%(\d*)(?:ld|zu)", r"%\1d", fmt).replace("%p", "0x%x")
    return py % args
