"""API clients against the scripted SSE server on 127.0.0.1: timing, content, usage, faults."""

from __future__ import annotations

import asyncio
import socket
import statistics
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import orjson
import pytest

from replay.engine import transport
from replay.engine.apis import APIS, ApiCall, make_client
from replay.metrics.record import RequestRecord
from tests.support.scripted_server import Fault, Script, ScriptedServer

pytestmark = pytest.mark.anyio

API_NAMES = sorted(APIS)
TOOL_CALLS = [
    {"id": "call_1", "name": "read_file", "arguments": '{"path": "src/main.rs", "lines": [1, 20]}'},
    {"id": "call_2", "name": "grep", "arguments": '{"pattern": "fn main", "note": "žluťoučký 🐎"}'},
]
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Open main."},
    {
        "role": "assistant",
        "content": "",
        "reasoning": "the user wants the file",
        "tool_calls": [{"id": "call_0", "name": "read_file", "arguments": '{"path": "main.rs"}'}],
    },
    {"role": "tool", "tool_call_id": "call_0", "content": "fn main() {}"},
    {"role": "user", "content": "And now?"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


@pytest.fixture
async def client() -> AsyncIterator[Any]:
    async with make_client() as c:
        yield c


def make_call(server: ScriptedServer | str, rid: str, **kw: Any) -> ApiCall:
    url = server if isinstance(server, str) else server.url
    kw.setdefault("timeout_s", 5.0)
    kw.setdefault("messages", [{"role": "user", "content": "hello there"}])
    return ApiCall(url, "test-model", max_tokens=32, headers={"X-Request-ID": rid}, **kw)


async def send(client: Any, api: str, call: ApiCall, states: list[str] | None = None) -> RequestRecord:
    return await APIS[api].send(client, call, states.append if states is not None else None)


# --- timing ---------------------------------------------------------------------------

# Events that arrive before the first token and must not stop the TTFT clock.
NOISE = {
    "openai": [
        b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":0}}\n\n',
        b'data: {"choices":[{"index":0,"delta":{"content":""},"finish_reason":null}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{"reasoning_content":null},"finish_reason":null}]}\n\n',
    ],
    "anthropic": [b'event: ping\ndata: {"type":"ping"}\n\n'],
    # Item and part openings, an empty delta, a reasoning summary part without text.
    "openai-responses": [
        b'event: response.output_item.added\ndata: {"type":"response.output_item.added","output_index":0,'
        b'"item":{"id":"msg_0","type":"message","role":"assistant","content":[]}}\n\n',
        b'event: response.content_part.added\ndata: {"type":"response.content_part.added","item_id":"msg_0",'
        b'"output_index":0,"content_index":0,"part":{"type":"output_text","text":""}}\n\n',
        b'data: {"type":"response.output_text.delta","item_id":"msg_0","output_index":0,"delta":""}\n\n',
        b'data: {"type":"response.reasoning_summary_part.added","item_id":"rs_0","output_index":0}\n\n',
    ],
}


@pytest.mark.timing
@pytest.mark.parametrize("api", API_NAMES)
async def test_ttft_within_5ms_of_scripted_delay(
    scripted_server: ScriptedServer, client: Any, api: str
) -> None:
    delay = 0.06
    scripted_server.default = Script(
        first_token_delay_s=delay, keepalives=3, pre_events=NOISE[api], tokens=5, token_interval_s=0.002
    )
    await send(client, api, make_call(scripted_server, "warm-up"))  # first-call costs are not under test
    over_delay, over_truth = [], []
    for i in range(5):
        states: list[str] = []
        res = await send(client, api, make_call(scripted_server, f"ttft-{i}"), states)
        truth = scripted_server.request(f"ttft-{i}")
        assert res.ok, res.error
        assert res.ttft_s is not None and truth.ttft_s is not None
        # Never early: stopping at a keep-alive, role, usage-only or empty chunk would be.
        assert res.ttft_s >= truth.ttft_s >= delay
        assert res.ttft_s < delay + 0.05
        over_delay.append(res.ttft_s - delay)
        over_truth.append(res.ttft_s - truth.ttft_s)
        assert res.n_comments == 3
        assert states == ["waiting", "prefill", "decoding", "done"]
        assert (
            res.t_sent
            < res.t_headers
            <= res.t_first_byte
            < res.t_first_token
            <= res.t_last_token
            <= res.t_end
        )
    # A loaded CI machine stalls the server thread's own sleeps by several ms at times, so
    # the 5 ms bound holds for the best of five; against server truth, for the median.
    # A wrong stamp (late parse, loop lag, connect time) would shift every sample.
    assert min(over_delay) < 0.005, over_delay
    assert statistics.median(over_truth) < 0.002, over_truth


@pytest.mark.parametrize("api", API_NAMES)
async def test_ttft_stops_at_reasoning_or_tool_call(
    scripted_server: ScriptedServer, client: Any, api: str
) -> None:
    delay, gap = 0.04, 0.03
    scripted_server.queue.extend(
        [
            Script(first_token_delay_s=delay, tokens=0, reasoning_tokens=2, token_interval_s=gap),
            Script(first_token_delay_s=delay, tokens=0, tool_calls=TOOL_CALLS[:1], token_interval_s=gap),
        ]
    )
    for rid in ("think", "tool"):
        res = await send(client, api, make_call(scripted_server, rid))
        assert res.ok, res.error
        truth = scripted_server.request(rid)
        assert res.ttft_s >= delay
        # Stamped at the server's first token event, not the one `gap` later.
        assert 0 <= res.t_first_token - truth.first_token_ns < gap * 1e9 / 3, rid


@pytest.mark.timing
@pytest.mark.parametrize("api", API_NAMES)
async def test_concurrent_streams_are_not_queued_in_the_client(
    scripted_server: ScriptedServer, client: Any, api: str
) -> None:
    delay = 0.5  # room for 40 connections on a loaded 2-core machine, far below 40 queued streams
    scripted_server.default = Script(
        first_token_delay_s=delay, keepalives=1, tokens=4, token_interval_s=0.005
    )
    results: dict[str, RequestRecord] = {}

    async def one(rid: str) -> None:
        results[rid] = await send(client, api, make_call(scripted_server, rid))

    async with anyio.create_task_group() as tg:
        for i in range(40):
            tg.start_soon(one, f"c-{i}")
    # All 40 were at the server before it sent any first token: none waited for a pool slot.
    assert max(s.recv_ns for s in scripted_server.seen) < min(s.first_token_ns for s in scripted_server.seen)
    for rid, res in results.items():
        assert res.ok, res.error
        truth = scripted_server.request(rid)
        # Same process, same clock: the client sent before the server got it, and read the
        # first token well within one first-token delay of the server writing it (the
        # server thread shares this process's GIL, so its bursts of 40 writes delay us).
        assert res.t_sent <= truth.recv_ns, rid
        assert 0 <= res.t_first_token - truth.first_token_ns < 200_000_000, rid
        assert res.ttft_s >= delay


@pytest.mark.timing
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="kernel receive stamps are Linux-only")
async def test_ttft_survives_a_blocked_event_loop(scripted_server: ScriptedServer, client: Any) -> None:
    # The token arrives while this loop is frozen (as in a long GC pause); its kernel
    # receive stamp, not the moment we read it, is what TTFT uses.
    delay = 0.05
    scripted_server.default = Script(first_token_delay_s=delay, tokens=3)
    got: dict[str, RequestRecord] = {}

    async def one() -> None:
        got["r"] = await send(client, "openai", make_call(scripted_server, "frozen"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(one)
        await anyio.sleep(0.02)
        time.sleep(0.2)  # noqa: ASYNC251 - blocking the loop is the point
        thawed = time.perf_counter_ns()
    res, truth = got["r"], scripted_server.request("frozen")
    assert res.ok, res.error
    assert truth.first_token_ns < thawed - 100_000_000  # it did arrive mid-freeze
    assert res.t_first_token - truth.first_token_ns < 5_000_000
    assert res.ttft_s < delay + 0.02


async def test_without_kernel_stamps_the_read_callback_stamps(
    scripted_server: ScriptedServer, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transport, "_SO_TIMESTAMPNS", None)  # as on macOS
    scripted_server.default = Script(first_token_delay_s=0.05, tokens=3)
    res = await send(client, "openai", make_call(scripted_server, "no-kernel"))
    truth = scripted_server.request("no-kernel")
    assert res.ok, res.error
    assert 0 <= res.t_first_token - truth.first_token_ns < 10_000_000


@pytest.mark.parametrize("api", API_NAMES)
async def test_decode_rate_from_token_stamps(scripted_server: ScriptedServer, client: Any, api: str) -> None:
    scripted_server.default = Script(tokens=11, token_interval_s=0.01)
    res = await send(client, api, make_call(scripted_server, "rate"))
    assert res.ok, res.error
    truth = scripted_server.request("rate")
    server_decode_s = (truth.last_token_ns - truth.first_token_ns) / 1e9
    assert res.usage.output_tokens == 11
    assert res.decode_s == pytest.approx(server_decode_s, abs=0.005)
    assert res.decode_tps == pytest.approx(10 / server_decode_s, rel=0.1)


# --- what is sent ---------------------------------------------------------------------


async def test_openai_request_body_and_headers(scripted_server: ScriptedServer, client: Any) -> None:
    call = make_call(
        scripted_server,
        "body-1",
        messages=MESSAGES,
        tools=TOOLS,
        temperature=0.0,
        think="off",
        extra_body={"chat_template_kwargs": {"enable_thinking": False, "x": 1}, "seed": 7},
    )
    call.headers["X-Replay-Finish"] = "stop"
    res = await send(client, "openai", call)
    assert res.ok, res.error
    seen = scripted_server.request("body-1")
    body = seen.body
    assert seen.path == "/v1/chat/completions"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 32 and body["temperature"] == 0.0 and body["seed"] == 7
    assert body["thinking"] == {"type": "disabled"}
    assert body["chat_template_kwargs"] == {"enable_thinking": False, "x": 1}  # extra_body wins
    assert body["tools"] == TOOLS
    assistant = body["messages"][2]
    assert "reasoning" not in assistant  # clients do not resend reasoning
    assert assistant["tool_calls"] == [
        {
            "id": "call_0",
            "type": "function",
            "function": {"name": "read_file", "arguments": '{"path": "main.rs"}'},
        }
    ]
    assert body["messages"][3] == MESSAGES[3]
    assert seen.headers["x-replay-finish"] == "stop"
    assert seen.headers["content-type"] == "application/json"


async def test_anthropic_request_body_and_headers(scripted_server: ScriptedServer, client: Any) -> None:
    call = make_call(scripted_server, "body-2", messages=MESSAGES, tools=TOOLS, think="off")
    res = await send(client, "anthropic", call)
    assert res.ok, res.error
    seen = scripted_server.request("body-2")
    body = seen.body
    assert seen.path == "/v1/messages"
    assert seen.headers["anthropic-version"] == "2023-06-01"
    assert body["system"] == "You are terse."
    assert body["thinking"] == {"type": "disabled"}
    assert "stream_options" not in body and "temperature" not in body
    assert body["tools"] == [
        {
            "name": "read_file",
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
            "description": "Read a file",
        }
    ]
    assert body["messages"] == [
        {"role": "user", "content": "Open main."},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "call_0", "name": "read_file", "input": {"path": "main.rs"}}
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_0", "content": "fn main() {}"},
                {"type": "text", "text": "And now?"},
            ],
        },
    ]


