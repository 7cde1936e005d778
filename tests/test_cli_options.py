"""A replay's options are declared once (`replay.cli.REPLAY_OPTIONS`, one field each of
`ReplayOptions`) and reach every verb that replays with the same name, help and default; each verb
receives them as one `ReplayOptions`."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import pytest
import typer
from typer.testing import CliRunner

from replay import cli
from replay.cli import CLIENT_OPTIONS, REPLAY_OPTIONS, app, command
from replay.engine.defaults import AB_HISTORY, SCENARIO_TIMEOUT_S
from replay.runs.options import ReplayOptions

DEFAULTS = {f.name: f.default for f in dataclasses.fields(ReplayOptions)}
# The options every replaying verb takes; run and ab take the schedule and what to send too.
CLIENT = set(CLIENT_OPTIONS)
VERBS: dict[tuple[str, ...], set[str]] = {
    ("run",): set(REPLAY_OPTIONS),
    ("ab",): set(REPLAY_OPTIONS),
    ("probe",): CLIENT,
    ("scenario", "run"): CLIENT,
}
# A verb's own default, where it is not ReplayOptions' (and why: engine.defaults).
OWN_DEFAULTS = {("ab",): {"history": AB_HISTORY}, ("scenario", "run"): {"timeout": SCENARIO_TIMEOUT_S}}


def _params(path: tuple[str, ...]) -> dict[str, Any]:
    cmd = command()
    for name in path:
        cmd = cmd.commands[name]
    return {p.name: p for p in cmd.params}


def _declaration(param: Any) -> tuple[Any, ...]:
    return (tuple(param.opts), tuple(param.secondary_opts), param.help, param.type.name, param.metavar)


def test_every_declared_option_is_a_field_of_replay_options() -> None:
    assert set(REPLAY_OPTIONS) <= set(DEFAULTS)
    assert set(CLIENT) <= set(REPLAY_OPTIONS)


@pytest.mark.parametrize("path", list(VERBS), ids=" ".join)
def test_each_verb_takes_its_replay_options_as_run_declares_them_with_their_defaults(
    path: tuple[str, ...],
) -> None:
    run, verb = _params(("run",)), _params(path)
    for name in VERBS[path]:
        assert name in verb, f"replay {' '.join(path)} has no --{name.replace('_', '-')}"
        assert _declaration(verb[name]) == _declaration(run[name]), name
        assert verb[name].default == OWN_DEFAULTS.get(path, {}).get(name, DEFAULTS[name]), name


def test_the_client_options_are_the_same_set_on_all_four_verbs() -> None:
    taken = {path: set(_params(path)) & set(REPLAY_OPTIONS) for path in VERBS}
    assert taken[("run",)] == taken[("ab",)] == set(REPLAY_OPTIONS)
    assert taken[("probe",)] == taken[("scenario", "run")] == CLIENT
    assert {"timeout", "loop", "connections"} <= CLIENT


def test_an_option_declared_once_reaches_a_verb_with_its_fields_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Adding an option is a field of ReplayOptions and its line in REPLAY_OPTIONS, nothing in the verbs."""

    @dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
    class Wider(ReplayOptions):
        retries: int = 3

    monkeypatch.setattr(cli, "ReplayOptions", Wider)
    monkeypatch.setitem(REPLAY_OPTIONS, "retries", Annotated[int, typer.Option(help="Retries.")])
    got: list[Any] = []
    small = typer.Typer()

    @small.command()
    @cli.replay_options("timeout", "retries")
    def verb(name: str, options: ReplayOptions = cli.REPLAY_DEFAULTS) -> None:
        got.append((name, options))

    assert CliRunner().invoke(small, ["x", "--retries", "5"]).exit_code == 0
    assert CliRunner().invoke(small, ["y", "--timeout", "9"]).exit_code == 0
    assert got == [("x", Wider(retries=5)), ("y", Wider(timeout=9.0))]


@pytest.mark.parametrize(
    ("path", "argv", "module", "function"),
    [
        (("run",), ["trace.jsonl"], "replay.commands.run", "run"),
        (("ab",), ["trace.jsonl", "--a", "a.toml", "--b", "b.toml"], "replay.commands.ab", "ab"),
        (("probe",), [], "replay.commands.probe", "probe"),
        (("scenario", "run"), ["switching"], "replay.commands.scenario", "run"),
    ],
    ids=lambda x: " ".join(x) if isinstance(x, tuple) else None,
)
def test_each_verb_receives_one_replay_options_from_the_command_line(
    path: tuple[str, ...], argv: list[str], module: str, function: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    got: list[Any] = []
    monkeypatch.setattr(f"{module}.{function}", lambda args, _console: got.append(args) or 0)
    given = ["--timeout", "5", "--max-duration", "60", "--loop", "asyncio", "--connections", "fresh"]
    done = CliRunner().invoke(app, [*path, *argv, *given, "--model", "m"])
    assert done.exit_code == 0, done.output
    (args,) = got
    own = OWN_DEFAULTS.get(path, {})
    assert args.options == dataclasses.replace(
        ReplayOptions(**own),
        timeout=5.0,
        max_duration=60.0,
        loop="asyncio",
        connections="fresh",
        model="m",
    )


def test_replay_options_are_frozen_and_keyword_only() -> None:
    options = ReplayOptions(plan="overlap", concurrency=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.timeout = 5.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        ReplayOptions("overlap")  # type: ignore[misc]
    assert dataclasses.replace(options, timeout=5.0).timeout == 5.0 and options.timeout == DEFAULTS["timeout"]


@pytest.mark.parametrize(
    ("change", "refused"),
    [
        ({"timeout": 0.0}, "--timeout"),
        ({"max_duration": -1.0}, "--max-duration"),
        ({"history": "mixed"}, "--history"),
        ({"think": "maybe"}, "--think"),
        ({"api": "grpc"}, "--api"),
        ({"loop": "trio"}, "--loop"),
        ({"connections": "always"}, "--connections"),
        ({"plan": "random"}, "unknown plan"),
        ({"concurrency": 0}, "--concurrency"),
        ({"speed": 0.0}, "--speed"),
    ],
)
def test_check_refuses_what_the_engine_does_not_know(change: dict[str, Any], refused: str) -> None:
    from replay.errors import UsageError

    with pytest.raises(UsageError, match=refused):
        ReplayOptions(**change).check()
    ReplayOptions().check()


def test_the_engine_config_carries_every_option_the_engine_reads() -> None:
    options = ReplayOptions(
        api="anthropic",
        model="m",
        history="recorded",
        think="on",
        timeout=7.0,
        loop="asyncio",
        connections="fresh",
        routing="least",
        session_header="X-Session-ID",
    )
    config = options.engine_config("http://127.0.0.1:9", ("http://a", "http://b"))
    assert (config.api, config.model, config.history, config.think, config.timeout_s) == (
        "anthropic",
        "m",
        "recorded",
        "on",
        7.0,
    )
    assert (config.loop, config.connections, config.routing, config.session_header) == (
        "asyncio",
        "fresh",
        "least",
        "X-Session-ID",
    )
    assert config.base_url == "http://127.0.0.1:9" and config.backends == ("http://a", "http://b")
