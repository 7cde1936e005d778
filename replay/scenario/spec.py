"""Scenario specs (`traces/scenarios/*.toml`): loaded with tomllib, checked field by field.

A spec is data, not code: sessions (role, start size, reply style), an ordered list of steps
(turns, compaction, prewarm, probe variants) and the text `replay scenario show` prints. Every
problem is reported as `file:line: problem`, the line found by looking for the offending key in the
file's text, because tomllib keeps no positions once a file has parsed.

Parameters: `[params]` declares named knobs with defaults; any string value `"$name"` elsewhere in
the spec is replaced by that knob's value, and a step with `when = "name"` is skipped when the knob
is false. `--param name=value` overrides a knob; `--param sessions.a.start_tokens=40000` overrides
any field by its dotted path. The built-in knob `scale` multiplies every content size.
"""

from __future__ import annotations

import datetime as _dt
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replay.errors import TraceError, UsageError
from replay.scenario.expect import Expect, parse_expect
from replay.scenario.inputs import SIM_PREFIX, Input, spec_value

PLANS = ("alternate", "overlap", "timed", "closed-loop")
OPS = ("turn", "compaction", "prewarm", "resend", "ask", "edit")
ORDERS = ("sequence", "parallel")
REPLY_STYLES = ("tool", "text")
SYSTEMS = ("shared", "own", "none")
BUILTIN_PARAMS: dict[str, Any] = {"scale": 1.0}
DEFAULT_CREATED = "2026-09-01T06:40:00+00:00"


# An arm's fleet: SGLang's router in front of the replicas (its policies), or the client routing
# over them itself (the engine's --routing).
ROUTER_POLICIES = ("cache_aware", "round_robin")
CLIENT_ROUTINGS = ("sticky", "round-robin", "least")


@dataclass(frozen=True, slots=True)
class Fleet:
    """`fleet = { replicas = N, router = "cache_aware" }` or `{ replicas = N, routing = "sticky" }`:
    N simulators (each started with the arm's `sim` flags), behind SGLang's router with that
    policy, or routed by the client."""

    replicas: int
    router: str | None = None  # sglang-router's --policy
    routing: str | None = None  # the client's routing over the replicas


@dataclass(frozen=True, slots=True)
class Arm:
    """One side of a comparison: simulator flags and parameter overrides."""

    name: str
    about: str
    sim: tuple[str, ...]
    params: dict[str, Any]
    source: str = ""  # the report's words for this arm's settings
    fleet: Fleet | None = None  # several simulators (and a router) instead of one


@dataclass(frozen=True, slots=True)
class RunSettings:
    plan: str = "alternate"
    concurrency: int | None = None
    round_robin: bool = False
    # The engine's --think: "on"/"auto" where the scenario is about reasoning the server hides.
    think: str = "off"
    # Modelled seconds per wall second when the scenario runs on the simulator (demo, tests).
    time_scale: float = 1000.0
    # Whether `scenario check` also runs the arms on the simulator over HTTP (the spread): false
    # for a scenario whose wall-clock run is too large for a check (days of deep requests).
    wall_clock: bool = True


@dataclass(frozen=True, slots=True)
class SessionSpec:
    id: str
    role: str = "interactive"
    api: str = "openai"
    model: str = "default"
    system: str = "shared"
    system_tokens: int = 0
    tools: bool = True
    start_tokens: int = 0
    start_messages: int | None = None
    history_chunk: int = 2000
    reply: str = "tool"
    reply_tokens: int = 128
    task_tokens: int = 200
    document_tokens: int = 0
    paragraphs: int = 16
    question_tokens: int = 40
    labels: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Step:
    """One entry of `[[steps]]`; per-session values are already expanded to dicts."""

    op: str
    sessions: tuple[str, ...]
    order: str = "sequence"
    repeat: dict[str, int] = field(default_factory=dict)
    grow: dict[str, int] = field(default_factory=dict)
    grow_to: dict[str, int] = field(default_factory=dict)
    until: dict[str, int] = field(default_factory=dict)
    start: dict[str, float] = field(default_factory=dict)
    gap_s: dict[str, float] = field(default_factory=dict)
    pause_s: dict[str, float] = field(default_factory=dict)
    follows: dict[str, str] = field(default_factory=dict)
    alongside: dict[str, str] = field(default_factory=dict)
    at: float | None = None
    keep_messages: int = 0
    keep_tokens: int = 0
    summary_tokens: int = 3000
    fraction: float = 0.5
    text: str = ""
    restart: bool = False
    latest: bool = False  # resend: the prompt the session sent last, not its first
    label: str = ""
    tag: str | None = None
    when: str | None = None