async def test_responses_request_body(scripted_server: ScriptedServer, client: Any) -> None:
    messages = [*MESSAGES[:1], {"role": "developer", "content": "sandbox: read-only"}, *MESSAGES[1:]]
    call = make_call(
        scripted_server,
        "body-3",
        messages=messages,
        tools=[*TOOLS, {"type": "custom", "name": "apply_patch", "description": "Patch"}],
        think="off",
        extra_body={"reasoning": {"summary": "auto"}, "store": False, "prompt_cache_key": "k1"},
    )
    res = await send(client, "openai-responses", call)
    assert res.ok, res.error
    seen = scripted_server.request("body-3")
    body = seen.body
    assert seen.path == "/v1/responses"
    assert body["instructions"] == "You are terse." and body["max_output_tokens"] == 32
    assert body["reasoning"] == {"summary": "auto"} and body["prompt_cache_key"] == "k1"
    assert body["store"] is False and "previous_response_id" not in body
    assert body["tools"] == [
        {
            "type": "function",
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
        {"type": "custom", "name": "apply_patch", "description": "Patch"},
    ]
    assert body["input"] == [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "sandbox: read-only"}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Open main."}]},
        {
            "type": "function_call",
            "call_id": "call_0",
            "name": "read_file",
            "arguments": '{"path": "main.rs"}',
        },
        {"type": "function_call_output", "call_id": "call_0", "output": "fn main() {}"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "And now?"}]},
    ]
    # Chained: only what follows the held messages goes, instructions again (they are never inherited).
    chained = make_call(
        scripted_server, "body-4", messages=messages, previous_response_id="resp_1", previous_messages=4
    )
    assert (await send(client, "openai-responses", chained)).ok
    body = scripted_server.request("body-4").body
    assert body["previous_response_id"] == "resp_1" and body["instructions"] == "You are terse."
    assert [i["type"] for i in body["input"]] == ["function_call_output", "message"]


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_tool_types_only_the_responses_api_knows_are_left_out_elsewhere(
    scripted_server: ScriptedServer, client: Any, api: str
) -> None:
    tools = [*TOOLS, {"type": "web_search"}, {"type": "namespace", "name": "multi_agent_v1", "tools": []}]
    res = await send(client, api, make_call(scripted_server, "tool-types", tools=tools))
    assert res.ok, res.error
    sent = scripted_server.request("tool-types").body["tools"]
    assert [t.get("name") or t["function"]["name"] for t in sent] == ["read_file"]


