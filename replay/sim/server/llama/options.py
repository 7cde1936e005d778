"""`replay sim serve --server llama`: llama-server's own flags, with llama-server's defaults.

The flags a cache model reads change what it does (`-np`, `-c`, `--cache-ram`, `--ctx-checkpoints`,
`--slot-prompt-similarity`, `--cache-reuse`, `--slot-save-path`, ...). Flags that only change how
fast a real machine runs (`-t`, `-fa`, `-ngl`) are accepted and change nothing: the modelled speed is
the preset's. A flag llama-server has and this simulator does not model is refused, never ignored.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from replay.errors import UsageError
from replay.serving.guard import Limits
from replay.sim.model.llama.arch import CACHE_TYPES
from replay.sim.model.llama.build import XLLAMACPP_BUILD
from replay.sim.model.llama.config import DEFAULT_PRESET, PRESETS, LlamaConfig, llama_config
from replay.sim.server.llama.model_file import ModelFile, read_model
from replay.sim.server.options import add_limit_flags, limits_from


@dataclass(frozen=True, slots=True)
class LlamaServeOptions:
    host: str = "127.0.0.1"
    port: int = 8080
    time_scale: float = 1.0
    log: str | None = None
    limits: Limits = Limits()
    alias: str | None = None
    slot_save_path: str | None = None
    metrics: bool = False
    slots: bool = True
    props: bool = False
    verbosity: int = 3
    model: ModelFile | None = None


def _switch(
    p: argparse._ArgumentGroup, on: tuple[str, ...], off: tuple[str, ...], dest: str, help_: str
) -> None:
    p.add_argument(*on, dest=dest, action="store_true", default=None, help=help_)
    p.add_argument(*off, dest=dest, action="store_false", default=None, help=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="replay sim serve --server llama",
        description="A simulated llama-server: its slots, prompt caches, checkpoints and log lines, no model run.",
    )
    p.add_argument("--server", choices=["llama"], default="llama", help=argparse.SUPPRESS)
    s = p.add_argument_group("simulator")
    s.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default=None,
        help=f"model figures without a model file (default {DEFAULT_PRESET}); with -m, the speeds only",
    )
    s.add_argument(
        "--build",
        type=int,
        default=None,
        help=f"llama.cpp build whose cache rules apply (default {XLLAMACPP_BUILD}, the xllamacpp wheel's)",
    )
    s.add_argument("--time-scale", type=float, default=1.0, help="run S times faster than modelled time")
    s.add_argument("--log", metavar="FILE", help="append the log here instead of stderr")
    s.add_argument(
        "--reply-tokens",
        dest="default_reply_tokens",
        type=int,
        default=None,
        metavar="N",
        help="tokens a reply has when neither the request nor -n caps it (the model has no EOS; default 256)",
    )
    g = p.add_argument_group("llama-server")
    g.add_argument("-m", "--model", metavar="FILE", help="GGUF model file: its layout and its tokenizer")
    g.add_argument("-a", "--alias", help="model name the API reports")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    g.add_argument(
        "-c", "--ctx-size", dest="n_ctx", type=int, help="context size over all slots (0 = model's)"
    )
    g.add_argument("-np", "--parallel", dest="n_parallel", type=int, help="slots (-1 = auto: 4, unified KV)")
    g.add_argument("-b", "--batch-size", dest="n_batch", type=int, help="logical batch size (2048)")
    g.add_argument("-ub", "--ubatch-size", dest="n_ubatch", type=int, help="physical batch size (512)")
    g.add_argument("-n", "--predict", "--n-predict", dest="n_predict", type=int, help="max tokens per reply")
    g.add_argument(
        "-cram",
        "--cache-ram",
        dest="cache_ram_mib",
        type=int,
        help="host prompt cache MiB (8192; -1 no limit, 0 off)",
    )
    g.add_argument("--slot-save-path", help="directory for slot save/restore files")
    g.add_argument("--metrics", action="store_true", help="enable GET /metrics")
    _switch(g, ("--slots",), ("--no-slots",), "endpoint_slots", "GET /slots (on; --no-slots)")
    g.add_argument("--props", action="store_true", help="enable POST /props")
    _switch(g, ("--cache-prompt",), ("--no-cache-prompt",), "cache_prompt", "reuse the slot's prefix (on)")
    _switch(
        g, ("-kvu", "--kv-unified"), ("-no-kvu", "--no-kv-unified"), "kv_unified", "one KV pool for all slots"
    )
    g.add_argument("--swa-full", action="store_true", default=None, help="full-size sliding-window cache")
    g.add_argument(
        "-ctxcp",
        "--ctx-checkpoints",
        "--swa-checkpoints",
        dest="ctx_checkpoints",
        type=int,
        help="checkpoints per slot (32)",
    )
    g.add_argument(
        "-cms",
        "--checkpoint-min-step",
        dest="checkpoint_min_step",
        type=int,
        help="min tokens between checkpoints (8192)",
    )
    g.add_argument(
        "-sps",
        "--slot-prompt-similarity",
        dest="slot_prompt_similarity",
        type=float,
        help="LCP share to pick a slot (0.1)",
    )
    g.add_argument("--cache-reuse", dest="cache_reuse", type=int, help="min chunk for KV-shift reuse (0 off)")
    _switch(
        g,
        ("--cache-idle-slots",),
        ("--no-cache-idle-slots",),
        "cache_idle_slots",
        "store idle slots in the host cache (on)",
    )
    g.add_argument(
        "-ctk", "--cache-type-k", choices=sorted(CACHE_TYPES), default="f16", help="KV cache type for K"
    )
    g.add_argument(
        "-ctv", "--cache-type-v", choices=sorted(CACHE_TYPES), default="f16", help="KV cache type for V"
    )
    g.add_argument(
        "-lv",
        "--verbosity",
        "--log-verbosity",
        dest="verbosity",
        type=int,
        default=None,
        help="log verbosity (3; 4 adds the cache lines)",
    )
    g.add_argument(
        "-v", "--verbose", "--log-verbose", dest="verbose", action="store_true", help="log everything"
    )
    n = p.add_argument_group("accepted, no effect on the model (its speed is the preset's)")
    for names, kind in (
        (("-t", "--threads"), int),
        (("-tb", "--threads-batch"), int),
        (("--threads-http",), int),
        (("-ngl", "--gpu-layers", "--n-gpu-layers"), int),
        (("-fa", "--flash-attn"), str),
        (("-s", "--seed"), int),
        (("--temp",), float),
        (("--keep",), int),
        (("-to", "--timeout"), int),
        (("--chat-template",), str),
    ):
        n.add_argument(
            *names, type=kind, dest="_" + names[-1].lstrip("-").replace("-", "_"), help=argparse.SUPPRESS
        )
    for flag in (
        "--jinja",
        "--no-jinja",
        "--no-warmup",
        "--log-prefix",
        "--log-timestamps",
        "-cb",
        "--cont-batching",
        "--no-webui",
        "--webui",
    ):
        n.add_argument(
            flag, action="store_true", dest="_" + flag.lstrip("-").replace("-", "_"), help=argparse.SUPPRESS
        )
    add_limit_flags(p)
    return p


_CONFIG = (
    "n_ctx",
    "n_parallel",
    "kv_unified",
    "n_batch",
    "n_ubatch",
    "cache_prompt",
    "cache_ram_mib",
    "ctx_checkpoints",
    "checkpoint_min_step",
    "slot_prompt_similarity",
    "cache_reuse",
    "cache_idle_slots",
    "swa_full",
    "n_predict",
    "default_reply_tokens",
    "build",
)


def parse(argv: list[str]) -> tuple[LlamaConfig, LlamaServeOptions]:
    ns = build_parser().parse_args(argv)
    if ns.time_scale <= 0:
        raise UsageError("--time-scale must be positive")
    if ns.n_parallel == 0:
        raise UsageError("-np: invalid value for n_parallel (0)")
    if ns.slot_save_path is not None and not Path(ns.slot_save_path).is_dir():
        raise UsageError(f"--slot-save-path must be an existing directory: {ns.slot_save_path}")
    model = read_model(ns.model, ns.cache_type_k, ns.cache_type_v) if ns.model else None
    overrides = {name: getattr(ns, name) for name in _CONFIG}
    preset = ns.preset or DEFAULT_PRESET
    cfg = llama_config(preset, **overrides)
    if model is not None:
        cfg = cfg.with_(arch=model.arch, model_id=Path(ns.model).name, preset=ns.preset or "model-file")
    cfg = cfg.with_(model_id=ns.alias or cfg.model_id)
    verbosity = 2**31 - 1 if ns.verbose else (ns.verbosity if ns.verbosity is not None else 3)
    host = "127.0.0.1" if ns.host == "localhost" else ns.host
    return cfg, LlamaServeOptions(
        host=host,
        port=ns.port,
        time_scale=ns.time_scale,
        log=ns.log,
        limits=limits_from(ns),
        alias=ns.alias,
        slot_save_path=ns.slot_save_path,
        metrics=ns.metrics,
        slots=ns.endpoint_slots is not False,
        props=ns.props,
        verbosity=verbosity,
        model=model,
    )


class _FlagError(Exception):
    pass


def flag_problem(argv: list[str]) -> str | None:
    """What argparse would refuse in these flags, as a line; None when they parse."""
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
