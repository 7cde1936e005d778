"""Process lifecycle of the simulator serving llama-server: bind, print llama-server's readiness
line (`server is listening on http://HOST:PORT`, with the real port when `--port 0`), stop on the
first SIGTERM or SIGINT (llama-server keeps nothing on shutdown: its slots live only in memory)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
from collections.abc import Iterator
from typing import TextIO

import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from replay.errors import UsageError
from replay.serving.guard import uvicorn_options
from replay.sim.model.llama.config import LlamaConfig
from replay.sim.model.llama.prompt import ChatTokenizer
from replay.sim.server import heap
from replay.sim.server.llama.app import create_app
from replay.sim.server.llama.log import LlamaLog
from replay.sim.server.llama.options import LlamaServeOptions, parse
from replay.sim.server.llama.runtime import LineSink, LlamaRuntime


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the simulator owns SIGTERM/SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def serve(argv: list[str]) -> int:
    try:
        cfg, opts = parse(argv)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    heap.fix_mmap_threshold()
    if opts.log:
        with open(opts.log, "a", encoding="utf-8") as stream:
            return asyncio.run(_main(cfg, opts, stream))
    return asyncio.run(_main(cfg, opts, sys.stderr))


def tokenizer_of(cfg: LlamaConfig, opts: LlamaServeOptions) -> ChatTokenizer:
    """The model file's tokenizer, or the simulator's word tokenizer with a `<s>` when the model
    adds a BOS."""
    if opts.model is not None:
        return opts.model.tokenizer
    return ChatTokenizer(None, "<s>" if cfg.arch.add_bos else None)


async def _main(cfg: LlamaConfig, opts: LlamaServeOptions, stream: TextIO) -> int:
    sink = LineSink(stream)
    slot_dir = opts.slot_save_path.rstrip("/") + "/" if opts.slot_save_path else ""
    log = LlamaLog(cfg, opts.verbosity, slot_dir)
    runtime = LlamaRuntime(cfg, time_scale=opts.time_scale, sink=sink, log=log)
    runtime.start(opts.model.path if opts.model is not None else None)
    if opts.model is not None and not opts.model.chatml:
        sink.write(log.startup_note("the model's chat template is not ChatML: prompts are counted as ChatML"))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((opts.host, opts.port))
    except OSError as exc:
        sink.write([f"failed to listen on {opts.host}:{opts.port}: {exc.strerror or exc}"])
        sock.close()
        await runtime.close()
        return 1
    config = uvicorn.Config(
        create_app(runtime, opts, tokenizer_of(cfg, opts), opts.limits),
        lifespan="off",
        log_level="error",
        access_log=False,
        timeout_graceful_shutdown=10,
        **uvicorn_options(opts.limits, AutoHTTPProtocol),
    )
    server = _Server(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.005)
    if serving.done():
        await runtime.close()
        return 1
    runtime.listening(opts.host, sock.getsockname()[1])
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({stopped, serving}, return_when=asyncio.FIRST_COMPLETED)
    runtime.stopping = True
    server.should_exit = True
    await serving
    stopped.cancel()
    await runtime.close()
    return 0
