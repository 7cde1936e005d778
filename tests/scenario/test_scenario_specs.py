"""Scenario specs load, generate deterministic valid traces, and carry the seed figures."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from replay.commands import scenario as commands
from replay.errors import TraceError, UsageError
from replay.scenario import find_scenario, generate, list_scenarios, load_spec, parse_params, plan_requests
from replay.scenario.build import PROBE_TAG, system_overhead
from replay.sim.model.config import config_for
from replay.sizing import jobs_from_trace
from replay.trace import read_trace, validate

NAMES = (
    "switching",
    "slow-morning",
    "three-overnight",
    "batched-routing",
    "batched-starvation",
    "cold-ab",
    "cache-probe",
    "prewarm",
    "depth-sweep",
    "cold-cut-reuse",
    "daily-use",
    "fleet-affinity",
)


def content_tokens(messages: list[dict]) -> int:
    """Content tokens of a planned message list (synthetic words; tool-call arguments not counted)."""
    total = 0
    for m in messages:
        c = m.get("content")
        if isinstance(c, dict):
            total += c["synth"]["tokens"]
        elif isinstance(c, list):
            total += sum(p["synth"]["tokens"] if isinstance(p, dict) else len(p.split()) for p in c)
    return total


def test_every_issue_scenario_is_built_in() -> None:
    assert sorted(s.name for s in list_scenarios()) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_generates_deterministically_and_validates(name: str, tmp_path: Path) -> None:
    spec = find_scenario(name)
    first = generate(spec, tmp_path / "a.jsonl")
    generate(find_scenario(name), tmp_path / "b.jsonl")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    counts = validate(tmp_path / "a.jsonl")
    assert counts["requests"] == first.requests > 0
    trace = read_trace(tmp_path / "a.jsonl")
    assert trace.header.source == f"scenario:{name}"
    assert [r.id for r in trace.requests] == list(range(1, first.requests + 1))
    assert all(r.t >= 0 for r in trace.requests)
    # Every arm's parameters give a valid trace too (prewarm switches a step off).
    for arm in spec.arms:
        generate(spec.with_params(arm.params), tmp_path / f"{arm.name}.jsonl")
        validate(tmp_path / f"{arm.name}.jsonl")


def test_switching_sizes_and_shared_system_prompt(tmp_path: Path) -> None:
    planned = plan_requests(find_scenario("switching"))
    assert [p.session for p in planned] == ["a", "b"] * 5
    a, b = planned[0], planned[1]
    assert a.messages[0] == b.messages[0]  # one shared system prompt, byte for byte
    assert a.messages[0]["content"]["synth"]["tokens"] == 11000  # the test harness's 11K prompt
    assert content_tokens(a.messages) == pytest.approx(70_000, abs=1_500)
    assert content_tokens(b.messages) == pytest.approx(80_000, abs=1_500)
    last_a, last_b = planned[-2], planned[-1]
    assert content_tokens(last_a.messages) == pytest.approx(110_000, abs=1_500)
    assert content_tokens(last_b.messages) == pytest.approx(120_000, abs=1_500)
    assert (
        last_a.messages[-1]["role"] == "tool" and last_a.messages[-1]["content"]["synth"]["tokens"] == 10_000
    )
    # On disk each turn is a delta: the previous reply spliced in as $reply plus one tool result.
    path = tmp_path / "s.jsonl"
    generate(find_scenario("switching"), path)
    trace = read_trace(path)
    turn = trace.requests[2]
    assert turn.parent is trace.requests[0] and turn.keep == trace.requests[0].n_messages
    assert turn.append[0] == {"$reply": 1}


def test_slow_morning_figures(tmp_path: Path) -> None:
    planned = plan_requests(find_scenario("slow-morning"))
    by = {}
    for p in planned:
        by.setdefault(p.session, []).append(p)
    main = by["main"]
    compaction = next(p for p in main if p.tag == "compaction")
    before = main[main.index(compaction) - 1]
    assert len(before.messages) + 2 == 208  # the last turn's reply and tool result are still to come
    # The report's sizes are the server's prompt counts (template, tool-call markup and replies
    # included): main 87K-103K over its thirteen calls to 07:30 and 126K before the compaction,
    # the finance jobs' first and last calls at 9K/60K and 10K/58K, the review at 62K.
    path = tmp_path / "morning.jsonl"
    generate(find_scenario("slow-morning"), path)
    requests = read_trace(path).requests
    prompts: dict[str, list[int]] = {}
    for request, (_, job) in zip(requests, jobs_from_trace(requests, config_for()), strict=True):
        if request.tag != "compaction":
            prompts.setdefault(request.session, []).append(job.prompt_tokens)
    assert prompts["main"][0] == pytest.approx(87_000, abs=300)
    assert prompts["main"][12] == pytest.approx(103_000, abs=300)  # "a reply that had made thirteen calls"
    assert prompts["main"][14] == pytest.approx(126_000, abs=300)  # the last before the compaction
    assert prompts["fin1"][0] == pytest.approx(9_000, abs=300) and prompts["fin1"][-1] == pytest.approx(
        60_000, abs=300
    )
    assert prompts["fin2"][0] == pytest.approx(10_000, abs=300) and prompts["fin2"][-1] == pytest.approx(
        58_000, abs=300
    )
    assert prompts["review"][0] == pytest.approx(62_000, abs=300)
    assert all(70_000 <= n <= 77_000 for n in prompts["main"][15:])  # "my turns at 70K to 77K"
    assert len(compaction.messages) == 146
    assert content_tokens(compaction.messages) == pytest.approx(70_000, abs=1_500)
    assert compaction.messages[0] == main[0].messages[0]  # the system prompt survives compaction
    fin1, fin2 = by["fin1"], by["fin2"]
    system = content_tokens(main[0].messages[:1])
    assert system + system_overhead(("read_file", "run_command", "search", "write_file")) == 14_336
    # The scheduled jobs do not carry the agent's system prompt (a 9K prompt cannot hold it).
    assert main[0].messages[0]["role"] == "system"
    assert fin1[0].messages[0]["role"] == fin2[0].messages[0]["role"] == "user"
    assert {p.tag for p in fin1 + fin2} == {"cron"}
    review = by["review"]
    assert review[0].messages[0] == main[0].messages[0]  # the shared 14,336-token system prompt
    # 07:55: two in flight from the start: the review's first call and main's wait for the same
    # reply (the compaction's); the review's is sent first, so no call continues main's live state.
    first_main = main[main.index(compaction) + 1]
    assert review[0].after is first_main.after is compaction
    assert review[0].delay_s < first_main.delay_s
    assert len(main[main.index(compaction) + 1 :]) + len(review) == 13
    assert len(review) == len(main[main.index(compaction) + 1 :]) + 1  # alternating, review first and last


def test_three_overnight_c_answers_in_text() -> None:
    planned = plan_requests(find_scenario("three-overnight"))
    c = [p for p in planned if p.session == "c"]
    assert {p.reply["finish"] for p in c} == {"stop"}
    assert {p.reply["finish"] for p in planned if p.session in "ab"} == {"tool_calls"}
    rounds = [p.session for p in planned][-9:]
    assert rounds == ["a", "b", "c"] * 3


def test_three_overnight_is_the_switching_tests_sessions_continued(tmp_path: Path) -> None:
    """Report 003: A and B were the switching test's sessions continued on the daily server, one
    turn on at 120K and 130K; the harness's 11K system prompt; C differs only in having no tool
    calls (same prompt, same tools), built the harness's way, 10K a turn, to ~100K."""
    spec = find_scenario("three-overnight")
    planned = plan_requests(spec)
    a = [p for p in planned if p.session == "a"]
    b = [p for p in planned if p.session == "b"]
    c = [p for p in planned if p.session == "c"]
    assert (
        len(a) == len(b) == 1 + 4 + 1 + 3
    )  # the test's cold read and four rounds, one turn on, three rounds
    assert c[0].messages[0] == a[0].messages[0]  # one shared system prompt
    assert c[0].params["tools"] == a[0].params["tools"]
    path = tmp_path / "o.jsonl"
    generate(spec, path)
    requests = read_trace(path).requests
    prompts: dict[str, list[int]] = {}
    for request, (_, job) in zip(requests, jobs_from_trace(requests, config_for()), strict=True):
        prompts.setdefault(request.session, []).append(job.prompt_tokens)
    assert prompts["a"][0] == pytest.approx(70_700, abs=500) and prompts["b"][0] == pytest.approx(
        80_800, abs=500
    )
    assert prompts["a"][4] == pytest.approx(111_000, abs=1_000) and prompts["b"][4] == pytest.approx(
        121_000, abs=1_000
    )
    assert prompts["a"][5] == pytest.approx(121_000, abs=1_000) and prompts["b"][5] == pytest.approx(
        131_000, abs=1_000
    )
    assert prompts["c"][-4] == pytest.approx(100_000, abs=5_000)  # "built fresh to 100K"


