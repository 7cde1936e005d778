"""The real llama.cpp server (xllamacpp wheel via our launcher) on generated models.

What the rest of the tool relies on is checked against the server's own numbers: usage and timings
fields, prompt-cache hits and misses (`timings.prompt_n`), the host-RAM prompt cache, slot files,
output that always runs to max_tokens, and a sliding-window model that creates context checkpoints.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from drivers.servers.xllamacpp_launch import STOP_DEADLINE_S
from replay.testing.gguf_model import SLOW, make_model
from replay.trace.synth import synth_text
from tests.support.llamakit import READY, Server, launched, printable, require_xllamacpp

pytestmark = pytest.mark.llama

TIMING_KEYS = {
    "cache_n",
    "prompt_n",
    "prompt_ms",
    "prompt_per_token_ms",
    "prompt_per_second",
    "predicted_n",
    "predicted_ms",
    "predicted_per_token_ms",
    "predicted_per_second",
}
TEMPLATE_TOKENS = 20  # BOS + ChatML markers around one user message, with room to spare
# One thread: llama.cpp's threads spin at every barrier, so two threads on a 2-core machine that is
# busy with anything else (pytest, other servers) run several times slower than one.


@pytest.fixture(scope="module")
def server(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    require_xllamacpp()
    work = tmp_path_factory.mktemp("llama-server")
    (work / "slots").mkdir()
    flags = ["-c", "16384", "-np", "1", "-t", "1", "--metrics", "--slot-save-path", "slots", "-lv", "4"]
    with launched(tiny_llama, *flags, log_path=work / "server.log", cwd=work) as s:
        yield s


def assert_usage(body: dict, max_tokens: int) -> None:
    usage, timings = body["usage"], body["timings"]
    assert timings.keys() >= TIMING_KEYS
    assert usage["completion_tokens"] == max_tokens == timings["predicted_n"]
    assert usage["prompt_tokens"] == timings["prompt_n"] + timings["cache_n"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == timings["cache_n"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_ready_line_is_llama_servers(server: Server) -> None:
    port = server.url.rsplit(":", 1)[1]
    line = next(ln for ln in server.log().splitlines() if READY.search(ln))
    assert re.fullmatch(
        rf"\d+\.\d\d\.\d{{3}}\.\d{{3}} I srv {{10}}main: server is listening on http://127\.0\.0\.1:{port}",
        line,
    )
    assert server.get("/health").json() == {"status": "ok"}


def test_chat_runs_to_max_tokens_with_printable_text(server: Server) -> None:
    for max_tokens in (1, 40):
        body = server.chat(synth_text(300, seed=11), max_tokens=max_tokens)
        assert_usage(body, max_tokens)
        choice = body["choices"][0]
        assert choice["finish_reason"] == "length"
        assert printable(choice["message"]["content"].strip()) or max_tokens == 1


def test_one_token_per_synthetic_word(server: Server) -> None:
    body = server.chat(synth_text(1000, seed=12), max_tokens=1)
    assert 1000 <= body["usage"]["prompt_tokens"] <= 1000 + TEMPLATE_TOKENS


def test_stream_with_usage_chunk(server: Server) -> None:
    events = server.chat_stream(synth_text(200, seed=13), max_tokens=24)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    final = chunks[-1]
    assert final["choices"] == []
    assert_usage(final, 24)
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finish[-1] == "length" and all(f is None for f in finish[:-1])
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert printable(text.strip())


def test_repeated_prompt_reprocesses_one_token(server: Server) -> None:
    prompt = synth_text(1500, seed=14)
    first = server.chat(prompt, max_tokens=4)["timings"]
    again = server.chat(prompt, max_tokens=4)["timings"]
    assert first["prompt_n"] >= 1500 and first["cache_n"] <= 8
    assert again["prompt_n"] == 1  # llama-server always re-evaluates the last prompt token
    assert again["cache_n"] == first["prompt_n"] + first["cache_n"] - 1


def test_extended_prompt_reprocesses_only_the_tail(server: Server) -> None:
    server.chat(synth_text(1200, seed=15), max_tokens=4)
    longer = server.chat(synth_text(1250, seed=15), max_tokens=4)["timings"]
    assert 50 <= longer["prompt_n"] <= 50 + TEMPLATE_TOKENS
    assert longer["cache_n"] >= 1200


def test_other_prompt_misses_then_host_cache_restores(server: Server) -> None:
    a, b = synth_text(1500, seed=16), synth_text(1500, seed=17)
    server.chat(a, max_tokens=4)
    miss = server.chat(b, max_tokens=4)["timings"]
    back = server.chat(a, max_tokens=4)["timings"]
    assert miss["prompt_n"] >= 1490  # only the template's opening tokens are shared
    assert back["prompt_n"] == 1  # A came back from the host-RAM prompt cache (--cache-ram default)
    assert "prompt_save:  - saving prompt with length" in server.log()


def test_slot_save_and_restore(server: Server) -> None:
    a, b = synth_text(800, seed=18), synth_text(800, seed=19)
    server.chat(a, max_tokens=4)
    saved = server.slot_action("save", "a.bin").json()
    assert saved["n_saved"] > 800 and saved["n_written"] > 0
    server.chat(b, max_tokens=4)
    restored = server.slot_action("restore", "a.bin").json()
    assert restored["n_restored"] == saved["n_saved"]
    assert server.chat(a, max_tokens=4)["timings"]["prompt_n"] == 1
    assert server.slot_action("save", "../escape.bin").status_code == 400


def test_metrics_count_processed_and_cached_tokens(server: Server) -> None:
    text = server.get("/metrics").text
    for name in (
        "llamacpp:prompt_tokens_total",
        "llamacpp:tokens_predicted_total",
        "llamacpp:n_decode_total",
    ):
        assert re.search(rf"^{re.escape(name)} \d", text, re.M), name


def test_sliding_window_model_creates_checkpoints(tiny_gemma2: Path, tmp_path: Path) -> None:
    require_xllamacpp()
    full = synth_text(1200, seed=20)
    branch = synth_text(400, seed=20) + " " + synth_text(800, seed=21)
    with launched(tiny_gemma2, "-c", "16384", "-t", "1", "-lv", "4", log_path=tmp_path / "swa.log") as s:
        first = s.chat(full, max_tokens=8)
        assert first["choices"][0]["finish_reason"] == "length"
        assert printable(first["choices"][0]["message"]["content"].strip())
        assert s.chat(full, max_tokens=4)["timings"]["prompt_n"] == 1
        branched = s.chat(branch, max_tokens=4)["timings"]
        log = s.log()
        t0 = time.monotonic()
        result = s.child.stop()
        stop_s = time.monotonic() - t0
    assert re.search(r"created context checkpoint \d+ of 32 \(pos_min = \d+, pos_max = \d+", log)
    # Branching 400 words in, far behind the sliding window: the cached prefix is unusable.
    assert branched["cache_n"] <= 1 and branched["prompt_n"] >= 1200
    assert "restored context checkpoint" in log or "forcing full prompt re-processing" in log
    assert result.returncode == 0 and result.how == "terminated" and stop_s < 3.0


def test_sigterm_mid_prompt_batch_stops_within_deadline(tmp_path: Path) -> None:
    """llama.cpp leaves its loop only between batches; one 4K-token batch of the 8x512 model takes
    seconds on 2 cores, so the launcher's watchdog must end it (exit 1) rather than hang."""
    require_xllamacpp()
    model = make_model(tmp_path / "slow.gguf", **SLOW)
    flags = ["-c", "8192", "-t", "1", "-b", "4096", "-ub", "4096"]
    with launched(model, *flags, log_path=tmp_path / "slow.log") as s:
        body = {"messages": [{"role": "user", "content": synth_text(4000, seed=22)}], "max_tokens": 4}
        sender = threading.Thread(target=lambda: _post_ignoring_errors(s.url, body), daemon=True)
        sender.start()
        _wait_for(lambda: "processing task" in s.log(), timeout=30)
        result = s.child.stop()
        sender.join(timeout=30)
    assert result.how == "terminated"
    assert result.seconds < STOP_DEADLINE_S + 1.5
    assert result.returncode == 0 or (result.returncode == 1 and "Timeout" in s.log())


def _post_ignoring_errors(url: str, body: dict) -> None:
    with contextlib.suppress(httpx.HTTPError):  # the server goes away mid-request, on purpose
        httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60.0)


def _wait_for(cond: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)
