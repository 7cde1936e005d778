"""Command-line flags of the simulated server, named after ds4-server's own where ds4 has one."""

from __future__ import annotations

import argparse
import datetime as _dt
from dataclasses import dataclass

from replay.errors import UsageError
from replay.serving.guard import Limits
from replay.sim.model.builds import BUILDS
from replay.sim.model.config import (
    CONTINUED_TRIGGERS,
    DEFAULT_PRESET,
    EVICTIONS,
    PRESETS,
    ROUTINGS,
    VISIBLE_KEYS,
    SimConfig,
    config_for,
    parse_bytes,
)


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
    limits: Limits = Limits()
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
    g.add_argument(
        "--server",
        choices=["ds4", "llama"],
        default="ds4",
        help="which server to simulate: ds4-server (these flags) or llama-server "
        "(`replay sim serve --server llama --help` lists its flags)",
    )
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument(
        "--port", type=int, default=8000, help="0 picks a free port (printed in the listening line)"
    )
    g.add_argument("--log", metavar="FILE", help="append ds4-format log lines here instead of stderr")
    g.add_argument(
        "--time-scale", type=float, default=1.0, help="run this many times faster than modelled time"
    )
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
    add_limit_flags(p)
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
    m.add_argument("--resume-prefill-s", type=float)
    m.add_argument(
        "--hidden-reasoning",
        action="store_true",
        default=None,
        help="replies hold reasoning clients never resend",
    )
    m.add_argument("--reasoning-tokens", type=int)
    m.add_argument("--visible-key", choices=VISIBLE_KEYS, help="which replies get a client-visible cache key")
    m.add_argument(
        "--tool-replay-key",
        action="store_true",
        default=None,
        help="field build (ds4 issue 1053): files keyed by their last reply's kind; tool requests find only tool-keyed ones",
    )
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
    k.add_argument(
        "--build",
        choices=sorted(BUILDS),
        help="the ds4 build whose cache rules to run (eviction, saves, keys): "
        + "; ".join(f"{b.name} = {b.about}" for b in BUILDS.values())
        + " (a rule flag below overrides the build's)",
    )
    k.add_argument("--eviction", choices=EVICTIONS, help="base = May build, aug = August build multipliers")
    k.add_argument(
        "--consume-deep-hits", action="store_true", default=None, help="May build: delete restored > cold_max"
    )
    k.add_argument("--continued-trigger", choices=CONTINUED_TRIGGERS)
    _describe(p)
    return p


# What the flags without a help text of their own mean (ds4's names; see ds4-server.md section 1).
_HELP = {
    "host": "address to listen on",
    "preset": "model figures to start from (every one can be overridden below)",
    "prefill_tps": "prefill speed, tokens per modelled second",
    "decode_tps": "decode speed, tokens per modelled second",
    "disk_read_gbps": "checkpoint read speed, GB per modelled second",
    "disk_write_gbps": "checkpoint write speed, GB per modelled second",
    "resume_prefill_s": "fixed seconds a prefill resumed after a disk restore costs",
    "reasoning_tokens": "hidden reasoning tokens per reply (with --hidden-reasoning)",
    "batched_sessions": "resident sessions (slots), each with its own KV, as ds4's --batched-session",
    "routing": "which slot a request goes to: ds4's (upstream) or one that prefers a slot already holding its prefix",
    "prefill_chunk": "prefill step, tokens",
    "prefill_quantum": "prefill step while no other slot decodes, tokens",
    "mixed_prefill_quantum": "prefill step while another slot decodes, tokens",
    "kv_disk_dir": "enable disk KV checkpoints in this directory (without it the budget is not in effect)",
    "kv_disk_space_mb": "disk budget for checkpoints, MiB",
    "kv_cache_min_tokens": "no checkpoint is saved or loaded below this many tokens",
    "kv_cache_cold_max_tokens": "cold save only for first prompts up to this many tokens (0: none)",
    "kv_cache_continued_interval_tokens": "continued save every N tokens of a prefill (rounded up to the align value)",
    "kv_cache_boundary_trim_tokens": "tail tokens dropped before a cold save",
    "kv_cache_boundary_align_tokens": "cold cut and continued step are multiples of this",
    "continued_trigger": "when a continued save fires: at exact multiples, or at the first chunk past one",
}


