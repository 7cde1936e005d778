"""The validator is FORMAT.md's schema: whatever validates runs; whatever does not is refused with
`file:line` (exit 2) before anything is sent."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from replay.cli import app
from replay.engine.apis import anthropic_body, openai_body
from replay.engine.plans import Alternate
from replay.engine.run import Engine, EngineConfig
from replay.errors import TraceError
from replay.trace.reader import MAX_SECONDS, read_trace, validate
from tests.support.trace_strategies import mutated_trace, trace_lines, write_trace

HEADER = {"kind": "trace", "format": "agent-replay-trace/1"}
SESSION = {"kind": "session", "id": "s", "api": "openai", "model": "m"}
FIRST = {
    "kind": "request",
    "id": 1,
    "session": "s",
    "t": 0,
    "append": [{"role": "user", "content": "hi"}],
    "params": {"max_tokens": 4},
    "reply": {"message": {"role": "assistant", "content": "ok"}, "finish": "stop", "output_tokens": 2},
}
SECOND = {
    "kind": "request",
    "id": 2,
    "session": "s",
    "t": 1,
    "parent": 1,
    "keep": 1,
    "append": [{"$reply": 1}, {"role": "user", "content": "more"}],
}


def with_field(line: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    line = copy.deepcopy(line)
    *parents, last = path.split(".")
    node = line
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return line


# (which request, dotted path, value): each accepted, or crashing the validator, before this issue.
INVALID = [
    (2, "keep", True),
    (1, "params", None),
    (1, "params.stream", "yes"),
    (1, "params.temperature", "hot"),
    (1, "params.temperature", -1),
    (1, "params.tools", 5),
    (1, "params.tools", [5]),
    (1, "params.max_tokens", -1),
    (1, "params.max_tokens", 1e308),
    (1, "params.max_tokens", "many"),
    (1, "params.extra", [1]),
    (1, "reply.finish", 5),
    (1, "reply.output_tokens", "x"),
    (1, "reply.output_tokens", -3),
    (1, "reply.message", "hi"),
    (1, "reply.message", {"role": "user", "content": "hi"}),
    (1, "reply.message", {"role": "assistant", "content": 5}),
    (
        1,
        "reply.message",
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "name": "f", "arguments": {}}]},
    ),
    (1, "reply.message", {"role": "assistant", "content": "", "tool_calls": "x"}),
    (1, "reply.status", "fine"),
    (1, "reply.first_token_s", -1),
    (2, "reply.first_token_s", -1),  # a reply of fewer than four keys was taken for a plain one
    (2, "reply.status", "fine"),
    (1, "usage.prompt_tokens", "x"),
    (1, "usage.cached_tokens", -1),
    (1, "usage.output_tokens", 2**60),
    (2, "after.delay_s", -5),
    (2, "after.delay_s", "soon"),
    (2, "after.request", [1]),
    (1, "tag", ["turn"]),
    (1, "tag", {"a": 1}),
    (1, "t", 1e308),
    (1, "t", -1),
    (1, "t", "0"),
    (1, "id", True),
    (1, "id", -1),
    (2, "parent", [1]),
    (2, "parent", {"a": 1}),
    (2, "parent", True),
    (2, "keep", 5),
    (2, "keep", -1),
    (
        1,
        "append",
        [{"role": "user", "content": "x", "tool_calls": [{"id": "c", "name": "f", "arguments": "{}"}]}],
    ),
    (1, "append", [{"role": "tool", "content": "x"}]),
    (1, "append", [{"role": "assistant", "content": "x", "reasoning": 5}]),
    (1, "append", [{"role": "user", "content": {"synth": {"tokens": 10**12, "seed": 1}}}]),
    (2, "append", [{"$reply": True}]),
    (1, "append", [{"role": "user", "content": {"$blob": [1]}}]),
    (1, "append", [{"$blob": {"a": 1}}]),
    (1, "params.tools", {"$blob": ["tools"]}),
    (2, "append", [{"$reply": [1]}]),
]
SESSION_INVALID = [("model", ["a", "b"]), ("model", 5), ("labels", [1]), ("role", 3), ("api", "grpc")]


@pytest.mark.parametrize(("which", "path", "value"), INVALID, ids=[f"{p}={v!r}"[:40] for _, p, v in INVALID])
def test_an_invalid_field_is_refused_with_file_and_line(
    tmp_path: Path, which: int, path: str, value: Any
) -> None:
    lines: list[Any] = [HEADER, SESSION, FIRST, SECOND]
    lines[1 + which] = with_field(lines[1 + which], path, value)
    trace = write_trace(tmp_path / "t.jsonl", lines)
    with pytest.raises(TraceError) as caught:
        validate(trace)
    assert str(caught.value).startswith(f"{trace}:{2 + which}: "), caught.value
    assert caught.value.exit_code == 2 and "\n" not in str(caught.value)


@pytest.mark.parametrize(("key", "value"), SESSION_INVALID)
def test_a_session_field_of_the_wrong_type_is_refused(tmp_path: Path, key: str, value: Any) -> None:
    trace = write_trace(tmp_path / "t.jsonl", [HEADER, {**SESSION, key: value}, FIRST])
    with pytest.raises(TraceError, match=rf"^{trace}:2: "):
        validate(trace)


def test_the_valid_base_trace_validates(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.jsonl", [HEADER, SESSION, FIRST, SECOND])
    assert validate(trace)["requests"] == 2


def test_the_cli_exits_2_with_one_line(tmp_path: Path) -> None:
    trace = write_trace(
        tmp_path / "t.jsonl", [HEADER, SESSION, with_field(FIRST, "params.max_tokens", "many")]
    )
    proc = subprocess.run(
        [sys.executable, "-m", "replay", "validate", str(trace)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{trace}:3:" in lines[0] and "max_tokens" in lines[0]


YEAR = 365 * 86400.0


@pytest.mark.parametrize(
    ("which", "path", "value"),
    [
        (1, "t", YEAR),
        (2, "t", 30 * YEAR),
        (2, "after.delay_s", 120 * 86400.0),
        (1, "reply.last_byte_s", YEAR),
    ],
)
def test_times_spanning_years_validate(tmp_path: Path, which: int, path: str, value: float) -> None:
    """A Claude Code store spanning a year failed with `t` 12228814.908 against a bound of 1e7."""
    lines: list[Any] = [HEADER, SESSION, FIRST, SECOND]
    if path == "t" and which == 1:
        lines[3] = with_field(SECOND, "t", value)  # t never decreases in a trace that is written in order
    lines[1 + which] = with_field(lines[1 + which], path, value)
    assert validate(write_trace(tmp_path / "t.jsonl", lines))["requests"] == 2


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seconds=st.floats(0, MAX_SECONDS, exclude_max=True) | st.floats(MAX_SECONDS, 1e300),
    field=st.sampled_from(["t", "after.delay_s", "reply.first_token_s"]),
)
def test_a_time_validates_below_the_bound_and_is_refused_at_its_line_from_it(
    tmp_path_factory: pytest.TempPathFactory, seconds: float, field: str
) -> None:
    lines: list[Any] = [HEADER, SESSION, FIRST, with_field(SECOND, field, seconds)]
    trace = write_trace(tmp_path_factory.mktemp("t") / "t.jsonl", lines)
    if seconds < MAX_SECONDS:
        assert validate(trace)["requests"] == 2
        return
    with pytest.raises(
        TraceError, match=rf"^{trace}:4: request 2: .*must be seconds \(a number from 0 to 1e9\)"
    ):
        validate(trace)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=trace_lines())
def test_traces_drawn_from_the_schema_validate(
    tmp_path_factory: pytest.TempPathFactory, lines: list[Any]
) -> None:
    trace = write_trace(tmp_path_factory.mktemp("t") / "t.jsonl", lines)
    assert validate(trace)["requests"] == sum(1 for line in lines if line["kind"] == "request")


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=mutated_trace())
def test_a_mutated_trace_is_refused_at_a_line_or_loads(
    tmp_path_factory: pytest.TempPathFactory, drawn: Any
) -> None:
    lines, _mutated = drawn
    trace = write_trace(tmp_path_factory.mktemp("t") / "t.jsonl", lines)
    try:
        loaded = read_trace(trace)
    except TraceError as exc:
        assert exc.exit_code == 2
        head, line, _ = str(exc).split(":", 2)
        assert head == str(trace) and 1 <= int(line) <= len(lines) + 1
        return
    # What the engine does with a request before sending it, in both history modes and both APIs.
    by_id = loaded.by_id()
    for mode in ("recorded", "live"):
        config = EngineConfig(base_url="http://127.0.0.1:9", history=mode)
        engine = Engine(loaded, Alternate(), config, lambda _rec: None)
        for req in loaded.requests:
            state = engine.sessions[req.session]
            call = engine._call(req, state)
            openai_body(call)
            anthropic_body(call)
            orjson.dumps(openai_body(call))
            orjson.dumps(anthropic_body(call))
            # live mode: the server answered with nothing of the recorded calls
            state.on_reply(req, {"role": "assistant", "content": "x"})
        assert by_id


@pytest.mark.e2e
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(drawn=mutated_trace())
def test_whatever_validates_runs_on_the_simulator(
    tmp_path_factory: pytest.TempPathFactory, sim_url: str, drawn: Any
) -> None:
    lines, _mutated = drawn
    folder = tmp_path_factory.mktemp("run")
    trace = write_trace(folder / "t.jsonl", lines)
    try:
        n = validate(trace)["requests"]
    except TraceError:
        event("refused by validate")
        return
    event("validated, so run")
    out = folder / "results.jsonl"
    result = CliRunner().invoke(
        app, ["run", str(trace), "--target", sim_url, "--out", str(out), "--quiet", "--timeout", "30"]
    )
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in (0, 1), result.output
    rows = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert sum(1 for r in rows if r["kind"] == "request") == n
    assert [r for r in rows if r["kind"] == "summary"]
