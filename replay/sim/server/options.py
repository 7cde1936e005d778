"""Command-line flags of the simulated server, named after ds4-server's own where ds4 has one."""

from __future__ import annotations

import argparse
import datetime as _dt
import re
from dataclasses import dataclass

from replay.errors import UsageError
from replay.sim.model.config import (
    CONTINUED_TRIGGERS,
    DEFAULT_PRESET,
    EVICTIONS,
    PRESETS,
    ROUTINGS,
    VISIBLE_KEYS,
    SimConfig,
    config_for,
)

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kib": 1024,
    "kb": 1000,
    "m": 1024**2,
    "mib": 1024**2,
    "mb": 1000**2,
    "g": 1024**3,
    "gib": 1024**3,
    "gb": 1000**3,
    "t": 1024**4,
    "tib": 1024**4,
    "tb": 1000**4,
}


def parse_bytes(text: str) -> int:
    """`34.5KiB`, `24G`, `64GB`, `4096`: K/M/G/T and KiB.. are binary, KB/MB/GB/TB decimal."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise UsageError(f"not a size: {text!r} (use e.g. 34.5KiB, 24G, 64GB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_tokens(text: str) -> int:
    """`77000`, `77K`, `1.5M` (decimal: token counts)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmM]?)\s*", text)
    if not m:
        raise UsageError(f"not a token count: {text!r}")
    return int(float(m.group(1)) * {"": 1, "k": 1000, "m": 1000_000}[m.group(2).lower()])


def _bytes_arg(text: str) -> int:
    try:
        return parse_bytes(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    kv_dir: str | None = None
    time_scale: float = 1.0
    log: str | None = None
    tool_call_rate: float = 0.0
    tool_call_max: int = 3
    seed: int = 0
    tool_names: tuple[str, ...] = ()
    # Wall-clock epoch of modelled time 0 and its UTC offset in seconds (`--clock`); None = now, local.
    clock: float | None = None
    utc_offset_s: float | None = None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="replay sim serve",
        description="A simulated ds4-server: ds4's cache policy, slots and log lines, no model needed.",
    )
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument(
        "--port", type=int, default=8000, help="0 picks a free port (printed in the listening line)"
    )
    g.add_argument("--log", metavar="FILE", help="append ds4-format log lines here instead of stderr")
    g.add_argument("--time-scale", type=float, default=1.0, help="run S times faster than modelled time")
    g.add_argument(
        "--clock",
        metavar="ISO",
        help="the time of the first request (e.g. 2026-09-01T06:45:00+00:00): modelled time starts "
        "with it and log lines and file times are stamped in modelled time from it (default: the "
        "start, local time)",
    )
    a = p.add_argument_group("agents")
    a.add_argument(
        "--tool-call-rate",
        type=float,
        default=0.0,
        metavar="R",
        help="answer this share (0-1) of requests that offer tools with a tool call whose arguments fit its schema",
    )
    a.add_argument(
        "--tool-call-max", type=int, default=3, metavar="N", help="tool rounds in a row before a text answer"
    )
    a.add_argument(
        "--seed", type=int, default=0, help="which requests get tool calls (same seed, same calls)"
    )
    a.add_argument(
        "--tool-names",
        default="",
        metavar="A,B",
        help="call only these tools when a request offers them (e.g. read-only ones); default: any",
    )
    m = p.add_argument_group("model")
    m.add_argument("--preset", choices=sorted(PRESETS), default=DEFAULT_PRESET)
    m.add_argument("-m", "--model", dest="model_id", help="model id to serve (default: the preset's)")
    m.add_argument("-c", "--ctx", type=int, help="context tokens per session")
    m.add_argument(
        "-n", "--tokens", dest="default_max_tokens", type=int, help="reply tokens when a request gives none"
    )
    m.add_argument("--prefill-tps", type=float)
    m.add_argument("--decode-tps", type=float)
    m.add_argument("--bytes-per-token", type=_bytes_arg, help="checkpoint bytes per token, e.g. 34.5KiB")
    m.add_argument("--fixed-bytes", type=_bytes_arg, help="checkpoint bytes per file, e.g. 22.9MiB")
    m.add_argument("--disk-read-gbps", type=float)
    m.add_argument("--disk-write-gbps", type=float)
    m.add_argument(
        "--hidden-reasoning",
        action="store_true",
        default=None,
        help="replies hold reasoning clients never resend",
    )
    m.add_argument("--reasoning-tokens", type=int)
    m.add_argument("--visible-key", choices=VISIBLE_KEYS, help="which replies get a client-visible cache key")
    s = p.add_argument_group("slots")
    s.add_argument("--batched-session", dest="batched_sessions", type=int, metavar="N")
    s.add_argument("--routing", choices=ROUTINGS)
    s.add_argument("--prefill-chunk", type=int)
    s.add_argument("--prefill-quantum", type=int)
    s.add_argument("--mixed-prefill-quantum", type=int)
    k = p.add_argument_group("disk KV cache")
    k.add_argument("--kv-disk-dir", metavar="DIR")
    k.add_argument("--kv-disk-space-mb", type=int)
    k.add_argument("--kv-cache-min-tokens", type=int)
    k.add_argument("--kv-cache-cold-max-tokens", type=int)
    k.add_argument("--kv-cache-continued-interval-tokens", type=int)
    k.add_argument("--kv-cache-boundary-trim-tokens", type=int)
    k.add_argument("--kv-cache-boundary-align-tokens", type=int)
    k.add_argument("--eviction", choices=EVICTIONS, help="base = May build, aug = August build multipliers")
    k.add_argument(
        "--consume-deep-hits", action="store_true", default=None, help="May build: delete restored > cold_max"
    )
    k.add_argument("--continued-trigger", choices=CONTINUED_TRIGGERS)
    return p


