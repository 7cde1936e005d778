"""The twin suite in CI (issue #34 item 5): every trace of tests/support/twin_suite.py through
`replay twin` on the real llama-server (xllamacpp, the generated tiny llama and gemma2) and on the
model configured from the server's startup log and /props. Per trace the agreement (requests whose
re-processed tokens are equal) must reach 0.99; the README lists each trace's figure.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from drivers.target import load_target
from replay.runs.twin import twin_live
from replay.twin.compare import render
from tests.support.llamakit import require_xllamacpp
from tests.support.twin_suite import CASES, server_toml, write_trace

pytestmark = [pytest.mark.e2e, pytest.mark.llama]


def _real(doc: dict[str, Any], key: str) -> list[Any]:
    return [r["real"][key] for r in doc["rows"]]


def _compacted(doc: dict[str, Any]) -> bool:
    """A request of a session, shorter than its last one, that finds only part of it (the system
    prompt) in the slot."""
    last: dict[str, int] = {}
    seen = False
    for r in doc["rows"]:
        s, prompt, cached = r["session"], r["prompt"], r["real"]["cached"]
        if s in last and prompt < last[s] and cached is not None and 2 < cached < prompt:
            seen = True
        last[s] = prompt
    return seen


def _restored_after_restart(doc: dict[str, Any]) -> bool:
    """The server restarted before a request, its slot restored from the file (with the context
    checkpoints this build appends to it), and that request resumed from a restored checkpoint."""
    lines = [orjson.loads(x) for x in Path(doc["real"]["results"]).read_bytes().splitlines() if x.strip()]
    restarts = [x for x in lines if x.get("kind") == "probe_restart" and x["restore"].get("n_restored")]
    from_file = [
        x
        for x in lines
        if x.get("kind") == "server" and x.get("event") == "restore" and x.get("source") == "slot_file"
    ]
    rows = {r["id"]: r["real"] for r in doc["rows"]}
    return (
        len(restarts) == 1
        and len(from_file) == 1
        and from_file[0]["checkpoints"] > 0
        and rows[restarts[0]["before_request"]]["checkpoints_used"] > 0
        and rows[restarts[0]["before_request"]]["cached"] > 0
    )


# What each trace is there for, seen on the real server (so a trace that stops exercising its rule
# fails here rather than agreeing about nothing).
SHOWS: dict[str, Callable[[dict[str, Any]], bool]] = {
    "host restores": lambda d: sum(_real(d, "restores")) > 0,
    "no restores": lambda d: sum(_real(d, "restores")) == 0,
    "evictions": lambda d: sum(_real(d, "evictions")) > 0,
    "2 slots": lambda d: set(_real(d, "slot")) == {0, 1},
    "4 slots": lambda d: set(_real(d, "slot")) == {0, 1, 2, 3},
    "compacted prompt keeps its system prompt": _compacted,
    "checkpoint restores": lambda d: sum(_real(d, "checkpoints_used")) > 0,
    "restart, slot restored with its checkpoints": _restored_after_restart,
}


@pytest.fixture(scope="module")
def models(tiny_llama: Path, tiny_gemma2: Path) -> dict[str, Path]:
    require_xllamacpp()
    return {"llama": tiny_llama, "gemma2": tiny_gemma2}


@pytest.mark.parametrize("name", list(CASES))
def test_twin_agrees_with_the_real_server(name: str, models: dict[str, Path], tmp_path: Path) -> None:
    case = CASES[name]
    trace = write_trace(tmp_path / "trace.jsonl", case.build)
    target = load_target(server_toml(tmp_path / "server.toml", models[case.model], case.flags))
    doc, _ = twin_live(target, trace, tmp_path / "twin", 120.0, lambda _m: None)
    shown = "\n".join(render(doc))
    print(f"\n{name}: agreement {doc['agreement']:.3f} ({doc['equal']}/{doc['requests']})\n{shown}")
    assert all(r["real"]["status"] == "ok" and r["model"]["status"] == "ok" for r in doc["rows"])
    assert doc["agreement"] >= 0.99, shown
    assert SHOWS[case.shows](doc), f"{name}: the real server did not show {case.shows}\n{shown}"
