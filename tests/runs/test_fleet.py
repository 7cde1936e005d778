"""Several targets through `replay run`: routed by the client, each line naming its backend."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import psutil
import pytest

from replay.metrics.results import read_results
from replay.trace import TraceWriter
from tests.support.scripted_server import Script, ScriptedServer

USAGE = {"prompt_tokens": 100, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 40}}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replay", *args], capture_output=True, text=True, check=False
    )


def _trace(path: Path, sessions: int = 6, turns: int = 3) -> Path:
    with TraceWriter(path, source="test") as w:
        for s in range(sessions):
            w.session(f"s{s}")
        for turn in range(turns):
            for s in range(sessions):
                msgs = [{"role": "user", "content": f"s{s} turn {t}"} for t in range(turn + 1)]
                w.request(f"s{s}", turn * 0.05 + s * 0.01, msgs, {"max_tokens": 3})
    return path


@pytest.fixture
def second_server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as server:
        yield server


@pytest.mark.e2e
@pytest.mark.parametrize("workers", [1, 2])
def test_run_over_two_targets_keeps_sessions_sticky_and_names_the_backends(
    scripted_server: ScriptedServer, second_server: ScriptedServer, tmp_path: Path, workers: int
) -> None:
    scripted_server.default = Script(usage=USAGE)
    second_server.default = Script(usage=USAGE)
    urls = [scripted_server.url, second_server.url]
    out = tmp_path / "r.jsonl"
    done = _cli(
        "run", str(_trace(tmp_path / "t.jsonl")), "--target", ",".join(urls), "--quiet", "--out", str(out),
        "--session-header", "X-Session-ID", "--workers", str(workers),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    res = read_results(out)
    assert res.run["target"]["backends"] == urls and res.run["target"]["routing"] == "sticky"
    assert res.run["target"]["affinity"] == {"header": "X-Session-ID", "field": None}
    placed: dict[str, set[str]] = {}
    for line in res.requests:
        placed.setdefault(line["session"], set()).add(line["backend"])
    assert all(len(b) == 1 for b in placed.values()) and len(placed) == 6
    served = {url: sum(1 for line in res.requests if line["backend"] == url) for url in urls}
    assert served == {
        scripted_server.url: len(scripted_server.seen),
        second_server.url: len(second_server.seen),
    }
    assert sum(served.values()) == 18
    # The summary's classes per backend (merged from the workers' parts when there were two).
    assert {url: s.classes["all"].count for url, s in res.backends.items()} == served


def test_a_list_of_targets_is_running_servers_only(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.jsonl", sessions=1, turns=1)
    for target, said in (
        ("http://127.0.0.1:1,sim", "must be a URL"),
        ("http://127.0.0.1:1,http://127.0.0.1:1", "named twice"),
    ):
        done = _cli("run", str(trace), "--target", target, "--quiet", "--out", str(tmp_path / "r.jsonl"))
        assert done.returncode == 2 and said in done.stderr, done.stderr
    done = _cli("run", str(trace), "--target", "http://127.0.0.1:1,http://127.0.0.1:2", "--routing", "random",
                "--out", str(tmp_path / "r.jsonl"))  # fmt: skip
    assert done.returncode == 2 and "--routing" in done.stderr
    assert not (tmp_path / "r.jsonl").exists()


@pytest.mark.e2e
def test_replicas_start_a_simulator_fleet_each_its_own_process_port_and_disk(tmp_path: Path) -> None:
    server = tmp_path / "fleet.toml"
    server.write_text(
        'kind = "sim"\nname = "fleet"\nreplicas = 2\nkv_disk_dir = "auto"\nrouting = "round-robin"\n'
        'flags = ["--time-scale", "200"]\n'
    )
    out, work = tmp_path / "r.jsonl", tmp_path / "work"
    trace = _trace(tmp_path / "t.jsonl", sessions=2, turns=2)
    done = _cli(
        "run", str(trace), "--server", str(server), "--quiet", "--out", str(out), "--workdir", str(work)
    )
    assert done.returncode == 0, done.stderr
    res = read_results(out)
    backends = res.run["target"]["backends"]
    assert res.run["target"]["routing"] == "round-robin" and len(set(backends)) == 2
    assert [line["backend"] for line in res.requests] == [backends[i % 2] for i in range(4)]
    # Each replica had a disk directory of its own, and a log of its own (so a process of its own).
    kv = sorted(p.name for p in work.glob("kv/*/replica-*"))
    assert kv == ["replica-0", "replica-1"]
    logs = sorted(p.name.split(".")[0] for p in work.glob("fleet-*.log"))
    assert logs == ["fleet-0", "fleet-1"]


@pytest.mark.e2e
def test_every_replica_has_its_own_counters_memory_and_log_records_in_the_results(tmp_path: Path) -> None:
    server = tmp_path / "fleet.toml"
    server.write_text(
        'kind = "sim"\nname = "fleet"\nreplicas = 2\nkv_disk_dir = "auto"\nflags = ["--time-scale", "200"]\n'
    )
    out = tmp_path / "r.jsonl"
    trace = _trace(tmp_path / "t.jsonl", sessions=4, turns=2)
    done = _cli(
        "run", str(trace), "--server", str(server), "--routing", "round-robin", "--quiet", "--out", str(out)
    )
    assert done.returncode == 0, done.stderr
    res = read_results(out)
    backends = res.run["target"]["backends"]
    lines = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    metrics = [line for line in lines if line["kind"] == "metrics"]
    assert [m["backend"] for m in metrics] == backends  # one per replica, in order
    memory = [line for line in lines if line["kind"] == "memory"]
    assert [m["backend"] for m in memory] == backends and len({m["pid"] for m in memory}) == 2
    # Each replica's own log, read against the requests it served: its records name it.
    parsed = [r for r in res.server if r.get("event") == "log_parse"]
    assert [r["backend"] for r in parsed] == backends and all(r["recognised"] > 0 for r in parsed)
    served_by = {line["seq"]: line["backend"] for line in res.requests}
    attributed = [r for r in res.server if r.get("request_seq") is not None]
    assert attributed and all(served_by[r["request_seq"]] == r["backend"] for r in attributed)


@pytest.mark.e2e
def test_each_replicas_metrics_are_scraped_and_checked_against_the_requests_it_served(tmp_path: Path) -> None:
    """Simulators playing llama-server expose its /metrics: every replica's counters are checked
    against its own requests' usage, and its gauges (requests processing, deferred) are kept."""
    server = tmp_path / "fleet.toml"
    server.write_text(
        'kind = "sim"\nname = "fleet"\nreplicas = 2\nflags = ["--server", "llama", "--time-scale", "200"]\n'
    )
    out = tmp_path / "r.jsonl"
    trace = _trace(tmp_path / "t.jsonl", sessions=4, turns=2)
    done = _cli(
        "run", str(trace), "--server", str(server), "--routing", "round-robin", "--quiet", "--out", str(out)
    )
    assert done.returncode == 0, done.stderr
    res = read_results(out)
    backends = res.run["target"]["backends"]
    metrics = [orjson.loads(x) for x in out.read_bytes().splitlines() if b'"kind":"metrics"' in x]
    assert [m["backend"] for m in metrics] == backends
    for m in metrics:
        mine = [line for line in res.requests if line["backend"] == m["backend"]]
        assert m["ok"] is True and m["requests"] == len(mine) == 4, m
        prompt = next(c for c in m["checks"] if c["what"] == "prompt")
        assert prompt["server"] == sum(line["prompt_tokens"] - line["cached_tokens"] for line in mine)
        assert (
            "llamacpp:requests_deferred" in m["gauges"]
            and "max" in m["gauges"]["llamacpp:requests_processing"]
        )


