"""The request shapes real agents send, recorded on the simulator and replayed 100% ok.

- Codex's OpenAI Responses API: instructions, developer items, function tools, reasoning settings,
  `store: false` with the whole input resent each turn, then a `previous_response_id` chain.
- Claude Code's Anthropic messages: system blocks with `cache_control`, a `role: "system"` entry
  inside `messages`, `metadata`, `?beta=true`, `HEAD /` first.
- Calls the recorder does not record are counted, logged and written as `unrecorded` lines.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from replay.engine.plans import make_plan
from replay.engine.run import EngineConfig
from replay.metrics.results import read_results
from replay.record.serve import RecordingServer
from replay.record.sessions import SessionInference
from replay.runs.pipeline import run_trace
from replay.runs.targets import open_target, resolve_target
from replay.trace import read_trace, validate

pytestmark = pytest.mark.e2e

TOOL = {
    "type": "function",
    "name": "shell",
    "description": "Run a command",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {
            "command": {"type": "array", "items": {"type": "string"}},
            "workdir": {"type": "string"},
        },
        "required": ["command"],
    },
}
INSTRUCTIONS = "You are a coding agent. Be brief. " * 30


class FixedWall:
    def __call__(self) -> float:
        return 30.0


@contextmanager
def simulator(*args: str) -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="agent-shapes-") as tmp:
        target = resolve_target("sim", None, ["--time-scale", "1000", *args], Path(tmp))
        with open_target(target, Path(tmp)) as served:
            yield served.url


def events(response: httpx.Response) -> list[dict[str, Any]]:
    out, name = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            obj = orjson.loads(line[6:])
            assert obj.get("type") == name  # the event name repeats the type, as OpenAI sends it
            out.append(obj)
    return out


def responses_turn(
    url: str, body: dict[str, Any], **headers: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One streamed Responses call as Codex makes it; returns the final response and its output items."""
    with httpx.stream("POST", f"{url}/v1/responses", json=body, headers=headers, timeout=30) as r:
        assert r.status_code == 200, r.read()
        evs = events(r)
    kinds = [e["type"] for e in evs]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
    items = [e["item"] for e in evs if e["type"] == "response.output_item.done"]
    final = evs[-1]["response"]
    assert final["output"] == items
    return final, items


def codex_like(url: str) -> None:
    """Two turns with the whole input resent (store: false), one turn chained by id (store: true)."""
    base = {
        "model": "gpt-sim",
        "instructions": INSTRUCTIONS,
        "tools": [TOOL],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"summary": "auto"},
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "conv-1",
        "stream": True,
    }
    items: list[dict[str, Any]] = [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "sandbox: read-only"}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list the files"}]},
    ]
    final, out = responses_turn(
        url, {**base, "store": False, "input": items}, **{"X-Replay-Finish": "tool_calls"}
    )
    call = next(i for i in out if i["type"] == "function_call")
    assert call["name"] == "shell" and final["usage"]["input_tokens"] > 0
    items += out
    items.append(
        {"type": "function_call_output", "call_id": call["call_id"], "output": "README.md\nsrc\n" * 20}
    )
    final, out = responses_turn(url, {**base, "store": False, "input": items})
    assert final["usage"]["input_tokens_details"]["cached_tokens"] > 0  # the first turn's prefix was live
    items += out
    items.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "thanks"}]})
    first, _ = responses_turn(url, {**base, "store": True, "input": items})
    nxt = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and now?"}]}]
    chained, _ = responses_turn(
        url, {**base, "store": True, "previous_response_id": first["id"], "input": nxt}
    )
    assert chained["usage"]["input_tokens"] > first["usage"]["input_tokens"]


def claude_code_like(url: str) -> None:
    """HEAD / first, then two turns the way Claude Code 2.1 sends them."""
    assert httpx.head(url + "/", timeout=10).status_code == 200
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; session=abc"},
        {"type": "text", "text": "You are Claude Code. " * 40, "cache_control": {"type": "ephemeral"}},
    ]
    tools = [
        {
            "name": "Read",
            "description": "Read a file",
            "input_schema": {
                "type": "object",
                "properties": {"file_path": {"type": "string"}},
                "required": ["file_path"],
            },
            "cache_control": {"type": "ephemeral"},
        }
    ]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Available agents: general-purpose. Skills: none."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "read the README", "cache_control": {"type": "ephemeral"}}],
        },
    ]
    body = {
        "model": "claude-sim",
        "system": system,
        "tools": tools,
        "messages": messages,
        "max_tokens": 64,
        "metadata": {"user_id": "user_abc_account__session_0f9b2c1d-1111-2222-3333-444455556666"},
        "stream": True,
    }
    headers = {
        "anthropic-version": "2023-06-01",
        "x-api-key": "sk-never-recorded",
        "X-Replay-Finish": "tool_calls",
    }
    with httpx.stream("POST", f"{url}/v1/messages?beta=true", json=body, headers=headers, timeout=30) as r:
        assert r.status_code == 200, r.read()
        evs = events(r)
    start = next(
        e for e in evs if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use"
    )
    use = start["content_block"]
    args = "".join(e["delta"]["partial_json"] for e in evs if e["type"] == "content_block_delta")
    messages[1]["content"][0].pop("cache_control")  # the mark moves to the newest turn
    messages.append(
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": use["id"],
                    "name": use["name"],
                    "input": orjson.loads(args or "{}"),
                }
            ],
        }
    )
    messages.append(
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use["id"], "content": "# README\n" * 30},
                {"type": "text", "text": "go on", "cache_control": {"type": "ephemeral"}},
            ],
        }
    )
    headers.pop("X-Replay-Finish")
    with httpx.stream(
        "POST",
        f"{url}/v1/messages?beta=true",
        json={**body, "messages": messages},
        headers=headers,
        timeout=30,
    ) as r:
        assert r.status_code == 200, r.read()
        assert events(r)[-1]["type"] == "message_stop"


