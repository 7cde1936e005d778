"""The engine's reader side alone: CPU per streamed request from de-chunked bytes to results line.

The rate benchmark measures the whole client against a server on the same core, so a change to
the reader side (SSE splitting, event decoding, the record, the results line) moves its figure by
less than the run-to-run noise. This replays the bytes the reference server sends for one 64-token
stream (`bench.refserver`'s own frames: a role+content first event, 63 token events, a finish
event, a usage event, `[DONE]`), de-chunked as two network reads, through the engine's own stream
loop, the OpenAI reader, `fill`, and `ResultsWriter.request` (line, summary, write and flush), and
reports the best of a few repetitions in CPU microseconds per request.

    python -m bench.readside [all|parse|read|write] [--requests N]

Run it pinned (`taskset -c 0`) and compare builds back to back: the figures are per build.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.refserver import _Chunks, _frame
from replay.engine import exchange
from replay.engine.chunks import Dechunker
from replay.engine.openai import OpenAIReader
from replay.engine.sse import SseParser
from replay.metrics.record import RequestRecord
from replay.metrics.results import ResultsWriter

MODES = ("all", "parse", "read", "write")


def stream_reads(tokens: int = 64) -> list[bytes]:
    """One streamed reply's body as the reference server frames it, de-chunked per network read:
    the first event alone (it waits for the first-token delay), then everything else at once."""
    chunks = _Chunks("bench")
    first = {
        **chunks.base,
        "id": "chatcmpl-7",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": "#7"}, "finish_reason": None}],
        "x_bench": {"sid": 7, "arrival_ns": 123456789012, "first_token_ns": 123456799012},
    }
    usage = {"prompt_tokens": 300, "completion_tokens": tokens, "total_tokens": 300 + tokens}
    tail = chunks.finish["length"] + _frame({**chunks.base, "choices": [], "usage": usage})
    framed = [_frame(first), chunks.token * (tokens - 1) + tail + chunks.done]
    dechunker = Dechunker()
    return [dechunker.feed(data) for data in framed]


class _Reads:
    """A response body that hands out recorded reads at once (a stand-in for the connection)."""

    __slots__ = ("items", "pos")

    def __init__(self, items: list[tuple[int, bytes]]) -> None:
        self.items = items
        self.pos = 0

    async def next(self) -> tuple[int, bytes] | None:
        pos = self.pos
        if pos < len(self.items):
            self.pos = pos + 1
            return self.items[pos]
        return None

    async def read(self) -> bytes:
        return b""

    async def drain(self, limit_s: float) -> None:
        return None


def read_one(items: list[tuple[int, bytes]]) -> RequestRecord:
    """One request's record, built and filled the way the engine and its exchange do it."""
    res = RequestRecord(
        seq=1,
        request_id=7,
        session="s7",
        tag="",
        switch=("new",),
        from_session=None,
        expected_output_tokens=64,
        t_origin=1,
        t_scheduled=2,
    )
    res.t_start = res.t_connected = 3
    res.t_sent = 4
    res.t_headers = 5
    reader = OpenAIReader()
    parser = SseParser()
    where = "request bench-7 POST /v1/chat/completions"
    step = exchange._read_stream(_Reads(items), res, reader, parser, None, where)
    with contextlib.suppress(StopIteration):  # the body never waits: one step runs it to its end
        step.send(None)
    res.n_comments = parser.comments
    reader.fill(res)
    return res


def measure(mode: str, requests: int, repeat: int = 5, freeze: bool = True) -> float:
    """Best-of-`repeat` CPU microseconds per request for `mode` (`freeze`: as a run does after its
    setup, the heap so far is left out of collections; a test in a shared process passes False)."""
    reads = stream_reads()
    items = [(1_000 + i, data) for i, data in enumerate(reads)]
    sample = read_one(items)
    if sample.status != "ok" or sample.usage.output_tokens != 64 or sample.n_token_events != 64:
        raise SystemExit(f"the recorded stream did not read back whole: {sample.status} {sample.error}")
    with tempfile.TemporaryDirectory(prefix="replay-readside-") as tmp:
        writer = ResultsWriter(Path(tmp) / "results.jsonl", {"bench": "readside"})

        def parse() -> None:
            for _ in range(requests):
                parser = SseParser()
                for data in reads:
                    parser.feed(data)

        def read() -> None:
            for _ in range(requests):
                read_one(items)

        def write() -> None:
            for _ in range(requests):
                writer.request(sample)

        def both() -> None:
            for _ in range(requests):
                writer.request(read_one(items))

        runs: dict[str, Callable[[], Any]] = {"all": both, "parse": parse, "read": read, "write": write}
        gc.collect()
        if freeze:
            gc.freeze()
        best = float("inf")
        for _ in range(repeat):
            t0 = time.process_time()
            runs[mode]()
            best = min(best, (time.process_time() - t0) / requests * 1e6)
        writer.close()
    return best


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.readside", description=__doc__.split("\n\n")[0])
    ap.add_argument("modes", nargs="*", default=["all"], choices=MODES)
    ap.add_argument("--requests", type=int, default=10_000)
    args = ap.parse_args(argv)
    for mode in args.modes:
        print(f"{mode}: {measure(mode, args.requests):.1f} us CPU per request")


if __name__ == "__main__":
    main()
