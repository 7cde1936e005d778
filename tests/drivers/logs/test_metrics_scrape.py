"""Prometheus scraping against a tiny llama.cpp-style `/metrics` app on 127.0.0.1."""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from drivers.scrape import (
    MetricsSampler,
    accumulate,
    check_usage,
    counter_deltas,
    disagreements,
    parse_exposition,
    scrape_sync,
)
from replay.errors import TargetError


class FakeLlama:
    """Counters a llama-server would keep, bumped by `serve` as if it answered a request."""

    def __init__(self) -> None:
        self.prompt = 0  # evaluated (not cached) prompt tokens
        self.cached = 0
        self.predicted = 0
        self.processing = 0

    def serve(self, prompt_tokens: int, cached_tokens: int, output_tokens: int) -> dict[str, int]:
        self.prompt += prompt_tokens - cached_tokens
        self.cached += cached_tokens
        self.predicted += output_tokens
        return {
            "prompt_tokens": prompt_tokens,
            "cached_tokens": cached_tokens,
            "output_tokens": output_tokens,
        }

    def restart(self) -> None:
        self.prompt = self.cached = self.predicted = 0

    def text(self) -> str:
        return (
            "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n"
            "# TYPE llamacpp:prompt_tokens_total counter\n"
            f"llamacpp:prompt_tokens_total {self.prompt}\n"
            "# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens served from cache.\n"
            "# TYPE llamacpp:prompt_tokens_cached_total counter\n"
            f"llamacpp:prompt_tokens_cached_total {self.cached}\n"
            "# TYPE llamacpp:tokens_predicted_total counter\n"
            f"llamacpp:tokens_predicted_total {self.predicted}\n"
            "# TYPE llamacpp:prompt_seconds_total counter\n"
            f"llamacpp:prompt_seconds_total {self.prompt / 1000.0}\n"
            "# TYPE llamacpp:requests_processing gauge\n"
            f"llamacpp:requests_processing {self.processing}\n"
        )


@pytest.fixture
def server() -> Iterator[tuple[str, FakeLlama]]:
    state = FakeLlama()

    async def metrics(_: Request) -> PlainTextResponse:
        return PlainTextResponse(state.text(), media_type="text/plain; version=0.0.4")

    app = Starlette(routes=[Route("/metrics", metrics)])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert srv.started
    try:
        yield f"http://127.0.0.1:{port}", state
    finally:
        srv.should_exit = True
        thread.join(timeout=5)
        sock.close()


def test_parse_exposition_format_details() -> None:
    text = (
        "# HELP vllm:prompt_tokens_total Prompt tokens.\n"
        "# TYPE vllm:prompt_tokens_total counter\n"
        'vllm:prompt_tokens_total{model_name="m",engine="0"} 100 1700000000000\n'
        'vllm:prompt_tokens_total{engine="1",model_name="m"} 50\n'
        "# TYPE vllm:latency histogram\n"
        'vllm:latency_bucket{le="+Inf"} 3\n'
        "vllm:latency_sum 1.5\n"
        "vllm:latency_count 3\n"
        "# TYPE g gauge\n"
        'g{path="a\\"b,c}"} NaN\n'
        "h_total +Inf\n"
        "not a sample line\n"
    )
    snap = parse_exposition(text, t_ns=1)
    assert snap.values['vllm:prompt_tokens_total{engine="0",model_name="m"}'] == 100
    assert snap.is_counter('vllm:prompt_tokens_total{engine="1",model_name="m"}')
    assert snap.is_counter("vllm:latency_sum") and snap.is_counter("vllm:latency_count")
    assert not snap.is_counter('vllm:latency_bucket{le="+Inf"}')
    assert math.isnan(snap.values['g{path="a\\"b,c}"}']) and snap.types['g{path="a\\"b,c}"}'] == "gauge"
    assert snap.is_counter("h_total") and snap.values["h_total"] == math.inf
    assert len(snap.values) == 7