def test_codex_and_claude_code_shapes_record_and_replay_all_ok(tmp_path: Path) -> None:
    trace_path, log = tmp_path / "agents.jsonl", tmp_path / "calls.jsonl"
    with simulator() as sim:
        inference = SessionInference(wall_clock=FixedWall())
        with RecordingServer(sim, trace_path, inference=inference, log=log) as rec:
            codex_like(rec.url)
            claude_code_like(rec.url)
            for probe in ("/v1/props", "/props", "/v1/models"):
                assert httpx.get(rec.url + probe, timeout=10).status_code == 200
            assert httpx.get(rec.url + "/api/tags", timeout=10).status_code == 404  # Ollama's, not ours
            assert httpx.post(rec.url + "/v1/embeddings?key=secret", json={}, timeout=10).status_code == 404
        counts = validate(trace_path)
        assert counts["requests"] == 6 and counts["unrecorded"] == 6
        trace = read_trace(trace_path)
        by_api = {s.api for s in trace.sessions.values()}
        assert by_api == {"openai-responses", "anthropic"}
        codex = [r for r in trace.requests if trace.sessions[r.session].api == "openai-responses"]
        claude = [r for r in trace.requests if trace.sessions[r.session].api == "anthropic"]
        assert len(codex) == 4 and len(claude) == 2
        assert len({r.session for r in codex}) == 1, "the resent and the chained turns are one conversation"

        # Responses: instructions first, the developer item kept, turns merged, settings kept.
        msgs = codex[1].messages()
        assert [m.get("role") for m in msgs[:3]] == ["system", "developer", "user"]
        assert msgs[0]["content"] == INSTRUCTIONS
        assert msgs[3] == {"$reply": codex[0].id} and msgs[4]["role"] == "tool"
        extra = codex[0].params["extra"]
        assert extra["reasoning"] == {"summary": "auto"} and extra["prompt_cache_key"] == "conv-1"
        assert extra["store"] is False and "previous_response_id" not in extra
        assert codex[3].params["previous_response"] == codex[2].id
        assert codex[3].parent is codex[2] and codex[3].keep == codex[2].n_messages
        assert codex[0].reply["finish"] == "tool_calls" and codex[0].usage["prompt_tokens"] > 0
        assert all(not r.is_compaction for r in codex[1:])

        # Anthropic as Claude Code sends it: the inline system entry, cache marks and metadata.
        first, second = claude
        msgs = first.messages()
        assert [m["role"] for m in msgs] == ["system", "system", "system", "user"]
        assert msgs[2].get("inline") is True and not msgs[1].get("inline")
        assert first.params["cache_control"] == [
            {"message": 1, "value": {"type": "ephemeral"}},
            {"message": 3, "value": {"type": "ephemeral"}},
        ]
        assert first.params["tools"][0]["cache_control"] == {"type": "ephemeral"}
        assert first.params["extra"]["metadata"]["user_id"].startswith("user_abc")
        assert second.parent is first and not second.is_compaction
        assert [m["message"] for m in second.params["cache_control"]] == [1, 6]
        assert "sk-never-recorded" not in trace_path.read_text()

        # Nothing lost without a word: the unrecorded calls, and the log of every call.
        lines = {(u["method"], u["path"]): u for u in trace.unrecorded}
        assert set(lines) == {
            ("HEAD", "/"),
            ("GET", "/api/tags"),
            ("GET", "/v1/props"),
            ("GET", "/props"),
            ("GET", "/v1/models"),
            ("POST", "/v1/embeddings"),
        }
        assert lines[("POST", "/v1/embeddings")]["statuses"] == {"404": 1}
        logged = [orjson.loads(line) for line in log.read_text().splitlines()]
        assert len(logged) == 12 and sum(x["recorded"] for x in logged) == 6
        assert all(x["bytes"] > 0 for x in logged if x["method"] != "HEAD")
        assert "secret" not in log.read_text()

        # Replayed on the simulator through the engine: every request ok, the chain re-made.
        with RecordingServer(
            sim, tmp_path / "again.jsonl", inference=SessionInference(wall_clock=FixedWall())
        ) as again:
            config = EngineConfig(base_url=again.url, timeout_s=60.0, run_id="rp")
            outcome = run_trace(
                trace, make_plan("alternate"), config, tmp_path / "results.jsonl", {"kind": "sim"}
            )
        assert outcome.exit_code == 0 and outcome.requests == 6
        rows = read_results(tmp_path / "results.jsonl").requests
        assert all(r["status"] == "ok" for r in rows)
        replayed = read_trace(tmp_path / "again.jsonl")
        chained = [r for r in replayed.requests if r.params.get("previous_response")]
        assert len(chained) == 1  # sent with the id the simulator gave this run's reply
        claude_again = [r for r in replayed.requests if replayed.sessions[r.session].api == "anthropic"]
        assert claude_again[0].params["cache_control"] == first.params["cache_control"]
        assert [m.get("inline") for m in claude_again[0].messages()] == [
            m.get("inline") for m in first.messages()
        ]