def _describe(parser: argparse.ArgumentParser) -> None:
    """Every flag gets a description, a readable placeholder and its default: the preset's figure
    where the flag overrides one (`--preset` changes it), else the flag's own."""
    preset = config_for(DEFAULT_PRESET)
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        if action.help is None:
            action.help = _HELP.get(action.dest, action.dest.replace("_", " "))
        if action.metavar is None and action.nargs != 0 and action.choices is None:
            named = {"host": "HOST", "model_id": "NAME"}.get(action.dest)
            action.metavar = named or {int: "N", float: "X", _bytes_arg: "SIZE"}.get(action.type, "VALUE")  # type: ignore[arg-type]
        default = action.default if action.default is not None else getattr(preset, action.dest, None)
        if default not in (None, "", False) and "default" not in action.help:
            if action.type is _bytes_arg and isinstance(default, int):
                default = size_text(default)  # as it is written: 64MiB, not 67108864
            shown = f"{default} for {DEFAULT_PRESET}" if action.default is None else default
            action.help += f" (default: {shown})"


def size_text(n: int) -> str:
    """A byte count as a flag takes it: `64MiB`, `34.5KiB` (to a tenth of a unit), else bytes."""
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= unit and (n * 10) % unit == 0:
            return f"{n / unit:g}{name}"
    return str(n)


class _FlagError(Exception):
    pass


def flag_problem(argv: list[str]) -> str | None:
    """What argparse would refuse in these simulator flags, as a line; None when they parse.

    A run checks its `--target sim[:preset]` and `--sim-args` with this before anything starts,
    rather than learning of a typo from a child process that exits with a usage message.
    """
    parser = build_parser()

    def error(message: str) -> None:
        raise _FlagError(message)

    parser.error = error  # type: ignore[method-assign]
    try:
        parser.parse_args(argv)
    except _FlagError as exc:
        return str(exc)
    except SystemExit:
        return "--help is not a run option"
    return None


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
    "resume_prefill_s",
    "hidden_reasoning",
    "reasoning_tokens",
    "visible_key",
    "tool_replay_key",
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


def add_limit_flags(p: argparse.ArgumentParser) -> None:
    """What one client may hold (replay.serving.guard); the defaults are far above agents' traffic."""
    d = Limits()
    g = p.add_argument_group("client limits")
    g.add_argument(
        "--max-body",
        type=_bytes_arg,
        default=d.max_body_bytes,
        help="largest request body (413 above)",
    )
    g.add_argument(
        "--header-timeout",
        type=float,
        default=d.header_timeout_s,
        metavar="S",
        help="seconds for a request's headers",
    )
    g.add_argument(
        "--body-timeout",
        type=float,
        default=d.body_timeout_s,
        metavar="S",
        help="seconds for a whole request body",
    )
    g.add_argument(
        "--keep-alive-timeout",
        type=float,
        default=d.keep_alive_s,
        metavar="S",
        help="idle seconds before a connection closes",
    )
    g.add_argument(
        "--max-connections",
        type=int,
        default=d.max_connections,
        metavar="N",
        help="requests served at once (503 beyond)",
    )


def limits_from(ns: argparse.Namespace) -> Limits:
    limits = Limits(
        max_body_bytes=ns.max_body,
        header_timeout_s=ns.header_timeout,
        body_timeout_s=ns.body_timeout,
        keep_alive_s=ns.keep_alive_timeout,
        max_connections=ns.max_connections,
    )
    try:
        return limits.check()
    except ValueError as exc:
        raise UsageError(f"--{exc}") from None


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
    if ns.build is not None:
        build = BUILDS[ns.build]
        given = {k: v for k, v in overrides.items() if v is not None}
        overrides = {**build.rules(), "build": build.name, **given}
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
        limits=limits_from(ns),
        tool_call_rate=ns.tool_call_rate,
        tool_call_max=ns.tool_call_max,
        seed=ns.seed,
        tool_names=tuple(n.strip() for n in ns.tool_names.split(",") if n.strip()),
        clock=clock,
        utc_offset_s=offset,
    )