def _router_or_skip() -> None:
    """SGLang's router comes with the [fleet] extra; CI sets REPLAY_REQUIRE_FLEET=1 so that it runs."""
    if importlib.util.find_spec("sglang_router") is None:
        if os.environ.get("REPLAY_REQUIRE_FLEET") == "1":
            pytest.fail("REPLAY_REQUIRE_FLEET=1 but sglang-router is not installed (pip install '.[fleet]')")
        pytest.skip("sglang-router is not installed (the [fleet] extra)")


@pytest.mark.e2e
def test_sglang_router_starts_in_front_of_its_simulators_and_all_stop_by_pid(tmp_path: Path) -> None:
    _router_or_skip()
    (tmp_path / "sims.toml").write_text(
        'kind = "sim"\nname = "sims"\nreplicas = 2\nflags = ["--server", "llama", "--time-scale", "200"]\n'
    )
    router = tmp_path / "router.toml"
    router.write_text(
        'kind = "sglang-router"\npolicy = "round_robin"\nbackend = "sims.toml"\nready_timeout = 120\n'
    )
    out, work = tmp_path / "r.jsonl", tmp_path / "work"
    trace = _trace(tmp_path / "t.jsonl", sessions=2, turns=2)
    done = _cli(
        "run", str(trace), "--server", str(router), "--quiet", "--out", str(out), "--workdir", str(work)
    )
    assert done.returncode == 0, done.stderr
    res = read_results(out)
    target = res.run["target"]
    assert target["kind"] == "sglang-router" and "--policy" in target["build"]["argv"]
    assert target["build"]["argv"][target["build"]["argv"].index("--policy") + 1] == "round_robin"
    workers = target["build"]["workers"]
    assert len(workers) == 2 and all(w["kind"] == "sim" for w in workers)
    assert [line["status"] for line in res.requests] == ["ok"] * 4
    # Round robin: each simulator served two of the four (its llama-server log has a task per request).
    for i in range(2):
        log = next(work.glob(f"sims-{i}.*.log")).read_text()
        assert log.count("launch_slot_") == 2, log[-2000:]
    # The router's debug log named the worker of every request: the lines say so, "router".
    assert [line["backend_source"] for line in res.requests] == ["router"] * 4
    served = {w["url"]: sum(1 for line in res.requests if line["backend"] == w["url"]) for w in workers}
    assert served == {w["url"]: 2 for w in workers}
    pids = [target["build"]["pid"], *(w["pid"] for w in workers)]
    assert all(
        not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE for pid in pids
    )


