"""Reference SSE server for client benchmarks: OpenAI chat streaming whose timing the server owns.

A load generator's TTFT can only be judged against what the server itself saw. This server
stamps, on CLOCK_MONOTONIC (`time.perf_counter_ns()`, shared by every process on the host), the
moment each request was complete in its socket buffer (`arrival_ns`: the kernel's receive stamp
of the read that completed it, so the server's own wait to read it is not counted) and the moment
it handed the first content chunk to the kernel (`first_token_ns`). Their difference is the TTFT truth; a
client's TTFT minus that truth is the client's own error. The stamps ride in the first chunk
(`x_bench`) and are kept in a log that `GET /truth` returns, keyed by the request's X-Request-ID
(or, for a client that sends none, by the server id `#N` that also starts the reply text, so
tools that only keep the generated text can still be matched).

Why raw sockets in the event loop and no framework: the server must never be the bottleneck of
the client it measures (see `python -m bench`, which checks its ceiling with wrk), and only a
socket read with `recvmsg` carries the kernel's stamp. It parses just enough HTTP/1.1 (request
line, headers, Content-Length body, keep-alive and pipelining) and uses uvloop when it is installed.

Per-request timing (header, else body field `bench`, else the server default):
`X-Bench-First-Token-Ms` / `first_token_ms`, `X-Bench-Token-Ms` / `token_ms` (gap between
tokens; 0 sends the rest at once), `X-Bench-Tokens` / `tokens` (else `max_tokens` or
`max_completion_tokens`).

Run it: `python -m bench.refserver --port 8000 [--first-token-ms 20] [--tokens 64]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from replay.engine.transport import enable_kernel_stamps, kernel_stamp

_now = time.perf_counter_ns
_MAX_HEAD = 64 * 1024
_RECV_BYTES = 256 * 1024
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
TRUTH_COLUMNS = ("sid", "request_id", "arrival_ns", "first_token_ns", "done_ns", "tokens", "body_bytes")
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 431: "Too Large"}


@dataclass(slots=True)
class Pacing:
    """Server-wide defaults; each request may override them."""

    first_token_ms: float = 20.0
    token_ms: float = 0.0
    tokens: int = 64
    model: str = "ref"


class TruthLog:
    """Per-request stamps; bounded so a long wrk run cannot eat the host's memory."""

    __slots__ = ("rows", "cap", "dropped")

    def __init__(self, cap: int = 2_000_000) -> None:
        self.rows: list[list[Any]] = []
        self.cap = cap
        self.dropped = 0

    def new(self, row: list[Any]) -> list[Any]:
        if len(self.rows) < self.cap:
            self.rows.append(row)
        else:
            self.dropped += 1
        return row

    def take(self, clear: bool) -> bytes:
        doc = {"columns": TRUTH_COLUMNS, "rows": self.rows, "dropped": self.dropped}
        out = orjson.dumps(doc)
        if clear:
            self.rows = []
            self.dropped = 0
        return out


def _number(headers: dict[str, str], key: str, body: dict[str, Any], field: str, default: float) -> float:
    raw = headers.get(key)
    if raw is not None:
        return float(raw)
    value = body.get(field) if body else None
    return default if value is None else float(value)