async def test_responses_usage_cached_tokens_and_response_id(
    scripted_server: ScriptedServer, client: Any
) -> None:
    usage = {
        "input_tokens": 5000,
        "input_tokens_details": {"cached_tokens": 4096},
        "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 5003,
    }
    scripted_server.default = Script(usage=usage, extra_final={"x_sim": {"total_s": 0.5}})
    for stream in (True, False):
        res = await send(client, "openai-responses", make_call(scripted_server, f"u{stream}", stream=stream))
        assert res.ok, res.error
        u = res.usage
        assert (u.prompt_tokens, u.cached_tokens, u.output_tokens) == (5000, 4096, 3)
        assert (u.reprocessed_tokens, u.reprocessed_source) == (904, "derived")
        assert res.raw_usage == usage and res.x_sim == {"total_s": 0.5}
        assert res.response_id == "resp_scripted" and res.finish == "stop"


async def test_responses_incomplete_is_length_and_failed_is_a_server_error(
    scripted_server: ScriptedServer, client: Any
) -> None:
    scripted_server.default = Script(finish="length")
    res = await send(client, "openai-responses", make_call(scripted_server, "cap"))
    assert res.ok and res.finish == "length"
    failed = (
        b'event: response.failed\ndata: {"type":"response.failed","response":{"id":"r","status":"failed",'
        b'"error":{"code":"server_error","message":"out of memory"}}}\n\n'
    )
    scripted_server.default = Script(tokens=1, pre_events=[failed])
    res = await send(client, "openai-responses", make_call(scripted_server, "failed"))
    assert res.status == "server_error" and "out of memory" in res.error


