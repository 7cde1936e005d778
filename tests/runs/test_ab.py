"""`replay ab` against two simulator builds that differ in one setting, where the winner is known.

The case is seed figures section 3: three agents with ~12,000-character system prompts, two rounds,
two slots, so round 2 of every agent misses live KV and must come from disk. With cold saves on,
round 2 restores the cold checkpoint (round-2/round-1 re-processed far below 1); with
`--kv-cache-cold-max-tokens 0` there is nothing restorable (thinking is on, so the evict saves hold
a reasoning block the client never resends) and round 2 re-reads the whole prompt (ratio near 1).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from rich.console import Console

from drivers.ports import free_port
from drivers.target import target_from_dict
from replay.commands.ab import AbArgs, ab
from replay.errors import UsageError
from replay.metrics.results import RunResults, read_results
from replay.report.ab import ArmRun, compare_outputs, pairs, render, within_ratios
from replay.runs.ab import arm_order, cache_target, plan_runs, run_ab
from replay.runs.options import ReplayOptions
from replay.trace.writer import TraceWriter

SIM_FLAGS = ["--batched-session", "2", "--time-scale", "500", "--hidden-reasoning"]
THINKING = ReplayOptions(think="on")
THINKING_AB = ReplayOptions(history="recorded", think="on")  # ab's own default history


def write_trace(path: Path, temperature: float = 0.0) -> Path:
    """Three agents, ~12,000-character system prompts (1,850 synthetic tokens), two rounds."""
    sessions = ["agent-1", "agent-2", "agent-3"]
    with TraceWriter(path, source="scenario:cold-ab") as w:
        history: dict[str, list[dict[str, Any]]] = {}
        for s in sessions:
            w.session(s, role="cron")
        t = 0.0
        for rnd in range(2):
            for i, s in enumerate(sessions):
                reply = {"role": "assistant", "content": {"synth": {"tokens": 30, "seed": 900 + i}}}
                if rnd == 0:
                    history[s] = [{"role": "system", "content": {"synth": {"tokens": 1850, "seed": 100 + i}}}]
                else:
                    history[s].append(reply)
                history[s].append(
                    {"role": "user", "content": {"synth": {"tokens": 40, "seed": 200 + 10 * rnd + i}}}
                )
                w.request(
                    s,
                    t,
                    list(history[s]),
                    params={"max_tokens": 30, "temperature": temperature},
                    reply={"message": reply, "finish": "stop", "output_tokens": 30},
                )
                t += 1.0
    return path


def write_target(path: Path, name: str, extra: list[str]) -> Path:
    flags = ", ".join(f'"{f}"' for f in SIM_FLAGS + extra)
    path.write_text(f'kind = "sim"\nname = "{name}"\nkv_disk_dir = "auto"\nflags = [{flags}]\n')
    return path


@pytest.fixture
def arms(tmp_path: Path) -> tuple[Path, Path, Path]:
    trace = write_trace(tmp_path / "cold-ab.jsonl")
    a = write_target(tmp_path / "cold-on.toml", "cold-on", [])
    b = write_target(tmp_path / "cold-off.toml", "cold-off", ["--kv-cache-cold-max-tokens", "0"])
    return trace, a, b


def round1_cached(path: str) -> list[int]:
    res = read_results(path)
    firsts: dict[str, dict[str, Any]] = {}
    for rec in sorted(res.requests, key=lambda r: r["id"]):
        firsts.setdefault(rec["session"], rec)
    return [r["cached_tokens"] for r in firsts.values()]


@pytest.mark.e2e
def test_cold_saves_on_beat_off_in_order_abba_on_fresh_caches(
    arms: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, a, b = arms
    out = tmp_path / "ab"
    code = ab(
        AbArgs(trace=trace, a=a, b=b, repeat=1, out_dir=out, options=THINKING_AB, as_json=True), Console()
    )
    assert code == 0
    doc = orjson.loads(capsys.readouterr().out)
    assert doc == orjson.loads((out / "ab.json").read_bytes())
    assert doc["complete"] is True

    # Order A B B A, one results file per arm run, each started from its own arm's TOML.
    assert doc["order"] == ["A", "B", "B", "A"]
    names = ["ab-01-A", "ab-02-B", "ab-03-B", "ab-04-A"]
    assert [Path(r["results"]).name for r in doc["runs"]] == [f"{n}.jsonl" for n in names]
    for run, name in zip(doc["runs"], names, strict=True):
        header = read_results(run["results"]).run["target"]
        assert header["ab"]["arm"] == run["arm"] == name[-1]
        assert ("--kv-cache-cold-max-tokens" in header["build"]["argv"]) == (run["arm"] == "B")

    # A fresh cache per arm run: distinct directories, each in its own run's work dir, empty at
    # start, removed after; no round-1 request was served by an earlier run's checkpoint.
    caches = [r["cache"] for r in doc["runs"]]
    assert len({c["dir"] for c in caches}) == 4
    for c, name in zip(caches, names, strict=True):
        assert c["fresh"] is True and c["removed"] is True and c["files"] > 0
        assert Path(c["dir"]).is_relative_to(out / "work" / name)
        assert not Path(c["dir"]).exists()
    for run in doc["runs"]:
        assert round1_cached(run["results"]) == [0, 0, 0]

    # The expected winner: cold saves on restore round 2 from disk; off re-reads it all.
    for run in doc["runs"]:
        ratio = run["within"]["2/1"]
        assert run["prefill_source"] == "modelled"
        if run["arm"] == "A":
            assert ratio["reprocessed"] < 0.2 and ratio["prefill"] < 0.2
            assert run["restores"] == 3
        else:
            assert 0.9 < ratio["reprocessed"] < 1.1 and 0.9 < ratio["prefill"] < 1.1
            assert run["restores"] == 0
    ab_rows = {(r["scope"], r["metric"]): r for r in doc["ab"]}
    for key in (("round 2/1", "reprocessed"), ("round 2/1", "prefill")):
        assert len(ab_rows[key]["values"]) == 2 and ab_rows[key]["min"] > 5  # B's ratio many times A's
    # The intervals from matched pairs: B re-processes many times more per switch; round 1
    # (cold) is the same build behaviour in both arms, so no difference there.
    stats = {(r["class"], r["metric"]): r for r in doc["stats"]}
    switch = stats[("switch", "re-processed tokens per request")]
    assert switch["difference"] is True and switch["ratio"] > 5 and switch["pairs"] == 6
    assert (switch["low"] or 0) > 5 or switch["interval_note"] == "same in every resample"
    assert stats[("cold", "re-processed tokens per request")]["difference"] is False
    assert stats[("switch", "prefill s per request")]["difference"] is True
    assert doc["verdict"]["text"].startswith("B re-processes ")
    assert "more tokens per switch" in doc["verdict"]["text"]
    assert doc["verdict"]["text"].endswith("outputs identical")
    assert "bootstrap" in doc["method"]
    # The arms differ only in the flag B adds, and the report says so.
    assert [d["field"] for d in doc["differences"]] == ["flag --kv-cache-cold-max-tokens"]
    assert doc["identity"]["A"]["summary"].startswith("sim: ")
    assert doc["arms"]["B"]["classes"]["switch"]["mean_cached"] == 0
    assert doc["arms"]["A"]["classes"]["switch"]["mean_cached"] > 1500

    # B adds a flag and re-reads more: the verdict's action keeps A, or calls it a trade when B's
    # decode (no cold saves to write) is also found faster; either way it names the flag and the cost.
    action = doc["verdict"]["action"]
    assert action.startswith(
        ("keep A (do not take --kv-cache-cold-max-tokens 0)", "--kv-cache-cold-max-tokens 0 is a trade")
    )
    assert "worse in re-processed tokens per request (switches)" in action
    # The console report leads with ratios and says why; by default it stops after the B/A table
    # and ends with the action.
    console = Console(record=True, width=160)
    render(doc, console)
    short = console.export_text()
    assert "Within-run ratios" not in short and "Per run pair" not in short
    assert " ".join(short.rsplit("action: ", 1)[-1].split()) == action  # the last words, wrapped or not
    console = Console(record=True, width=160)
    render(doc, console, verbose=True)
    text = console.export_text()
    assert text.index("verdict:") < text.index("B / A per switch class") < text.index("Within-run ratios")
    assert text.index("Within-run ratios") < text.index("Per run pair") < text.index("Per switch class")
    assert "arms differ in 1 field(s):\n  --kv-cache-cold-max-tokens: (not set) -> 0" in text
    assert "page cache" in text and "order A B B A" in text
    assert "outputs at temperature 0:" in text
    # The simulator's replies depend only on the prompt: both arms must say the same.
    assert all(r.get("output_sha1") for run in doc["runs"] for r in read_results(run["results"]).requests)
    assert doc["outputs"]["status"] == "match"
    # Each seconds figure names its clock: prefill the simulator's modelled, TTFT measured here; the
    # page says B's change as one would type it above the differences.
    page = (out / "report" / "index.html").read_text()
    assert " s (modelled)</td>" in page and " s (wall)</td>" in page and "ran 500x faster" in page
    assert "B changes: --kv-cache-cold-max-tokens 0" in page
    assert " s (modelled)" in text and " s (wall)" in text


def test_arm_order_is_blocks_of_abba_even_for_one() -> None:
    assert arm_order(1) == ["A", "B", "B", "A"]
    assert arm_order(2) == ["A", "B", "B", "A", "A", "B", "B", "A"]
    with pytest.raises(UsageError):
        arm_order(0)


def test_plan_runs_gives_each_run_its_own_workdir_unless_reusing(tmp_path: Path) -> None:
    fresh = plan_runs(tmp_path, 1, reuse_cache=False)
    assert [p.name for p in fresh] == ["ab-01-A", "ab-02-B", "ab-03-B", "ab-04-A"]
    assert len({p.workdir for p in fresh}) == 4 and all(p.fresh for p in fresh)
    reused = plan_runs(tmp_path, 1, reuse_cache=True)
    assert {p.workdir.name for p in reused} == {"arm-A", "arm-B"}
    assert reused[0].workdir == reused[3].workdir and not any(p.fresh for p in reused)


def test_cache_target_moves_explicit_cache_dirs_into_the_run(tmp_path: Path) -> None:
    work = tmp_path / "work"
    auto = target_from_dict({"kind": "sim", "kv_disk_dir": "auto"})
    assert cache_target(auto, work, fresh=True) is auto
    explicit = target_from_dict({"kind": "ds4", "kv_disk_dir": "/data/kv"})
    assert cache_target(explicit, work, fresh=True).kv_disk_dir == str(work / "kv")
    assert cache_target(explicit, work, fresh=False).kv_disk_dir == "/data/kv"
    flag = target_from_dict({"kind": "sim", "flags": ["--kv-disk-dir", "/data/kv", "-c", "100"]})
    assert cache_target(flag, work, fresh=True).flags == ("--kv-disk-dir", str(work / "kv"), "-c", "100")
    eq = target_from_dict({"kind": "sim", "flags": ["--kv-disk-dir=/data/kv"]})
    assert cache_target(eq, work, fresh=True).flags == (f"--kv-disk-dir={work / 'kv'}",)


def test_run_ab_refuses_a_used_out_dir(arms: tuple[Path, Path, Path], tmp_path: Path) -> None:
    trace, a, b = arms
    used = tmp_path / "used"
    used.mkdir()
    (used / "ab-01-A.jsonl").write_text("")
    with pytest.raises(UsageError, match="not empty"):
        run_ab(trace, a, b, out_dir=used)


def _run(index: int, arm: str, outputs: dict[int, str | None], session: str = "s1") -> ArmRun:
    requests = []
    for seq, (rid, sha) in enumerate(sorted(outputs.items()), 1):
        rec: dict[str, Any] = {"kind": "request", "seq": seq, "id": rid, "session": session, "status": "ok"}
        if sha is not None:
            rec["output_sha1"] = sha
        requests.append(rec)
    res = RunResults(path=f"ab-{index:02d}-{arm}.jsonl", run={}, requests=requests)
    return ArmRun(index, arm, res, 0, {"dir": None, "fresh": False})


def test_outputs_match_when_every_run_gave_the_same_reply() -> None:
    same = {1: "aa", 2: "bb"}
    runs = [_run(1, "A", same), _run(2, "B", same), _run(3, "B", same), _run(4, "A", same)]
    out = compare_outputs(runs, temp0_ids={1, 2})
    assert out["status"] == "match" and out["compared"] == 2 and out["matched"] == 2


def test_outputs_differ_between_arms_and_name_the_first_difference() -> None:
    a = {1: "aa", 2: "bb", 3: "cc"}
    b = {1: "aa", 2: "XX", 3: "YY"}  # live history: once 2 differs, 3 follows
    runs = [_run(1, "A", a), _run(2, "B", b), _run(3, "B", b), _run(4, "A", a)]
    out = compare_outputs(runs, temp0_ids=None)
    assert out["status"] == "differ" and out["matched"] == 1
    assert out["differ_between_arms"] == [2, 3]
    assert out["first_difference_per_session"] == {"s1": 2}


def test_outputs_unstable_within_an_arm_and_temperature_filter() -> None:
    runs = [_run(1, "A", {1: "aa", 2: "p"}), _run(2, "B", {1: "aa", 2: "p"}), _run(3, "B", {1: "zz", 2: "q"})]
    out = compare_outputs(runs, temp0_ids={1})  # request 2 was sampled at temperature > 0
    assert out["compared"] == 1 and out["unstable_within_arm"]["B"] == [1]
    assert out["status"] == "differ"


def test_outputs_unknown_without_hashes() -> None:
    runs = [_run(1, "A", {1: None}), _run(2, "B", {1: None})]
    assert compare_outputs(runs, temp0_ids=None)["status"] == "unknown"


def test_pairs_take_adjacent_runs_and_drop_an_unfinished_pair() -> None:
    runs = [{"arm": a, "index": i} for i, a in enumerate(["A", "B", "B", "A", "A"], 1)]
    got = [(a["index"], b["index"]) for a, b in pairs(runs)]
    assert got == [(1, 2), (4, 3)]


def test_within_ratios_use_only_sessions_present_in_both_rounds() -> None:
    per_round = [
        {0: {"reprocessed": 1000, "prefill_s": 2.0}, 1: {"reprocessed": 1000, "prefill_s": 2.0}},
        {0: {"reprocessed": 100, "prefill_s": 0.2}},  # session 1's round 2 failed
    ]
    got = within_ratios(per_round)["2/1"]
    assert got["reprocessed"] == 0.1 and got["prefill"] == 0.1 and got["reprocessed_sessions"] == 1


@pytest.mark.e2e
def test_reuse_cache_keeps_one_cache_per_arm_and_the_daily_service_is_stopped_once(
    arms: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    trace, a, b = arms
    daily = Path(__file__).parent.parent / "drivers" / "fake_daily.py"
    state = tmp_path / "machine"
    state.mkdir()
    port = free_port()
    cmd = [sys.executable, str(daily)]
    service = tmp_path / "daily.toml"
    service.write_text(
        f'state_dir = "{tmp_path / "guard-state"}"\n[service]\nmanager = "command"\nname = "daily"\n'
        f"start = {orjson.dumps([*cmd, 'start', str(state), str(port)]).decode()}\n"
        f"stop = {orjson.dumps([*cmd, 'stop', str(state)]).decode()}\n"
        f"status = {orjson.dumps([*cmd, 'status', str(state)]).decode()}\n"
        f'pid_file = "{state / "daily.pid"}"\nport = {port}\nstop_timeout = 10\nready_timeout = 10\n'
    )
    subprocess.run([*cmd, "start", str(state), str(port)], check=True)
    try:
        outcome = run_ab(
            trace,
            a,
            b,
            repeat=1,
            out_dir=tmp_path / "ab",
            options=THINKING,
            reuse_cache=True,
            service=service,
        )
        # The daily service was stopped before run 1 and given back after run 4, once.
        starts = (state / "starts.log").read_text().split()
        stops = (state / "stops.log").read_text().split()
        assert (len(starts), len(stops)) == (2, 1)
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int((state / "daily.pid").read_text()), signal.SIGKILL)
    assert outcome.exit_code == 0
    runs = outcome.doc["runs"]
    assert [r["arm"] for r in runs] == ["A", "B", "B", "A"]
    first_a, last_a = runs[0], runs[3]
    assert first_a["cache"]["dir"] == last_a["cache"]["dir"]
    assert first_a["cache"]["fresh"] is True and last_a["cache"]["fresh"] is False
    assert not last_a["cache"]["removed"] and Path(last_a["cache"]["dir"]).is_dir()
    assert round1_cached(first_a["results"]) == [0, 0, 0]
    # The second A run's first round restores what the first A run saved.
    assert all(c > 1500 for c in round1_cached(last_a["results"]))


def write_twin(path: Path, name: str) -> Path:
    """A simulator arm slow enough (time scale 5) that TTFT is the modelled time, not start-up jitter."""
    flags = ", ".join(f'"{f}"' for f in ["--batched-session", "2", "--time-scale", "5", "--hidden-reasoning"])
    path.write_text(f'kind = "sim"\nname = "{name}"\nkv_disk_dir = "auto"\nflags = [{flags}]\n')
    return path


def test_identical_arms_are_refused_before_anything_starts(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.jsonl")
    a, b = write_twin(tmp_path / "a.toml", "twin-a"), write_twin(tmp_path / "b.toml", "twin-b")
    with pytest.raises(UsageError, match="identical.*--allow-identical"):
        run_ab(trace, a, b, out_dir=tmp_path / "ab")
    assert not list((tmp_path / "ab").glob("*.jsonl"))
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "replay",
            "ab",
            str(trace),
            "--a",
            str(a),
            "--b",
            str(b),
            "--out-dir",
            str(tmp_path / "c"),
        ],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 2 and "--allow-identical" in cli.stderr


@pytest.mark.timing
@pytest.mark.e2e
def test_an_aa_check_detects_no_difference_in_any_metric_and_reports_it(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.jsonl")
    a, b = write_twin(tmp_path / "a.toml", "twin-a"), write_twin(tmp_path / "b.toml", "twin-b")
    out = tmp_path / "ab"
    outcome = run_ab(trace, a, b, repeat=1, out_dir=out, options=THINKING, allow_identical=True)
    doc = outcome.doc
    assert outcome.exit_code == 0 and doc["order"] == ["A", "B", "B", "A"]
    assert doc["stats"] and all(not r["difference"] for r in doc["stats"]), doc["stats"]
    text = doc["verdict"]["text"]
    assert text.startswith(
        "no difference detected in any metric with an interval; TTFT p99"
    ) and text.endswith("outputs identical")
    assert "no interval (6 pairs; a p99 needs 500 pairs: about --repeat 84)" in text
    assert doc["differences"] == [] and any("A/A check" in w for w in doc["warnings"])
    # Per-arm caches say fresh, agreeing with each run's header.
    for run in doc["runs"]:
        assert (
            run["cache"]["fresh"] is read_results(run["results"]).run["target"]["ab"]["cache_fresh"] is True
        )

    # The report: written beside ab.json, and `replay report` redraws it from ab.json or the folder.
    page = (out / "report" / "index.html").read_text()
    assert "no difference detected in any metric" in page and "<script" not in page
    assert page.count('data-plot="timeline"') == 4 and "Run order" in page
    md = (out / "report" / "summary.md").read_text()
    assert md.startswith("# A/B: twin-a vs twin-b") and "| class | metric |" in md
    for n, arg in enumerate((out / "ab.json", out)):
        again = tmp_path / f"again-{n}"  # a new folder each: an existing one needs --force
        cli = subprocess.run(
            [sys.executable, "-m", "replay", "report", str(arg), "--html", str(again)],
            capture_output=True,
            text=True,
        )
        assert cli.returncode == 0, cli.stderr
        assert "verdict: no difference detected in any metric" in cli.stdout
        assert (again / "index.html").is_file()
    as_json = subprocess.run(
        [sys.executable, "-m", "replay", "report", str(out / "ab.json"), "--json"],
        capture_output=True,
        text=True,
    )
    assert orjson.loads(as_json.stdout)["verdict"] == doc["verdict"]


def test_live_history_divergence_names_each_sessions_first_request_and_suggests_recorded() -> None:
    from replay.report.ab import analyze

    a = {1: "aa", 2: "bb", 3: "cc"}
    b = {1: "aa", 2: "XX", 3: "YY"}
    runs = [_run(1, "A", a), _run(2, "B", b), _run(3, "B", b), _run(4, "A", a)]
    doc = analyze(runs, None, {"history": "live"})
    assert doc["outputs"]["first_difference_per_session"] == {"s1": 2}
    assert "--history recorded" in doc["outputs"]["note"]
    assert "outputs differ (1/3 identical)" in doc["verdict"]["text"]
    console = Console(record=True, width=300)
    render(doc, console)
    text = console.export_text()
    assert "first diverging request per session: s1 at request 2" in text and "--history recorded" in text
    assert "note" not in analyze(runs, None, {"history": "recorded"})["outputs"]


def _timed_run(index: int, arm: str, outputs: dict[int, str], tokens: dict[int, int]) -> ArmRun:
    run = _run(index, arm, outputs)
    for rec in run.results.requests:
        t = tokens[rec["id"]]
        rec |= {"switch": ["switch"], "reprocessed_tokens": t, "ttft_s": t / 1000, "latency_s": t / 500}
    return run


def test_in_live_history_the_verdict_rests_on_the_requests_before_a_reply_differed() -> None:
    """Issue #40: the builds' replies first differed at request 3, later prompts differed with them,
    and the headline credited the build with '1.09x fewer tokens per switch'. Requests after a
    session's first differing reply are drift: left out of the verdict, shown apart."""
    from replay.report.ab import analyze
    from replay.report.ab_html import ab_markdown

    ids = range(1, 9)
    a = {i: f"a{i}" for i in ids}
    b = {i: (f"a{i}" if i < 3 else f"b{i}") for i in ids}  # replies differ from request 3 on
    same = {i: 1000 + 100 * i for i in ids}
    drifted = {i: (same[i] if i <= 3 else same[i] // 2) for i in ids}  # B's later prompts re-read less
    runs = [
        _timed_run(1, "A", a, same),
        _timed_run(2, "B", b, drifted),
        _timed_run(3, "B", b, drifted),
        _timed_run(4, "A", a, same),
    ]
    live = analyze(runs, None, {"history": "live"})
    rows = {(r["class"], r["metric"]): r for r in live["stats"]}
    tokens = rows[("switch", "re-processed tokens per request")]
    assert tokens["pairs"] == 6 and tokens["ratio"] == 1.0 and not tokens["difference"]  # requests 1-3
    assert live["drift"] == {"clean": 6, "pairs": 16}
    assert not live["verdict"]["difference"] or "fewer tokens" not in live["verdict"]["text"]
    assert (
        "figures from the 6 of 16 request pairs whose prompts were the same in both arms"
        in live["verdict"]["text"]
    )
    mixed = {(r["class"], r["metric"]): r for r in live["stats_with_drift"]}
    assert mixed[("switch", "re-processed tokens per request")]["difference"]  # what drift alone makes
    console = Console(record=True, width=300)
    render(live, console, verbose=True)
    assert "For reference, every request pair" in console.export_text()
    md = ab_markdown(live)
    assert "these mix the build with the drift" in md
    # Recorded history sends the same prompts whatever the replies: no drift to set apart.
    recorded = analyze(runs, None, {"history": "recorded"})
    assert recorded["drift"] is None and recorded["stats_with_drift"] == []


def test_replay_report_reads_a_version_1_ab_json_without_a_verdict(tmp_path: Path) -> None:
    from replay.report.ab import analyze
    from replay.report.ab_html import is_ab, show_ab

    same = {1: "aa", 2: "bb"}
    doc = analyze([_run(1, "A", same), _run(2, "B", same)], None, {"targets": {}})
    assert doc["format"] == "agent-replay-ab/3"
    old = {k: v for k, v in doc.items() if k not in ("verdict", "method", "stats", "warnings", "confidence")}
    old["format"] = "agent-replay-ab/1"
    (tmp_path / "ab.json").write_bytes(orjson.dumps(old))
    assert is_ab(tmp_path) and is_ab(tmp_path / "ab.json")
    console = Console(record=True, width=200)
    show_ab(tmp_path, as_json=False, console=console)
    assert "no verdict" in (tmp_path / "report" / "index.html").read_text()
    (tmp_path / "other.json").write_bytes(orjson.dumps({"format": "something-else"}))
    assert not is_ab(tmp_path / "other.json")


def test_flags_are_compared_by_name_whatever_their_order() -> None:
    from replay.runs.ab_arms import arm_view, differences, flag_values

    assert flag_values(
        ["-c", "4096", "--swa-full", "--temp", "-1", "--x=y", "--lora", "a", "--lora", "b"]
    ) == {
        "-c": ["4096"],
        "--swa-full": [None],
        "--temp": ["-1"],
        "--x": ["y"],
        "--lora": ["a", "b"],
    }
    a = target_from_dict(
        {"kind": "sim", "flags": ["-c", "16384", "-np", "1", "--cache-ram", "0", "--swa-full"]}
    )
    b = target_from_dict({"kind": "sim", "flags": ["-np", "1", "--cache-ram", "8192", "-c", "16384"]})
    diffs = differences({"A": arm_view(a, {}), "B": arm_view(b, {})})
    assert [d["detail"] for d in diffs] == ["--cache-ram: 0 -> 8192", "--swa-full: (set) -> (not set)"]


def test_a_run_whose_log_has_unknown_cache_lines_says_so() -> None:
    """Issue #40: 17 lines of a newer build were dropped silently; now each run's log_parse record
    counts them, `replay run`/`replay ab` print it, and ab.json carries it as a warning."""
    from replay.report.ab import analyze
    from replay.serverside.logs import log_warnings

    parse = {"kind": "server", "event": "log_parse", "lines": 500, "recognised": 200, "unrecognised": 17}
    runs = [_run(1, "A", {1: "a"}), _run(2, "B", {1: "a"})]
    runs[0].results.server.append({**parse, "unrecognised_cache": 0})
    runs[1].results.server.append({**parse, "unrecognised_cache": 17})
    doc = analyze(runs, None, {})
    assert doc["runs"][1]["log"]["unrecognised_cache"] == 17
    said = [w for w in doc["warnings"] if "line(s) about its caches" in w]
    assert said == [
        "run 02 (B): the server log has 17 line(s) about its caches that this tool does not recognise; "
        "its stores, restores and evictions may be undercounted"
    ]
    assert log_warnings(runs[0].results.server) == [] and len(log_warnings(runs[1].results.server)) == 1
