"""`replay ab` on the real llama.cpp server (xllamacpp): host cache on (A) against `--cache-ram 0` (B).

One slot, the `switching` scenario scaled down: with the host-RAM prompt cache every switch loads
its own conversation back; without it every switch re-reads all but the shared prefix. The A/B
must name that with an interval, attribute llama-server's own cache events (host-cache stores and
restores) to the requests, take prefill seconds from `prompt eval time`, and identify the build by
the package and a hash of its native libraries.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from replay.metrics.results import read_results
from replay.runs.ab import run_ab
from replay.runs.options import ReplayOptions
from replay.scenario import find_scenario, generate
from tests.support.llamakit import require_xllamacpp

pytestmark = pytest.mark.llama

PARAMS = {"scale": 0.02, "turns": 2, "defaults.reply_tokens": 32}


def target(path: Path, name: str, model: Path, *flags: str) -> Path:
    listed = ", ".join(f'"{f}"' for f in ("-c", "16384", "-np", "1", "-t", "1", "-lv", "4", *flags))
    path.write_text(
        f'kind = "llamacpp"\nname = "{name}"\nbinary = "xllamacpp"\nmodel = "{model}"\n'
        f"flags = [{listed}]\nready_timeout = 60\nstop_timeout = 10\n"
    )
    return path


def test_host_cache_off_reprocesses_more_per_switch_and_the_log_says_why(
    tiny_llama: Path, tmp_path: Path
) -> None:
    require_xllamacpp()
    trace = tmp_path / "switching.jsonl"
    generate(find_scenario("switching", PARAMS), trace)
    a = target(tmp_path / "a.toml", "host-cache", tiny_llama)
    b = target(tmp_path / "b.toml", "no-host-cache", tiny_llama, "--cache-ram", "0")
    out = tmp_path / "ab"
    outcome = run_ab(trace, a, b, repeat=1, out_dir=out, options=ReplayOptions(timeout=120.0))
    doc = outcome.doc
    assert outcome.exit_code == 0 and doc["order"] == ["A", "B", "B", "A"]

    # The verdict and its interval: B re-processes many times more per switch.
    stats = {(r["class"], r["metric"]): r for r in doc["stats"]}
    switch = stats[("switch", "re-processed tokens per request")]
    assert switch["difference"] and switch["low"] > 2, switch
    assert (
        doc["verdict"]["text"].startswith("B re-processes ")
        and "more tokens per switch" in doc["verdict"]["text"]
    )
    assert [d["detail"] for d in doc["differences"]] == ["--cache-ram: (not set) -> 0"]

    # Build identity: the wheel's package, version and native-library hash, on both arms.
    for arm in ("A", "B"):
        view = doc["identity"][arm]["view"]
        assert view["package"].startswith("xllamacpp ") and len(view["package.combined_sha256"]) == 64
        assert "package xllamacpp" in doc["identity"][arm]["summary"]

    # llama-server's own log, correlated: A's switches restore from the host cache, B's never do;
    # every request has its task with prefill tokens equal to timings.prompt_n, and prefill
    # seconds come from `prompt eval time`.
    for run in doc["runs"]:
        res = read_results(run["results"])
        assert run["prefill_source"] == "server-log"
        tasks = {s["request_seq"]: s for s in res.server if s["event"] == "request"}
        for rec in res.requests:
            task = tasks[rec["seq"]]
            assert task["prefill"] == rec["reprocessed_tokens"] and task["prompt"] == rec["prompt_tokens"]
            assert task["prompt_done_s"] > 0
        switches = [r for r in res.requests if "switch" in r["switch"]]
        restores = [s for s in res.server if s["event"] == "restore" and s["source"] == "host_cache"]
        stores = [s for s in res.server if s["event"] == "store" and s["reason"] == "host_cache"]
        if run["arm"] == "A":
            assert {s["request_seq"] for s in restores} == {r["seq"] for r in switches}
            for s in restores:
                rec = next(r for r in res.requests if r["seq"] == s["request_seq"])
                assert s["tokens"] == rec["cached_tokens"]
            assert stores
        else:
            assert restores == [] and stores == []