def _long_trace(path: Path, sessions: int = 3, turns: int = 4) -> Path:
    """Sessions whose turns each add a few hundred words, each session its own text from the start."""
    with TraceWriter(path, source="test") as w:
        for s in range(sessions):
            w.session(f"s{s}")
        for turn in range(turns):
            for s in range(sessions):
                msgs = [
                    {"role": "user", "content": " ".join(f"s{s}t{t}w{i}" for i in range(150))}
                    for t in range(turn + 1)
                ]
                w.request(f"s{s}", turn * 0.05 + s * 0.01, msgs, {"max_tokens": 3})
    return path


def _router_run(tmp_path: Path, policy: str) -> list[dict]:
    (tmp_path / "sims.toml").write_text(
        'kind = "sim"\nname = "sims"\nreplicas = 2\nflags = ["--server", "llama", "--time-scale", "200"]\n'
    )
    router = tmp_path / f"{policy}.toml"
    router.write_text(
        f'kind = "sglang-router"\npolicy = "{policy}"\nbackend = "sims.toml"\nready_timeout = 120\n'
    )
    out = tmp_path / f"{policy}.jsonl"
    trace = _long_trace(tmp_path / "t.jsonl")
    done = _cli(
        "run", str(trace), "--server", str(router), "--plan", "overlap", "--concurrency", "3",
        "--history", "recorded", "--quiet", "--out", str(out), "--workdir", str(tmp_path / f"w-{policy}"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return read_results(out).requests


def _stays(lines: list[dict]) -> tuple[int, int, list[int]]:
    """Continuing requests that found their session's previous prompt cached (so went to the replica
    that served it), of all continuing requests; and what each continuing request re-read beyond
    the tokens it added."""
    last: dict[str, int] = {}
    stayed = continuing = 0
    extra: list[int] = []
    for line in sorted(lines, key=lambda x: x["id"]):
        before = last.get(line["session"])
        last[line["session"]] = line["prompt_tokens"]
        if before is None:
            continue
        continuing += 1
        stayed += line["cached_tokens"] >= before - 8  # a few template tokens at the end may differ
        extra.append(line["reprocessed_tokens"] - (line["prompt_tokens"] - before))
    return stayed, continuing, extra


def _model_agrees(tmp_path: Path, policy: str) -> float:
    """The percentage of requests the router model (sim/router.py) places where the router
    did, walked in the order the router's log chose them, each arriving to the requests in
    flight when it was sent. Cache-aware's first requests go to the least loaded worker, and a
    request that ends just as another arrives may still count on the router's side: one of
    twelve may differ there."""
    from replay.scenario.check import ArmView, routing_texts

    res = read_results(tmp_path / f"{policy}.jsonl")
    res.run["target"]["fleet"] = {"router": policy, "replicas": 2}
    agrees = ArmView(res, texts=routing_texts(tmp_path / "t.jsonl")).model_agrees_pct()
    assert agrees is not None
    return agrees


def _pairs(lines: list[dict]) -> list[tuple[dict, dict]]:
    """Each continuing request with its session's previous one."""
    last: dict[str, dict] = {}
    out = []
    for line in sorted(lines, key=lambda x: x["id"]):
        if line["session"] in last:
            out.append((last[line["session"]], line))
        last[line["session"]] = line
    return out


@pytest.mark.timing  # three in flight: a request ending as the next arrives moves the router's choice
@pytest.mark.e2e
def test_sglang_routers_cache_aware_policy_keeps_conversations_where_round_robin_moves_them(
    tmp_path: Path,
) -> None:
    """What the router promises (sgl-router's src/policies/cache_aware.rs: with the workers in
    balance, a request goes to the worker whose tree matches most of its text, above
    --cache-threshold): three conversations, three in flight, two simulated llama-servers.
    Cache-aware: every continuing request finds its previous prompt cached and re-reads only its
    new tokens. Round robin (3 sessions over 2 replicas): each turn lands on the other replica."""
    _router_or_skip()
    stayed, continuing, extra = _stays(_router_run(tmp_path, "cache_aware"))
    assert _model_agrees(tmp_path, "cache_aware") >= 100 * 11 / 12
    assert continuing == 9 and stayed / continuing >= 0.95, (stayed, continuing)
    assert max(extra) <= 8, extra  # only the new turn's tokens (and a few of the template) re-read
    lines = _router_run(tmp_path, "round_robin")
    assert _model_agrees(tmp_path, "round_robin") == 100
    stayed_rr, continuing_rr, extra_rr = _stays(lines)
    assert continuing_rr == 9 and stayed_rr <= 6, (stayed_rr, continuing_rr)  # 3 in flight: order varies
    # A move re-reads at least the turn the other replica never saw (a turn adds the same words,
    # so the same tokens, every time), and at most the whole previous prompt.
    turn = min(b["prompt_tokens"] - a["prompt_tokens"] for a, b in _pairs(lines))
    moved = [x for x in extra_rr if x > 8]
    assert len(moved) == 9 - stayed_rr and all(turn - 8 <= x <= 4 * turn for x in moved), (turn, extra_rr)
