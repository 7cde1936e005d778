"""The captured real-server logs in tests/data/llama still hold what their README promises.

A re-capture (python -m tests.llama.capture_logs) that lost a scenario's key lines, or leaked a
temporary path, fails here instead of silently weakening the log parser's tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.llama.capture_logs import SCENARIOS

DATA = Path(__file__).resolve().parents[1] / "data" / "llama"

MARKERS = {
    "llama_server_basic": [
        "server is listening on http://127.0.0.1:",
        "selected slot by LCP similarity",
        "need to evaluate at least 1 token",
        "prompt_save:  - saving prompt with length",
        "found better prompt with f_keep",
        "exceeds the available context size",
        "prompt cache is enabled, size limit: 8192 MiB",
    ],
    "llama_server_default_verbosity": ["selected slot by LRU", "prompt eval time ="],
    "llama_server_np2": ["prompt cache is disabled", "selected slot by id (1)", "id  1 | task"],
    "llama_server_swa": [
        "cache_reuse is not supported by this context",
        "created context checkpoint 1 of 32",
        "restored context checkpoint",
        "erased invalidated context checkpoint",
    ],
    "llama_server_swa_forcing": ["forcing full prompt re-processing due to lack of cache data"],
    "llama_server_swa_full": ["stop processing"],
    "llama_server_two_slots_cache": [
        "saving idle slot to prompt cache",
        "prompt is already in the cache, skipping",
        "cache state: 3 prompts",
    ],
    "llama_server_cache_limits": [
        "prompt cache is enabled, size limit: 1 MiB",
        "erasing context checkpoint too close to an earlier one",
        "making room for prompt cache entry, removing oldest entry",
        "exceeds cache size limit 1.000 MiB, skipping",
    ],
}
# The second build prints the same cache lines (and announces itself as build 1, commit 7e4c0a9).
for _name in ("two_slots_cache", "cache_limits"):
    MARKERS[f"llama_server_b_{_name}"] = [*MARKERS[f"llama_server_{_name}"], "build 1 (7e4c0a9)"]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_capture_present_and_clean(name: str) -> None:
    log = (DATA / f"{name}.log").read_text()
    steps = json.loads((DATA / f"{name}.steps.json").read_text())
    assert steps["scenario"] == name and len(steps["steps"]) == len(SCENARIOS[name][2])
    for marker in MARKERS[name]:
        assert marker in log, f"{name}: {marker!r}"
    for leak in ("/tmp/", "/work/", "/home/", "/root/"):
        assert leak not in log, f"{name}: absolute path {leak}"


def test_steps_record_the_cache_shapes() -> None:
    """The numbers the README describes, from the server's own timings."""

    def prompt_n(name: str) -> dict[str, tuple[int, int]]:
        steps = json.loads((DATA / f"{name}.steps.json").read_text())["steps"]
        return {
            s["step"]: (s["timings"]["prompt_n"], s["timings"]["cache_n"]) for s in steps if "timings" in s
        }

    basic = prompt_n("llama_server_basic")
    assert basic["A again (cache hit)"][0] == 1
    assert basic["A back (host cache load)"][0] == 1
    assert basic["A after restore"][0] == 1
    assert prompt_n("llama_server_swa_forcing")["branch at 500 words"][1] == 0
    assert prompt_n("llama_server_swa_full")["branch at 500 words"][1] >= 500
