"""Every scenario on the simulator: the shape the seed figures describe comes out of ds4's policy.

Each fixture runs a scenario's arms once (module scope) on simulator child processes bound to
127.0.0.1; alternate-plan scenarios run at a very large time scale (their outcome does not depend
on wall time), the closed-loop slow morning at one where the client's own overhead stays small.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest

from replay.metrics.results import RunResults, read_results
from replay.runs.scenario import run_arm, run_arms, run_shared
from replay.scenario import find_scenario

pytestmark = pytest.mark.e2e

# Modelled seconds per wall second for alternate-plan scenarios. Not more: the client's own time
# between requests becomes modelled idle time, which ages checkpoint hits (6 h half-life).
FAST = 10_000.0


class Arm:
    """One arm's results, with the lookups the assertions need."""

    def __init__(self, res: RunResults) -> None:
        self.res = res
        self.requests = sorted(res.requests, key=lambda r: r["seq"])
        assert self.requests and all(r["status"] == "ok" for r in self.requests), [
            r.get("error") for r in self.requests
        ]
        self.by_id = {r["id"]: r for r in self.requests}

    def session(self, sid: str) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["session"] == sid]

    def events(self, kind: str, seq: int | None = ...) -> list[dict[str, Any]]:  # type: ignore[assignment]
        return [s for s in self.res.server if s["event"] == kind and (seq is ... or s["request_seq"] == seq)]

    def previous(self, rec: dict[str, Any]) -> dict[str, Any]:
        """The same session's request before `rec`."""
        mine = self.session(rec["session"])
        return mine[mine.index(rec) - 1]


def run(name: str, arms: list[str], tmp: Path, scale: float = FAST) -> dict[str, Arm]:
    spec = find_scenario(name)
    out: dict[str, Arm] = {}
    for result in run_arms(spec, tmp, arms, time_scale=scale):  # side by side, one simulator each
        assert result.outcome.exit_code == 0, result.outcome
        out[result.arm] = Arm(read_results(result.results))
    assert list(out) == arms
    return out


@pytest.fixture(scope="module")
def switching(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Arm]:
    return run("switching", ["4G", "24G", "64G"], tmp_path_factory.mktemp("switching"))


def test_switching_64g_restores_every_switch_in_full(switching: dict[str, Arm]) -> None:
    arm = switching["64G"]
    switches = [r for r in arm.requests if "switch" in r["switch"]]
    assert len(switches) == 8
    for rec in switches:
        prev = arm.previous(rec)
        assert rec["modelled"]["cache_source"] == "disk"
        assert rec["cached_tokens"] >= prev["prompt_tokens"]  # the whole conversation, reply included
        assert 10_000 <= rec["reprocessed_tokens"] <= 10_100  # only the new tool result
        assert 20 <= rec["modelled"]["prefill_s"] + rec["modelled"]["decode_s"] <= 30  # seed: 23-26 s
    assert arm.events("evict") == []
    assert len(arm.events("restore")) >= 8
    assert arm.session("a")[-1]["prompt_tokens"] == pytest.approx(111_000, rel=0.02)
    assert arm.session("b")[-1]["prompt_tokens"] == pytest.approx(121_000, rel=0.02)


def test_switching_small_budgets_evict_unrestored_files_and_reread(switching: dict[str, Arm]) -> None:
    for name in ("4G", "24G"):
        assert switching[name].events("evict"), name
    assert all(e["hits"] == 0 for e in switching["4G"].events("evict"))  # at 4 GB nothing is ever restored
    low = switching["4G"]
    for rec in (r for r in low.requests if "switch" in r["switch"]):
        assert rec["reprocessed_tokens"] > 0.9 * rec["prompt_tokens"]  # re-reads the whole conversation
    mid = switching["24G"]
    reread = [r["reprocessed_tokens"] for r in mid.requests if "switch" in r["switch"]]
    assert max(reread) > 15_000  # 24 GB loses the latest copy at least once
    assert statistics.mean(reread) < statistics.mean(
        r["reprocessed_tokens"] for r in low.requests if "switch" in r["switch"]
    )


