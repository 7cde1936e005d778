"""Where each number a scenario feeds the model comes from: its `[[inputs]]` rows.

Every input names what it sets, then either the report's words (`source`: the report's file
number and a short quote) or `assumed` (why this value, when no report gives one) with the
`range` a reader should find plausible. `replay scenario show NAME --inputs` prints them with
how far each row of the scenario moves across that range, measured on the model
(`replay.runs.sensitivity`). An input is never chosen because a row then holds: its value comes
from its source, or from the middle of what is plausible.

An input names one of:
* a spec value by its dotted path, as `--param` takes it (`sessions.fin1.start_tokens`,
  `steps.0.gap_s`, `leftovers.1.hits`, `defaults.reply_tokens`), or a `[params]` knob;
* a figure of the simulated server, `sim.FIELD` (`sim.disk_write_gbps`, `sim.prefill_tps`): the
  arms' preset value unless an arm's flags set it, changed with its flag on every arm;
* `run.time_scale`, the wall-clock speed of `scenario run` (no row is judged on it).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SIM_PREFIX = "sim."


@dataclass(frozen=True, slots=True)
class Input:
    name: str
    source: str = ""  # "003: \"...\"": the report's words
    assumed: str = ""  # why this value when no report gives it
    range: tuple[float, float] | None = None  # plausible values, for the sensitivity
    note: str = ""

    @property
    def sim_field(self) -> str | None:
        """The `SimConfig` field of a `sim.` input."""
        return self.name[len(SIM_PREFIX) :] if self.name.startswith(SIM_PREFIX) else None

    @property
    def flag(self) -> str | None:
        """The simulator flag that sets a `sim.` input."""
        field = self.sim_field
        return None if field is None else "--" + field.replace("_", "-")

    @property
    def provenance(self) -> str:
        return self.source if self.source else f"assumed: {self.assumed}"


def spec_value(path: str | Path, name: str, params: dict[str, Any]) -> Any:
    """The value a dotted spec path (or a knob) has in the spec as written; a `"$knob"` value
    reads the knob. None when the spec does not set it."""
    if name in params:
        return params[name]
    node: Any = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    for key in name.split("."):
        if isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        elif isinstance(node, dict) and key in node:
            node = node[key]
        else:
            return None
    if isinstance(node, str) and node.startswith("$"):
        return params.get(node[1:], node)
    return node


def set_to(template: Any, number: float) -> Any:
    """`number` in the shape of the value it replaces: every session of a per-session table
    (`gap_s = {main = 10, fin1 = 10}` -> all the same), an integer where the spec has one."""
    if isinstance(template, dict):
        return {k: set_to(v, number) for k, v in template.items()}
    if isinstance(template, int) and not isinstance(template, bool):
        return int(round(number))
    return float(number)
