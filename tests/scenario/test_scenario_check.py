"""`replay scenario check`: expectations are data in the specs, evaluated on the arms' results."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from rich.console import Console

from replay.commands.scenario import CheckArgs, check
from replay.errors import TraceError
from replay.metrics.results import RunResults
from replay.scenario import find_scenario, list_scenarios, load_spec
from replay.scenario.check import ArmView, evaluate
from replay.scenario.expect import Expect, clock_window

# The built-in scenarios that reproduce numeric rows of seed figures sections 1-3.
FIELD_SCENARIOS = (
    "slow-morning",
    "three-overnight",
    "switching",
    "batched-routing",
    "batched-starvation",
    "cold-ab",
    "prewarm",
    "cold-cut-reuse",
    "daily-use",
)

SPEC = """
[scenario]
name = "tiny"
title = "a tiny spec"
clock = "2026-09-01T06:40:00+00:00"

[[arms]]
name = "a"

[prompt]
system_tokens = 100

[sessions.s]

[[steps]]
sessions = "s"

[[expect]]
arm = "a"
metric = "call_s"
value = [1, 2]
source = "seed-figures 1"
"""


def _spec(tmp_path: Path, extra: str = "", replace: tuple[str, str] = ("", "")) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text((SPEC + extra).replace(*replace) if replace[0] else SPEC + extra)
    return path


def test_every_field_scenario_has_expectations_with_a_source() -> None:
    specs = {s.name: s for s in list_scenarios()}
    for name in FIELD_SCENARIOS:
        assert specs[name].expects, name
        for e in specs[name].expects:
            assert re.match(r"00[023], ", e.source), (name, e.source)  # the report it comes from
            if e.gap is not None:  # a known gap is explained, and the spec's notes point at it
                assert len(e.gap) > 20 and "gap" in specs[name].notes, name


def test_a_spec_loads_its_expectations_and_clock(tmp_path: Path) -> None:
    spec = load_spec(_spec(tmp_path))
    assert spec.clock_s == 6 * 3600 + 40 * 60
    (e,) = spec.expects
    assert (e.arm, e.metric, e.lo, e.hi, e.stat, e.tolerance) == ("a", "call_s", 1.0, 2.0, "all", 0.1)
    assert clock_window("06:45-07:41", spec.clock_s) == (300.0, 3720.0)


@pytest.mark.parametrize(
    ("replace", "problem"),
    [
        (('arm = "a"\nmetric', 'arm = "b"\nmetric'), "unknown arm 'b'"),
        (('source = "seed-figures 1"', 'source = ""'), "names its source"),
        (('metric = "call_s"', 'metric = "speed"'), "metric must be one of"),
        (("value = [1, 2]", "value = [2, 1]"), "[low, high]"),
        (("value = [1, 2]", 'value = "fast"'), "a number or a range"),
    ],
)
def test_bad_expectations_name_file_and_line(tmp_path: Path, replace: tuple[str, str], problem: str) -> None:
    path = _spec(tmp_path, replace=replace)
    with pytest.raises(TraceError) as info:
        load_spec(path)
    assert problem in str(info.value) and str(path) in str(info.value)
    assert info.value.line >= 18  # the [[expect]] table (line 18), not the top of the file


def _request(seq: int, session: str, prompt: int, cached: int, total_s: float, **more: Any) -> dict[str, Any]:
    return {
        "kind": "request",
        "seq": seq,
        "id": seq,
        "session": session,
        "status": "ok",
        "sent_s": seq * 0.1,
        "switch": more.pop("switch", ["switch"]),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "reprocessed_tokens": prompt - cached,
        "modelled": {"total_s": total_s, "restore_s": 0.5, "slot": 0},
        **more,
    }


def _view() -> ArmView:
    requests = [
        _request(1, "a", 20_000, 0, 40.0, switch=["cold"]),
        _request(2, "b", 30_000, 0, 60.0, switch=["cold"]),
        _request(3, "a", 21_000, 20_000, 2.0),
        _request(4, "b", 31_000, 14_000, 35.0),
    ]
    server = [
        {"kind": "server", "event": "evict", "request_seq": 4, "line": 10, "hits": 0},
        {"kind": "server", "event": "evict", "request_seq": 4, "line": 11, "hits": 2},
        {"kind": "server", "event": "store", "request_seq": 4, "line": 12},
        {"kind": "server", "event": "store", "request_seq": None, "line": 20, "reason": "shutdown"},
    ]
    res = RunResults(path="x", run={"target": {"time_scale": 1000.0}}, requests=requests, server=server)
    return ArmView(res, initial_files=3)


def test_request_metrics_are_summed_up_as_the_row_says() -> None:
    view = _view()
    ok = evaluate("t", Expect(arm="x", metric="call_s", lo=1, hi=60, switch="switch"), view)
    assert ok.holds and ok.modelled == "2-35"
    bad = evaluate("t", Expect(arm="x", metric="call_s", lo=30, hi=60, switch="switch"), view)
    assert not bad.holds and bad.failed and "1 of 2 outside" in bad.modelled
    median = evaluate("t", Expect(arm="x", metric="call_s", lo=37, hi=38, stat="median"), view)
    assert median.holds and median.value == 37.5
    beyond = evaluate(
        "t", Expect(arm="x", metric="reread_beyond_growth", lo=0, hi=0, session="b", slack=300), view
    )
    assert not beyond.holds and beyond.value == 16_000  # B lost its 30K state: re-read 17K for 1K of growth
    a = evaluate(
        "t", Expect(arm="x", metric="reread_beyond_growth", lo=0, hi=0, session="a", slack=300), view
    )
    assert a.holds


def test_second_half_ratios_of_tokens_and_of_prompt_times() -> None:
    view = _view()
    for rec, prefill_s in zip(view.requests, (40.0, 60.0, 2.5, 37.5), strict=True):
        rec["modelled"]["prefill_s"] = prefill_s
    assert view.run_value("second_half_ratio", view.requests) == (1_000 + 17_000) / (20_000 + 30_000)
    assert view.run_value("second_half_prefill_ratio", view.requests) == (2.5 + 37.5) / (40.0 + 60.0)


def test_run_counts_leave_out_the_shutdown_and_can_be_scoped() -> None:
    view = _view()
    assert view.run_value("files_at_end", []) == 3 + 1 - 2  # the shutdown store is not the workload's
    assert view.run_value("evicted_with_hits", []) == 1
    scoped = evaluate("t", Expect(arm="x", metric="evictions", lo=0, hi=0, session="a"), view)
    assert scoped.holds  # A's requests evicted nothing
    assert not evaluate("t", Expect(arm="x", metric="evictions", lo=0, hi=0), view).holds


def test_saves_their_sizes_and_the_most_restored_cut() -> None:
    requests = [
        _request(1, "a", 52_700, 0, 90.0),
        _request(2, "a", 141_446, 51_200, 170.0),
        _request(3, "b", 60_000, 0, 100.0),
        _request(4, "a", 152_487, 51_200, 190.0),
        _request(5, "b", 61_000, 6_144, 100.0),
        _request(6, "a", 201_544, 51_200, 290.0),
    ]

    def ev(line: int, seq: int | None, event: str, **more: Any) -> dict[str, Any]:
        return {"kind": "server", "event": event, "request_seq": seq, "line": line, **more}

    server = [
        ev(1, 1, "store", reason="cold", tokens=51_200, mib=1725.0),
        ev(2, 2, "restore", tokens=51_200),
        ev(3, 3, "store", reason="evict", tokens=53_000, mib=1785.0),
        ev(4, 4, "restore", tokens=51_200),
        ev(5, 4, "store", reason="evict", tokens=60_500, mib=2038.0),
        ev(6, 5, "restore", tokens=6_144),
        ev(7, 6, "restore", tokens=51_200),
        ev(8, 6, "store", reason="checkpoint", tokens=100, mib=1.0),  # llama-server's: not a disk save
        ev(9, None, "store", reason="shutdown", tokens=202_000, mib=6800.0),  # not the workload's
    ]
    view = ArmView(RunResults(path="x", run={"target": {}}, requests=requests, server=server))
    assert view.run_value("saves", []) == 3
    assert view.run_value("saves_over_evict_saves", []) == 1.5  # one cold save beside two evict saves
    assert view.run_value("top_cut_restores", []) == 3  # 51,200 three times, 6,144 once
    coverage = view.event_values("top_cut_coverage", [])
    assert [round(c, 1) for c in coverage] == [36.2, 33.6, 25.4]  # report 000's file, falling
    fell = evaluate("t", Expect(arm="x", metric="top_cut_coverage", lo=25.4, hi=36.2, tolerance=0.01), view)
    assert fell.holds and fell.modelled == "25.4-36.2"
    median = evaluate(
        "t", Expect(arm="x", metric="save_gib", lo=1.74, hi=1.74, stat="median", slack=0.01), view
    )
    assert median.holds and median.value == 1785.0 / 1024
    big = evaluate("t", Expect(arm="x", metric="save_gib", lo=5.7, hi=5.7, stat="max"), view)
    assert not big.holds and big.value == 2038.0 / 1024  # the shutdown save is not counted
    scoped = evaluate("t", Expect(arm="x", metric="saves", lo=1, hi=1, session="b"), view)
    assert scoped.holds


def test_a_known_gap_is_shown_and_never_fails() -> None:
    view = _view()
    gap = evaluate("t", Expect(arm="x", metric="call_s", lo=300, hi=400, gap="the model is faster"), view)
    assert not gap.holds and not gap.failed and gap.status == "known gap"


@pytest.mark.e2e
def test_check_runs_the_arms_and_states_each_figure(tmp_path: Path) -> None:
    out = io.StringIO()
    console = Console(file=out, width=250)
    code = check(CheckArgs(names=["cold-ab"], out=tmp_path), console)
    text = out.getvalue()
    assert code == 0, text
    assert "000, A/B" in text and "0.187" in text and "known gap" in text
    assert "spread cold-ab/on-2nd: 0.0%" in text  # alternate-plan arms: the run is the walk
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert check(CheckArgs(names=["batched-routing"], json=True, out=tmp_path / "j"), console) == 0
    rows = orjson.loads(buf.getvalue())
    assert {r["status"] for r in rows} == {"ok"} and {r["arm"] for r in rows} == {"upstream", "reuse-aware"}


@pytest.mark.e2e
def test_check_fails_when_a_figure_does_not_hold(tmp_path: Path) -> None:
    spec = find_scenario("batched-routing")
    text = Path(spec.path).read_text().replace("value = 11154", "value = 20000")
    path = tmp_path / "batched-routing.toml"
    path.write_text(text)
    out = io.StringIO()
    assert check(CheckArgs(names=[str(path)], out=tmp_path / "r"), Console(file=out, width=250)) == 1
    assert "FAIL" in out.getvalue()


def test_a_scenario_without_a_wall_clock_run_is_judged_on_the_walk_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`[run] wall_clock = false` (daily-use: 43 hours of deep requests): the check starts no
    simulator and every row has the walk's figure and no spread."""
    import replay.commands.scenario as commands

    def no_run(*_: Any, **__: Any) -> None:
        raise AssertionError("a wall_clock = false scenario must not run over HTTP")

    monkeypatch.setattr(commands, "run_arms", no_run)
    spec = find_scenario("cold-cut-reuse")
    text = Path(spec.path).read_text().replace("time_scale = 20\n", "time_scale = 20\nwall_clock = false\n")
    path = tmp_path / "cold-cut-reuse.toml"
    path.write_text(text)
    verdicts = commands.check_scenario(load_spec(path), tmp_path / "out")
    assert {v.expect.arm for v in verdicts} == {"cold-on", "cold-off"}
    assert all(v.run is None and v.spread is None and v.value is not None for v in verdicts)
    assert [v.status for v in verdicts].count("ok") == 1  # the cold-off saves all hold the reply


