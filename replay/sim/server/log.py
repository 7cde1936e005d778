"""ds4-server log lines for the simulator's events, to the letter of the reference (section 3).

The same parser reads the real server's log and the simulator's, so these formats are a contract:
`MMDD HH:MM:SS ds4-server: <message>`, local time, one line per event, no ANSI colour.
Durations in messages are the modelled ones, and so is the timestamp: the clock at modelled time 0
(the start, or `--clock`) plus the modelled seconds, so a log read back spans the hours it models.
"""

from __future__ import annotations

import time
from pathlib import Path

from replay.sim.model import events as ev
from replay.sim.model.config import GiB, MiB, SimConfig

PREFIX = "ds4-server: "


def stamp(epoch: float | None = None, utc_offset_s: float | None = None) -> str:
    """`MMDD HH:MM:SS` in local time, or at `utc_offset_s` from UTC when given."""
    epoch = time.time() if epoch is None else epoch
    if utc_offset_s is None:
        return time.strftime("%m%d %H:%M:%S", time.localtime(epoch))
    return time.strftime("%m%d %H:%M:%S", time.gmtime(epoch + utc_offset_s))


def line(message: str, epoch: float | None = None, utc_offset_s: float | None = None) -> str:
    return f"{stamp(epoch, utc_offset_s)} {PREFIX}{message}"


def _span(cached: int, prompt: int) -> str:
    return f"{cached}..{prompt}:{prompt - cached}"


def _flags(flags: str) -> str:
    return f" {flags}" if flags else ""


def _mib(size: int) -> str:
    return f"{size / MiB:.2f}"


def _path(kv_dir: str, name: str) -> str:
    return str(Path(kv_dir) / name)


def format_event(event: ev.Event, cfg: SimConfig, kv_dir: str = "") -> str | None:
    """The message ds4 logs for `event` (without the timestamp prefix), or None if it logs nothing."""
    match event:
        case ev.LiveMiss():
            return (
                f"live kv cache miss live={event.live} prompt={event.prompt} common={event.common} "
                f"reason={event.reason}"
            )
        case ev.LiveContinuation():
            return (
                f"thinking live continuation match=visible-prefix cached={event.cached} prompt={event.prompt}"
            )
        case ev.Stored():
            cp = event.checkpoint
            return (
                f"kv cache stored tokens={cp.tokens} trimmed={cp.trimmed} reason={event.reason} key={cp.key} "
                f"size={_mib(cp.size)} MiB save={event.save_s * 1000:.1f} ms"
            )
        case ev.Skipped():
            return f"kv cache skipped tokens={event.tokens} reason={event.reason} because {event.because}"
        case ev.Evicted():
            cp = event.checkpoint
            return (
                f"kv cache evicted reason=disk-cache-full tokens={cp.tokens} hits={cp.hits} "
                f"size={_mib(cp.size)} MiB file={_path(kv_dir, cp.name)}"
            )
        case ev.DiskHit():
            cp = event.checkpoint
            consumed = " consumed" if event.consumed else ""
            return (
                f"kv cache hit text tokens={cp.tokens} text={cp.text_bytes()} quant={cfg.quant_bits} key={cp.key} "
                f"load={event.load_s * 1000:.1f} ms{consumed} file={_path(kv_dir, cp.name)}"
            )
        case ev.PromptStart():
            return f"chat ctx={_span(event.cached, event.prompt)}{_flags(event.flags)} prompt start"
        case ev.PrefillChunk():
            total = event.prompt - event.cached
            pct = 100.0 * event.done / total if total else 100.0
            return (
                f"chat ctx={_span(event.cached, event.prompt)}{_flags(event.flags)} prefill chunk "
                f"{event.done}/{total} ({pct:.1f}%) chunk={event.chunk_tps:.2f} t/s avg={event.avg_tps:.2f} t/s "
                f"{event.elapsed:.3f}s"
            )
        case ev.PromptDone():
            return f"chat ctx={_span(event.cached, event.prompt)}{_flags(event.flags)} prompt done {event.elapsed:.3f}s"
        case ev.DecodeProgress():
            return (
                f"chat ctx={event.start}..{event.start + event.gen}:{event.gen} gen={event.gen}{_flags(event.flags)} "
                f"decoding chunk={event.chunk_tps:.2f} t/s avg={event.avg_tps:.2f} t/s {event.elapsed:.3f}s"
            )
        case ev.ToolCallsEmitted():
            return (
                f"tool calls ctx={_span(event.cached, event.prompt)} n={len(event.ids)} raw_tool_text=0 "
                f"ids=[{','.join(event.ids)}] names=[{','.join(event.names)}]"
            )
        case ev.ThinkingRemembered():
            return (
                f"thinking live checkpoint remembered ctx={_span(event.cached, event.prompt)} live={event.live} "
                f"visible={len(event.visible.text().encode())}"
            )
        case ev.Finished():
            r = event.result
            error = f' error="{r.error}"' if r.error else ""
            return (
                f"chat ctx={_span(r.cached_tokens, r.prompt_tokens)} gen={r.completion_tokens}{_flags(event.flags)} "
                f"finish={r.finish}{error} {r.prefill_s + r.decode_s:.3f}s"
            )
        case ev.Persisting():
            if cfg.batched:
                return f"persisting resident KV cache before shutdown slot={event.slot} tokens={event.tokens}"
            return f"persisting current KV cache before shutdown tokens={event.tokens}"
    return None


def startup_lines(cfg: SimConfig) -> list[str]:
    """What ds4 prints after model load; the disk line follows the startup eviction pass."""
    buf_mib = cfg.bytes_per_token * cfg.ctx / MiB
    lines = [
        f"context buffers {buf_mib:.2f} MiB (ctx={cfg.ctx}, backend=sim, prefill_chunk={cfg.prefill_chunk}, "
        f"raw_kv_rows={cfg.ctx}, compressed_kv_rows={cfg.ctx // 4})"
    ]
    if cfg.slots > 1:
        gib = cfg.bytes_per_token * cfg.ctx * cfg.slots / GiB
        lines.append(f"{cfg.slots} resident sessions request at least {gib:.2f} GiB of context buffers")
    if cfg.batched:
        lines.append(
            f"batched mode enabled resident_sessions={cfg.slots} prefill_quantum={cfg.prefill_quantum} "
            f"mixed_prefill_quantum={cfg.mixed_prefill_quantum} decode_coalesce_us=2000"
        )
    return lines


def kv_disk_line(cfg: SimConfig, kv_dir: str) -> str:
    return (
        f"KV disk cache {kv_dir} (budget={cfg.kv_disk_space_mb} MiB, cross-quant=accept, "
        f"min={cfg.kv_cache_min_tokens}, cold_max={cfg.kv_cache_cold_max_tokens}, "
        f"continued={cfg.kv_cache_continued_interval_tokens}, trim={cfg.kv_cache_boundary_trim_tokens}, "
        f"align={cfg.kv_cache_boundary_align_tokens}, hit_half_life={int(cfg.hit_half_life_s)}s)"
    )


def listening_line(host: str, port: int) -> str:
    return f"listening on http://{host}:{port}"


SHUTDOWN_REQUESTED = "shutdown requested, draining requests"
