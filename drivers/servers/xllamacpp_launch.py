"""Run llama.cpp's server from the `xllamacpp` wheel as if it were the `llama-server` executable.

`xllamacpp` compiles llama.cpp's HTTP server into a Python extension but ships no command line.
This module is that command line: `python -m drivers.servers.xllamacpp_launch -m MODEL --port N ...`
takes llama-server's own flags, so the driver starts the embedded server and a user's real binary
through one code path. Run it as a child process, never import-and-serve in the tool's process:
a crash in C++ must not take the run with it.

Behaviour a driver relies on:
- llama.cpp's own log goes to stderr unchanged (a log parser sees the real server's lines).
- Once `GET /health` answers 200 it prints llama-server's readiness line to stderr, in llama.cpp's
  log format: `0.00.052.114 I srv          main: server is listening on http://127.0.0.1:PORT`.
  With `--port 0` the server picks a free port and this line names it.
- SIGTERM or SIGINT stops the server: exit 0 at once when idle or generating. llama.cpp stops its
  loop only between batches, so mid-way through a long prompt batch it leaves after
  STOP_DEADLINE_S without the C++ cleanup (faulthandler's "Timeout" and stack on stderr, exit 1).
- A flag it does not map is an error (one line, exit 2), never silently ignored: a benchmark must
  not run with a setting the user believes is in effect but is not.
"""

from __future__ import annotations

import argparse
import faulthandler
import http.client
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

PROG = "xllamacpp_launch"
READY_TEXT = "srv          main: server is listening on {address}"
HEALTH_TIMEOUT_S = 60.0
# One prompt batch of a larger model can take many seconds; nothing on disk depends on the cleanup.
STOP_DEADLINE_S = 2.0

# A setter takes the xllamacpp.CommonParams and the parsed value.
Setter = Callable[[Any, Any], None]

CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
FLASH_ATTN = {"on": "ENABLED", "off": "DISABLED", "auto": "AUTO"}


class LaunchError(Exception):
    """A one-line reason the server cannot be started, with the exit code to use."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line and exit 2, instead of usage text."""

    def error(self, message: str) -> NoReturn:
        raise LaunchError(message, 2)


def _attr(name: str) -> Setter:
    def set_(p: Any, v: Any) -> None:
        setattr(p, name, v)

    return set_


def _const(name: str, value: Any) -> Setter:
    def set_(p: Any, _v: Any) -> None:
        setattr(p, name, value)

    return set_


def _noop(_p: Any, _v: Any) -> None:
    """For flags whose effect xllamacpp always has: accepting them is honest, ignoring others is not."""


def _set_model(p: Any, v: str) -> None:
    if not Path(v).is_file():
        raise LaunchError(f"model file not found: {v}", 2)
    p.model.path = v


def _set_slot_save_path(p: Any, v: str) -> None:
    # llama-server checks the directory and appends the separator; without it the slot file name
    # is glued onto the directory name.
    if not Path(v).is_dir():
        raise LaunchError(f"--slot-save-path must be an existing directory: {v}", 2)
    p.slot_save_path = v if v.endswith(os.sep) else v + os.sep


def _set_threads(p: Any, v: int) -> None:
    p.cpuparams.n_threads = v


def _set_threads_batch(p: Any, v: int) -> None:
    p.cpuparams_batch.n_threads = v


def _set_timeout(p: Any, v: int) -> None:
    p.timeout_read = v
    p.timeout_write = v


def _set_seed(p: Any, v: int) -> None:
    p.sampling.seed = v


def _set_temp(p: Any, v: float) -> None:
    p.sampling.temp = v


def _set_alias(p: Any, v: str) -> None:
    p.model_alias = {a.strip() for a in v.split(",") if a.strip()}


def _set_api_key(p: Any, v: str) -> None:
    p.api_keys = [k for k in v.split(",") if k]


def _cache_type(field: str) -> Setter:
    def set_(p: Any, v: str) -> None:
        import xllamacpp

        setattr(p, field, xllamacpp.ggml_type["GGML_TYPE_" + v.upper()])

    return set_


def _set_flash_attn(p: Any, v: str) -> None:
    import xllamacpp

    p.flash_attn_type = xllamacpp.llama_flash_attn_type["LLAMA_FLASH_ATTN_TYPE_" + FLASH_ATTN[v]]


