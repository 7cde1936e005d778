"""The simulator as agents meet it: `/v1/responses`, tool calls from the tool schema, probes.

Run in-process: the app over a real runtime, called through httpx's ASGI transport, so each case is
fast (streams arrive whole, which is all these checks need).
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.sim.model.config import DEFAULT_PRESET, config_for
from replay.sim.server.agentic import AgentOptions, example, tool_choice, tool_rounds
from replay.sim.server.app import create_app
from replay.sim.server.runtime import LogSink, SimRuntime

TOOL = {
    "type": "function",
    "name": "exec_command",
    "parameters": {
        "type": "object",
        "properties": {"cmd": {"type": "string"}, "timeout": {"type": "integer", "minimum": 5}},
        "required": ["cmd", "timeout"],
    },
}


pytestmark = pytest.mark.anyio


class Client:
    """Synchronous-looking calls are awaited: `await c.post(...)`."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.c = client

    async def post(self, path: str, json: Any, **headers: str) -> httpx.Response:
        return await self.c.post(path, json=json, headers=headers)

    async def get(self, path: str) -> httpx.Response:
        return await self.c.get(path)

    async def head(self, path: str) -> httpx.Response:
        return await self.c.head(path)


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    log = LogSink(io.StringIO())
    runtime = SimRuntime(config_for(DEFAULT_PRESET, disk=False), kv_dir=None, time_scale=1000.0, log=log)
    await runtime.start()
    app = create_app(runtime, AgentOptions(tool_call_rate=1.0, tool_call_max=1, seed=3))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as c:
        yield Client(c)
    await runtime.shutdown()
    await runtime.close()


def events(text: str) -> list[dict[str, Any]]:
    out = []
    name = None
    for line in text.splitlines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            obj = orjson.loads(line[6:])
            assert obj["type"] == name
            out.append(obj)
    return out


async def test_responses_stream_follows_openais_event_order_and_tool_calls_fit_the_schema(
    client: Client,
) -> None:
    body = {"model": "m", "instructions": "be brief", "input": "list files", "tools": [TOOL], "stream": True}
    r = await client.post("/v1/responses", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    evs = events(r.text)
    kinds = [e["type"] for e in evs]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert "response.function_call_arguments.delta" in kinds
    assert kinds[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
    final = evs[-1]["response"]
    (call,) = final["output"]
    assert call["type"] == "function_call" and call["name"] == "exec_command"
    args = orjson.loads(call["arguments"])
    assert isinstance(args["cmd"], str) and args["timeout"] >= 5
    assert "".join(e["delta"] for e in evs if e["type"].endswith("arguments.delta")) == call["arguments"]
    usage = final["usage"]
    assert usage["input_tokens"] > 0 and usage["input_tokens_details"]["cached_tokens"] == 0

    # The agent runs the tool and sends the result: one round was the maximum, so it gets text.
    items = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]},
        call,
        {"type": "function_call_output", "call_id": call["call_id"], "output": "a.txt"},
    ]
    r = await client.post("/v1/responses", json={**body, "input": items, "stream": False})
    whole = r.json()
    assert whole["status"] == "completed" and [o["type"] for o in whole["output"]] == ["message"]
    assert whole["usage"]["input_tokens_details"]["cached_tokens"] > 0  # the first turn's prefix was live


async def test_previous_response_id_chains_and_store_false_forgets(client: Client) -> None:
    body = {"model": "m", "input": "hello", "max_output_tokens": 8}
    r = await client.post("/v1/responses", json=body, **{"X-Replay-Finish": "length"})
    first = r.json()
    assert first["status"] == "incomplete" and first["incomplete_details"] == {"reason": "max_output_tokens"}
    r = await client.post(
        "/v1/responses", json={"model": "m", "previous_response_id": first["id"], "input": "and?"}
    )
    second = r.json()
    assert second["usage"]["input_tokens"] > first["usage"]["input_tokens"]
    assert second["usage"]["input_tokens_details"]["cached_tokens"] > 0
    r = await client.post("/v1/responses", json={"model": "m", "input": "x", "store": False})
    unstored = r.json()
    r = await client.post(
        "/v1/responses", json={"model": "m", "previous_response_id": unstored["id"], "input": "y"}
    )
    assert r.status_code == 400 and "not found" in r.json()["error"]["message"]
    assert (await client.post("/v1/responses", json={"model": "m", "input": 3})).status_code == 400


async def test_probes_are_answered_as_llama_cpp_answers_them(client: Client) -> None:
    assert (await client.head("/")).status_code == 200
    props = (await client.get("/v1/props")).json()
    assert props["default_generation_settings"]["n_ctx"] > 0
    assert (await client.get("/props")).json() == props
    for other in ("/api/tags", "/api/v1/models", "/version"):
        assert (await client.get(other)).status_code == 404