def test_rows_are_judged_on_the_modelled_walk_the_same_every_run(tmp_path: Path) -> None:
    """The slow morning's rows (closed-loop, two in flight) come out the same walk after walk:
    a per-window row no longer depends on how busy the machine is (it passed 2 of 4 wall-clock
    runs before)."""
    from replay.runs.sensitivity import walk_rows

    spec = find_scenario("slow-morning")
    first = walk_rows(spec, tmp_path)
    again = walk_rows(spec, tmp_path)
    assert [(v.modelled, v.status) for v in first] == [(v.modelled, v.status) for v in again]
    windows = [v for v in first if v.expect.step in ("06:45", "07:55")]
    assert len(windows) >= 8


def test_a_rows_spread_is_how_far_the_run_strays_from_the_walk() -> None:
    from replay.commands.scenario import spread_lines
    from replay.scenario.check import Verdict

    e = Expect(arm="24G", metric="call_s", lo=68, hi=363)
    walked = Verdict("s", e, "40-250", 40.0, False, (40.0, 250.0))
    ran = Verdict("s", e, "20-250", 20.0, False, (20.0, 250.0))
    row = walked.with_run(ran)
    assert row.spread == pytest.approx(0.5)  # the low end, 20 against 40
    assert walked.with_run(walked).spread == 0.0
    assert spread_lines([row]) == ["spread s/24G: 50.0% at most, 1 of 1 row(s) differ on the wall-clock run"]
    assert row.to_json()["run"] == {"modelled": "20-250", "value": 20.0}


