"""Running the recording proxy: in the foreground for `replay record`, or in a thread for tests.

Listens on 127.0.0.1 unless told otherwise: the proxy forwards the agent's credentials upstream,
so anyone who can reach it can use them.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn
from rich.console import Console

from replay.errors import UsageError
from replay.record.anonymize import Anonymizer
from replay.record.calls import CallLog
from replay.record.live import RecordView, live_view
from replay.record.proxy import QuietUpstreamBroke, RecordingProxy
from replay.record.recorder import Recorder
from replay.record.sessions import SessionInference
from replay.serving.guard import Limits, uvicorn_options
from replay.trace.writer import TraceWriter

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class _Server(uvicorn.Server):
    """uvicorn without re-raising the stop signal after its graceful shutdown.

    Ctrl-C or SIGTERM is how a recording ends, not a failure: the trace is closed, the summary
    printed and the exit code is 0. A second signal forces the exit, as in uvicorn.
    """

    stopped_by: str | None = None

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def stop(sig: int, _frame: object) -> None:
            if self.should_exit:
                self.force_exit = True
            self.should_exit = True
            self.stopped_by = signal.Signals(sig).name

        original = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def parse_listen(listen: str) -> tuple[str, int]:
    """`HOST:PORT`, `:PORT` or `PORT`; the host defaults to 127.0.0.1."""
    host, sep, port = listen.rpartition(":")
    if not sep:
        host, port = "", listen
    host = host.strip("[]") or "127.0.0.1"
    try:
        number = int(port)
    except ValueError:
        raise UsageError(f"--listen must be HOST:PORT, not {listen!r}") from None
    if not 0 <= number <= 65535:
        raise UsageError(f"--listen port {number} is out of range")
    return host, number


class RecordingServer:
    """Proxy + recorder + trace writer, served by uvicorn on a socket bound here.

    The socket is bound and listening before the trace is opened: a port in use fails with the
    trace untouched, and a client that connects from then on waits in the queue (`replay.outputs`).
    """

    def __init__(
        self,
        upstream: str,
        out: str | Path,
        host: str = "127.0.0.1",
        port: int = 0,
        anonymize_key: str | None = None,
        inference: SessionInference | None = None,
        notes: str = "",
        limits: Limits | None = None,
        keep_rejected: bool = False,
        log: str | Path | None = None,
    ) -> None:
        if not upstream.startswith(("http://", "https://")):
            raise UsageError(f"--upstream must be an http(s) URL, not {upstream!r}")
        self.upstream = upstream.rstrip("/")
        self.out = str(out)
        self.host = host
        self._sock: socket.socket | None = self._listen(host, port)
        self.port = self._sock.getsockname()[1]
        calls = None
        try:
            calls = CallLog(log)
            notes = notes or f"recorded through replay record (upstream {self.upstream})"
            self.writer = TraceWriter(self.out, source="record", notes=notes)
        except BaseException:
            self._sock.close()
            if calls is not None:
                calls.close()
            raise
        anonymizer = Anonymizer(anonymize_key) if anonymize_key else None
        self.recorder = Recorder(self.writer, inference, anonymizer, keep_rejected=keep_rejected)
        self.limits = limits or Limits()
        self.proxy = RecordingProxy(self.upstream, self.recorder, limits=self.limits)
        self.proxy.calls = calls
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.stopped_by: str | None = None  # the signal that ended `serve_forever`

    @staticmethod
    def _listen(host: str, port: int) -> socket.socket:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            sock.listen(2048)  # connections queue from here on, so "listening on" is true when printed
        except OSError as exc:
            sock.close()
            raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
        return sock

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def _uvicorn(self) -> _Server:
        """The uvicorn server on the listening socket (made once)."""
        if self._server is not None:
            return self._server
        uvicorn_log = logging.getLogger("uvicorn.error")
        if not any(isinstance(f, QuietUpstreamBroke) for f in uvicorn_log.filters):
            uvicorn_log.addFilter(QuietUpstreamBroke())
        config = uvicorn.Config(
            self.proxy.app,
            loop="asyncio",
            lifespan="on",
            log_level="warning",
            access_log=False,
            proxy_headers=False,
            server_header=False,
            date_header=False,
            timeout_graceful_shutdown=5,
            backlog=2048,
            **uvicorn_options(self.limits),  # h11, with a deadline on request heads
        )
        self._server = _Server(config)
        return self._server

    def start(self) -> RecordingServer:
        """Serve from a background thread of this process (tests, embedding)."""
        server = self._uvicorn()
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [self._sock]}, name="replay-record", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("recording proxy did not start")
            time.sleep(0.005)
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(timeout=5)
        self._close()

    def _close(self) -> None:
        if self._server is not None:
            self.stopped_by = self._server.stopped_by
        if self._sock is not None:
            self._sock.close()
        self._server = self._thread = self._sock = None
        if not self.writer.closed:
            try:
                self.proxy.calls.write_to(self.writer)
            except OSError as exc:
                self.recorder.stats.write_errors += 1
                self.recorder.stats.last_problem = f"trace write failed: {exc}"
        self.proxy.calls.close()
        self.writer.close()

    def __enter__(self) -> RecordingServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def serve_forever(self, console: Console | None = None) -> None:
        """Serve in this (main) thread until Ctrl-C or SIGTERM, with the live table if given a console."""
        server = self._uvicorn()
        try:
            if console is None:
                server.run(sockets=[self._sock])
            else:
                view = RecordView(self.recorder, self.proxy, self.upstream, self.out)
                with live_view(view, console):
                    server.run(sockets=[self._sock])
                if not console.is_terminal:  # rich ends a terminal's last frame with a newline, not a file's
                    console.line()
        finally:
            self._close()


def rejected_text(rejected: dict[int, int]) -> str:
    """`3 rejected by the upstream (HTTP 400 x2, HTTP 503 x1)`."""
    per = ", ".join(f"HTTP {status} x{n}" for status, n in sorted(rejected.items()))
    return f"{sum(rejected.values())} rejected by the upstream ({per})"


def record(
    upstream: str,
    listen: str,
    out: str | Path,
    anonymize: bool = False,
    key: str | None = None,
    console: Console | None = None,
    limits: Limits | None = None,
    keep_rejected: bool = False,
    log: str | Path | None = None,
) -> int:
    """`replay record`: proxy and record until interrupted; returns the exit code."""
    if anonymize and not key:
        raise UsageError("--anonymize needs --key SECRET (the same key gives the same synthetic text)")
    host, port = parse_listen(listen)
    server = RecordingServer(
        upstream,
        out,
        host=host,
        port=port,
        anonymize_key=key if anonymize else None,
        limits=limits,
        keep_rejected=keep_rejected,
        log=log,
    )
    console = console or Console(stderr=True)
    console.print(
        f"listening on {server.url} -> {server.upstream}, writing {server.out}",
        highlight=False,
        soft_wrap=True,
    )
    if host not in _LOOPBACK:
        console.print(
            f"[yellow]warning:[/yellow] listening on {host}: anyone who can reach it can use your upstream credentials",
            highlight=False,
            soft_wrap=True,
        )
    server.serve_forever(console)
    stats = server.recorder.stats
    console.print(
        f"{server.out}: {stats.recorded} requests recorded in {len(server.recorder.inference.sessions)} sessions"
        f" ({stats.errors} with errors, {stats.unrecorded} not recordable"
        + (f", {stats.dropped_parts} image/document parts left out" if stats.dropped_parts else "")
        + (f", {rejected_text(stats.rejected)}" if stats.rejected else "")
        + ")"
        + (f"; stopped by {server.stopped_by}" if server.stopped_by else ""),
        highlight=False,
        soft_wrap=True,
    )
    if server.proxy.calls.missing:
        console.print(
            f"[yellow]warning:[/yellow] {server.proxy.calls.summary()} (written to the trace as 'unrecorded' lines)",
            highlight=False,
            soft_wrap=True,
        )
    return 0 if not stats.write_errors else 1
