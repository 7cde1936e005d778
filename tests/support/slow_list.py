"""Which tests `just test` leaves to `just test-slow`: those that took a worker more than a few
seconds, read from a pytest run's `--durations=0` lines (setup, call and teardown added up).

`just test-profile` runs the whole suite, then `just test`'s tests alone (a module fixture shared
by a listed test and others is then charged to one of those), and rewrites `tests/slow.txt` with
the tests slow in either; the conftest marks them `slow`. Measured, not chosen.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

# `12.34s call     tests/x/test_y.py::test_z[param]`, as pytest's --durations prints it.
DURATION = re.compile(r"^(\d+(?:\.\d+)?)s (?:setup|call|teardown)\s+(\S.*)$")


def durations(lines: Iterable[str]) -> Counter[str]:
    """Seconds per test node id, its setup, call and teardown added up."""
    seconds: Counter[str] = Counter()
    for line in lines:
        if m := DURATION.match(line.rstrip("\n")):
            seconds[m.group(2)] += float(m.group(1))
    return seconds


def slow_tests(lines: Iterable[str], over: float) -> list[str]:
    """The node ids that took `over` seconds or more, slowest first."""
    return [node for node, s in durations(lines).most_common() if s >= over]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="pytest outputs with --durations=0 lines")
    parser.add_argument("--over", type=float, default=2.5, help="seconds of one worker (default 2.5)")
    args = parser.parse_args(argv)
    # Several runs: a test slow in any is slow (a module's shared fixture is charged to the first
    # of its tests a run picks, which moves when that one is listed).
    nodes = sorted(
        {node for run in args.runs for node in slow_tests(Path(run).read_text().splitlines(), args.over)}
    )
    print(
        f"# {len(nodes)} tests over {args.over:g} s of a worker: `just test-slow` runs them, not `just test`."
    )
    print("# Written by `just test-profile` (tests/support/slow_list.py) from --durations=0 runs.")
    print("\n".join(nodes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
