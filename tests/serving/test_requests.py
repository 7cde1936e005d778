"""Malformed requests get a 4xx naming the field, in the API's own error shape; never a 500."""

from __future__ import annotations

import hashlib
import time

import httpx
import orjson
import pytest

from replay.record.requests import parse_request
from replay.record.wire import WireError
from replay.serving.fields import FieldError, RequestFields, load_body
from tests.support.serverkit import Child

pytestmark = pytest.mark.e2e

USER = [{"role": "user", "content": "hi"}]

# (body, the field the error must name): the shapes the field fuzz found giving 500s, and more
OPENAI_BAD = [
    ({"messages": [{"role": "assistant", "content": "x", "tool_calls": "abc"}]}, "messages[0].tool_calls"),
    (
        {"messages": [{"role": "assistant", "content": "x", "tool_calls": ["abc"]}]},
        "messages[0].tool_calls[0]",
    ),
    (
        {"messages": [{"role": "assistant", "content": "x", "tool_calls": [{"function": "abc"}]}]},
        "messages[0].tool_calls[0].function",
    ),
    ({"messages": [{"role": "assistant", "tool_calls": True}]}, "messages[0].tool_calls"),
    ({"messages": USER, "tools": [1, None]}, "tools[0]"),
    ({"messages": USER, "tools": 5}, "tools"),
    ({"messages": 7}, "messages"),
    ({"messages": [3]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": USER, "stream": "false"}, "stream"),
    ({"messages": USER, "max_tokens": -1}, "max_tokens"),
    ({"messages": USER, "max_tokens": "10"}, "max_tokens"),
    ({"messages": USER, "max_tokens": 2**63}, "max_tokens"),
    ({"messages": USER, "max_tokens": 2.5}, "max_tokens"),
    ({"messages": USER, "temperature": "hot"}, "temperature"),
    ({"messages": USER, "model": 5}, "model"),
]
ANTHROPIC_BAD = [
    (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
        "messages[0].content[0].text",
    ),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    (
        {"messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": 3}]}]},
        "messages[0].content[0].name",
    ),
    ({"messages": USER, "system": 5}, "system"),
    ({"messages": USER, "tools": 5}, "tools"),
    ({"messages": USER, "stream": "true"}, "stream"),
    ({"messages": USER, "max_tokens": 1e30}, "max_tokens"),
]

RESPONSES_BAD = [
    ({"input": 5}, "input"),
    ({"input": [3]}, "input[0]"),
    ({"input": [{"role": "wizard", "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": 5}]}, "input[0].content"),
    (
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]},
        "input[0].content[0].text",
    ),
    ({"input": [{"type": 7, "role": "user", "content": "x"}]}, "input[0].type"),
    (
        {"input": [{"type": "function_call", "call_id": 1, "name": "f", "arguments": "{}"}]},
        "input[0].call_id",
    ),
    ({"input": [{"type": "function_call", "call_id": "c", "name": ["f"]}]}, "input[0].name"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": {"a": 1}}]}, "input[0].output"),
    ({"input": "hi", "tools": 5}, "tools"),
    ({"input": "hi", "tools": ["x"]}, "tools[0]"),
    ({"input": "hi", "tools": [{"type": "function", "name": 3}]}, "tools[0].name"),
    ({"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": "x"}]}, "tools[0].parameters"),
    ({"input": "hi", "instructions": ["x"]}, "instructions"),
    ({"input": "hi", "previous_response_id": 5}, "previous_response_id"),
    ({"input": "hi", "reasoning": "high"}, "reasoning"),
    ({"input": "hi", "reasoning": {"effort": 1}}, "reasoning.effort"),
    ({"input": "hi", "stream": "false"}, "stream"),
    ({"input": "hi", "store": "no"}, "store"),
    ({"input": "hi", "max_output_tokens": -1}, "max_output_tokens"),
    ({"input": "hi", "max_output_tokens": "10"}, "max_output_tokens"),
    ({"input": "hi", "max_output_tokens": 2**63}, "max_output_tokens"),
    ({"input": "hi", "max_output_tokens": 2e9}, "max_output_tokens"),
    ({"input": "hi", "max_tokens": 2**40}, "max_tokens"),
    ({"input": "hi", "temperature": "hot"}, "temperature"),
    ({"input": "hi", "model": 5}, "model"),
]