_CONFIG_FIELDS = (
    "model_id",
    "ctx",
    "default_max_tokens",
    "prefill_tps",
    "decode_tps",
    "bytes_per_token",
    "fixed_bytes",
    "disk_read_gbps",
    "disk_write_gbps",
    "hidden_reasoning",
    "reasoning_tokens",
    "visible_key",
    "batched_sessions",
    "routing",
    "prefill_chunk",
    "prefill_quantum",
    "mixed_prefill_quantum",
    "kv_disk_space_mb",
    "kv_cache_min_tokens",
    "kv_cache_cold_max_tokens",
    "kv_cache_continued_interval_tokens",
    "kv_cache_boundary_trim_tokens",
    "kv_cache_boundary_align_tokens",
    "eviction",
    "consume_deep_hits",
    "continued_trigger",
)


def parse(argv: list[str] | None = None) -> tuple[SimConfig, ServeOptions]:
    ns = build_parser().parse_args(argv)
    overrides = {name: getattr(ns, name) for name in _CONFIG_FIELDS}
    if ns.batched_sessions is not None and ns.batched_sessions < 1:
        raise UsageError("--batched-session must be at least 1")
    if ns.time_scale <= 0:
        raise UsageError("--time-scale must be positive")
    if not 0.0 <= ns.tool_call_rate <= 1.0:
        raise UsageError("--tool-call-rate must be between 0 and 1")
    if ns.tool_call_max < 0:
        raise UsageError("--tool-call-max must be >= 0")
    cfg = config_for(ns.preset, disk=ns.kv_disk_dir is not None, **overrides)
    host = "127.0.0.1" if ns.host == "localhost" else ns.host
    clock = offset = None
    if ns.clock is not None:
        try:
            when = _dt.datetime.fromisoformat(ns.clock)
        except ValueError:
            raise UsageError(f"--clock: not an ISO 8601 time: {ns.clock!r}") from None
        if when.tzinfo is None:
            when = when.astimezone()
        clock = when.timestamp()
        delta = when.utcoffset()
        offset = delta.total_seconds() if delta is not None else 0.0
    return cfg, ServeOptions(
        host=host,
        port=ns.port,
        kv_dir=ns.kv_disk_dir,
        time_scale=ns.time_scale,
        log=ns.log,
        tool_call_rate=ns.tool_call_rate,
        tool_call_max=ns.tool_call_max,
        seed=ns.seed,
        tool_names=tuple(n.strip() for n in ns.tool_names.split(",") if n.strip()),
        clock=clock,
        utc_offset_s=offset,
    )
