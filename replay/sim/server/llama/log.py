"""llama-server's log lines for the llama model's events, in llama.cpp's own formats.

Each line is `M.SS.mmm.uuu L ` (modelled time since start, level letter) and the message as the
server's printf writes it (`SLT_*`: `slot %12.*s: id %2d | task %d | ...`, `SRV_*`: `srv  %12.*s: ...`,
the function name cut to 12 characters), so the project's llama log parser and correlator
(drivers/logs/llamacpp.py, replay/serverside/llamacpp.py) read the simulator's log as they read the
real one. Which lines appear follows the verbosity (`-lv`): trace lines (`SLT_TRC`, `SRV_TRC`) from 4,
info and warnings from 3; builds before b10068 printed the cache lines at info or warning level.
"""

from __future__ import annotations

from replay.sim.model.llama import events as ev
from replay.sim.model.llama.config import LlamaConfig

MIB = 1024 * 1024
PR_13194 = "https://github.com/ggml-org/llama.cpp/pull/13194#issuecomment-2868343055"
LEVELS = {"ERR": (1, "E"), "WRN": (2, "W"), "INF": (3, "I"), "TRC": (4, "I"), "DBG": (5, "D")}


def stamp(t: float) -> str:
    """llama.cpp's common_log timestamp: minutes.seconds.milliseconds.microseconds."""
    us = max(0, int(t * 1_000_000))
    return f"{us // 60_000_000}.{us // 1_000_000 % 60:02d}.{us // 1000 % 1000:03d}.{us % 1000:03d}"


def slot_line(func: str, slot: int, task: int, message: str) -> str:
    return f"slot {func[:12]:>12}: id {slot:2d} | task {task} | {message}"


def srv_line(func: str, message: str) -> str:
    return f"srv  {func[:12]:>12}: {message}"


def _mib(n: int) -> str:
    return f"{n / MIB:.3f}"