def test_cache_probe_steps_and_probe_marker(tmp_path: Path) -> None:
    spec = find_scenario("cache-probe")
    planned = plan_requests(spec)
    first, e1, e2, e3, e4, back, e5 = planned
    assert e1.messages == first.messages and back.messages == first.messages and e5.messages == first.messages
    doc, q2 = e2.messages[0]["content"], first.messages[0]["content"]
    assert doc[:-1] == q2[:-1] and doc[-1] != q2[-1]  # same document, other question
    edited = e3.messages[0]["content"]
    assert len(edited) == len(q2) + 1 and isinstance(edited[8], str)  # a line inserted at 50%
    assert e4.session == "other"
    assert [p.tag for p in planned].count(PROBE_TAG) == 1 and e5.tag == PROBE_TAG
    result = generate(spec, tmp_path / "p.jsonl")
    assert result.notice is not None and "#7" in result.notice and "driver" in result.notice
    assert "E5" in read_trace(tmp_path / "p.jsonl").header.notes


def test_prewarm_requests_are_prefill_only_and_the_arms_rewrite_or_resend() -> None:
    spec = find_scenario("prewarm")
    planned = plan_requests(spec)
    warm = [p for p in planned if p.tag == "prewarm"]
    assert len(warm) == 3 and all(p.params["max_tokens"] == 0 for p in warm)
    firsts = {p.session: p for p in planned if p.tag != "prewarm"}
    assert all(firsts[w.session].messages == w.messages for w in warm)  # the real turn sends what was warmed
    rewritten = plan_requests(spec.with_params(spec.arm("rewrite").params))
    asks = {p.session: p for p in rewritten if p.tag != "prewarm"}
    for w in warm:
        question = asks[w.session].messages[-1]["content"]
        assert (
            question[:-1] == w.messages[-1]["content"][:-1] and question[-1] != w.messages[-1]["content"][-1]
        )


