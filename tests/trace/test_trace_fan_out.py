"""Format /2 (`after.spawn`, `after.waits`): written and read; /1 traces still read, and refused
when they use what /1 did not have."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from replay.errors import TraceError
from replay.trace import FORMAT, TraceWriter, read_trace, validate
from replay.trace.model import READS


def _lines(*objs: dict) -> bytes:
    return b"\n".join(orjson.dumps(o) for o in objs) + b"\n"


def _trace(version: str, after: dict | None) -> list[dict]:
    head = {"kind": "trace", "format": version, "created": "", "source": "test", "notes": ""}
    s = {"kind": "session", "id": "a"}
    r1 = {
        "kind": "request",
        "id": 1,
        "session": "a",
        "t": 0,
        "append": [{"role": "user", "content": "x"}],
        "params": {},
    }
    r2 = {
        "kind": "request",
        "id": 2,
        "session": "a",
        "t": 1,
        "append": [{"role": "user", "content": "y"}],
        "params": {},
    }
    if after is not None:
        r2["after"] = after
    return [head, s, r1, r2]


def test_the_writer_writes_format_2_and_both_versions_read() -> None:
    assert FORMAT == "agent-replay-trace/2" and READS == ("agent-replay-trace/1", FORMAT)


def test_v1_traces_still_read(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_bytes(_lines(*_trace("agent-replay-trace/1", {"request": 1, "delay_s": 0.5})))
    assert validate(p)["requests"] == 2
    assert read_trace(p).header.format == "agent-replay-trace/1"


@pytest.mark.parametrize(
    "after", [{"request": 1, "delay_s": 0, "waits": [1]}, {"request": 1, "delay_s": 0, "spawn": True}]
)
def test_v1_refuses_fan_out_fields(tmp_path: Path, after: dict) -> None:
    p = tmp_path / "t.jsonl"
    p.write_bytes(_lines(*_trace("agent-replay-trace/1", after)))
    with pytest.raises(TraceError, match=r"need format agent-replay-trace/2") as err:
        validate(p)
    assert err.value.line == 4


@pytest.mark.parametrize(
    ("after", "problem"),
    [
        ({"request": 1, "delay_s": 0, "waits": []}, "non-empty list"),
        ({"request": 1, "delay_s": 0, "waits": [7]}, "after.waits 7 is not defined"),
        ({"request": 1, "delay_s": 0, "waits": [True]}, "after.waits true is not defined"),
        ({"delay_s": 0, "spawn": True}, "after.spawn must be"),
        ({"request": 1, "delay_s": 0, "spawn": "yes"}, "after.spawn must be"),
    ],
)
def test_v2_checks_fan_out_fields(tmp_path: Path, after: dict, problem: str) -> None:
    p = tmp_path / "t.jsonl"
    p.write_bytes(_lines(*_trace(FORMAT, after)))
    with pytest.raises(TraceError, match=problem):
        validate(p)


def test_v2_round_trip(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    with TraceWriter(p, source="test") as w:
        w.session("a")
        w.session("s", role="subagent")
        r1 = w.request("a", 0, [{"role": "user", "content": "x"}])
        r2 = w.request(
            "s", 0.1, [{"role": "user", "content": "y"}], after={"request": r1, "delay_s": 0, "spawn": True}
        )
        w.request(
            "a", 1, [{"role": "user", "content": "z"}], after={"request": r1, "delay_s": 0.2, "waits": [r2]}
        )
    trace = read_trace(p)
    assert trace.header.format == FORMAT
    assert trace.requests[1].after == {"request": 1, "delay_s": 0, "spawn": True}
    assert trace.requests[2].after == {"request": 1, "delay_s": 0.2, "waits": [2]}
