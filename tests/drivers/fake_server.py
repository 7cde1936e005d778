"""Stand-in servers for the driver tests, run as child processes (never imported by tests).

Modes:
  line PORT DELAY TERMS    print ds4's readiness line after DELAY s; on SIGTERM append a line to
                           the file TERMS, "write a checkpoint" (0.1 s) and exit 0
  http PORT LOADING        answer GET /health with 503 for LOADING s, then 200 (llama-server)
  stubborn TERMS           ignore SIGTERM (recording each one) and fork a grandchild in the same
                           process group that ignores it too
  llama ...                a fake llama-server: --version prints a version line; otherwise reads
                           --port and answers /health 503 for 0.3 s, then 200
  ds4 ...                  a fake ds4-server: reads --port, prints its line, exits 0 on SIGTERM;
                           writes its argv and DS4_LOCK_FILE to $FAKE_DS4_RECORD
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import sys
import time


def record_term(path: str) -> None:
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")


def serve_forever_until_term(port: int, terms: str | None, checkpoint_s: float) -> None:
    def on_term(signum: int, frame: object) -> None:
        if terms:
            record_term(terms)
        time.sleep(checkpoint_s)
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    while True:
        time.sleep(1)


def main() -> None:
    mode = sys.argv[1]
    if mode == "line":
        port, delay, terms = int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
        signal.signal(signal.SIGTERM, lambda s, f: (record_term(terms), time.sleep(0.1), os._exit(0)))
        print("loading model...", file=sys.stderr, flush=True)
        time.sleep(delay)
        print(f"0101 00:00:00 ds4-server: listening on http://127.0.0.1:{port}", file=sys.stderr, flush=True)
        while True:
            time.sleep(1)
    elif mode in ("http", "llama"):
        if mode == "llama":
            args = sys.argv[2:]
            if "--version" in args:
                print("load_backend: loaded CPU backend", file=sys.stderr)
                print("version: 4242 (abcdef0)", file=sys.stderr)
                print("built with cc for x86_64-linux-gnu", file=sys.stderr)
                return
            port, loading = int(args[args.index("--port") + 1]), 0.3
        else:
            port, loading = int(sys.argv[2]), float(sys.argv[3])
        t0 = time.monotonic()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                ready = time.monotonic() - t0 >= loading
                code = 200 if ready else 503
                body = json.dumps({"status": "ok"} if ready else {"error": "Loading model"}).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                print(f"{self.command} {self.path}", file=sys.stderr, flush=True)

        server = http.server.HTTPServer(("127.0.0.1", port), Handler)
        signal.signal(signal.SIGTERM, lambda s, f: os._exit(0))
        server.serve_forever()
    elif mode == "stubborn":
        terms = sys.argv[2]
        signal.signal(signal.SIGTERM, lambda s, f: record_term(terms))
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            with open(terms + ".grandchild.tmp", "w") as f:
                f.write(str(os.getpid()))
            os.replace(terms + ".grandchild.tmp", terms + ".grandchild")  # readers never see it half written
            while True:
                time.sleep(1)
        print("stubborn ready", file=sys.stderr, flush=True)
        while True:
            time.sleep(1)
    elif mode == "ds4":
        args = sys.argv[2:]
        port = int(args[args.index("--port") + 1])
        record = os.environ.get("FAKE_DS4_RECORD")
        if record:
            with open(record, "w") as f:
                json.dump({"argv": args, "lock": os.environ.get("DS4_LOCK_FILE")}, f)
        print(f"0101 00:00:00 ds4-server: listening on http://127.0.0.1:{port}", file=sys.stderr, flush=True)
        serve_forever_until_term(port, None, 0.05)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
