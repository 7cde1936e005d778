"""Results files read by `report`: damage is refused at file:line; a last line cut short by a killed
run is reported, not silently dropped."""

from __future__ import annotations

import copy
import io
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from replay.commands.report import ReportArgs
from replay.commands.report import report as report_command
from replay.engine.usage import Usage
from replay.errors import TraceError
from replay.metrics.record import RequestRecord
from replay.metrics.results import ResultsWriter, read_results
from tests.support.replies import positions
from tests.support.trace_strategies import NASTY, SMALL_JSON


def results_lines(tmp: Path) -> list[dict[str, Any]]:
    path = tmp / "base.jsonl"
    writer = ResultsWriter(path, {"target": {"kind": "sim"}})
    for seq, (status, switch) in enumerate(
        [("ok", ("cold",)), ("ok", ("switch",)), ("timeout", ("continue",))], 1
    ):
        rec = RequestRecord(
            seq=seq,
            request_id=seq,
            session="a",
            tag="turn",
            switch=switch,
            from_session=None,
            t_scheduled=seq * 1000,
            t_sent=seq * 1000 + 10,
            t_first_token=seq * 1000 + 5000,
            t_last_token=seq * 1000 + 9000,
            t_end=seq * 1000 + 9500,
            status=status,
            usage=Usage(prompt_tokens=100, cached_tokens=40, reprocessed_tokens=60, output_tokens=4),
        )
        writer.request(rec)
    writer.close({"outcome": "done", "requests": 3, "errors": 1, "cancelled": 0})
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def write(path: Path, lines: list[Any]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    return path


def report(path: Path) -> str:
    out = io.StringIO()
    report_command(ReportArgs(results=[path]), Console(file=out, width=200))
    return out.getvalue()


def test_a_last_line_cut_short_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "r.jsonl", results_lines(tmp_path))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 40])  # the summary line, half written
    assert read_results(path).truncated_line == 5
    report(path)
    assert f"{path}:5: last line cut short" in capsys.readouterr().err


def test_a_bad_line_that_is_not_the_last_is_damage(tmp_path: Path) -> None:
    lines = results_lines(tmp_path)
    path = tmp_path / "r.jsonl"
    path.write_bytes(
        b"".join(orjson.dumps(x) + b"\n" for x in lines[:2]) + b"{oops\n" + orjson.dumps(lines[3]) + b"\n"
    )
    with pytest.raises(TraceError, match=rf"^{path}:3: bad JSON"):
        read_results(path)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_a_mutated_results_file_is_refused_at_a_line_or_reported(tmp_path: Path, data: st.DataObject) -> None:
    lines = copy.deepcopy(results_lines(tmp_path))
    index = data.draw(st.integers(1, len(lines) - 1))
    path_in = data.draw(st.sampled_from(positions(lines[index])))
    new = data.draw(NASTY | SMALL_JSON)
    if not path_in:
        lines[index] = new
    else:
        node: Any = lines[index]
        for key in path_in[:-1]:
            node = node[key]
        node[path_in[-1]] = new
    path = write(tmp_path / "m.jsonl", lines)
    try:
        report(path)
    except TraceError as exc:
        assert str(exc).startswith(f"{path}:{index + 1}: "), exc