def clock_seconds(clock: str | None) -> float | None:
    """An ISO 8601 time as seconds after its own midnight (None stays None)."""
    if clock is None:
        return None
    t = _dt.datetime.fromisoformat(clock)
    return float(t.hour * 3600 + t.minute * 60 + t.second)


@dataclass(frozen=True, slots=True)
class Leftover:
    """Checkpoint files an earlier day left in the disk-KV directory before the scenario starts.

    `what = "system-prefix"`: one file holding the shared system prompt + tools (the cold save's
    chat-anchor cut of the agent's earlier conversations); `"other"`: `gib` of files of
    `file_tokens` each that no prompt of the scenario shares. `hits` restores, last used `age_h`
    hours before trace time 0 (hits decay with ds4's 6 h half-life).
    """

    what: str
    hits: int
    age_h: float
    gib: float = 0.0
    file_tokens: int = 81920


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    path: str
    title: str
    reproduces: str
    look_for: str
    expected: str
    server_flags: tuple[str, ...]
    notes: str
    run: RunSettings
    params: dict[str, Any]
    arms: tuple[Arm, ...]
    system_tokens: int
    tools: tuple[str, ...]
    sessions: dict[str, SessionSpec]
    steps: tuple[Step, ...]
    seed: int
    created: str
    overrides: dict[str, Any] = field(default_factory=dict)
    # The report's wall clock at trace time 0 (ISO 8601), for scenarios taken from a dated report:
    # the simulator stamps its log with it and expectation windows are written in it.
    clock: str | None = None
    # The rendered system turn (system prompt + tools + template) the shared prompt must come to,
    # when the report gives that figure (ds4's `cached=` on a switch); 0 = system_tokens as content.
    system_turn_tokens: int = 0
    leftovers: tuple[Leftover, ...] = ()
    expects: tuple[Expect, ...] = ()
    inputs: tuple[Input, ...] = ()

    @property
    def clock_s(self) -> float | None:
        """Seconds after midnight of trace time 0, in the report's own time zone."""
        return clock_seconds(self.clock)

    def arm(self, name: str) -> Arm:
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise UsageError(
            f"scenario {self.name} has no arm {name!r} (arms: {', '.join(a.name for a in self.arms)})"
        )

    def with_params(self, overrides: dict[str, Any]) -> Scenario:
        """The same spec file loaded again with more overrides (an arm's, say); later ones win."""
        if not overrides:
            return self
        return load_spec(self.path, {**self.overrides, **overrides})


class _Where:
    """Maps a dotted key path to a line of the spec's text, for error messages."""

    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self.lines = text.splitlines()

    def line(self, keys: tuple[str | int, ...]) -> int:
        names = [k for k in keys if isinstance(k, str)]
        if not names:
            return 0
        start = 0
        table = ".".join(names[:-1])
        if table:
            header = re.compile(r"^\s*\[\[?\s*" + re.escape(table) + r"\s*\]\]?\s*$")
            index = [k for k in keys if isinstance(k, int)]
            seen = -1
            for n, text in enumerate(self.lines):
                if header.match(text):
                    seen += 1
                    start = n
                    if not index or seen == index[0]:
                        break
        key = re.compile(r"^\s*" + re.escape(names[-1]) + r"\s*=")
        header_of_key = re.compile(r"^\s*\[\[?\s*" + re.escape(".".join(names)) + r"\s*\]\]?\s*$")
        for n in range(start, len(self.lines)):
            if key.match(self.lines[n]) or header_of_key.match(self.lines[n]):
                return n + 1
        return start + 1 if table else 0

    def fail(self, keys: tuple[str | int, ...], problem: str) -> TraceError:
        where = ".".join(str(k) if isinstance(k, str) else f"[{k}]" for k in keys).replace(".[", "[")
        return TraceError(self.path, self.line(keys), f"{where}: {problem}" if where else problem)