def _post(base: str, path: str, body: object) -> httpx.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    return httpx.post(base + path, content=content, headers={"content-type": "application/json"})


@pytest.mark.parametrize(("body", "field"), OPENAI_BAD)
def test_simulator_refuses_malformed_openai_requests_naming_the_field(sim: Child, body, field):
    r = _post(sim.url, "/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert f"'{field}'" in error["message"] and error["type"] == "invalid_request_error"
    assert "\n" not in r.text


@pytest.mark.parametrize(("body", "field"), ANTHROPIC_BAD)
def test_simulator_refuses_malformed_anthropic_requests_in_anthropic_shape(sim: Child, body, field):
    r = _post(sim.url, "/v1/messages", body)
    assert r.status_code == 400, r.text
    obj = r.json()
    assert obj["type"] == "error" and obj["error"]["type"] == "invalid_request_error"
    assert f"'{field}'" in obj["error"]["message"]


@pytest.mark.parametrize(("body", "field"), RESPONSES_BAD)
def test_simulator_refuses_malformed_responses_requests_naming_the_field(sim: Child, body, field):
    r = _post(sim.url, "/v1/responses", {"model": "m", **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert f"'{field}'" in error["message"] and error["type"] == "invalid_request_error"
    assert error["param"] == field and "\n" not in r.text


def test_responses_max_output_tokens_is_bounded_by_the_context_and_stream_is_a_boolean(sim: Child):
    ctx = httpx.get(sim.url + "/v1/models").json()["data"][0]["context_length"]
    r = _post(sim.url, "/v1/responses", {"input": "hi", "max_output_tokens": ctx + 1})
    assert r.status_code == 400 and r.json()["error"]["message"] == (
        f"'max_output_tokens' must be an integer from 0 to {ctx} (the context size), got {ctx + 1}"
    )
    ok = _post(sim.url, "/v1/responses", {"input": "hi", "max_output_tokens": 3, "stream": False})
    assert ok.status_code == 200 and ok.headers["content-type"].startswith("application/json")
    assert ok.json()["usage"]["output_tokens"] == 3


def test_max_tokens_is_bounded_by_the_context_with_a_clear_message(sim: Child):
    ctx = httpx.get(sim.url + "/v1/models").json()["data"][0]["context_length"]
    huge = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1' + b"0" * 30 + b"}"
    r = _post(sim.url, "/v1/chat/completions", huge)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == (
        f"'max_tokens' must be an integer from 0 to {ctx} (the context size), got 1e+30"
    )
    assert (
        _post(sim.url, "/v1/chat/completions", {"messages": USER, "max_tokens": ctx + 1}).status_code == 400
    )
    ok = _post(sim.url, "/v1/chat/completions", {"messages": USER, "max_tokens": 3})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3


def test_stream_false_is_a_boolean_and_does_not_stream(sim: Child):
    r = _post(sim.url, "/v1/chat/completions", {"messages": USER, "max_tokens": 2, "stream": False})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    r = _post(sim.url, "/v1/chat/completions", {"messages": USER, "max_tokens": 2, "stream": "false"})
    assert r.status_code == 400


@pytest.mark.parametrize("method", ["OPTIONS", "FOO", "PUT", "TRACE"])
def test_unknown_methods_get_405_in_json(sim: Child, method: str):
    for path in ("/v1/chat/completions", "/v1/messages", "/health", "/nowhere"):
        r = httpx.request(method, sim.url + path)
        assert r.status_code in (404, 405) if method == "PUT" else r.status_code == 405, (
            method,
            path,
            r.text,
        )
        assert "error" in r.json()
    r = httpx.request("OPTIONS", sim.url + "/v1/chat/completions")
    assert r.status_code == 405 and "POST" in r.headers["allow"]


def test_both_servers_publish_an_openapi_schema(sim: Child, proxy: Child):
    doc = httpx.get(sim.url + "/openapi.json").json()
    assert doc["openapi"].startswith("3.") and "/v1/chat/completions" in doc["paths"]
    body = doc["paths"]["/v1/messages"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["required"] == ["messages"]
    responses = doc["paths"]["/v1/responses"]["post"]
    assert "400" in responses["responses"]
    fields = responses["requestBody"]["content"]["application/json"]["schema"]["properties"]
    assert {"input", "instructions", "previous_response_id", "max_output_tokens", "stream"} <= set(fields)
    pdoc = httpx.get(proxy.url + "/_replay/openapi.json").json()
    assert (
        "/s/{session}/v1/messages" in pdoc["paths"]
        and "502" in pdoc["paths"]["/v1/messages"]["post"]["responses"]
    )


def test_the_proxy_passes_the_simulators_refusals_through_and_records_them_as_rejected(proxy: Child):
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": 5}]})
    r = httpx.post(proxy.url + "/v1/messages", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "'messages[0].content'" in r.json()["error"]["message"]
    digest = hashlib.sha256(body).hexdigest()
    deadline = time.monotonic() + 10  # the line is written once the reply has gone to the agent
    while True:
        lines = [orjson.loads(line) for line in proxy.trace.read_bytes().splitlines()]  # type: ignore[attr-defined]
        rejected = [line for line in lines if line["kind"] == "rejected" and line["sha256"] == digest]
        if rejected or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert rejected and rejected[0]["status"] == 400 and rejected[0]["bytes"] == len(body)
    assert "Traceback" not in proxy.log()


# --- the accessors and the recorder's own parser --------------------------------------------------


@pytest.mark.parametrize(("body", "field"), OPENAI_BAD)
def test_every_recorder_error_names_the_field_openai(body, field):
    if field in ("messages[0].role",):
        with pytest.raises(WireError, match=r"messages\[0\]\.role"):
            parse_request("openai", orjson.dumps(body))
        return
    if field in ("model",):  # the recorder keeps any model name it can, it is only a label
        parse_request("openai", orjson.dumps(body))
        return
    with pytest.raises(WireError) as err:
        parse_request("openai", orjson.dumps(body))
    assert f"'{field}'" in str(err.value) or (field == "max_tokens" and "'max_tokens'" in str(err.value))


@pytest.mark.parametrize(("body", "field"), ANTHROPIC_BAD)
def test_every_recorder_error_names_the_field_anthropic(body, field):
    with pytest.raises(WireError) as err:
        parse_request("anthropic", orjson.dumps(body))
    assert f"'{field}'" in str(err.value)


def test_fields_name_nested_paths_and_refuse_look_alikes():
    f = RequestFields({"a": {"b": [{"c": "x"}, 5]}, "flag": "false", "n": 2.5, "big": 2**60})
    with pytest.raises(FieldError, match=r"'a\.b\[1\]' must be an object, got 5"):
        f.obj("a").objects("b")  # type: ignore[union-attr]
    with pytest.raises(FieldError, match="'flag' must be true or false"):
        f.boolean("flag")
    with pytest.raises(FieldError, match="'n' must be an integer"):
        f.count("n")
    with pytest.raises(FieldError, match="'big' must be an integer from 0 to 100 .ctx."):
        f.count("big", 100, "ctx")
    with pytest.raises(FieldError, match="'missing' is required"):
        f.items("missing", required=True)
    assert f.text("absent") is None and f.objects("absent") == []
    with pytest.raises(FieldError, match="not valid JSON"):
        load_body(b"{")
    with pytest.raises(FieldError, match="the request body must be an object, got \\[1\\]"):
        load_body(b"[1]")