def test_a_row_strays_when_its_run_is_more_than_half_its_tolerance_from_the_walk() -> None:
    """The rule `scenario check` holds every wall-clock run to (CI runs it on every scenario: the
    slow morning at its 20x time scale measured 0.1% at most; at 200x, with replies counted done
    when this host read them, a queued 06:45 call came out 27-29 s against the walk's 44.9 s)."""
    from replay.scenario.check import Verdict

    e = Expect(arm="24G", metric="call_s", lo=68, hi=363)  # tolerance 10%: half of it is 5%
    walked = Verdict("s", e, "40-250", 40.0, False, (40.0, 250.0))
    assert not walked.strays  # no wall-clock run
    assert not walked.with_run(Verdict("s", e, "41-255", 41.0, False, (41.0, 255.0))).strays  # 2.4%, 2%
    assert walked.with_run(Verdict("s", e, "40-265", 40.0, False, (40.0, 265.0))).strays  # 5.7% at the top
    assert walked.with_run(Verdict("s", e, "-", None, False, None)).strays  # the run selected nothing
    none = Verdict("s", e, "-", None, False, None)
    assert not none.with_run(none).strays
    near_zero = Expect(arm="24G", metric="restores", lo=0, hi=0, slack=2)  # slack 2: 1 apart is within
    assert (
        not Verdict("s", near_zero, "0", 0.0, True, (0.0, 0.0))
        .with_run(Verdict("s", near_zero, "1", 1.0, True, (1.0, 1.0)))
        .strays
    )