class _Table:
    """Typed access to one TOML table; every getter reports `file:line: key: problem`."""

    def __init__(self, where: _Where, keys: tuple[str | int, ...], data: Any) -> None:
        if not isinstance(data, dict):
            raise where.fail(keys, "must be a table")
        self.where = where
        self.keys = keys
        self.data = data
        self.used: set[str] = set()

    def fail(self, key: str | None, problem: str) -> TraceError:
        return self.where.fail((*self.keys, key) if key else self.keys, problem)

    def get(self, key: str, types: type | tuple[type, ...], default: Any, what: str) -> Any:
        self.used.add(key)
        if key not in self.data:
            return default
        value = self.data[key]
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in _tuple(types))
        if not ok:
            raise self.fail(key, f"must be {what}, got {_show(value)}")
        return value

    def text(self, key: str, default: str = "") -> str:
        return self.get(key, str, default, "a string")

    def int(self, key: str, default: int = 0, low: int = 0) -> int:
        value = self.get(key, int, default, "an integer")
        if value < low:
            raise self.fail(key, f"must be at least {low}, got {value}")
        return value

    def number(self, key: str, default: float = 0.0, low: float = 0.0) -> float:
        value = float(self.get(key, (int, float), default, "a number"))
        if value < low:
            raise self.fail(key, f"must be at least {low}, got {value:g}")
        return value

    def flag(self, key: str, default: bool = False) -> bool:
        return self.get(key, bool, default, "true or false")

    def choice(self, key: str, options: tuple[str, ...], default: str) -> str:
        value = self.text(key, default)
        if value not in options:
            raise self.fail(key, f"must be one of {', '.join(options)}, got {value!r}")
        return value

    def strings(self, key: str) -> tuple[str, ...]:
        value = self.get(key, list, [], "a list of strings")
        if not all(isinstance(v, str) for v in value):
            raise self.fail(key, "must be a list of strings")
        return tuple(value)

    def table(self, key: str) -> _Table:
        self.used.add(key)
        return _Table(self.where, (*self.keys, key), self.data.get(key, {}))

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            raise self.fail(unknown[0], f"unknown key (known here: {', '.join(sorted(self.used))})")


def _fleet(arm: _Table) -> Fleet:
    """An arm's `fleet` (an inline table, whose keys have no line of their own: a problem in it
    is reported at the line of `fleet =`)."""
    try:
        return _fleet_keys(arm.table("fleet"))
    except TraceError as exc:
        raise TraceError(exc.path, arm.where.line((*arm.keys, "fleet")), exc.problem) from None


def _fleet_keys(t: _Table) -> Fleet:
    replicas = t.int("replicas", 2, low=2)
    router = t.get("router", str, None, "a string")
    routing = t.get("routing", str, None, "a string")
    if (router is None) == (routing is None):
        raise t.fail(
            None, "a fleet needs router = 'POLICY' (SGLang's router) or routing = 'HOW' (the client's)"
        )
    if router is not None and router not in ROUTER_POLICIES:
        raise t.fail("router", f"must be one of {', '.join(ROUTER_POLICIES)}, got {router!r}")
    if routing is not None and routing not in CLIENT_ROUTINGS:
        raise t.fail("routing", f"must be one of {', '.join(CLIENT_ROUTINGS)}, got {routing!r}")
    t.done()
    return Fleet(replicas, router, routing)


def _tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_value(text: str) -> Any:
    """A `--param` value: TOML syntax when it parses (42, 0.5, true, "x"), else the raw string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_params(items: list[str]) -> dict[str, Any]:
    """`["k=v", ...]` from the command line."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--param: expected NAME=VALUE, got {item!r}")
        out[key.strip()] = parse_value(value.strip())
    return out


def _set_dotted(where: _Where, data: dict[str, Any], dotted: str, value: Any) -> None:
    """`sessions.a.start_tokens`, or with an index into an array of tables: `steps.0.gap_s`."""
    keys = dotted.split(".")
    node: Any = data
    for i, key in enumerate(keys[:-1]):
        if isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
            continue
        if not isinstance(node, dict) or key not in node:
            raise UsageError(f"--param {dotted}: no table {'.'.join(keys[: i + 1])!r} in {where.path}")
        node = node[key]
    if not isinstance(node, dict):
        raise UsageError(f"--param {dotted}: {'.'.join(keys[:-1])!r} is not a table in {where.path}")
    node[keys[-1]] = value