def test_deltas_and_reset() -> None:
    a = parse_exposition("# TYPE c counter\nc 10\n# TYPE g gauge\ng 1\nu_total 5\n", t_ns=0)
    b = parse_exposition("# TYPE c counter\nc 25\n# TYPE g gauge\ng 3\nu_total 2\n", t_ns=2_000_000_000)
    d = counter_deltas(a, b)
    assert d.values == {"c": 15, "u_total": 2} and d.resets == ["u_total"]
    assert d.gauges == {"g": (1.0, 3.0)} and d.seconds == 2.0
    assert d.total("c") == 15 and d.total("missing") is None
    # scrape-to-scrape accumulation keeps what happened before a restart
    c = parse_exposition("# TYPE c counter\nc 4\n", t_ns=3_000_000_000)
    acc = accumulate([a, b, c])
    assert acc.values["c"] == 15 + 4 and "c" in acc.resets and acc.seconds == 3.0


def test_scrape_deltas_agree_with_usage(server: tuple[str, FakeLlama]) -> None:
    url, state = server
    state.serve(4000, 0, 10)  # before the phase: must not count
    before = scrape_sync(url + "/metrics")
    usage = [state.serve(3966, 2, 100), state.serve(4016, 3965, 100), state.serve(4071, 1, 50)]
    usage.append({"prompt_tokens": None, "cached_tokens": None, "status": "error"})
    after = scrape_sync(url + "/metrics")
    d = counter_deltas(before, after)
    assert d.total("llamacpp:prompt_tokens_total") == 3964 + 51 + 4070
    checks = check_usage(d, usage, "llamacpp")
    assert [c.what for c in checks] == ["prompt", "cached", "output"]
    assert all(c.ok for c in checks) and disagreements(checks, d) == []


def test_scrape_flags_disagreement(server: tuple[str, FakeLlama]) -> None:
    url, state = server
    before = scrape_sync(url + "/metrics")
    usage = [state.serve(5000, 0, 20)]
    state.serve(3000, 0, 20)  # a request the run never saw (another client)
    after = scrape_sync(url + "/metrics")
    d = counter_deltas(before, after)
    msgs = disagreements(check_usage(d, usage, "llamacpp"), d)
    assert len(msgs) == 2
    assert msgs[0].startswith("prompt tokens: server counter llamacpp:prompt_tokens_total grew by 8,000")
    assert "usage sums to 5,000 (difference +3,000)" in msgs[0]
    assert msgs[1].startswith("output tokens")


def test_sampler_scrapes_during_the_phase_and_survives_a_restart(server: tuple[str, FakeLlama]) -> None:
    url, state = server

    def scraped_since(n: int) -> None:
        """Until the sampler's thread has taken two more scrapes (so one began after now): on a
        loaded machine 0.2 s of sleep held none, and the restart took the 1000 with it."""
        deadline = time.monotonic() + 30
        while len(sampler.snapshots) < n + 2:
            assert time.monotonic() < deadline, sampler.snapshots
            time.sleep(0.01)

    with MetricsSampler(url + "/metrics", interval=0.05) as sampler:
        state.serve(1000, 0, 10)
        scraped_since(len(sampler.snapshots))
        state.restart()
        state.serve(500, 100, 5)
        scraped_since(len(sampler.snapshots))
    assert len(sampler.snapshots) >= 4 and sampler.failures == 0
    d = sampler.deltas()
    assert d.total("llamacpp:prompt_tokens_total") == 1000 + 400
    assert d.total("llamacpp:tokens_predicted_total") == 15
    assert any(k.startswith("llamacpp:prompt_tokens_total") for k in d.resets)
    assert "server restarted" in disagreements([], d)[0]


def test_missing_metrics_endpoint_is_a_target_error(server: tuple[str, FakeLlama]) -> None:
    url, _ = server
    with pytest.raises(TargetError, match="404"):
        scrape_sync(url + "/nope")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    with pytest.raises(TargetError, match="cannot scrape"):
        scrape_sync(f"http://127.0.0.1:{dead}/metrics", timeout=1)