def test_cold_ab_and_depth_sweep_shapes() -> None:
    cold = plan_requests(find_scenario("cold-ab"))
    assert [p.session for p in cold] == ["agent1", "agent2", "agent3"] * 2
    # each agent its own ~12,000-character system prompt (report 000)
    assert all(p.messages[0]["role"] == "system" for p in cold)
    assert len({str(p.messages[0]) for p in cold}) == 3
    sweep = plan_requests(find_scenario("depth-sweep"))
    depths = [content_tokens(p.messages) for p in sweep]
    assert depths[0] == 2048 and depths[-1] >= 131_072 - 300
    assert all(b > a for a, b in zip(depths, depths[1:], strict=False))


def test_params_and_dotted_overrides(tmp_path: Path) -> None:
    spec = find_scenario("switching", parse_params(["turns=2", "sessions.a.start_tokens=30000", "scale=0.5"]))
    planned = plan_requests(spec)
    assert len(planned) == 2 + 2 * 2
    assert content_tokens(planned[0].messages) == pytest.approx(15_000, abs=500)
    assert planned[0].messages[0]["content"]["synth"]["tokens"] == 5500
    with pytest.raises(UsageError, match="no such parameter"):
        find_scenario("switching", {"nope": 1})
    with pytest.raises(UsageError, match="no table 'sessions.zz'"):
        find_scenario("switching", {"sessions.zz.start_tokens": 1})
    with pytest.raises(UsageError, match="true or false"):
        find_scenario("prewarm", {"rewrite": 3})
    with pytest.raises(UsageError, match="no scenario"):
        find_scenario("no-such-scenario")
    with pytest.raises(UsageError, match="NAME=VALUE"):
        parse_params(["turns"])


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    return path


GOOD = """
[scenario]
title = "t"

[sessions.a]
system = "none"
reply = "text"

[[steps]]
sessions = "a"
"""


@pytest.mark.parametrize(
    ("change", "line", "problem"),
    [
        (('[[steps]]\nsessions = "a"\n', '[[steps]]\nsessions = "zz"\n'), 10, "unknown session 'zz'"),
        (('reply = "text"', 'reply = "text"\nbogus = 3'), 8, "sessions.a.bogus: unknown key"),
        (('reply = "text"', 'reply = "poem"'), 7, "must be one of tool, text"),
        (('system = "none"', 'start_tokens = -4\nsystem = "none"'), 6, "must be at least 0"),
        (('title = "t"', 'title = "t\nx'), 3, "bad TOML"),
        (('sessions = "a"\n', 'sessions = "a"\nrepeat = "$missing"\n'), 11, "unknown parameter '$missing'"),
    ],
)
def test_spec_errors_name_file_and_line(
    tmp_path: Path, change: tuple[str, str], line: int, problem: str
) -> None:
    load_spec(_write(tmp_path, GOOD))  # the base spec is fine
    path = _write(tmp_path, GOOD.replace(*change))
    with pytest.raises(TraceError) as err:
        load_spec(path)
    assert err.value.path == str(path)
    assert err.value.line == line, str(err.value)
    assert problem in err.value.problem
    assert str(err.value).startswith(f"{path}:{line}: ")


