"""The slow list: read from pytest's --durations lines, and naming only tests that exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import slow_node_ids
from tests.support.slow_list import durations, slow_tests

ROOT = Path(__file__).resolve().parent.parent


def test_durations_add_up_setup_call_and_teardown_per_test() -> None:
    lines = [
        "============================= slowest durations ==============================",
        "3.10s call     tests/a/test_x.py::test_one[p q-1]",
        "1.00s setup    tests/a/test_x.py::test_one[p q-1]",
        "0.20s teardown tests/a/test_x.py::test_one[p q-1]",
        "2.49s call     tests/a/test_x.py::test_two",
        "9.00s call     tests/b/test_y.py::test_three",
        "(12 durations < 0.005s hidden.  Use -vv to show these durations.)",
    ]
    assert durations(lines)["tests/a/test_x.py::test_one[p q-1]"] == 4.3
    assert slow_tests(lines, 2.5) == ["tests/b/test_y.py::test_three", "tests/a/test_x.py::test_one[p q-1]"]


def test_every_listed_test_is_a_test_function_of_its_file() -> None:
    """A renamed or removed test leaves no stale line: `just test-profile` rewrites the list."""
    for node in slow_node_ids():
        path, _, name = node.partition("::")
        function = re.sub(r"\[.*\]$", "", name)
        tree = ast.parse((ROOT / path).read_text())
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        assert function in defined, node