async def test_responses_custom_tool_call_keeps_its_free_form_input(
    scripted_server: ScriptedServer, client: Any
) -> None:
    def ev(obj: dict[str, Any]) -> bytes:
        return b"event: " + obj["type"].encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"

    item = {"id": "ct_1", "type": "custom_tool_call", "call_id": "call_9", "name": "apply_patch", "input": ""}
    patch = "*** Begin Patch\n*** End Patch"
    frames = [
        ev({"type": "response.output_item.added", "output_index": 0, "item": item}),
        ev(
            {
                "type": "response.custom_tool_call_input.delta",
                "output_index": 0,
                "item_id": "ct_1",
                "delta": patch,
            }
        ),
        ev({"type": "response.output_item.done", "output_index": 0, "item": {**item, "input": patch}}),
    ]
    scripted_server.default = Script(tokens=0, pre_events=frames)
    res = await send(client, "openai-responses", make_call(scripted_server, "custom"))
    assert res.ok, res.error
    assert res.finish == "tool_calls"
    assert res.message["tool_calls"] == [
        {"id": "call_9", "name": "apply_patch", "arguments": patch, "type": "custom"}
    ]


async def test_anthropic_cache_marks_inline_system_and_tool_marks(
    scripted_server: ScriptedServer, client: Any
) -> None:
    messages = [
        {"role": "system", "content": "billing line"},
        {"role": "system", "content": "You are terse."},
        {"role": "system", "content": "agents: none", "inline": True},
        *MESSAGES[1:],
    ]
    marked_tools = [{**TOOLS[0], "cache_control": {"type": "ephemeral"}}]
    eph = {"type": "ephemeral"}
    call = make_call(
        scripted_server, "marks", messages=messages, tools=marked_tools, cache_marks=[(1, eph), (6, eph)]
    )
    assert (await send(client, "anthropic", call)).ok
    body = scripted_server.request("marks").body
    assert body["system"] == [
        {"type": "text", "text": "billing line"},
        {"type": "text", "text": "You are terse.", "cache_control": eph},
    ]
    assert body["tools"][0]["cache_control"] == eph
    assert body["messages"][0] == {"role": "system", "content": "agents: none"}
    assert body["messages"][-1]["content"][-1] == {"type": "text", "text": "And now?", "cache_control": eph}
    # The chat client knows neither mark: `inline` is not sent, `developer` goes as `system`.
    call = make_call(scripted_server, "plain", messages=[*messages, {"role": "developer", "content": "d"}])
    assert (await send(client, "openai", call)).ok
    sent = scripted_server.request("plain").body["messages"]
    assert all("inline" not in m for m in sent) and sent[-1] == {"role": "system", "content": "d"}