# (flag spellings as llama-server has them, value type or None for a switch, setter, help)
FLAGS: list[tuple[tuple[str, ...], Any, Setter, str]] = [
    (("-m", "--model"), str, _set_model, "GGUF model file"),
    (("-a", "--alias"), str, _set_alias, "model name(s) the API reports, comma separated"),
    (("--host",), str, lambda p, v: setattr(p, "hostnames", [v]), "address to bind (127.0.0.1)"),
    (("--port",), int, _attr("port"), "port to bind (8080; 0 picks a free one)"),
    (("-c", "--ctx-size"), int, _attr("n_ctx"), "context size over all slots (0 = model's)"),
    (("-np", "--parallel"), int, _attr("n_parallel"), "number of slots"),
    (("-b", "--batch-size"), int, _attr("n_batch"), "logical batch size"),
    (("-ub", "--ubatch-size"), int, _attr("n_ubatch"), "physical batch size"),
    (("-t", "--threads"), int, _set_threads, "generation threads"),
    (("-tb", "--threads-batch"), int, _set_threads_batch, "prompt threads (default: --threads)"),
    (("--threads-http",), int, _attr("n_threads_http"), "HTTP worker threads"),
    (("-n", "--predict", "--n-predict"), int, _attr("n_predict"), "default max tokens to generate"),
    (("--keep",), int, _attr("n_keep"), "tokens kept on context shift"),
    (("-s", "--seed"), int, _set_seed, "default sampling seed"),
    (("--temp",), float, _set_temp, "default sampling temperature"),
    (("-cram", "--cache-ram"), int, _attr("cache_ram_mib"), "host prompt cache MiB (-1 no limit, 0 off)"),
    (("--slot-save-path",), str, _set_slot_save_path, "directory for slot save/restore files"),
    (("--metrics",), None, _const("endpoint_metrics", True), "enable GET /metrics"),
    (("--slots",), None, _const("endpoint_slots", True), "enable GET /slots"),
    (("--no-slots",), None, _const("endpoint_slots", False), "disable GET /slots"),
    (("--props",), None, _const("endpoint_props", True), "enable POST /props"),
    (("--cache-prompt",), None, _const("cache_prompt", True), "reuse the slot's KV for a shared prefix"),
    (("--no-cache-prompt",), None, _const("cache_prompt", False), "never reuse the slot's KV"),
    (("-kvu", "--kv-unified"), None, _const("kv_unified", True), "one KV buffer shared by all slots"),
    (("-no-kvu", "--no-kv-unified"), None, _const("kv_unified", False), "a KV buffer per slot"),
    (("--swa-full",), None, _const("swa_full", True), "full-size sliding-window cache"),
    (
        ("-ctxcp", "--ctx-checkpoints", "--swa-checkpoints"),
        int,
        _attr("n_ctx_checkpoints"),
        "checkpoints per slot",
    ),
    (("-cms", "--checkpoint-min-step"), int, _attr("checkpoint_min_step"), "min tokens between checkpoints"),
    (
        ("-sps", "--slot-prompt-similarity"),
        float,
        _attr("slot_prompt_similarity"),
        "LCP share to pick a slot",
    ),
    (("--cache-reuse",), int, _attr("n_cache_reuse"), "min chunk for KV shifting reuse (0 off)"),
    (("--cache-idle-slots",), None, _const("cache_idle_slots", True), "save idle slots to the host cache"),
    (("--no-cache-idle-slots",), None, _const("cache_idle_slots", False), "do not save idle slots"),
    (("-ctk", "--cache-type-k"), CACHE_TYPES, _cache_type("cache_type_k"), "KV cache type for K"),
    (("-ctv", "--cache-type-v"), CACHE_TYPES, _cache_type("cache_type_v"), "KV cache type for V"),
    (("-fa", "--flash-attn"), tuple(FLASH_ATTN), _set_flash_attn, "flash attention on|off|auto"),
    (("--jinja",), None, _const("use_jinja", True), "render the chat template with jinja (default)"),
    (("--no-jinja",), None, _const("use_jinja", False), "use llama.cpp's built-in templates"),
    (("--chat-template",), str, _attr("chat_template"), "chat template override"),
    (("--no-warmup",), None, _const("warmup", False), "skip the warm-up decode"),
    (("--context-shift",), None, _const("ctx_shift", True), "shift context when it fills"),
    (("--no-context-shift",), None, _const("ctx_shift", False), "fail requests that overflow"),
    (("-cb", "--cont-batching"), None, _const("cont_batching", True), "continuous batching (default)"),
    (("-nocb", "--no-cont-batching"), None, _const("cont_batching", False), "no continuous batching"),
    (
        ("-ngl", "--gpu-layers", "--n-gpu-layers"),
        int,
        _attr("n_gpu_layers"),
        "layers to offload (CPU build: none)",
    ),
    (("-to", "--timeout"), int, _set_timeout, "HTTP read/write timeout seconds"),
    (("--api-key",), str, _set_api_key, "API key(s), comma separated"),
    (("--webui",), None, _const("ui", True), "serve the web UI"),
    (("--no-webui",), None, _const("ui", False), "do not serve the web UI"),
    (("-v", "--verbose", "--log-verbose"), None, _const("verbosity", 2**31 - 1), "log everything"),
    (("-lv", "--verbosity", "--log-verbosity"), int, _attr("verbosity"), "log verbosity threshold"),
    (("--log-prefix",), None, _noop, "level letter on each line (always on in xllamacpp)"),
    (("--log-timestamps",), None, _noop, "timestamp on each line (always on in xllamacpp)"),
]