def _substitute(where: _Where, node: Any, params: dict[str, Any], keys: tuple[str | int, ...]) -> Any:
    if isinstance(node, str) and node.startswith("$"):
        name = node[1:]
        if name not in params:
            raise where.fail(keys, f"unknown parameter {node!r} (declared: {', '.join(sorted(params))})")
        return params[name]
    if isinstance(node, dict):
        return {k: _substitute(where, v, params, (*keys, k)) for k, v in node.items()}
    if isinstance(node, list):
        return [_substitute(where, v, params, (*keys, i)) for i, v in enumerate(node)]
    return node


def load_spec(path: str | Path, overrides: dict[str, Any] | None = None) -> Scenario:
    """Read and check one spec; `overrides` are `--param` values (knobs or dotted paths)."""
    path = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(path, 0, f"cannot open: {exc.strerror}") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        problem = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(exc))
        raise TraceError(path, int(m.group(1)) if m else 0, f"bad TOML: {problem}") from None
    where = _Where(path, text)
    declared = dict(BUILTIN_PARAMS)
    params_table = _Table(where, ("params",), raw.get("params", {}))
    for key, value in params_table.data.items():
        if not isinstance(value, bool | int | float | str):
            raise params_table.fail(key, "a parameter must be a number, a string or true/false")
        declared[key] = value
    params = dict(declared)
    for key, value in (overrides or {}).items():
        if key in declared:
            if isinstance(declared[key], bool) != isinstance(value, bool):
                want = "true or false" if isinstance(declared[key], bool) else "a value, not true/false"
                raise UsageError(f"--param {key}: expected {want}")
            params[key] = value
        elif "." in key:
            _set_dotted(where, raw, key, value)
        else:
            known = ", ".join(sorted(declared))
            raise UsageError(f"--param {key}: {path} has no such parameter (declared: {known})")
    scale = params["scale"]
    if not isinstance(scale, int | float) or isinstance(scale, bool) or scale <= 0:
        if "scale" in (overrides or {}):
            raise UsageError(f"--param scale: must be a number > 0, got {scale!r}")
        raise where.fail(("params", "scale"), "must be a number > 0")
    body = {k: v for k, v in raw.items() if k != "params"}
    body = _substitute(where, body, params, ())
    return _build(where, Path(path), body, params, dict(overrides or {}))