@pytest.mark.parametrize(("api", "think", "expected"), [
    ("openai", "auto", {}),
    ("openai", "on", {"chat_template_kwargs": {"enable_thinking": True}}),
    ("anthropic", "auto", {}),
    ("anthropic", "on", {"thinking": {"type": "enabled", "budget_tokens": 1024}}),
])  # fmt: skip
async def test_think_switches(
    scripted_server: ScriptedServer, client: Any, api: str, think: str, expected: dict[str, Any]
) -> None:
    await send(client, api, make_call(scripted_server, "think", think=think))
    body = scripted_server.request("think").body
    for key in ("thinking", "chat_template_kwargs", "reasoning_effort"):
        assert body.get(key) == expected.get(key)


# --- what comes back ------------------------------------------------------------------


@pytest.mark.parametrize("api", API_NAMES)
@pytest.mark.parametrize("stream", [True, False])
async def test_tool_calls_accumulate(
    scripted_server: ScriptedServer, client: Any, api: str, stream: bool
) -> None:
    scripted_server.default = Script(tokens=2, reasoning_tokens=2, tool_calls=TOOL_CALLS, arg_pieces=4)
    res = await send(client, api, make_call(scripted_server, "tools", stream=stream, tools=TOOLS))
    assert res.ok, res.error
    assert res.finish == "tool_calls"
    assert res.message is not None
    assert res.message["content"] == "tok0 tok1 "
    assert res.message["reasoning"] == "think0 think1 "
    got = res.message["tool_calls"]
    assert [(t["id"], t["name"]) for t in got] == [(t["id"], t["name"]) for t in TOOL_CALLS]
    assert [orjson.loads(t["arguments"]) for t in got] == [orjson.loads(t["arguments"]) for t in TOOL_CALLS]