@pytest.fixture(scope="module")
def morning(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Arm]:
    """The slow morning's arms walked in modelled time (what `scenario check` judges), and the
    same arms on the simulator over HTTP at 200x (ten times the spec's: the tokens and events
    these tests compare follow the order of the calls, which 200x keeps; the spec's 20x keeps the
    calls' seconds too, for `scenario check`'s spread)."""
    from replay.runs.modelled import model_arm

    spec = find_scenario("slow-morning")
    tmp = tmp_path_factory.mktemp("morning")
    out: dict[str, Arm] = {}
    for result in run_arms(spec, tmp, ["24G", "64G"], time_scale=200.0):
        assert result.outcome.exit_code == 0, result.outcome
        out[f"{result.arm} run"] = Arm(read_results(result.results))
        out[result.arm] = Arm(model_arm(spec, spec.arm(result.arm), result.trace))
    return out


def _window(arm: Arm, sessions: tuple[str, ...], after_compaction: bool) -> list[dict[str, Any]]:
    compaction = next(r for r in arm.requests if r["tag"] == "compaction")
    return [
        r
        for r in arm.requests
        if r["session"] in sessions
        and (r["seq"] > compaction["seq"]) == after_compaction
        and r is not compaction
    ]


def test_slow_morning_24g_switches_miss_and_find_the_shared_system_prefix(morning: dict[str, Arm]) -> None:
    arm = morning["24G"]
    early = _window(arm, ("main", "fin1", "fin2"), after_compaction=False)
    switches = [r for r in early if "switch" in r["switch"]]
    assert len(switches) == len(early) - 3  # every request after the three first is from another conversation
    assert all(arm.events("live_miss", r["seq"]) for r in switches)
    # "including calls of mine that had 90K tokens cached and only had to wait"
    assert any(r["session"] == "main" and r["cached_tokens"] >= 87_000 for r in switches)
    compaction = next(r for r in arm.requests if r["tag"] == "compaction")
    assert compaction["prompt_tokens"] == pytest.approx(70_000, rel=0.05)  # about 70K kept
    assert compaction["cached_tokens"] == 14_336  # the shared prefix came back, the rest is re-read
    late = _window(arm, ("main",), after_compaction=True)
    assert len(late) == 6 and all(r["cached_tokens"] == 14_336 for r in late)  # main at 07:55
    evictions = arm.events("evict")
    assert len(evictions) > 20 and sum(1 for e in evictions if e["hits"] == 0) >= 0.9 * len(evictions)


def test_slow_morning_64g_restores_each_early_call_whole_until_files_restored_once_pile_up(
    morning: dict[str, Arm],
) -> None:
    arm = morning["64G"]
    early = [r for r in _window(arm, ("main", "fin1", "fin2"), False) if "switch" in r["switch"]]
    assert early and all(r["modelled"]["cache_source"] == "disk" for r in early)
    assert max(r["modelled"]["restore_s"] for r in early) <= 1.5  # "in about a second"
    whole = [r for r in early if r["cached_tokens"] >= r["prompt_tokens"] - 4_000]
    assert len(whole) >= 0.5 * len(early)  # its own new tokens only, for the first half hour at least
    assert len(arm.events("evict")) < len(morning["24G"].events("evict"))


@pytest.mark.parametrize("budget", ["24G", "64G"])
def test_slow_morning_on_the_simulator_is_within_2pct_of_the_sweep(
    morning: dict[str, Arm], budget: str
) -> None:
    """Sweep = simulator: `size sweep`'s closed-loop walk (here, the arm walked in modelled time
    with its flags and leftovers) and a wall-clock run of the arm over HTTP agree within 2%."""
    walked, ran = morning[budget], morning[f"{budget} run"]
    for name in ("reprocessed_tokens", "cached_tokens"):
        a = sum(r[name] for r in walked.requests)
        b = sum(r[name] for r in ran.requests)
        assert abs(a - b) <= 0.02 * a, (name, a, b)
    assert (
        abs(len(walked.events("restore")) - len(ran.events("restore")))
        <= 0.02 * len(walked.events("restore")) + 1
    )
    assert (
        abs(len(walked.events("evict")) - len(ran.events("evict"))) <= 0.02 * len(walked.events("evict")) + 1
    )