def _build(
    where: _Where, path: Path, raw: dict[str, Any], params: dict[str, Any], overrides: dict[str, Any]
) -> Scenario:
    top = _Table(where, (), raw)
    top.used.add("params")
    meta = top.table("scenario")
    name = meta.text("name", path.stem)
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name):
        raise meta.fail("name", "must be lower-case letters, digits and dashes")
    title = meta.text("title")
    if not title:
        raise meta.fail("title", "every scenario needs a one-line title")
    scenario_fields = {
        "reproduces": meta.text("reproduces").strip(),
        "look_for": meta.text("look_for").strip(),
        "expected": meta.text("expected").strip(),
        "notes": meta.text("notes").strip(),
    }
    server_flags = meta.strings("server_flags")
    seed = meta.int("seed", 1)
    clock = meta.get("clock", str, None, "an ISO 8601 time, e.g. 2026-09-01T06:40:00+00:00")
    if clock is not None:
        try:
            _dt.datetime.fromisoformat(clock)
        except ValueError:
            raise meta.fail("clock", f"not an ISO 8601 time: {clock!r}") from None
    created = meta.text("created", clock or DEFAULT_CREATED)
    meta.done()

    run_t = top.table("run")
    concurrency = run_t.int("concurrency", 0)
    run = RunSettings(
        plan=run_t.choice("plan", PLANS, "alternate"),
        concurrency=concurrency or None,
        round_robin=run_t.flag("round_robin"),
        think=run_t.choice("think", ("off", "on", "auto"), "off"),
        time_scale=run_t.number("time_scale", 1000.0, low=1e-9),
        wall_clock=run_t.get("wall_clock", bool, True, "true or false"),
    )
    run_t.done()

    prompt = top.table("prompt")
    system_tokens = prompt.int("system_tokens", 0)
    system_turn_tokens = prompt.int("system_turn_tokens", 0)
    if system_turn_tokens and system_tokens:
        raise prompt.fail("system_turn_tokens", "give system_tokens or system_turn_tokens, not both")
    system_tokens = system_tokens or system_turn_tokens
    tools = prompt.strings("tools") or ("read_file", "run_command")
    prompt.done()

    arms_raw = top.get("arms", list, [], "an array of tables ([[arms]])")
    arms: list[Arm] = []
    for i, item in enumerate(arms_raw):
        t = _Table(where, ("arms", i), item)
        arm_name = t.text("name")
        if not arm_name:
            raise t.fail("name", "every arm needs a name")
        arm_params = t.table("params").data
        for key, value in arm_params.items():
            if key not in params:
                raise t.fail("params", f"unknown parameter {key!r}")
            if isinstance(params[key], bool) != isinstance(value, bool):
                raise t.fail("params", f"parameter {key!r} must be true or false")
        arms.append(
            Arm(
                name=arm_name,
                about=t.text("about"),
                sim=t.strings("sim"),
                params=dict(arm_params),
                source=t.text("source"),
                fleet=_fleet(t) if "fleet" in t.data else None,
            )
        )
        t.done()
    if len({a.name for a in arms}) != len(arms):
        raise where.fail(("arms",), "arm names must be unique")
    if not arms:
        arms.append(Arm(name="default", about="the simulator's defaults", sim=(), params={}))

    defaults = top.table("defaults")
    sessions_t = top.table("sessions")
    sessions: dict[str, SessionSpec] = {}
    for sid in sessions_t.data:
        sessions[sid] = _session(where, sid, defaults.data, sessions_t.data[sid])
    _session(where, "defaults", {}, defaults.data)  # checks the defaults' own keys and types
    if not sessions:
        raise sessions_t.fail(None, "a scenario needs at least one session ([sessions.NAME])")
    for s in sessions.values():
        if s.system == "shared" and system_tokens == 0:
            raise where.fail(("sessions", s.id, "system"), "'shared' needs prompt.system_tokens > 0")
        if s.reply == "tool" and not s.tools:
            raise where.fail(("sessions", s.id, "reply"), "tool-call replies need tools = true")

    leftovers = _leftovers(where, top.get("leftovers", list, [], "an array of tables ([[leftovers]])"))
    expect_rows = top.get("expect", list, [], "an array of tables ([[expect]])")
    expects = _expects(where, expect_rows, arms, clock_seconds(clock))
    inputs = _inputs(where, top.get("inputs", list, [], "an array of tables ([[inputs]])"), path, params)
    steps_raw = top.get("steps", list, [], "an array of tables ([[steps]])")
    steps = tuple(_step(where, i, item, sessions, params) for i, item in enumerate(steps_raw))
    if not steps:
        raise where.fail(("steps",), "a scenario needs at least one step ([[steps]])")
    top.done()
    return Scenario(
        name=name,
        path=str(path),
        title=title,
        server_flags=server_flags,
        run=run,
        params=params,
        arms=tuple(arms),
        system_tokens=system_tokens,
        tools=tools,
        sessions=sessions,
        steps=steps,
        seed=seed,
        created=created,
        overrides=overrides,
        clock=clock,
        system_turn_tokens=system_turn_tokens,
        leftovers=leftovers,
        expects=expects,
        inputs=inputs,
        **scenario_fields,
    )


def _inputs(where: _Where, rows: list[Any], path: Path, params: dict[str, Any]) -> tuple[Input, ...]:
    from replay.sim.model.config import SimConfig  # the fields a `sim.` input may name

    out = []
    for i, item in enumerate(rows):
        t = _Table(where, ("inputs", i), item)
        name = t.text("name")
        span = t.get("range", list, None, "a range [low, high]")
        row = Input(
            name=name,
            source=t.text("source"),
            assumed=t.text("assumed"),
            range=None if span is None else _range(t, span),
            note=t.text("note"),
        )
        t.done()
        if bool(row.source) == bool(row.assumed):
            raise t.fail(
                "source", "an input has its report's words (source) or says why it is assumed, one of the two"
            )
        if name.startswith(SIM_PREFIX):
            if name[len(SIM_PREFIX) :] not in SimConfig.__dataclass_fields__:
                raise t.fail("name", f"{name!r}: the simulator has no such figure")
        elif name != "run.time_scale" and spec_value(path, name, params) is None:
            raise t.fail("name", f"{name!r} is neither a knob nor a value this spec sets")
        if row.assumed and row.range is None and name.startswith(SIM_PREFIX):
            raise t.fail("range", "an assumed figure needs the range it is plausible in")
        out.append(row)
    if len({r.name for r in out}) != len(out):
        raise where.fail(("inputs",), "each input is listed once")
    return tuple(out)