async def test_openai_tool_deltas_out_of_order_and_repeated_names(
    scripted_server: ScriptedServer, client: Any
) -> None:
    def chunk(tc: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": {"tool_calls": [tc]}}]}) + b"\n\n"

    frames = [
        chunk({"index": 1, "id": "b", "function": {"name": "second", "arguments": '{"y"'}}),
        chunk({"index": 0, "id": "a", "function": {"name": "first", "arguments": ""}}),
        chunk({"index": 0, "function": {"name": "first", "arguments": '{"x": 1}'}}),
        chunk({"index": 1, "function": {"arguments": ": 2}"}}),
    ]
    scripted_server.default = Script(tokens=0, pre_events=frames, finish="tool_calls")
    res = await send(client, "openai", make_call(scripted_server, "ooo"))
    assert res.ok, res.error
    assert res.message["tool_calls"] == [
        {"id": "a", "name": "first", "arguments": '{"x": 1}'},
        {"id": "b", "name": "second", "arguments": '{"y": 2}'},
    ]


async def test_openai_usage_timings_and_x_sim(scripted_server: ScriptedServer, client: Any) -> None:
    usage = {"prompt_tokens": 4104, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 3966}}
    timings = {"prompt_n": 138, "cache_n": 3966, "predicted_n": 3, "prompt_ms": 12.5}
    x_sim = {
        "queue_s": 0.0,
        "prefill_s": 1.5,
        "decode_s": 0.2,
        "total_s": 1.7,
        "cache_source": "live",
        "slot": 0,
    }
    scripted_server.default = Script(usage=usage, timings=timings, extra_final={"x_sim": x_sim})
    res = await send(client, "openai", make_call(scripted_server, "usage"))
    assert res.ok, res.error
    assert (res.usage.prompt_tokens, res.usage.cached_tokens) == (4104, 3966)
    assert (res.usage.reprocessed_tokens, res.usage.reprocessed_source) == (138, "server")
    assert res.timings == timings and res.x_sim == x_sim and res.raw_usage == usage
    assert res.finish == "stop"


async def test_anthropic_usage_merges_start_and_delta(scripted_server: ScriptedServer, client: Any) -> None:
    start = {
        "input_tokens": 0,
        "cache_read_input_tokens": 14336,
        "cache_creation_input_tokens": 10,
        "output_tokens": 0,
    }
    x_sim = {"total_s": 0.5, "cache_source": "disk", "slot": 1}
    scripted_server.default = Script(
        usage=start, final_usage={"output_tokens": 3}, extra_final={"x_sim": x_sim}
    )
    res = await send(client, "anthropic", make_call(scripted_server, "usage"))
    assert res.ok, res.error
    u = res.usage
    assert (u.prompt_tokens, u.cached_tokens, u.cache_write_tokens, u.output_tokens) == (14346, 14336, 10, 3)
    assert (u.reprocessed_tokens, u.reprocessed_source) == (10, "server")
    assert res.x_sim == x_sim
    assert res.finish == "stop"  # end_turn in OpenAI's words


@pytest.mark.parametrize("api", API_NAMES)
async def test_non_stream(scripted_server: ScriptedServer, client: Any, api: str) -> None:
    scripted_server.default = Script(
        first_token_delay_s=0.03, tokens=4, extra_final={"x_sim": {"total_s": 1.0}}
    )
    states: list[str] = []
    res = await send(client, api, make_call(scripted_server, "whole", stream=False), states)
    assert res.ok, res.error
    assert scripted_server.request("whole").body["stream"] is False
    assert res.message == {"role": "assistant", "content": "tok0 tok1 tok2 tok3 "}
    assert res.finish == "stop"
    assert res.usage.output_tokens == 4 and res.x_sim == {"total_s": 1.0}
    assert res.t_first_token is None and res.ttft_s is None
    assert res.latency_s is not None and res.latency_s >= 0.03
    assert states == ["waiting", "prefill", "done"]


