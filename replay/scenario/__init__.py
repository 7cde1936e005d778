"""Scenario specs (traces/scenarios/*.toml) -> deterministic traces; running their arms on the simulator."""

from replay.scenario.build import GenerateResult, generate, plan_requests, probe_notice, trace_probe_notice
from replay.scenario.catalog import SCENARIOS_DIR, find_scenario, list_scenarios
from replay.scenario.spec import Arm, Scenario, load_spec, parse_params

__all__ = [
    "SCENARIOS_DIR",
    "Arm",
    "GenerateResult",
    "Scenario",
    "find_scenario",
    "generate",
    "list_scenarios",
    "load_spec",
    "parse_params",
    "plan_requests",
    "probe_notice",
    "trace_probe_notice",
]