async def test_anthropic_accepts_claude_codes_system_entries_in_messages(client: Client) -> None:
    body = {
        "model": "m",
        "max_tokens": 16,
        "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "system", "content": "agents: none"}, {"role": "user", "content": "hi"}],
    }
    r = await client.post("/v1/messages?beta=true", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["stop_reason"] == "end_turn"  # no tools offered: text


# --- tool choice ------------------------------------------------------------------------


def conversation(n: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"task {i}"} for i in range(n)]


def test_tool_calls_come_at_the_rate_fixed_by_the_seed_and_loops_end() -> None:
    opts = AgentOptions(tool_call_rate=0.3, tool_call_max=3, seed=11)
    picks = [tool_choice(opts, conversation(n), [TOOL]) for n in range(1, 401)]
    assert picks == [tool_choice(opts, conversation(n), [TOOL]) for n in range(1, 401)]
    share = sum(p is not None for p in picks) / len(picks)
    assert 0.22 < share < 0.38
    other = AgentOptions(tool_call_rate=0.3, tool_call_max=3, seed=12)
    assert picks != [tool_choice(other, conversation(n), [TOOL]) for n in range(1, 401)]
    # After tool_call_max rounds since the last user message, always text.
    always = AgentOptions(tool_call_rate=1.0, tool_call_max=2)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    rounds = 0
    while (pick := tool_choice(always, msgs, [TOOL])) is not None:
        rounds += 1
        call = {"id": f"c{rounds}", "name": pick[0], "arguments": pick[1]}
        msgs += [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{rounds}", "content": "ok"},
        ]
    assert rounds == 2 == tool_rounds(msgs)
    assert (
        tool_choice(always, msgs, None) is None
        and tool_choice(AgentOptions(), conversation(1), [TOOL]) is None
    )
    only = AgentOptions(tool_call_rate=1.0, tool_names=("nothing-offered",))
    assert tool_choice(only, conversation(1), [TOOL]) is None


# A JSON Schema strategy (the subset tool definitions use) and a checker of the same subset.
_leaf = st.one_of(
    st.just({"type": "string"}),
    st.builds(lambda lo: {"type": "string", "minLength": lo}, st.integers(0, 12)),
    st.builds(
        lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
        st.integers(-50, 50),
        st.integers(0, 9),
    ),
    st.just({"type": "number"}),
    st.just({"type": "boolean"}),
    st.builds(
        lambda vals: {"type": "string", "enum": vals},
        st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=4),
    ),
    st.just({"type": ["string", "null"]}),
)
schemas = st.recursive(
    _leaf,
    lambda inner: st.one_of(
        st.builds(
            lambda items, lo: {"type": "array", "items": items, "minItems": lo}, inner, st.integers(0, 3)
        ),
        st.dictionaries(
            st.sampled_from(["path", "command", "pattern", "a", "b", "limit"]), inner, max_size=4
        ).flatmap(
            lambda props: st.builds(
                lambda req: {"type": "object", "properties": props, "required": req},
                st.lists(
                    st.sampled_from(sorted(props)) if props else st.nothing(),
                    unique=True,
                    max_size=len(props),
                ),
            )
        ),
        st.builds(lambda a, b: {"anyOf": [a, b]}, inner, inner),
    ),
    max_leaves=12,
)


def valid(value: Any, schema: dict[str, Any]) -> bool:
    if "anyOf" in schema:
        return any(valid(value, s) for s in schema["anyOf"])
    if "enum" in schema:
        return value in schema["enum"]
    kinds = schema.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    checks = {
        "string": lambda v: isinstance(v, str) and len(v) >= schema.get("minLength", 0),
        "integer": lambda v: type(v) is int and schema.get("minimum", v) <= v <= schema.get("maximum", v),
        "number": lambda v: type(v) in (int, float),
        "boolean": lambda v: type(v) is bool,
        "null": lambda v: v is None,
        "array": lambda v: (
            isinstance(v, list)
            and len(v) >= schema.get("minItems", 0)
            and all(valid(x, schema["items"]) for x in v)
        ),
        "object": lambda v: (
            isinstance(v, dict)
            and all(k in v for k in schema.get("required", []))
            and all(valid(v[k], schema["properties"][k]) for k in v)
        ),
    }
    return any(checks[k](value) for k in kinds)


@settings(max_examples=300, deadline=None)
@given(schemas)
def test_arguments_are_valid_for_every_drawn_schema(schema: dict[str, Any]) -> None:
    value = example(schema)
    assert valid(value, schema), (schema, value)
    orjson.dumps(value)  # JSON text, as arguments travel