@pytest.mark.parametrize("api", API_NAMES)
async def test_stream_answered_with_json_is_read_as_a_whole(
    scripted_server: ScriptedServer, client: Any, api: str
) -> None:
    # A server that ignores `stream` answers with one JSON body; the reply still counts.
    res = await send(client, api, make_call(scripted_server, "json", extra_body={"stream": False}))
    assert res.ok, res.error
    assert res.message is not None and res.message["content"] == "tok0 tok1 tok2 "


# --- faults ---------------------------------------------------------------------------


def assert_names_request(res: RequestRecord, rid: str) -> None:
    assert res.error is not None
    assert f"request {rid} " in res.error, res.error
    assert "\n" not in res.error


FAULTS: list[tuple[Fault, bool, str, str]] = [
    # fault, stream, expected status, words in the error
    ("http_error", True, "http_error", "HTTP 503: scripted failure"),
    ("http_error", False, "http_error", "HTTP 503: scripted failure"),
    ("reset_before_headers", True, "stream_broken", "before response headers"),
    ("reset_before_headers", False, "stream_broken", "before response headers"),
    ("reset_mid_stream", True, "stream_broken", "after "),
    ("reset_mid_stream", False, "stream_broken", "connection failed"),
    ("event_error", True, "server_error", "scripted failure"),
    ("bad_json", True, "stream_broken", "not JSON"),
    ("bad_json", False, "stream_broken", "not JSON"),
    ("hang", True, "timeout", "no complete response after 0.3s"),
    ("hang", False, "timeout", "no complete response after 0.3s"),
    ("hang_mid_stream", True, "timeout", "no complete response after 0.3s"),
]


@pytest.mark.parametrize("api", API_NAMES)
@pytest.mark.parametrize(("fault", "stream", "status", "words"), FAULTS)
async def test_fault_lands_as_status(
    scripted_server: ScriptedServer,
    client: Any,
    api: str,
    fault: Fault,
    stream: bool,
    status: str,
    words: str,
) -> None:
    scripted_server.default = Script(fault=fault, fault_after=2, http_status=503, tokens=5)
    rid = f"{fault}-{stream}"
    states: list[str] = []
    with anyio.fail_after(5):
        res = await send(client, api, make_call(scripted_server, rid, stream=stream, timeout_s=0.3), states)
    assert res.status == status, res.error
    assert words in res.error
    assert_names_request(res, rid)
    assert len([s for s in scripted_server.seen if s.request_id == rid]) == 1  # never re-sent
    assert states[0] == "waiting" and states[-1] == "done"
    assert res.t_end is not None
    if status == "http_error":
        assert res.http_status == 503
    if status == "timeout":
        assert res.latency_s == pytest.approx(0.3, abs=0.1)


@pytest.mark.parametrize("api", API_NAMES)
@pytest.mark.parametrize("fault", ["reset_mid_stream", "event_error", "hang_mid_stream"])
async def test_mid_stream_fault_keeps_what_was_received(
    scripted_server: ScriptedServer, client: Any, api: str, fault: Fault
) -> None:
    scripted_server.default = Script(fault=fault, fault_after=2, tokens=5)
    res = await send(client, api, make_call(scripted_server, "partial", timeout_s=0.3))
    assert not res.ok
    assert res.message is not None and res.message["content"] == "tok0 tok1 "
    assert res.t_first_token is not None and res.n_token_events == 2


