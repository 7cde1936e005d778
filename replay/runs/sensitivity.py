"""How far each row of a scenario moves when an input takes the ends of its plausible range.

Every arm with rows is walked in modelled time (`runs.modelled`) at the input's low and high
end, the rest of the spec as written, and each row is evaluated as `replay scenario check`
evaluates it; a row whose figure changes is reported with its three figures.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replay.runs.leftovers import leftover_count
from replay.runs.modelled import arm_config, model_arm, walkable
from replay.scenario.build import generate, plan_requests
from replay.scenario.check import ArmView, Verdict, evaluate
from replay.scenario.inputs import Input, set_to, spec_value
from replay.scenario.spec import Arm, Scenario


@dataclass(frozen=True, slots=True)
class Move:
    """One row across an input's range: its figure at the low end, as written, at the high end."""

    row: str
    low: str
    base: str
    high: str
    status_low: str
    status_base: str
    status_high: str


def current_value(spec: Scenario, inp: Input) -> Any:
    """The input's value as the spec runs it."""
    if inp.name == "run.time_scale":
        return spec.run.time_scale
    field = inp.sim_field
    if field is not None:
        ds4 = [arm for arm in spec.arms if walkable(arm)]
        values = {repr(getattr(arm_config(arm), field)) for arm in ds4}
        first = getattr(arm_config(ds4[0]), field)
        return first if len(values) == 1 else "per arm: " + ", ".join(sorted(values))
    return spec_value(spec.path, inp.name, spec.params)


def walk_rows(spec: Scenario, workdir: Path, arms: dict[str, Arm] | None = None) -> list[Verdict]:
    """Every row of the spec judged on its arm walked in modelled time (the rows of arms the
    walk does not model, `modelled.walkable`, are left out: they are judged on their run)."""
    verdicts = []
    views: dict[str, ArmView] = {}
    for name in dict.fromkeys(e.arm for e in spec.expects):
        arm = (arms or {}).get(name) or spec.arm(name)
        if not walkable(arm):
            continue
        armed = spec.with_params(arm.params)
        trace = workdir / f"{spec.name}-{name}.trace.jsonl"
        generate(armed, trace)
        labels = {p.rid: p.label for p in plan_requests(armed)}
        views[name] = ArmView(model_arm(armed, arm, trace), leftover_count(armed, list(arm.sim)), labels)
    for e in spec.expects:
        if e.arm in views:
            verdicts.append(evaluate(spec.name, e, views[e.arm]))
    return verdicts


def _at(spec: Scenario, inp: Input, number: float) -> tuple[Scenario, dict[str, Arm]]:
    """The spec with the input set to `number` (and the arms that carry it, for `sim.` inputs)."""
    flag = inp.flag
    if flag is not None:
        arms = {a.name: dataclasses.replace(a, sim=(*a.sim, flag, f"{number:g}")) for a in spec.arms}
        return spec, arms
    template = current_value(spec, inp)
    return spec.with_params({inp.name: set_to(template, number)}), {}


def row_label(v: Verdict) -> str:
    e = v.expect
    return f"{e.arm}: {e.about or e.metric}"


def sensitivity(
    spec: Scenario, inp: Input, base: list[Verdict], say: Callable[[str], None] | None = None
) -> list[Move]:
    """The rows that move when `inp` goes to the ends of its range (none for an input without a
    range, or the wall clock's `run.time_scale`, which no row is judged on)."""
    if inp.range is None or inp.name == "run.time_scale":
        return []
    ends: list[list[Verdict]] = []
    with tempfile.TemporaryDirectory(prefix="replay-inputs-") as scratch:
        for number in inp.range:
            if say is not None:
                say(f"{inp.name} = {number:g}")
            varied, arms = _at(spec, inp, number)
            ends.append(walk_rows(varied, Path(scratch), arms))
    moves = []
    for b, lo, hi in zip(base, ends[0], ends[1], strict=True):
        if lo.modelled != b.modelled or hi.modelled != b.modelled:
            moves.append(
                Move(row_label(b), lo.modelled, b.modelled, hi.modelled, lo.status, b.status, hi.status)
            )
    return moves
