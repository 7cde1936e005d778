"""The bare-asyncio floor client: it really streams, and its TTFTs match the server's truth."""

from __future__ import annotations

import os

from bench.floor import floor_point
from bench.refserver import Pacing, serve_in_thread
from bench.server import RunningServer


def test_floor_point_streams_every_request_and_matches_truth():
    with serve_in_thread(Pacing(first_token_ms=5.0, tokens=8)) as (srv, url):
        running = RunningServer(url=url, pid=os.getpid(), realtime=False, loop="asyncio", note="in-thread")
        point = floor_point(running, concurrency=4, requests=24)
        assert srv.truth.rows == []  # read and cleared by the point
    assert point.requests == 24
    assert point.error.n == 24 and point.error.unmatched == 0
    # Client TTFT can only be later than the server's own: arrival comes after the send.
    assert point.error.p50_ms >= 0 and point.error.truth_p50_ms >= 5.0
    assert point.rate > 0 and point.cpu_ms_per_request > 0
