"""What each CLI verb does: one module per verb group, each verb taking one keyword-only options
object (`RunArgs`, `AbArgs`, ...) that `replay.cli` fills from the command line.

This is the glue between options and the packages below (runs, report, record, sizing, sim):
it decides what to print, the packages decide what happens.
"""

from __future__ import annotations

import sys

import orjson


def print_json(doc: object) -> None:
    """Machine-readable output (`--json`) on stdout, indented."""
    sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
