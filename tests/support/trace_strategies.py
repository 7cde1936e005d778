"""Valid traces drawn from FORMAT.md's schema, and one-position mutations of them."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
from hypothesis import strategies as st

from tests.support.replies import positions

# Values that are wrong in many places, and any JSON besides.
NASTY = st.sampled_from(
    [
        None,
        True,
        False,
        -1,
        0,
        1,
        1.5,
        1e308,
        -5,
        2**53,
        2**63,
        "x",
        "",
        "a\nb\r",
        [],
        [1],
        {},
        {"a": 1},
        {"$blob": "nope"},
    ]
)
SMALL_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda c: st.lists(c, max_size=2) | st.dictionaries(st.text(max_size=4), c, max_size=2),
    max_leaves=4,
)
TOOLS = [
    {"type": "function", "function": {"name": "bash", "description": "run", "parameters": {"type": "object"}}}
]
# Seconds between requests: an agent's next call, or the next session months later (a store that
# spans years imports whole: four gaps stay below the bound of 10^9 s).
GAPS = st.floats(0, 3) | st.floats(0, 2.4e8)


@st.composite
def trace_lines(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A valid trace: 1-2 sessions, 1-5 requests chaining with parent/keep/append."""
    lines: list[dict[str, Any]] = [
        {
            "kind": "trace",
            "format": "agent-replay-trace/1",
            "created": "2026-12-01",
            "source": "sample",
            "notes": "",
        }
    ]
    sessions = ["a", "b"][: draw(st.integers(1, 2))]
    for sid in sessions:
        lines.append(
            {
                "kind": "session",
                "id": sid,
                "role": "interactive",
                "api": draw(st.sampled_from(["openai", "anthropic"])),
                "model": "m",
                "labels": {},
            }
        )
    lines.append({"kind": "blob", "id": "tools", "value": TOOLS})
    last: dict[str, tuple[int, int]] = {}  # session -> (request id, its message count)
    t = 0.0
    for rid in range(1, draw(st.integers(1, 5)) + 1):
        sid = draw(st.sampled_from(sessions))
        req: dict[str, Any] = {"kind": "request", "id": rid, "session": sid, "t": t}
        t += draw(GAPS)
        if sid in last:
            parent, n = last[sid]
            keep = draw(st.integers(0, n)) if draw(st.booleans()) else n
            req.update(parent=parent, keep=keep)
            append: list[Any] = [{"$reply": parent}] if keep == n else []
            append.append(
                {"role": "user", "content": {"synth": {"tokens": draw(st.integers(1, 40)), "seed": rid}}}
            )
        else:
            append = [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"synth": {"tokens": 20, "seed": 1}}, "hello"]},
            ]
            keep = 0
        req["append"] = append
        req["params"] = {
            "max_tokens": draw(st.integers(1, 12)),
            "temperature": 0,
            "stream": draw(st.booleans()),
        }
        if draw(st.booleans()):
            req["params"]["tools"] = {"$blob": "tools"}
        calls = [{"id": f"c{rid}", "name": "bash", "arguments": "{}"}] if draw(st.booleans()) else []
        message: dict[str, Any] = {"role": "assistant", "content": "ok"}
        if calls:
            message["tool_calls"] = calls
        req["reply"] = {
            "message": message,
            "finish": "tool_calls" if calls else "stop",
            "output_tokens": draw(st.integers(1, 8)),
        }
        req["usage"] = {"prompt_tokens": 50, "cached_tokens": 10, "output_tokens": 3}
        if sid in last:
            req["after"] = {"request": last[sid][0], "delay_s": draw(GAPS)}
        req["tag"] = draw(st.sampled_from(["turn", "compaction", "cron"]))
        last[sid] = (rid, keep + len(append))
        if calls:  # the tool's answer rides on the next request of the session
            pass
        lines.append(req)
    return lines


@st.composite
def mutated_trace(draw: st.DrawFn) -> tuple[list[dict[str, Any]], int]:
    """A valid trace with one position of one line changed; returns (lines, 1-based line mutated)."""
    lines = copy.deepcopy(draw(trace_lines()))
    index = draw(st.integers(0, len(lines) - 1))
    line = lines[index]
    path = draw(st.sampled_from(positions(line)))
    new = draw(NASTY | SMALL_JSON)
    if not path:
        lines[index] = new
        return lines, index + 1
    parent: Any = line
    for key in path[:-1]:
        parent = parent[key]
    if isinstance(parent, dict) and draw(st.booleans()) and path[-1] != "kind":
        del parent[path[-1]]
    else:
        parent[path[-1]] = new
    return lines, index + 1


def write_trace(path: Path, lines: list[Any]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    return path