def test_slow_morning_log_is_stamped_in_the_reports_clock(morning: dict[str, Arm]) -> None:
    lines = Path(morning["24G run"].res.path).with_suffix(".server.log").read_text().splitlines()
    assert lines[0].startswith("0901 06:45:")  # the first request's time in the report
    last = lines[-1].split()[1]
    assert "07:10:00" < last < "09:30:00"  # modelled hours, not the few wall seconds of the run


@pytest.fixture(scope="module")
def overnight(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Arm]:
    return run("three-overnight", ["field", "pr1058"], tmp_path_factory.mktemp("overnight"))


def test_three_overnight_c_misses_every_turn_with_hidden_reasoning(overnight: dict[str, Arm]) -> None:
    arm = overnight["field"]
    c = arm.session("c")
    for rec in c[1:]:
        assert rec["cached_tokens"] < arm.previous(rec)["prompt_tokens"]  # never its latest state
    for rec in c[-3:]:
        assert rec["reprocessed_tokens"] > 20_000  # far more than the 10K it added
    for rec in arm.session("a")[1:]:
        assert rec["cached_tokens"] >= arm.previous(rec)["prompt_tokens"]  # A never loses its own
    evictions = arm.events("evict")
    assert len(evictions) > 30  # the 64 GB cache filled
    assert sum(1 for e in evictions if e["hits"] == 0) >= 0.9 * len(evictions)


def test_three_overnight_pr1058_brings_c_back(overnight: dict[str, Arm]) -> None:
    arm = overnight["pr1058"]
    first_round = arm.session("c")[-3]
    assert first_round["cached_tokens"] >= arm.previous(first_round)["prompt_tokens"]
    assert first_round["reprocessed_tokens"] < 10_100
    field = overnight["field"].session("c")[-3]
    assert field["reprocessed_tokens"] > 90_000


@pytest.fixture(scope="module")
def routing(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Arm]:
    return run("batched-routing", ["upstream", "reuse-aware"], tmp_path_factory.mktemp("routing"))


def test_batched_routing_upstream_misses_live_every_switch(routing: dict[str, Arm]) -> None:
    arm = routing["upstream"]
    later = arm.requests[2:]
    assert len(later) == 9
    assert {r["modelled"]["slot"] for r in arm.requests} == {0}  # the second slot stays empty
    for rec in later:
        misses = arm.events("live_miss", rec["seq"])
        assert misses and misses[0]["common"] >= 11_000  # common = the shared system prompt
        assert rec["modelled"]["cache_source"] == "disk"


def test_batched_routing_reuse_aware_keeps_both_live(routing: dict[str, Arm]) -> None:
    arm = routing["reuse-aware"]
    later = arm.requests[2:]
    assert {r["modelled"]["slot"] for r in arm.requests} == {0, 1}
    for rec in later:
        assert rec["modelled"]["cache_source"] == "live"
        assert arm.events("live_miss", rec["seq"]) == [] and arm.events("restore", rec["seq"]) == []
        assert rec["reprocessed_tokens"] < 1_600
    assert arm.events("evict") == []


@pytest.fixture(scope="module")
def cold_ab(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Arm]:
    return run("cold-ab", ["on-2nd", "off-1st"], tmp_path_factory.mktemp("cold"))


def _ratio(arm: Arm) -> float:
    first, second = arm.requests[:3], arm.requests[3:]
    return sum(r["reprocessed_tokens"] for r in second) / sum(r["reprocessed_tokens"] for r in first)