def test_check_fails_when_a_wall_clock_run_strays_from_its_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    import replay.commands.scenario as commands
    from replay.scenario.check import Verdict

    e = Expect(arm="24G", metric="call_s", lo=40, hi=50, about="a queued call")
    walked = Verdict("slow-morning", e, "44.9", 44.9, True, (44.9, 44.9))  # the row holds on the walk
    run = Verdict("slow-morning", e, "28.0", 28.0, False, (28.0, 28.0))
    monkeypatch.setattr(commands, "check_scenario", lambda spec, out: [walked.with_run(run)])
    out = io.StringIO()
    assert check(CheckArgs(names=["slow-morning"]), Console(file=out, width=250)) == 1
    text = out.getvalue()
    assert "strays slow-morning/24G, a queued call: walk 44.9, wall-clock run 28.0" in text
    assert "1 stray on the wall-clock run" in text
    monkeypatch.setattr(commands, "check_scenario", lambda spec, out: [walked.with_run(walked)])
    assert check(CheckArgs(names=["slow-morning"]), Console(file=io.StringIO(), width=250)) == 0


def test_show_inputs_lists_every_input_with_its_source_and_how_far_rows_move() -> None:
    from replay.commands.scenario import inputs_table

    out = io.StringIO()
    console = Console(file=out, width=300)
    console.print(inputs_table(find_scenario("cold-ab"), console))
    text = out.getvalue()
    for name in ("defaults.system_tokens", "sim.resume_prefill_s", "sim.prefill_tps", "arm on-2nd"):
        assert name in text
    assert 'assumed: "それぞれ約 12,000 文字の system' in text and '000: "chat ctx=6144..6657:513' in text
    # the logged request's run decides the resumed prefill's cost: the cold-on ratios move with it
    assert "on-2nd: cold saves on, second run" in text and "0.191" in text


def test_llama_server_figures_come_from_its_log_records_and_slot_files() -> None:
    """Checkpoints (`store`, reason checkpoint: how far before the prompt's end), the host cache's
    largest state, the slot file of a restart, and `--cache-reuse` as the startup log shows it."""
    requests = [_request(1, "doc", 32_155, 0, 160.0), _request(2, "doc", 32_155, 32_151, 0.7)]
    server = [
        {
            "kind": "server",
            "event": "store",
            "request_seq": 1,
            "line": 5,
            "reason": "checkpoint",
            "tokens": 31_639,
        },
        {
            "kind": "server",
            "event": "store",
            "request_seq": 1,
            "line": 6,
            "reason": "checkpoint",
            "tokens": 32_151,
        },
        {
            "kind": "server",
            "event": "store",
            "request_seq": 2,
            "line": 9,
            "reason": "checkpoint",
            "tokens": 32_151,
        },
        {
            "kind": "server",
            "event": "store",
            "request_seq": 2,
            "line": 8,
            "reason": "host_cache",
            "mib": 2867.2,
        },
    ]
    restart = {
        "kind": "probe_restart",
        "save": {"n_written": 730_144_440, "save_ms": 3600.0},
        "restore": {"restore_ms": 300.0},
    }
    run = {"target": {"time_scale": 1.0, "effective": {"cache_reuse": 0}}}
    view = ArmView(RunResults(path="x", run=run, requests=requests, server=server, restarts=[restart]))
    first = [view.requests[0]]
    assert view.run_value("checkpoints_made", first, scoped=True) == 2
    assert view.run_value("checkpoint_depth_min", first, scoped=True) == 4
    assert view.run_value("checkpoint_depth_max", first, scoped=True) == 516
    assert view.run_value("checkpoints_made", view.requests) == 3
    assert view.run_value("host_cache_gib", view.requests) == 2.8
    assert view.run_value("slot_file_gib", []) == 730_144_440 / 2**30
    assert (view.run_value("slot_save_s", []), view.run_value("slot_restore_s", [])) == (3.6, 0.3)
    assert view.run_value("cache_reuse_in_effect", []) == 0
    bare = ArmView(RunResults(path="x", run={"target": {}}, requests=requests))
    assert bare.run_value("slot_save_s", []) is None and bare.run_value("cache_reuse_in_effect", []) is None
