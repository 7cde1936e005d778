"""Whole runs against a server that answers with any JSON anywhere: one results line per request,
the run completes, and its summary and metrics lines are written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from replay.cli import app
from tests.support.replies import body_bytes, stream_frames
from tests.support.scripted_server import Script, ScriptedServer
from tests.support.trace_strategies import write_trace

pytestmark = pytest.mark.e2e


def three_requests(api: str, stream: bool) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = [
        {"kind": "trace", "format": "agent-replay-trace/1"},
        {"kind": "session", "id": "s", "api": api, "model": "m"},
    ]
    for rid in (1, 2, 3):
        req: dict[str, Any] = {
            "kind": "request",
            "id": rid,
            "session": "s",
            "t": 0,
            "append": [{"role": "user", "content": f"turn {rid}"}],
            "params": {"max_tokens": 8, "stream": stream},
        }
        if rid > 1:
            req.update(
                parent=rid - 1, keep=1, append=[{"$reply": rid - 1}, {"role": "user", "content": "go"}]
            )
        lines.append(req)
    return lines


def run(trace: Path, url: str, out: Path) -> tuple[int, list[dict[str, Any]]]:
    result = CliRunner().invoke(
        app, ["run", str(trace), "--target", url, "--out", str(out), "--quiet", "--timeout", "10"]
    )
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.exit_code, [orjson.loads(line) for line in out.read_bytes().splitlines()]


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(api=st.sampled_from(["openai", "anthropic", "openai-responses"]), stream=st.booleans(), data=st.data())
def test_any_json_anywhere_in_a_reply_leaves_one_line_per_request(
    scripted_server: ScriptedServer,
    tmp_path_factory: pytest.TempPathFactory,
    api: str,
    stream: bool,
    data: Any,
) -> None:
    scripted_server.reset()
    bad = data.draw(stream_frames(api)) if stream else [data.draw(body_bytes(api))]
    # The middle request gets the drawn reply; the others a normal one.
    scripted_server.queue.extend([Script(), Script(raw=bad), Script()])
    folder = tmp_path_factory.mktemp("run")
    trace = write_trace(folder / "t.jsonl", three_requests(api, stream))
    code, rows = run(trace, scripted_server.url, folder / "results.jsonl")
    requests = [r for r in rows if r["kind"] == "request"]
    assert [r["id"] for r in requests] == [1, 2, 3]
    assert requests[0]["status"] == requests[2]["status"] == "ok"
    second = requests[1]
    event(f"middle request: {second['status']}")
    assert second["status"] in ("ok", "bad_payload", "stream_broken", "server_error"), second
    if second["status"] == "bad_payload":
        assert second["error"] and "wrong reply shape" in second["error"] and second.get("evidence")
    assert code == (0 if second["status"] == "ok" else 1)
    assert sum(1 for r in rows if r["kind"] == "summary") == 1
    assert sum(1 for r in rows if r["kind"] == "metrics") == 1