class _Step(argparse.Action):
    """Record (setter, value) in command-line order, so `--no-x --x` ends with x on, as in llama-server."""

    def __init__(self, *args: Any, setter: Setter, **kwargs: Any) -> None:
        self.setter = setter
        super().__init__(*args, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        steps = getattr(namespace, "steps", None) or []
        steps.append((self.setter, True if self.nargs == 0 else values, option_string))
        namespace.steps = steps


def build_parser() -> argparse.ArgumentParser:
    """The llama-server flags this launcher maps."""
    parser = _Parser(prog=f"python -m drivers.servers.{PROG}", allow_abbrev=False)
    for names, kind, setter, help_ in FLAGS:
        dest = names[-1].lstrip("-").replace("-", "_")
        if kind is None:
            parser.add_argument(*names, dest=dest, action=_Step, setter=setter, nargs=0, help=help_)
        elif isinstance(kind, tuple):
            parser.add_argument(*names, dest=dest, action=_Step, setter=setter, choices=kind, help=help_)
        else:
            parser.add_argument(*names, dest=dest, action=_Step, setter=setter, type=kind, help=help_)
    return parser


def parse_flags(argv: Sequence[str]) -> list[tuple[Setter, Any, str]]:
    """Flags in command-line order as (setter, value, flag); later flags win, as in llama-server."""
    ns, unknown = build_parser().parse_known_args(list(argv))
    if unknown:
        flag = next((u for u in unknown if u.startswith("-")), unknown[0])
        raise LaunchError(f"unknown or unsupported llama-server flag: {flag}", 2)
    steps: list[tuple[Setter, Any, str]] = getattr(ns, "steps", None) or []
    if not any(setter is _set_model for setter, _v, _f in steps):
        raise LaunchError("missing -m/--model FILE", 2)
    return steps


def make_params(argv: Sequence[str]) -> Any:
    """An xllamacpp.CommonParams with llama-server's defaults and the given flags applied."""
    steps = parse_flags(argv)
    try:
        import xllamacpp
    except ImportError as e:
        raise LaunchError(f"xllamacpp is not installed ({e}): pip install 'agent-replay[llama]'", 1) from e
    p = xllamacpp.CommonParams()
    p.port = 8080  # llama-server's default; xllamacpp's own default is 0
    for setter, value, flag in steps:
        try:
            setter(p, value)
        except (AttributeError, KeyError) as e:  # an older wheel without this setting
            version = getattr(xllamacpp, "__version__", "?")
            raise LaunchError(f"{flag} is not supported by xllamacpp {version} ({e})", 2) from e
    if p.cpuparams_batch.n_threads < 0:
        p.cpuparams_batch.n_threads = p.cpuparams.n_threads  # llama-server: -tb defaults to -t
    return p


def _log(level: str, text: str, t0: float) -> None:
    """One line in llama.cpp's common_log format (minutes.seconds.ms.us since t0, level letter)."""
    us = int((time.monotonic() - t0) * 1_000_000)
    stamp = f"{us // 60_000_000}.{us // 1_000_000 % 60:02d}.{us // 1000 % 1000:03d}.{us % 1000:03d}"
    sys.stderr.write(f"{stamp} {level} {text}\n")
    sys.stderr.flush()


def wait_healthy(address: str, timeout_s: float = HEALTH_TIMEOUT_S) -> None:
    """Poll GET /health until 200: the server answers 503 while loading and refuses before binding."""
    # llama.cpp formats the address as "http://%s:%d" (no brackets around an IPv6 host).
    host, _, port = address.removeprefix("http://").rpartition(":")
    host = host.strip("[]")
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        conn = http.client.HTTPConnection(host, int(port), timeout=2.0)
        try:
            conn.request("GET", "/health")
            status = conn.getresponse().status
            if status == 200:
                return
            last = f"HTTP {status}"
        except OSError as e:
            last = str(e)
        finally:
            conn.close()
        time.sleep(0.02)
    raise LaunchError(f"server at {address} not healthy after {timeout_s:.0f} s: {last}", 1)


def serve(argv: Sequence[str]) -> int:
    """Start the server, announce readiness, block until SIGTERM/SIGINT, stop it."""
    params = make_params(argv)
    import xllamacpp

    # Block the stop signals before the server's threads exist so they inherit the mask and the
    # signal is delivered only to sigwait below, never into a C++ thread.
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    t0 = time.monotonic()  # llama.cpp's log clock starts as the server initialises; keep ours in step
    try:
        server = xllamacpp.Server(params)
    except (RuntimeError, ValueError) as e:
        raise LaunchError(f"server failed to start: {e}", 1) from e
    address = server.listening_address
    if not stop_signals & signal.sigpending():  # stopped while loading: never announce readiness
        wait_healthy(address)
        _log("I", READY_TEXT.format(address=address), t0)
        signal.sigwait(stop_signals)
    # No line of ours here: requests may still be logging, and our write could split one of theirs.
    # The watchdog is faulthandler's C thread because the server's destructor holds the GIL while it
    # waits for the batch: a Python timer could never run. It prints "Timeout" and the stack, exit 1.
    faulthandler.dump_traceback_later(STOP_DEADLINE_S, exit=True)
    del server
    faulthandler.cancel_dump_traceback_later()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        return serve(args)
    except LaunchError as e:
        sys.stderr.write(f"{PROG}: error: {e}\n")
        sys.stderr.flush()
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