@pytest.mark.parametrize("api", API_NAMES)
async def test_stream_without_terminator_is_broken_but_kept(
    scripted_server: ScriptedServer, client: Any, api: str
) -> None:
    scripted_server.default = Script(fault="no_done", tokens=3)
    res = await send(client, api, make_call(scripted_server, "nodone"))
    assert res.status == "stream_broken"
    terminal = {"openai": "[DONE]", "anthropic": "message_stop", "openai-responses": "response.completed"}
    assert terminal[api] in res.error
    assert_names_request(res, "nodone")
    assert res.message is not None and res.message["content"] == "tok0 tok1 tok2 "
    if api == "openai-responses":
        assert res.usage.output_tokens is None  # its usage rides only on the terminal event
    else:
        assert res.usage.output_tokens == 3  # usage that arrived before the cut is kept


@pytest.mark.parametrize("api", API_NAMES)
@pytest.mark.parametrize("timeout_s", [0.2, None])
async def test_body_left_open_after_the_terminal_event_is_still_ok(
    scripted_server: ScriptedServer, client: Any, api: str, timeout_s: float | None
) -> None:
    scripted_server.default = Script(fault="linger", tokens=3)
    with anyio.fail_after(3):
        res = await send(client, api, make_call(scripted_server, "linger", timeout_s=timeout_s))
    assert res.ok, res.error
    assert res.message is not None and res.message["content"] == "tok0 tok1 tok2 "
    assert res.latency_s < 0.1  # t_end is the terminal event, not the end of the wait


@pytest.mark.parametrize("api", API_NAMES)
async def test_connect_error(client: Any, api: str) -> None:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = await send(client, api, make_call(f"http://127.0.0.1:{port}", "nobody"))
    assert res.status == "connect_error"
    assert_names_request(res, "nobody")
    assert res.t_sent is None and res.t_end is not None


@pytest.mark.parametrize("api", API_NAMES)
async def test_slow_stream_times_out_with_partial_reply(
    scripted_server: ScriptedServer, client: Any, api: str
) -> None:
    scripted_server.default = Script(tokens=50, token_interval_s=0.02)
    res = await send(client, api, make_call(scripted_server, "slow", timeout_s=0.25))
    assert res.status == "timeout"
    assert_names_request(res, "slow")
    assert res.message is not None and 5 <= res.n_token_events < 50
    assert res.latency_s == pytest.approx(0.25, abs=0.1)


async def test_caller_cancellation_propagates(scripted_server: ScriptedServer, client: Any) -> None:
    scripted_server.default = Script(fault="hang")
    with anyio.move_on_after(0.2) as scope:
        await send(client, "openai", make_call(scripted_server, "cancel", timeout_s=None))
    assert scope.cancelled_caught


async def test_a_caller_cancellation_with_a_timeout_set_is_not_a_timeout(
    scripted_server: ScriptedServer, client: Any
) -> None:
    scripted_server.default = Script(fault="hang")
    with anyio.move_on_after(0.2) as scope:
        await send(client, "openai", make_call(scripted_server, "cancel", timeout_s=5.0))
    assert scope.cancelled_caught


async def test_a_request_inside_its_timeout_leaves_no_timer_behind(
    scripted_server: ScriptedServer, client: Any
) -> None:
    scripted_server.default = Script(tokens=2)
    res = await send(client, "openai", make_call(scripted_server, "quick", timeout_s=0.1))
    assert res.ok, res.error
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0.2)  # past the timeout: nothing cancels the caller now
    assert task.cancelling() == 0


# --- connections ----------------------------------------------------------------------


@pytest.mark.parametrize("api", API_NAMES)
@pytest.mark.parametrize("close", ["header", "socket"])
async def test_server_closing_after_each_stream_never_fails(
    scripted_server: ScriptedServer, client: Any, api: str, close: str
) -> None:
    # ds4 sends Connection: close; llama-server closes the socket while its headers say keep-alive.
    scripted_server.default = Script(
        tokens=2, connection_close=close == "header", close_after=close == "socket"
    )
    for i in range(50):
        res = await send(client, api, make_call(scripted_server, f"seq-{i}", stream=i % 5 != 4))
        assert res.ok, res.error
    assert len(scripted_server.seen) == 50  # nothing sent twice
    assert len({s.client_port for s in scripted_server.seen}) == 50  # a fresh connection each time