def test_cold_ab_round_two_ratio(cold_ab: dict[str, Arm]) -> None:
    on, off = cold_ab["on-2nd"], cold_ab["off-1st"]
    # seed: round 2 re-read 3,225 of 19,609 tokens with cold saves on, all of them with them off
    assert sum(r["reprocessed_tokens"] for r in on.requests[3:]) == 3_225
    assert sum(r["reprocessed_tokens"] for r in off.requests[3:]) == 19_609
    assert _ratio(off) == pytest.approx(1.0, abs=0.08)  # seed: 0.904 and 1.016
    assert [r["prompt_tokens"] for r in on.requests[:3]] == [7_132, 6_655, 5_822]
    assert [r["prompt_tokens"] for r in on.requests[3:]] == [7_132, 6_655, 5_822]  # resent unchanged
    cold = sorted(s["tokens"] for s in on.events("store") if s["reason"] == "cold")
    assert cold == [4096, 6144, 6144]  # the report's cuts of 5,822 and 6,655, and 7,132's (no chat anchor)
    assert (
        len([e for e in on.events("restore") if e["request_seq"] in {r["seq"] for r in on.requests[3:]}]) == 3
    )
    assert off.events("restore") == [] and not [s for s in off.events("store") if s["reason"] == "cold"]


@pytest.fixture(scope="module")
def probe_and_sweep(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Arm]:
    tmp = tmp_path_factory.mktemp("probe")
    probe, sweep = find_scenario("cache-probe"), find_scenario("depth-sweep")
    # Both use the simulator's defaults and cannot change each other's outcome: one process.
    shared = run_shared([(probe, probe.arm("4G")), (sweep, sweep.arm("sim"))], tmp, flags=[], time_scale=FAST)
    wide = run_arm(probe, probe.arm("16G"), tmp, time_scale=FAST)
    return {
        "4G": Arm(read_results(shared[0].results)),
        "sweep": Arm(read_results(shared[1].results)),
        "16G": Arm(read_results(wide.results)),
    }


def test_cache_probe_steps(probe_and_sweep: dict[str, Arm]) -> None:
    for name in ("4G", "16G"):
        arm = probe_and_sweep[name]
        first, e1, e2, e3, e4, back, e5 = arm.requests
        assert first["reprocessed_tokens"] == first["prompt_tokens"] > 32_000
        for rec in (e1, e2, back, e5):
            assert rec["reprocessed_tokens"] < 2_000, (name, rec["id"])  # the 30,720 checkpoint comes back
        assert e4["session"] == "other" and e4["cached_tokens"] == 0
        assert e5["tag"] == "probe"
        if name == "16G":
            assert e3["cached_tokens"] == 10_240 and 20_000 < e3["reprocessed_tokens"] < 23_000
        else:
            assert e3["reprocessed_tokens"] == e3["prompt_tokens"]  # the early chain was evicted


def test_depth_sweep_rates_are_flat(probe_and_sweep: dict[str, Arm]) -> None:
    arm = probe_and_sweep["sweep"]
    assert arm.requests[-1]["prompt_tokens"] >= 131_072
    for rec in arm.requests[1:]:
        assert 8_192 <= rec["reprocessed_tokens"] <= 8_300  # each step continues from live KV
        m = rec["modelled"]
        assert rec["reprocessed_tokens"] / m["prefill_s"] == pytest.approx(510, rel=0.05)
        assert rec["output_tokens"] / m["decode_s"] == pytest.approx(40, rel=0.05)


@pytest.fixture(scope="module")
def prewarm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Arm]:
    return run("prewarm", ["continue", "rewrite"], tmp_path_factory.mktemp("prewarm"))


def test_prewarm_writes_the_cut_and_the_first_turns_restore_it(prewarm: dict[str, Arm]) -> None:
    for arm in prewarm.values():
        warmups = [r for r in arm.requests if r["tag"] == "prewarm"]
        assert len(warmups) == 3 and all(r["output_tokens"] == 0 for r in warmups)
        cuts = sorted(s["tokens"] for s in arm.events("store") if s["reason"] == "cold")
        assert cuts == [4_096, 6_144, 10_240]  # report 000's three cuts
    rewritten = [r for r in prewarm["rewrite"].requests if r["tag"] != "prewarm"]
    assert [r["cached_tokens"] for r in rewritten] == [10_240, 6_144, 4_096]
    continued = [r for r in prewarm["continue"].requests if r["tag"] != "prewarm"]
    assert [r["cached_tokens"] for r in continued] == [11_732, 6_655, 5_822]