class _Chunks:
    """Pre-encoded SSE frames (HTTP chunked encoding) that every reply shares."""

    def __init__(self, model: str) -> None:
        self.model = model
        base = {"id": "chatcmpl-ref", "object": "chat.completion.chunk", "created": 0, "model": model}
        self.token = _frame(
            {**base, "choices": [{"index": 0, "delta": {"content": " tok"}, "finish_reason": None}]}
        )
        self.finish = {
            reason: _frame({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
            for reason in ("length", "stop")
        }
        self.base = base
        self.done = _frame_raw(b"data: [DONE]\n\n") + b"0\r\n\r\n"


def _frame_raw(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _frame(obj: dict[str, Any]) -> bytes:
    return _frame_raw(b"data: " + orjson.dumps(obj) + b"\n\n")


def _response_head(
    status: int, ctype: bytes, keep: bool, extra: bytes = b"", length: int | None = None
) -> bytes:
    head = b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\n" % (status, _REASONS.get(status, "OK").encode(), ctype)
    head += b"transfer-encoding: chunked\r\n" if length is None else b"content-length: %d\r\n" % length
    head += b"connection: keep-alive\r\n" if keep else b"connection: close\r\n"
    return head + extra + b"\r\n"


class RefServer:
    """The request handling; one instance per listening socket."""

    def __init__(self, pacing: Pacing | None = None, truth_cap: int = 2_000_000) -> None:
        self.pacing = pacing or Pacing()
        self.truth = TruthLog(truth_cap)
        self._sid = 0
        self._chunks: dict[str, _Chunks] = {}
        self.loop: asyncio.AbstractEventLoop | None = None

    def chunks(self, model: str) -> _Chunks:
        found = self._chunks.get(model)
        if found is None:
            found = self._chunks[model] = _Chunks(model)
        return found

    async def listen(self, host: str = "127.0.0.1", port: int = 0) -> Listener:
        self.loop = asyncio.get_running_loop()
        return Listener(self, self.loop, host, port)

    # --- routes ------------------------------------------------------------------------

    def handle(
        self,
        conn: _Conn,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes,
        keep: bool,
        arrival: int,
    ) -> None:
        path, _, query = target.partition("?")
        if path == "/v1/chat/completions":
            if method != "POST":
                return conn.reply(405, b'{"error":"POST only"}', keep)
            return self.chat(conn, headers, body, keep, arrival)
        if method not in ("GET", "HEAD", "DELETE", "POST"):
            return conn.reply(405, b'{"error":"method not allowed"}', keep)
        if path == "/truth":
            clear = method == "DELETE" or "clear=1" in query
            return conn.reply(200, self.truth.take(clear), keep)
        if path in ("/v1/models", "/models"):
            doc = {
                "object": "list",
                "data": [{"id": self.pacing.model, "object": "model", "owned_by": "replay-bench"}],
            }
            return conn.reply(200, orjson.dumps(doc), keep)
        if path in ("/health", "/"):
            return conn.reply(200, b'{"status":"ok"}', keep)
        return conn.reply(404, b'{"error":"not found"}', keep)

    def chat(self, conn: _Conn, headers: dict[str, str], body: bytes, keep: bool, arrival: int) -> None:
        try:
            req = orjson.loads(body) if body else {}
            if not isinstance(req, dict):
                raise ValueError("body is not an object")
            knobs = req.get("bench") or {}
            p = self.pacing
            first_ms = _number(headers, "x-bench-first-token-ms", knobs, "first_token_ms", p.first_token_ms)
            token_ms = _number(headers, "x-bench-token-ms", knobs, "token_ms", p.token_ms)
            asked = req.get("max_completion_tokens") or req.get("max_tokens") or p.tokens
            tokens = int(_number(headers, "x-bench-tokens", knobs, "tokens", asked))
        except (ValueError, TypeError) as exc:
            return conn.reply(400, orjson.dumps({"error": {"message": f"bad request: {exc}"}}), keep)
        self._sid += 1
        sid = self._sid
        rid = headers.get("x-request-id")
        row = self.truth.new([sid, rid, arrival, None, None, max(tokens, 1), len(body)])
        model = req.get("model") or p.model
        usage = {
            "prompt_tokens": len(body) // 4,
            "completion_tokens": row[5],
            "total_tokens": len(body) // 4 + row[5],
        }
        if req.get("stream"):
            _Stream(
                self,
                conn,
                row,
                keep,
                model,
                usage,
                token_ms / 1000.0,
                bool((req.get("stream_options") or {}).get("include_usage", True)),
            ).start(first_ms / 1000.0)
        else:
            self.loop.call_later(first_ms / 1000.0, self._whole, conn, row, keep, model, usage)

    def _whole(self, conn: _Conn, row: list[Any], keep: bool, model: str, usage: dict[str, Any]) -> None:
        if conn.gone:
            return
        text = f"#{row[0]}" + " tok" * (row[5] - 1)
        doc = {
            "id": f"chatcmpl-{row[0]}",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
            ],
            "usage": usage,
        }
        row[3] = _now()
        conn.reply(200, orjson.dumps(doc), keep, request_id=row[1])
        row[4] = _now()


class _Stream:
    """One streamed reply: headers at once, the first token after its delay, then the rest."""

    __slots__ = ("srv", "conn", "row", "keep", "model", "usage", "gap", "include_usage", "sent", "handle")

    def __init__(
        self,
        srv: RefServer,
        conn: _Conn,
        row: list[Any],
        keep: bool,
        model: str,
        usage: dict[str, Any],
        gap: float,
        include_usage: bool,
    ) -> None:
        self.srv, self.conn, self.row, self.keep = srv, conn, row, keep
        self.model, self.usage, self.gap, self.include_usage = model, usage, gap, include_usage
        self.sent = 0
        self.handle: asyncio.TimerHandle | None = None

    def start(self, delay: float) -> None:
        extra = b"cache-control: no-cache\r\n"
        if self.row[1] is not None:
            extra += b"x-request-id: %s\r\n" % self.row[1].encode("latin-1")
        self.conn.write(_response_head(200, b"text/event-stream", self.keep, extra))
        self.conn.stream = self
        if delay > 0:
            self.handle = self.srv.loop.call_later(delay, self.first)
        else:
            self.first()

    def first(self) -> None:
        if self.conn.gone:
            return
        row = self.row
        sid = row[0]
        t = _now()
        row[3] = t
        base = self.srv.chunks(self.model).base
        delta = {"role": "assistant", "content": f"#{sid}"}
        obj = {
            **base,
            "id": f"chatcmpl-{sid}",
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
        }
        obj["x_bench"] = {"sid": sid, "arrival_ns": row[2], "first_token_ns": t}
        self.conn.write(_frame(obj))
        self.sent = 1
        if self.sent >= row[5]:
            self.end()
        elif self.gap <= 0:
            chunks = self.srv.chunks(self.model)
            self.conn.write(chunks.token * (row[5] - 1))
            self.sent = row[5]
            self.end()
        else:
            self.handle = self.srv.loop.call_later(self.gap, self.next)

    def next(self) -> None:
        if self.conn.gone:
            return
        self.conn.write(self.srv.chunks(self.model).token)
        self.sent += 1
        if self.sent >= self.row[5]:
            self.end()
        else:
            self.handle = self.srv.loop.call_later(self.gap, self.next)

    def end(self) -> None:
        chunks = self.srv.chunks(self.model)
        tail = chunks.finish["length"]
        if self.include_usage:
            tail += _frame({**chunks.base, "choices": [], "usage": self.usage})
        self.conn.write(tail + chunks.done)
        self.row[4] = _now()
        self.handle = None
        self.conn.stream = None
        self.conn.finished(self.keep)

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


class Listener:
    """The listening socket, accepting in the event loop's reader callback."""

    def __init__(self, srv: RefServer, loop: asyncio.AbstractEventLoop, host: str, port: int) -> None:
        self.srv, self.loop = srv, loop
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(4096)
        self.sock.setblocking(False)
        self.port: int = self.sock.getsockname()[1]
        self.conns: set[_Conn] = set()
        self.closed = False
        loop.add_reader(self.sock.fileno(), self._accept)

    def _accept(self) -> None:
        for _ in range(64):
            try:
                sock, _addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_RESOURCES:  # accepting again at once would spin: wait a second
                    self.loop.remove_reader(self.sock.fileno())
                    self.loop.call_later(1.0, self._resume)
                    return
                continue  # a connection reset before it was taken
            self.conns.add(_Conn(self, sock))

    def _resume(self) -> None:
        if not self.closed:
            self.loop.add_reader(self.sock.fileno(), self._accept)

    def close(self) -> None:
        """Stop accepting and drop every open connection."""
        self.closed = True
        self.loop.remove_reader(self.sock.fileno())
        self.sock.close()
        for conn in list(self.conns):
            conn.lost()


class _Conn:
    """One client connection, read and written on its own socket; requests are parsed one at a
    time (pipelined ones wait their turn).

    Not an asyncio transport: a request's arrival is the kernel's receive stamp of the read that
    completed it, which asyncio's `data_received` cannot give. Stamped in Python instead, the
    truth counted the server's own wait to read (up to 9 ms with 500 streams in flight) as the
    client's TTFT error.
    """

    __slots__ = (
        "listener",
        "srv",
        "sock",
        "fd",
        "loop",
        "buf",
        "stamp",
        "out",
        "busy",
        "gone",
        "closing",
        "stream",
    )

    def __init__(self, listener: Listener, sock: socket.socket) -> None:
        self.listener, self.srv, self.loop = listener, listener.srv, listener.loop
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        enable_kernel_stamps(sock)  # without them, kernel_stamp falls back to the read's own time
        self.sock, self.fd = sock, sock.fileno()
        self.buf = bytearray()
        self.stamp = 0  # arrival of the last bytes read
        self.out = bytearray()  # written but not yet taken by the socket
        self.busy = False
        self.gone = False
        self.closing = False  # close once `out` is sent
        self.stream: _Stream | None = None
        self.loop.add_reader(self.fd, self._readable)

    def _readable(self) -> None:
        try:
            data, anc, _flags, _addr = self.sock.recvmsg(_RECV_BYTES, 64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return self.lost()
        if not data:
            return self.lost()
        self.stamp = kernel_stamp(anc, _now())
        self.buf += data
        if not self.busy:
            self._next(self.stamp)

    def write(self, data: bytes) -> None:
        if self.gone:
            return
        if self.out:
            self.out += data
            return
        try:
            sent = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            return self.lost()
        if sent < len(data):
            self.out += data[sent:]
            self.loop.add_writer(self.fd, self._writable)

    def _writable(self) -> None:
        try:
            sent = self.sock.send(self.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return self.lost()
        del self.out[:sent]
        if not self.out:
            self.loop.remove_writer(self.fd)
            if self.closing:
                self.lost()

    def lost(self) -> None:
        """The connection ends: the client left, a send failed, or the reply said close."""
        if self.gone:
            return
        self.gone = True
        if self.stream is not None:
            self.stream.cancel()
            self.stream = None
        self.loop.remove_reader(self.fd)
        if self.out:
            self.loop.remove_writer(self.fd)
        self.sock.close()
        self.listener.conns.discard(self)

    def _next(self, arrival: int) -> None:
        while not self.busy and not self.gone:
            buf = self.buf
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _MAX_HEAD:
                    self.reply(431, b'{"error":"headers too large"}', False)
                return
            lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
            parts = lines[0].split(" ")
            if len(parts) != 3:
                self.reply(400, b'{"error":"bad request line"}', False)
                return
            method, target, version = parts
            headers: dict[str, str] = {}
            for line in lines[1:]:
                key, _, value = line.partition(":")
                headers[key.strip().lower()] = value.strip()
            if "chunked" in headers.get("transfer-encoding", ""):
                self.reply(400, b'{"error":"chunked request bodies are not supported"}', False)
                return
            total = end + 4 + int(headers.get("content-length") or 0)
            if len(buf) < total:
                return
            body = bytes(buf[end + 4 : total])
            del buf[:total]
            conn_hdr = headers.get("connection", "").lower()
            keep = conn_hdr == "keep-alive" if version == "HTTP/1.0" else conn_hdr != "close"
            self.busy = True
            self.srv.handle(self, method, target, headers, body, keep, arrival)

    def reply(self, status: int, payload: bytes, keep: bool, request_id: str | None = None) -> None:
        extra = b"" if request_id is None else b"x-request-id: %s\r\n" % request_id.encode("latin-1")
        self.write(_response_head(status, b"application/json", keep, extra, len(payload)) + payload)
        self.finished(keep)

    def finished(self, keep: bool) -> None:
        if not keep:
            self.busy = True  # read no more requests
            self.closing = True
            if not self.out:
                self.lost()
            return
        self.busy = False
        if self.buf:
            self._next(self.stamp)


# --- running it ----------------------------------------------------------------------------


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when it is installed (it is not a dependency), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


@contextlib.contextmanager
def serve_in_thread(pacing: Pacing | None = None, host: str = "127.0.0.1") -> Iterator[tuple[RefServer, str]]:
    """Run a server on an ephemeral port in a background thread (tests, quick checks)."""
    srv = RefServer(pacing)
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    def main() -> None:
        asyncio.set_event_loop(loop)
        box["server"] = loop.run_until_complete(srv.listen(host, 0))
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=main, name="refserver", daemon=True)
    thread.start()
    ready.wait(10)
    server: Listener = box["server"]
    try:
        yield srv, f"http://{host}:{server.port}"
    finally:

        async def close() -> None:
            server.close()

        asyncio.run_coroutine_threadsafe(close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def main(argv: list[str] | None = None) -> None:
    default = Pacing()
    ap = argparse.ArgumentParser(prog="python -m bench.refserver", description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    ap.add_argument("--first-token-ms", type=float, default=default.first_token_ms)
    ap.add_argument("--token-ms", type=float, default=default.token_ms)
    ap.add_argument(
        "--tokens", type=int, default=default.tokens, help="reply tokens when the request names none"
    )
    ap.add_argument("--model", default=default.model)
    ap.add_argument("--truth-cap", type=int, default=2_000_000, help="most requests kept in the /truth log")
    args = ap.parse_args(argv)
    pacing = Pacing(args.first_token_ms, args.token_ms, args.tokens, args.model)
    srv = RefServer(pacing, args.truth_cap)
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    server = loop.run_until_complete(srv.listen(args.host, args.port))
    port = server.port
    kind = type(loop).__module__.split(".")[0]
    print(f"refserver ({kind} loop) listening on http://{args.host}:{port}", flush=True)
    try:
        loop.run_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
        loop.close()
    sys.exit(0)


if __name__ == "__main__":
    main()
