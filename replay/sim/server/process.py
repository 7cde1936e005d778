"""Process lifecycle of the simulated server: bind, print ds4's readiness line, stop like ds4.

Readiness is the `listening on http://HOST:PORT` line, printed only once the socket accepts
connections (with the real port when `--port 0`). The first SIGTERM/SIGINT logs ds4's shutdown
line, stops accepting, drains running requests, writes the shutdown checkpoints and exits 0; a
second signal exits 130 at once without checkpoints, as ds4 does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Iterator
from typing import TextIO

import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from replay.errors import UsageError
from replay.serving.guard import uvicorn_options
from replay.sim.model.config import SimConfig
from replay.sim.server import heap
from replay.sim.server import log as simlog
from replay.sim.server.agentic import AgentOptions
from replay.sim.server.app import create_app
from replay.sim.server.flags import server_kind
from replay.sim.server.options import ServeOptions, parse
from replay.sim.server.runtime import LogSink, SimRuntime


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the simulator owns SIGTERM/SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def serve(argv: list[str] | None = None) -> int:
    """Entry point of `python -m replay.sim` / `replay sim serve`; returns the exit code."""
    args = sys.argv[1:] if argv is None else list(argv)
    if server_kind(args) == "llama":
        from replay.sim.server.llama.process import serve as serve_llama

        return serve_llama(args)
    try:
        cfg, opts = parse(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return run(cfg, opts)


def _clock_line(scale: float) -> str:
    """Said once at start: how the simulator's time relates to the real server's it models."""
    if scale == 1:
        return "time scale 1: modelled time runs at wall-clock speed (a 4-minute prefill takes 4 minutes)"
    return (
        f"time scale {scale:g}: modelled time runs {scale:g}x faster than the wall clock "
        f"(a 4-minute prefill takes {240 / scale:.3g} s); replies carry the modelled times in x_sim"
    )


def run(cfg: SimConfig, opts: ServeOptions) -> int:
    """Serve until signalled."""
    heap.fix_mmap_threshold()  # before the caches fill: see replay.sim.server.heap
    if opts.log:
        with open(opts.log, "a", encoding="utf-8") as stream:
            return asyncio.run(_main(cfg, opts, stream))
    return asyncio.run(_main(cfg, opts, sys.stderr))


async def _main(cfg: SimConfig, opts: ServeOptions, stream: TextIO) -> int:
    sink = LogSink(stream, opts.utc_offset_s)
    runtime = SimRuntime(cfg, kv_dir=opts.kv_dir, time_scale=opts.time_scale, log=sink, clock=opts.clock)
    await runtime.start()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((opts.host, opts.port))
    except OSError as exc:
        sink.write(f"failed to listen on {opts.host}:{opts.port}: {exc.strerror or exc}")
        sock.close()
        await runtime.close()
        return 1
    config = uvicorn.Config(
        create_app(
            runtime,
            AgentOptions(opts.tool_call_rate, opts.tool_call_max, opts.seed, opts.tool_names),
            limits=opts.limits,
        ),
        lifespan="off",
        log_level="error",
        access_log=False,
        timeout_graceful_shutdown=60,
        **uvicorn_options(opts.limits, AutoHTTPProtocol),
    )
    server = _Server(config)
    stop = asyncio.Event()

    def on_signal() -> None:
        if stop.is_set():
            os._exit(130)
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.005)
    if serving.done():
        await runtime.close()
        return 1
    sink.write(simlog.listening_line(opts.host, sock.getsockname()[1]))
    if sys.stderr.isatty():  # a person at a terminal; the ds4-format log stays ds4's lines only
        print(_clock_line(opts.time_scale), file=sys.stderr, flush=True)
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({stopped, serving}, return_when=asyncio.FIRST_COMPLETED)
    for listener in getattr(server, "servers", []):
        listener.close()
    await runtime.shutdown()
    server.should_exit = True
    await serving
    stopped.cancel()
    await runtime.close()
    return 0
