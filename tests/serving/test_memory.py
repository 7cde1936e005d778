"""Memory returns near its baseline after huge requests, on both servers (figures in the report).

Three distinct prompts of 9 MB each (refused: longer than the context) go to the simulator, and
through the proxy in front of it. The simulator once kept every text it tokenized (a cache bounded
by count only) and the proxy recorded refused bodies whole; now neither holds them after the reply.
"""

from __future__ import annotations

import functools
import gc
import threading
import time

import httpx
import orjson
import pytest

from tests.support.serverkit import Child, start_proxy, start_sim

pytestmark = pytest.mark.e2e

PROMPT_BYTES = 9 * 2**20
RETAINED_MAX_MIB = 40  # one prompt's text and tokens alone are ~25 MiB: three kept would be ~75


def _word(n: int) -> str:
    """12 letters: one token of the simulator's tokenizer (cheap to tokenize), distinct per n."""
    out = []
    for _ in range(12):
        n, r = divmod(n, 26)
        out.append(chr(97 + r))
    return "".join(out)


@functools.cache
def _prompt(seed: int) -> bytes:
    words = " ".join(_word(seed * 10**7 + i) for i in range(PROMPT_BYTES // 13 + 1))[:PROMPT_BYTES]
    return orjson.dumps({"model": "m", "messages": [{"role": "user", "content": words}], "max_tokens": 1})


class Peak:
    """Samples a server's RSS in the background; `.mib` is the highest seen."""

    def __init__(self, server: Child) -> None:
        self.server, self.mib, self._stop = server, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.mib = max(self.mib, self.server.rss_mib())

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.mib


def _settled_rss(server: Child) -> float:
    time.sleep(1.5)
    return server.rss_mib()


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> tuple[Child, Child]:
    sim = start_sim("--ctx", "8192", "--tokens", "4")
    proxy = start_proxy(sim.url, tmp_path_factory.mktemp("mem") / "trace.jsonl")
    yield sim, proxy
    proxy.stop()
    sim.stop()


@pytest.mark.parametrize("which", ["sim", "proxy"])
def test_memory_returns_near_baseline_after_huge_requests(servers, which, capsys):
    sim, proxy = servers
    server = sim if which == "sim" else proxy
    small = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    headers = {"content-type": "application/json"}
    with httpx.Client(timeout=120) as client:
        for _ in range(3):
            assert (
                client.post(server.url + "/v1/chat/completions", content=small, headers=headers).status_code
                == 200
            )
        baseline = _settled_rss(server)
        peak = Peak(server)
        for seed in range(3):
            r = client.post(server.url + "/v1/chat/completions", content=_prompt(seed), headers=headers)
            assert r.status_code == 400 and "context" in r.text
        top = peak.stop()
        assert (
            client.post(server.url + "/v1/chat/completions", content=small, headers=headers).status_code
            == 200
        )
    gc.collect()
    after = _settled_rss(server)
    with capsys.disabled():
        print(f"\n{which}: baseline {baseline:.0f} MiB, peak {top:.0f} MiB, after {after:.0f} MiB")
    assert after - baseline < RETAINED_MAX_MIB, (baseline, top, after)