def _range(t: _Table, span: list[Any]) -> tuple[float, float]:
    if len(span) != 2 or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in span):
        raise t.fail("range", "must be [low, high]")
    lo, hi = float(span[0]), float(span[1])
    if lo > hi:
        raise t.fail("range", "must be [low, high]")
    return lo, hi


LEFTOVER_KINDS = ("system-prefix", "other")


def _leftovers(where: _Where, rows: list[Any]) -> tuple[Leftover, ...]:
    out = []
    for i, item in enumerate(rows):
        t = _Table(where, ("leftovers", i), item)
        row = Leftover(
            what=t.choice("what", LEFTOVER_KINDS, "other"),
            hits=t.int("hits", 0),
            age_h=t.number("age_h", 12.0),
            gib=t.number("gib", 0.0),
            file_tokens=t.int("file_tokens", 81920, low=1),
        )
        t.done()
        if row.what == "other" and row.gib <= 0:
            raise t.fail("gib", "leftovers of other conversations need gib > 0")
        out.append(row)
    return tuple(out)


def _expects(where: _Where, rows: list[Any], arms: list[Arm], clock_s: float | None) -> tuple[Expect, ...]:
    names = {a.name for a in arms}
    out = []
    for i, item in enumerate(rows):
        t = _Table(where, ("expect", i), item)
        raw: dict[str, Any] = {
            "arm": t.text("arm"),
            "metric": t.text("metric"),
            "stat": t.text("stat", "all"),
            "window": t.text("window"),
            "source": t.text("source"),
            "about": t.text("about"),
            "tolerance": t.number("tolerance", 0.1),
            "slack": t.number("slack", 0.0),
        }
        for key in ("step", "session", "tag", "switch", "gap"):
            value = t.get(key, str, None, "a string")
            if value is not None:
                raw[key] = value
        last = t.get("last", int, None, "an integer")
        if last is not None:
            raw["last"] = last
        raw["value"] = t.get("value", (int, float, list), None, "a number or a range [low, high]")
        t.done()
        if raw["arm"] not in names:
            raise t.fail("arm", f"unknown arm {raw['arm']!r} (arms: {', '.join(sorted(names))})")
        if not raw["source"]:
            raise t.fail(
                "source", "every expectation names its source (the report and its section, e.g. 003, the fix)"
            )
        try:
            out.append(parse_expect(raw, clock_s))
        except ValueError as exc:
            raise t.fail(None, str(exc)) from None
    return tuple(out)


def _session(where: _Where, sid: str, defaults: dict[str, Any], data: Any) -> SessionSpec:
    keys: tuple[str, ...] = ("defaults",) if sid == "defaults" else ("sessions", sid)
    if not isinstance(data, dict):
        raise where.fail(keys, "must be a table")
    t = _Table(where, keys, {**defaults, **data})
    d = SessionSpec(id=sid)
    spec = SessionSpec(
        id=sid,
        role=t.text("role", d.role),
        api=t.choice("api", ("openai", "anthropic"), d.api),
        model=t.text("model", d.model),
        system=t.choice("system", SYSTEMS, d.system),
        system_tokens=t.int("system_tokens", d.system_tokens),
        tools=t.flag("tools", d.tools),
        start_tokens=t.int("start_tokens", d.start_tokens),
        start_messages=t.int("start_messages", 0) or None,
        history_chunk=t.int("history_chunk", d.history_chunk, low=1),
        reply=t.choice("reply", REPLY_STYLES, d.reply),
        reply_tokens=t.int("reply_tokens", d.reply_tokens),
        task_tokens=t.int("task_tokens", d.task_tokens, low=1),
        document_tokens=t.int("document_tokens", 0),
        paragraphs=t.int("paragraphs", d.paragraphs, low=1),
        question_tokens=t.int("question_tokens", d.question_tokens, low=1),
        labels=t.get("labels", dict, {}, "a table"),
    )
    t.done()
    if spec.system == "own" and spec.system_tokens == 0 and sid != "defaults":
        raise where.fail((*keys, "system_tokens"), "system = 'own' needs system_tokens > 0")
    return spec


