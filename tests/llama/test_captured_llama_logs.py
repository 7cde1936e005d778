"""The captured real-server logs in tests/data/llama still hold what their README promises.

A re-capture (python tests/llama/capture_logs.py) that lost a scenario's key lines, or leaked a
temporary path, fails here instead of silently weakening the log parser's tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from capture_logs import SCENARIOS

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
}


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
