"""Writes ds4-server log text from the printf formats in reference/ds4-server.md section 3.

Tests build logs with this instead of pasting blobs, so a scenario reads as what the server did
(start, request, miss, restore, restart) and the expected figures follow from the arguments.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

YELLOW = "\x1b[33m"
RESET = "\x1b[0m"


class Ds4LogWriter:
    def __init__(
        self, start: dt.datetime = dt.datetime(2026, 5, 21, 9, 0, 0), *, colour: bool = False
    ) -> None:
        self.now = start
        self.colour = colour
        self.lines: list[str] = []

    # -- raw lines -------------------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)

    def server(self, msg: str) -> None:
        stamp = self.now.strftime("%m%d %H:%M:%S")
        body = f"{YELLOW}{msg}{RESET}" if self.colour else msg
        self.lines.append(f"{stamp} ds4-server: {body}")

    def engine(self, msg: str) -> None:
        self.lines.append(f"ds4: {msg}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"

    # -- process lines ---------------------------------------------------------------------------

    def startup(
        self,
        *,
        ctx: int = 262144,
        prefill_chunk: int = 4096,
        disk_dir: str | None = "/var/kv",
        budget: int = 65536,
        min_tokens: int = 512,
        cold_max: int = 30000,
        continued: int = 10000,
        trim: int = 32,
        align: int = 2048,
        sessions: int | None = None,
        port: int = 8000,
    ) -> None:
        self.engine("loading model weights")
        self.server(
            f"context buffers 5120.00 MiB (ctx={ctx}, backend=metal, prefill_chunk={prefill_chunk}, "
            f"raw_kv_rows=128, compressed_kv_rows={ctx // 4})"
        )
        if sessions is not None and sessions > 1:
            self.server(f"{sessions} resident sessions request at least 96.0 GiB of context buffers")
        if disk_dir is not None:
            self.server(
                f"KV disk cache {disk_dir} (budget={budget} MiB, cross-quant=accept, min={min_tokens}, "
                f"cold_max={cold_max}, continued={continued}, trim={trim}, align={align}, hit_half_life=21600s)"
            )
        if sessions is not None:
            self.server(
                f"batched mode enabled resident_sessions={sessions} prefill_quantum=2048 "
                "mixed_prefill_quantum=128 decode_coalesce_us=2000"
            )
            self.server("MTP speculative decoding is disabled while native session batching is active")
        self.server(f"listening on http://127.0.0.1:{port}")

    def shutdown(self, persist: Iterable[int] = ()) -> None:
        self.server("shutdown requested, draining requests")
        for slot, tokens in enumerate(persist):
            self.server(f"persisting resident KV cache before shutdown slot={slot} tokens={tokens}")
            self.store(tokens, reason="shutdown")

    # -- cache lines -----------------------------------------------------------------------------

    def live_miss(
        self,
        live: int,
        prompt: int,
        common: int,
        reason: str = "token-mismatch",
        *,
        resp: bool = False,
        vision: str | None = None,
    ) -> None:
        tag = " RESPPROTO" if resp else ""
        vis = f" vision={vision}" if vision is not None else ""
        self.server(
            f"live kv cache miss{tag} live={live} prompt={prompt} common={common}{vis} reason={reason}"
        )

    def store(
        self,
        tokens: int,
        reason: str,
        *,
        trimmed: int = 0,
        key: str = "token-text",
        mib: float | None = None,
        ms: float = 150.0,
    ) -> None:
        size = mib if mib is not None else 22.9 + tokens * 13768 / 2**20
        self.server(
            f"kv cache stored tokens={tokens} trimmed={trimmed} reason={reason} key={key} "
            f"size={size:.2f} MiB save={ms:.1f} ms"
        )

    def hit(
        self,
        tokens: int,
        *,
        key: str = "token-text",
        load_ms: float = 950.0,
        consumed: bool = False,
        resp: bool = False,
        path: str = "/var/kv/0123456789abcdef0123456789abcdef01234567.kv",
    ) -> None:
        tag = " RESPPROTO" if resp else ""
        cons = " consumed" if consumed else ""
        self.server(
            f"kv cache hit text{tag} tokens={tokens} text={tokens * 4} quant=2 key={key} "
            f"load={load_ms:.1f} ms{cons} file={path}"
        )

    def evict(self, tokens: int, hits: int = 0, *, path: str = "/var/kv/ffff.kv") -> None:
        size = 22.9 + tokens * 13768 / 2**20
        self.server(
            f"kv cache evicted reason=disk-cache-full tokens={tokens} hits={hits} size={size:.2f} MiB file={path}"
        )

    # -- one request -----------------------------------------------------------------------------

    def request(
        self,
        cached: int,
        prompt: int,
        gen: int,
        *,
        api: str = "chat",
        flags: str = "",
        finish: str = "tool_calls",
        error: str | None = None,
        prefill_tps: float = 500.0,
        decode_tps: float = 40.0,
        chunk: int = 4096,
        tool_calls: int | None = None,
        end_flags: str = "",
        cold_store: int | None = None,
    ) -> None:
        """prompt start -> prefill chunks -> prompt done -> decoding every 50 tokens -> finish."""
        span = f"{api} ctx={cached}..{prompt}:{prompt - cached}"
        f = f" {flags}" if flags else ""
        todo = prompt - cached
        self.server(f"{span}{f} prompt start")
        if todo > chunk:
            done = 0
            while done < todo:
                pct = 100.0 * done / todo
                secs = done / prefill_tps
                self.server(
                    f"{span}{f} prefill chunk {done}/{todo} ({pct:.1f}%) chunk={prefill_tps:.2f} t/s "
                    f"avg={prefill_tps:.2f} t/s {secs:.2f}s"
                )
                if cold_store is not None and done <= cold_store < done + chunk:
                    self.store(cold_store, "cold", trimmed=prompt - cold_store)
                done += chunk
        prefill_s = todo / prefill_tps
        self.advance(prefill_s)
        self.server(f"{span}{f} prompt done {prefill_s:.2f}s")
        if cold_store is not None and todo <= chunk:
            self.store(cold_store, "cold", trimmed=prompt - cold_store)
        n = 0
        while n < gen:
            n = min(gen, n + 50)
            secs = n / decode_tps
            self.server(
                f"{api} ctx={prompt}..{prompt + n}:{n} gen={n}{f} decoding chunk={decode_tps:.2f} t/s "
                f"avg={decode_tps:.2f} t/s {secs:.2f}s"
            )
        self.advance(gen / decode_tps)
        if tool_calls:
            self.server(
                f"tool calls ctx={cached}..{prompt}:{todo} n={tool_calls} raw_dsml=0 "
                f"ids=[call_0] names=[read_file]"
            )
        ef = f" {end_flags}" if end_flags else ""
        err = f' error="{error}"' if error is not None else ""
        total = prefill_s + gen / decode_tps
        self.server(f"{span} gen={gen}{f}{ef} finish={finish}{err} {total:.2f}s")
        self.advance(1.0)
