"""Property fuzz of both servers as a hostile client would: chat-, messages- and Responses-shaped JSON with any node replaced
by any JSON value, bytes that are not JSON, odd methods and paths. For every generated input: no
5xx, no hang, and the server answers a normal request right after.

The proxy sits in front of the simulator, so its answers are the simulator's (passed through)
plus its own; afterwards its trace must validate and its log hold no recorder error.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay.trace import validate
from tests.support.serverkit import Child

pytestmark = pytest.mark.e2e

SAFE_INT = st.integers(min_value=-(2**63), max_value=2**64 - 1)  # what JSON encoders can write
json_values = st.recursive(
    st.none()
    | st.booleans()
    | SAFE_INT
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
texts = st.text(max_size=40)
content = texts | st.lists(
    texts | st.fixed_dictionaries({"type": st.just("text"), "text": texts}), max_size=3
)
tool_call = st.fixed_dictionaries(
    {
        "id": texts,
        "type": st.just("function"),
        "function": st.fixed_dictionaries({"name": texts, "arguments": st.just('{"a": 1}') | texts}),
    }
)
openai_message = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "developer"]), "content": content}),
    st.fixed_dictionaries(
        {
            "role": st.just("assistant"),
            "content": content | st.none(),
            "tool_calls": st.lists(tool_call, max_size=2),
        }
    ),
    st.fixed_dictionaries({"role": st.just("tool"), "tool_call_id": texts, "content": content}),
)
openai_tool = st.fixed_dictionaries(
    {
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": texts, "description": texts, "parameters": st.just({"type": "object"})}
        ),
    }
)
openai_body = st.fixed_dictionaries(
    {"model": st.just("m"), "messages": st.lists(openai_message, min_size=1, max_size=4)},
    optional={
        "tools": st.lists(openai_tool, max_size=2),
        "max_tokens": st.integers(0, 8),
        "stream": st.booleans(),
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
        "temperature": st.floats(0, 2),
    },
)
block = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": texts}),
    st.fixed_dictionaries({"type": st.just("tool_use"), "id": texts, "name": texts, "input": json_values}),
    st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": texts, "content": content}),
)
anthropic_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant"]), "content": texts | st.lists(block, max_size=3)}
)
anthropic_body = st.fixed_dictionaries(
    {"model": st.just("m"), "messages": st.lists(anthropic_message, min_size=1, max_size=4)},
    optional={
        "system": content,
        "tools": st.lists(
            st.fixed_dictionaries(
                {"name": texts, "description": texts, "input_schema": st.just({"type": "object"})}
            ),
            max_size=2,
        ),
        "max_tokens": st.integers(0, 8),
        "stream": st.booleans(),
    },
)

responses_item = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "developer", "assistant"]), "content": content},
        optional={"type": st.just("message")},
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("function_call"),
            "call_id": texts,
            "name": texts,
            "arguments": st.just('{"a": 1}') | texts,
        }
    ),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": texts, "output": content}),
    st.fixed_dictionaries({"type": st.just("reasoning"), "summary": st.just([])}),
)
responses_body = st.fixed_dictionaries(
    {"model": st.just("m"), "input": texts | st.lists(responses_item, min_size=1, max_size=4)},
    optional={
        "instructions": texts,
        "tools": st.lists(
            st.fixed_dictionaries(
                {
                    "type": st.just("function"),
                    "name": texts,
                    "description": texts,
                    "parameters": st.just({"type": "object"}),
                }
            ),
            max_size=2,
        ),
        "reasoning": st.fixed_dictionaries({"effort": st.sampled_from(["none", "low", "high"])}),
        "max_output_tokens": st.integers(0, 8),
        "stream": st.booleans(),
        "store": st.booleans(),
        "temperature": st.floats(0, 2),
    },
)


def _paths(value: Any, at: tuple = ()) -> list[tuple]:
    out = [at]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*at, i))
    return out


@st.composite
def mutated(draw: st.DrawFn, bodies: st.SearchStrategy[dict]) -> bytes:
    """A valid body, then up to three of its nodes replaced by any JSON value (or deleted)."""
    body = orjson.loads(orjson.dumps(draw(bodies)))  # a copy: `st.just` values are shared
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from(_paths(body)))
        if not path:
            body = draw(json_values)
            continue
        parent = body
        for key in path[:-1]:
            parent = parent[key]
        if isinstance(parent, dict) and draw(st.booleans()):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(json_values)
        if not isinstance(body, dict | list):
            break
    return orjson.dumps(body)


ROUTES = [
    "/v1/chat/completions",
    "/v1/messages",
    "/v1/responses",
    "/v1/models",
    "/health",
    "/stats",
    "/nowhere",
    "/v1/chat/x",
]
request = st.one_of(
    st.tuples(st.just("POST"), st.just("/v1/chat/completions"), mutated(openai_body)),
    st.tuples(st.just("POST"), st.just("/v1/messages"), mutated(anthropic_body)),
    st.tuples(st.just("POST"), st.just("/v1/responses"), mutated(responses_body)),
    st.tuples(st.sampled_from(["POST", "PUT"]), st.sampled_from(ROUTES), st.binary(max_size=64)),
    st.tuples(
        st.sampled_from(["OPTIONS", "FOO", "DELETE", "PATCH", "GET", "HEAD"]),
        st.sampled_from(ROUTES),
        st.just(b""),
    ),
)
NORMAL = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
NORMAL_RESPONSES = orjson.dumps({"model": "m", "input": "hi", "max_output_tokens": 2})


def _exchange(client: httpx.Client, base: str, method: str, path: str, body: bytes) -> int:
    """The status, the whole reply read (a stream to its end) within the client's timeout."""
    with client.stream(method, base + path, content=body, headers={"content-type": "application/json"}) as r:
        for _ in r.iter_raw():
            pass
        return r.status_code


@pytest.mark.parametrize("which", ["sim", "proxy"])
def test_no_generated_request_gets_a_5xx_or_hangs_and_the_server_serves_on(sim: Child, proxy: Child, which):
    server = sim if which == "sim" else proxy
    seen: dict[int, int] = {}
    with httpx.Client(timeout=httpx.Timeout(15.0)) as client:
        # the proxy's examples cost two hops each: fewer of them keep both runs to seconds
        examples = 150 if which == "sim" else 80

        @settings(
            max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None
        )
        @given(request)
        def check(req: tuple[str, str, bytes]) -> None:
            method, path, body = req
            status = _exchange(client, server.url, method, path, body)  # a hang raises ReadTimeout
            seen[status] = seen.get(status, 0) + 1
            assert status < 500, (method, path, body[:300], status)
            assert _exchange(client, server.url, "POST", "/v1/chat/completions", NORMAL) == 200
            if path == "/v1/responses":
                assert _exchange(client, server.url, "POST", path, NORMAL_RESPONSES) == 200

        check()
    assert seen.get(200, 0) and seen.get(400, 0), seen  # both kinds of input were generated
    log = server.log()
    assert "Traceback" not in log and "recorder error" not in log, log[-3000:]
    if which == "proxy":
        assert validate(proxy.trace)["requests"] > 0  # type: ignore[attr-defined]