class LlamaLog:
    """Formats events into (time, level, text) lines at a verbosity, for one build's rules."""

    def __init__(self, cfg: LlamaConfig, verbosity: int = 3, slot_dir: str = "") -> None:
        self.cfg = cfg
        self.verbosity = verbosity
        self.trace = "TRC" if cfg.rules.trace_level_log else "INF"
        self.slot_dir = slot_dir

    def _keep(self, level: str) -> bool:
        return LEVELS[level][0] <= self.verbosity

    def line(self, t: float, level: str, text: str) -> str | None:
        if not self._keep(level):
            return None
        return f"{stamp(t)} {LEVELS[level][1]} {text}"

    def format(self, e: ev.Event, busy: bool) -> list[str]:
        """The lines of one event; `busy`: some slot still works (no `all slots are idle` line)."""
        out: list[tuple[str, str]] = []
        tr = self.trace
        match e:
            case ev.SlotSkipped():
                what = " - skipping, slot is empty" if e.empty else " - skipping, is_processing = 1"
                out.append((tr, slot_line("get_available_slot", e.slot, -1, what)))
            case ev.SlotSimilarity():
                out.append(
                    (
                        tr,
                        slot_line(
                            "get_available_slot",
                            e.slot,
                            -1,
                            f" - checking sim = {e.sim:.3f} ({e.lcp}/{e.n_tokens}) > {e.threshold:.3f}",
                        ),
                    )
                )
            case ev.SlotSelected():
                if e.by == "id":
                    text = f"selected slot by id ({e.slot})"
                elif e.by == "lcp":
                    text = f"selected slot by LCP similarity, f_sim_best = {e.sim:.3f} (> {e.threshold:.3f} thold), f_keep = {e.f_keep:.3f}"
                else:
                    text = f"selected slot by LRU, t_last = {e.t_last}"
                out.append(("INF", slot_line("get_available_slot", e.slot, -1, text)))
            case ev.CacheUpdating():
                out.append((tr, srv_line("get_available_slot", "updating prompt cache")))
            case ev.PromptSaved():
                out.append(
                    (
                        tr,
                        srv_line(
                            "prompt_save",
                            f" - saving prompt with length {e.tokens}, total state size = {_mib(e.bytes)} MiB (draft: 0.000 MiB)",
                        ),
                    )
                )
            case ev.PromptSaveSkipped():
                if e.reason == "contained":
                    out.append((tr, srv_line("alloc", " - prompt is already in the cache, skipping")))
                else:
                    out.append(
                        (
                            "WRN",
                            srv_line(
                                "alloc",
                                f" - prompt state size {_mib(e.bytes)} MiB exceeds cache size limit {_mib(e.limit)} MiB, skipping",
                            ),
                        )
                    )
            case ev.PromptDropped():
                size = f"(size = {_mib(e.bytes)} MiB)"
                if e.cause == "obsolete":
                    out.append(
                        (tr, srv_line("alloc", f" - removing obsolete cached prompt with length {e.tokens}"))
                    )
                elif e.cause == "room":
                    out.append(
                        (
                            "WRN",
                            srv_line(
                                "alloc",
                                f" - making room for prompt cache entry, removing oldest entry {size}",
                            ),
                        )
                    )
                elif e.cause == "size":
                    out.append(
                        (
                            "WRN",
                            srv_line("update", f" - cache size limit reached, removing oldest entry {size}"),
                        )
                    )
                else:
                    text = f" - cache token limit ({e.limit_tokens}, est: {e.est_tokens}) reached, removing oldest entry {size}"
                    out.append(("WRN", srv_line("update", text)))
            case ev.PromptLookup():
                out.append(
                    (
                        tr,
                        srv_line(
                            "load",
                            f" - looking for better prompt, base f_keep = {e.base_keep:.3f}, f_sim = {e.base_sim:.3f}",
                        ),
                    )
                )
                for tokens, lcp, keep, sim in e.candidates:
                    text = f"   - prompt with length {tokens:7d}, lcp = {lcp:7d}, f_keep = {keep:.3f}, f_sim = {sim:.3f}"
                    out.append((tr, srv_line("load", text)))
            case ev.PromptLoaded():
                out.append(
                    (
                        tr,
                        srv_line(
                            "load",
                            f" - found better prompt with f_keep = {e.f_keep:.3f}, f_sim = {e.f_sim:.3f}",
                        ),
                    )
                )
            case ev.CacheState():
                text = (
                    f" - cache state: {len(e.entries)} prompts, {_mib(e.bytes)} MiB "
                    f"(limits: {_mib(e.limit_bytes)} MiB, {e.limit_tokens} tokens, {e.est_tokens} est)"
                )
                out.append((tr, srv_line("update", text)))
                for i, (tokens, ckpts, nbytes) in enumerate(e.entries):
                    text = f"   - prompt 0x{0x7F0000000000 + 0x1000 * i:x}: {tokens:7d} tokens, checkpoints: {ckpts:2d}, {nbytes / MIB:9.3f} MiB"
                    out.append((tr, srv_line("update", text)))
            case ev.CacheUpdated():
                out.append(
                    (
                        tr,
                        srv_line("get_available_slot", f"prompt cache update took {e.seconds * 1000:.2f} ms"),
                    )
                )
            case ev.IdleSlotSaved():
                out.append(
                    (tr, slot_line("process_single_task", e.slot, -1, "saving idle slot to prompt cache"))
                )
            case ev.Launched():
                out.append(
                    (
                        "INF",
                        slot_line("launch_slot_with_task", e.slot, e.task, "processing task, is_child = 0"),
                    )
                )
            case ev.NewPrompt():
                text = f"new prompt, n_ctx_slot = {e.n_ctx_slot}, n_keep = 0, task.n_tokens = {e.n_tokens}"
                out.append((tr, slot_line("operator()", e.slot, e.task, text)))
            case ev.CacheReuseIgnored():
                text = f"cache reuse is not supported - ignoring n_cache_reuse = {e.n_cache_reuse}"
                out.append(("WRN", slot_line("operator()", e.slot, e.task, text)))
            case ev.CacheReuseChunk():
                text = f"reusing chunk with size {e.size}, shifting KV cache [{e.src}, {e.src + e.size}) -> [{e.dst}, {e.dst + e.size})"
                out.append((tr, slot_line("operator()", e.slot, e.task, text)))
            case ev.CheckpointChecked():
                c = e.checkpoint
                text = f"checking checkpoint with [{c.pos_min}, {c.pos_max}] against {e.threshold}..."
                out.append((tr, slot_line("operator()", e.slot, e.task, text)))
            case ev.CheckpointRestored():
                c = e.checkpoint
                text = (
                    f"restored context checkpoint (pos_min = {c.pos_min}, pos_max = {c.pos_max}, n_tokens = {c.n_tokens}, "
                    f"n_past = {e.n_past}, size = {_mib(c.size)} MiB)"
                )
                out.append((tr, slot_line("operator()", e.slot, e.task, text)))
            case ev.FullReprocess():
                text = f"forcing full prompt re-processing due to lack of cache data (likely due to SWA or hybrid/recurrent memory, see {PR_13194})"
                out.append((tr, slot_line("operator()", e.slot, e.task, text)))
            case ev.CheckpointErased():
                c = e.checkpoint
                text = (
                    f"erased invalidated context checkpoint (pos_min = {c.pos_min}, pos_max = {c.pos_max}, n_tokens = {c.n_tokens}, "
                    f"n_swa = {e.n_swa}, pos_next = {e.pos_next}, size = {_mib(c.size)} MiB)"
                )
                out.append((tr, slot_line("operator()", e.slot, e.task, text)))
            case ev.LastTokenReevaluated():
                text = f"need to evaluate at least 1 token for each active slot (n_past = {e.n_past}, task.n_tokens() = {e.n_tokens})"
                out.append(("WRN", slot_line("operator()", e.slot, e.task, text)))
                out.append(
                    ("WRN", slot_line("operator()", e.slot, e.task, f"n_past was set to {e.n_past - 1}"))
                )
            case ev.SeqRemove():
                text = f"cached n_tokens = {e.n_tokens}, memory_seq_rm [{e.n_tokens}, end)"
                out.append((tr, slot_line("operator()", e.slot, e.task, text)))
            case ev.CheckpointDropped():
                c = e.checkpoint
                pos = f"(pos_min = {c.pos_min}, pos_max = {c.pos_max}, n_tokens = {c.n_tokens}, size = {_mib(c.size)} MiB)"
                if e.cause == "too-close":
                    out.append(
                        (
                            tr,
                            slot_line(
                                "create_checkpoint",
                                e.slot,
                                e.task,
                                f"erasing context checkpoint too close to an earlier one {pos}",
                            ),
                        )
                    )
                elif e.cause == "oldest":
                    out.append(
                        (
                            "WRN",
                            slot_line(
                                "create_checkpoint", e.slot, e.task, f"erasing old context checkpoint {pos}"
                            ),
                        )
                    )
                else:
                    out.append(
                        (
                            tr,
                            slot_line(
                                "create_checkpoint",
                                e.slot,
                                e.task,
                                f"superseding context checkpoint at n_tokens = {c.n_tokens}",
                            ),
                        )
                    )
            case ev.CheckpointCreated():
                c = e.checkpoint
                text = (
                    f"created context checkpoint {e.index} of {e.limit} (pos_min = {c.pos_min}, pos_max = {c.pos_max}, "
                    f"n_tokens = {c.n_tokens}, size = {_mib(c.size)} MiB)"
                )
                out.append((tr, slot_line("create_checkpoint", e.slot, e.task, text)))
            case ev.PromptProgress():
                tps = e.processed / e.elapsed if e.elapsed > 0 else 0.0
                text = f"prompt processing, n_tokens = {e.processed:6d}, progress = {e.progress:.2f}, t = {e.elapsed:6.2f} s / {tps:.2f} tokens per second"
                out.append(("INF", slot_line("print_timings_pp", e.slot, e.task, text)))
            case ev.PromptDone():
                text = f"init sampler, took 0.00 ms, tokens: text = {e.n_tokens}, total = {e.n_tokens}"
                out.append((tr, slot_line("init_sampler", e.slot, e.task, text)))
            case ev.Finished():
                out += self._finished(e, busy)
            case ev.SlotPurged():
                out.append(
                    ("WRN", srv_line("try_clear_idle_slots", f"purging slot {e.slot} with {e.tokens} tokens"))
                )
            case ev.SlotAction():
                path = f"{self.slot_dir}{e.filename}"
                if e.checkpoints and e.action == "save":
                    text = f"appended {e.checkpoints} context checkpoint(s) ({_mib(e.checkpoint_bytes)} MiB) to '{path}'"
                    out.append(("INF", slot_line("save_slot_checkpoints", e.slot, -1, text)))
                elif e.checkpoints and e.action == "restore":
                    text = f"restored {e.checkpoints} context checkpoint(s) from '{path}'"
                    out.append(("INF", slot_line("load_slot_checkpoints", e.slot, -1, text)))
        return [s for s in (self.line(e.t, level, text) for level, text in out) if s is not None]

    def _finished(self, e: ev.Finished, busy: bool) -> list[tuple[str, str]]:
        r = e.result
        out: list[tuple[str, str]] = []
        if r.error is not None:
            out.append(("ERR", srv_line("send_error", f"task id = {r.task}, error: {r.error}")))
        else:
            pm, dm = r.prompt_s * 1000, r.predicted_s * 1000
            p_tok = pm / r.prompt_n if r.prompt_n else 0.0
            d_tok = dm / r.predicted_n if r.predicted_n else 0.0
            p_tps = 1e3 / pm * r.prompt_n if pm > 0 else 0.0
            d_tps = 1e3 / dm * r.predicted_n if dm > 0 else 0.0
            for text in (
                f"prompt eval time = {pm:10.2f} ms / {r.prompt_n:5d} tokens ({p_tok:8.2f} ms per token, {p_tps:8.2f} tokens per second)",
                f"       eval time = {dm:10.2f} ms / {r.predicted_n:5d} tokens ({d_tok:8.2f} ms per token, {d_tps:8.2f} tokens per second)",
                f"      total time = {pm + dm:10.2f} ms / {r.prompt_n + r.predicted_n:5d} tokens",
                f"   graphs reused = {0:10d}",
            ):
                out.append(("INF", slot_line("print_timings", r.slot, r.task, text)))
        out.append(
            (
                "INF",
                slot_line(
                    "release", r.slot, r.task, f"stop processing: n_tokens = {e.n_tokens}, truncated = 0"
                ),
            )
        )
        if not busy:
            out.append((self.trace, srv_line("update_slots", "all slots are idle")))
        return out

    def startup(self, model_path: str | None, parallel_auto: bool) -> list[str]:
        """What llama-server prints before it serves: its build, verbosity, the model's caches and
        the cache settings in force (the lines `drivers.logs.effective` reads back)."""
        cfg = self.cfg
        tr = self.trace
        lines: list[tuple[str, str]] = [
            ("INF", srv_line("init", "initializing ...")),
            ("INF", srv_line("init", f"build_info: b{cfg.rules.build}-sim")),
            (
                "INF",
                "cmn  common_param: common_params_print_info: verbosity = "
                f"{min(self.verbosity, 2**31 - 1)} (adjust with the `-lv N` CLI arg)",
            ),
        ]
        if parallel_auto:
            lines.append(
                (
                    tr,
                    srv_line("main", "n_parallel is set to auto, using n_parallel = 4 and kv_unified = true"),
                )
            )
        if model_path:
            lines.append(("INF", srv_line("load_model", f"loading model '{model_path}'")))
        arch = cfg.arch
        if arch.kind == "iswa":
            base = cfg.ctx_total if cfg.unified else cfg.ctx_total // cfg.n_slots
            lines.append(("INF", f"llama_kv_cache_iswa: creating non-SWA KV cache, size = {base} cells"))
            if cfg.swa_full:
                lines.append(
                    (
                        "INF",
                        "llama_kv_cache_iswa: using full-size SWA cache (ref: https://github.com/ggml-org/llama.cpp/pull/13194#issuecomment-2868343055)",
                    )
                )
            lines.append(
                ("INF", f"llama_kv_cache_iswa: creating     SWA KV cache, size = {cfg.swa_cells} cells")
            )
        if cfg.cache_reuse > 0 and not arch.can_shift:
            lines.append(
                (
                    "WRN",
                    srv_line(
                        "load_model", "cache_reuse is not supported by this context, it will be disabled"
                    ),
                )
            )
        if cfg.swa_full and arch.n_swa == 0:
            lines.append(
                (
                    "WRN",
                    srv_line("load_model", "swa_full is not supported by this model, it will be disabled"),
                )
            )
        unified = "true" if cfg.unified else "false"
        lines.append(
            (
                "INF",
                srv_line(
                    "load_model",
                    f"initializing, n_slots = {cfg.n_slots}, n_ctx_slot = {cfg.n_ctx_slot}, kv_unified = '{unified}'",
                ),
            )
        )
        for i in range(cfg.n_slots):
            lines.append((tr, slot_line("load_model", i, -1, f"new slot, n_ctx = {cfg.n_ctx_slot}")))
        if cfg.prompt_cache_on:
            limit = "no limit" if cfg.cache_ram_mib < 0 else f"{cfg.cache_ram_mib} MiB"
            lines.append((tr, srv_line("load_model", f"prompt cache is enabled, size limit: {limit}")))
            lines.append((tr, srv_line("load_model", "use `--cache-ram 0` to disable the prompt cache")))
        else:
            lines.append(
                (tr, srv_line("load_model", "prompt cache is disabled - use `--cache-ram N` to enable it"))
            )
        lines.append(
            (tr, srv_line("load_model", "for more info see https://github.com/ggml-org/llama.cpp/pull/16391"))
        )
        if cfg.ctx_checkpoints > 0:
            text = f"context checkpoints enabled, max = {cfg.ctx_checkpoints}, min spacing = {cfg.checkpoint_min_step}"
            lines.append((tr, srv_line("load_model", text)))
        else:
            lines.append((tr, srv_line("load_model", "context checkpoints disabled")))
        if cfg.cache_idle_slots:
            if not cfg.prompt_cache_on:
                lines.append(("WRN", srv_line("init", "--cache-idle-slots requires --cache-ram, disabling")))
            elif cfg.unified:
                lines.append(
                    (
                        tr,
                        srv_line(
                            "init",
                            "idle slots will be saved to prompt cache and cleared upon starting a new task",
                        ),
                    )
                )
            else:
                lines.append(
                    (
                        tr,
                        srv_line("init", "idle slots will be saved to prompt cache upon starting a new task"),
                    )
                )
        lines.append(("INF", srv_line("init", "model loaded")))
        return [s for s in (self.line(0.0, level, text) for level, text in lines) if s is not None]

    def startup_note(self, text: str) -> list[str]:
        line = self.line(0.0, "WRN", srv_line("init", text))
        return [line] if line is not None else []

    def listening(self, t: float, host: str, port: int) -> list[str]:
        out = [
            self.line(t, "INF", srv_line("main", f"server is listening on http://{host}:{port}")),
            self.line(t, self.trace, srv_line("update_slots", "all slots are idle")),
        ]
        return [s for s in out if s is not None]
