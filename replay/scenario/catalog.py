"""Where the built-in scenarios live, and finding one by name or by path.

The specs are the TOML files in the repository's `traces/scenarios/`; a NAME that ends in `.toml`
or contains a slash is read as a path instead, so users can keep their own specs anywhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from replay.errors import UsageError
from replay.scenario.spec import Scenario, load_spec

SCENARIOS_DIR = Path(__file__).resolve().parents[2] / "traces" / "scenarios"


def spec_paths(directory: Path = SCENARIOS_DIR) -> list[Path]:
    return sorted(directory.glob("*.toml"))


def list_scenarios(directory: Path = SCENARIOS_DIR) -> list[Scenario]:
    """Every built-in spec, loaded (so a broken one fails here, with its file and line)."""
    return [load_spec(p) for p in spec_paths(directory)]


def find_scenario(
    name: str, params: dict[str, Any] | None = None, directory: Path = SCENARIOS_DIR
) -> Scenario:
    if name.endswith(".toml") or "/" in name:
        return load_spec(name, params)
    path = directory / f"{name}.toml"
    if not path.exists():
        known = ", ".join(p.stem for p in spec_paths(directory)) or "none"
        raise UsageError(f"no scenario {name!r} (built in: {known}; or give a path to a .toml spec)")
    return load_spec(path, params)