def _per_session(t: _Table, key: str, sessions: tuple[str, ...], kind: type, default: Any) -> dict[str, Any]:
    """A value given once for every session of the step, or as a table `{session = value}`."""
    t.used.add(key)
    if key not in t.data:
        return dict.fromkeys(sessions, default)
    value = t.data[key]
    if isinstance(value, dict):
        unknown = set(value) - set(sessions)
        if unknown:
            raise t.fail(key, f"names sessions not in this step: {', '.join(sorted(unknown))}")
        out = dict.fromkeys(sessions, default)
        out.update(value)
    else:
        out = dict.fromkeys(sessions, value)
    for sid, v in out.items():
        if v is default:
            continue
        ok = isinstance(v, int | float) if kind is float else isinstance(v, kind)
        if not ok or isinstance(v, bool) or v < 0:
            raise t.fail(
                key, f"value for {sid!r} must be a non-negative {'number' if kind is float else 'integer'}"
            )
        out[sid] = kind(v)
    return out


def _follows(t: _Table, names: tuple[str, ...], key: str = "follows") -> dict[str, str]:
    """`follows = {review = "main"}`: review's first request waits for main's first of the step.
    `alongside = {review = "main"}`: review's first waits for what main's first waits for (the
    same reply), then its own `pause_s`: the two are sent together, two in flight."""
    value = t.get(key, dict, {}, "a table {session = session}")
    for sid, leader in value.items():
        if sid not in names or leader not in names or sid == leader:
            raise t.fail(key, f"{sid} = {leader!r}: both must be other sessions of this step")
        if leader in value:
            raise t.fail(key, f"{leader!r} {key} another session itself")
    return dict(value)


def _step(where: _Where, i: int, data: Any, sessions: dict[str, SessionSpec], params: dict[str, Any]) -> Step:
    t = _Table(where, ("steps", i), data)
    op = t.choice("op", OPS, "turn")
    names = t.get("sessions", (list, str), None, "a session name or a list of them")
    if names is None:
        names = t.get("session", str, None, "a session name")
    if names is None:
        raise t.fail("sessions", "every step names its session(s)")
    names = (names,) if isinstance(names, str) else tuple(names)
    for sid in names:
        if not isinstance(sid, str) or sid not in sessions:
            raise t.fail("sessions", f"unknown session {sid!r} (sessions: {', '.join(sessions)})")
    if op != "turn" and op != "prewarm" and len(names) != 1:
        raise t.fail("sessions", f"op {op!r} acts on exactly one session")
    when = t.get("when", str, None, "a parameter name")
    if when is not None and when not in params:
        raise t.fail("when", f"unknown parameter {when!r}")
    at = t.get("at", (int, float), None, "a number of seconds")
    step = Step(
        op=op,
        sessions=names,
        order=t.choice("order", ORDERS, "sequence"),
        repeat=_per_session(t, "repeat", names, int, 1),
        grow=_per_session(t, "grow", names, int, 0),
        grow_to=_per_session(t, "grow_to", names, int, 0),
        until=_per_session(t, "until", names, int, 0),
        start=_per_session(t, "start", names, float, 0.0),
        gap_s=_per_session(t, "gap_s", names, float, 0.0),
        pause_s=_per_session(t, "pause_s", names, float, 0.0),
        follows=_follows(t, names),
        alongside=_follows(t, names, "alongside"),
        at=None if at is None else float(at),
        keep_messages=t.int("keep_messages", 0),
        keep_tokens=t.int("keep_tokens", 0),
        summary_tokens=t.int("summary_tokens", 3000),
        fraction=t.number("fraction", 0.5),
        text=t.text("text", "A line inserted here changes everything after it."),
        restart=t.flag("restart"),
        latest=t.flag("latest"),
        label=t.text("label"),
        tag=t.get("tag", str, None, "a string"),
        when=when,
    )
    t.done()
    if op == "compaction" and (step.keep_messages < 4 or step.keep_tokens == 0):
        raise t.fail("keep_messages", "a compaction needs keep_messages >= 4 and keep_tokens > 0")
    if op in ("ask", "edit") and sessions[names[0]].document_tokens == 0:
        raise t.fail("op", f"{op!r} changes a document prompt: the session needs document_tokens > 0")
    if not 0.0 <= step.fraction <= 1.0:
        raise t.fail("fraction", "must be between 0 and 1")
    return step