@pytest.mark.parametrize("name", NAMES)
def test_show_explains_each_scenario(name: str) -> None:
    buf = io.StringIO()
    assert commands.show(commands.ShowArgs(name=name), Console(file=buf, width=200)) == 0
    assert f"replay scenario run {name}" in buf.getvalue()
    buf = io.StringIO()
    assert commands.show(commands.ShowArgs(name=name, verbose=True), Console(file=buf, width=200)) == 0
    text = buf.getvalue()
    for heading in (
        "Reproduces",
        "What to look for",
        "Expected on the simulator",
        "Server flags",
        "Arms",
        "Run it",
    ):
        assert heading in text, heading
    spec = find_scenario(name)
    for arm in spec.arms:
        assert arm.name in text
    assert f"replay scenario generate {name}" in text
    if name == "cache-probe":
        assert "needs a driver" in text


def test_list_and_generate_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    buf = io.StringIO()
    console = Console(file=buf, width=200)
    assert commands.list_(console) == 0
    assert all(name in buf.getvalue() for name in NAMES)
    monkeypatch.chdir(tmp_path)
    assert (
        commands.generate(commands.GenerateArgs(name="cache-probe", params=["document=4000"]), console) == 0
    )
    trace = read_trace(tmp_path / "cache-probe.jsonl")
    assert trace.requests[0].messages()[0]["content"][0]["synth"]["tokens"] == 250  # 4000 / 16 paragraphs
    assert "need a driver" in buf.getvalue()
    out = tmp_path / "sub" / "x.jsonl"
    out.parent.mkdir()
    assert commands.generate(commands.GenerateArgs(name="depth-sweep", out=out), console) == 0
    assert validate(out)["requests"] == 17


# The scenarios taken from reports 000 and 003, and the build each report ran.
FIELD_BUILDS = {
    "slow-morning": "sept",
    "three-overnight": "sept",
    "switching": "sept",
    "batched-routing": "sept",
    "batched-starvation": "sept",
    "cold-ab": "sept",
    "prewarm": "sept",
}


def test_one_model_per_build() -> None:
    """Every arm of a field scenario names the build its report ran and sets none of a build's
    rules itself, so every scenario that runs a build runs exactly its rules (the slow morning
    and the overnight, both report 003's September server, ran two eviction rules before)."""
    from replay.runs.modelled import arm_config
    from replay.sim.model.builds import BUILDS, RULE_FIELDS

    seen: dict[str, dict[str, object]] = {}
    for name, build in FIELD_BUILDS.items():
        spec = find_scenario(name)
        for arm in spec.arms:
            flags = list(arm.sim)
            assert "--build" in flags, (name, arm.name)
            named = flags[flags.index("--build") + 1]
            assert named == build or named.startswith(build + "-"), (name, arm.name, named)
            for field in RULE_FIELDS:
                assert "--" + field.replace("_", "-") not in flags, (name, arm.name, field)
            cfg = arm_config(arm)
            rules = {field: getattr(cfg, field) for field in RULE_FIELDS}
            assert rules == BUILDS[named].rules()
            assert seen.setdefault(named, rules) == rules


@pytest.mark.parametrize("name", list(FIELD_BUILDS))
def test_every_field_scenario_says_where_its_inputs_come_from(name: str) -> None:
    spec = find_scenario(name)
    assert spec.inputs, name
    for inp in spec.inputs:
        assert inp.source or inp.assumed
        if inp.source:
            assert inp.source[:4] in ("000:", "002:", "003:", "000'"), (name, inp.name, inp.source)
    for arm in spec.arms:
        assert arm.source.startswith(("000:", "003:")), (name, arm.name)
    # every session size and every step's timing is accounted for
    named = {inp.name for inp in spec.inputs}
    for sid in spec.sessions:
        for key in ("start_tokens", "task_tokens", "document_tokens", "system_tokens"):
            raw = spec_raw(spec, f"sessions.{sid}.{key}")
            if raw is not None:
                assert f"sessions.{sid}.{key}" in named or f"defaults.{key}" in named, (name, sid, key)


def spec_raw(spec, dotted: str):
    from replay.scenario.inputs import spec_value

    return spec_value(spec.path, dotted, {})
