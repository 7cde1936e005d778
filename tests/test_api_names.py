"""One set of API names everywhere a request's API is named: the engine's registry, the trace
format, the thinking switches and the recording proxy's routes. A name added to one of them and
not the others fails here, before a trace names an API the engine cannot send or the proxy records
a route the engine cannot replay."""

from __future__ import annotations

import httpx
import orjson
import pytest

from replay.engine.apis import APIS as ENGINE_APIS
from replay.engine.apis import THINK_FIELDS, ApiCall
from replay.record.proxy import RECORDED_ROUTES
from replay.record.requests import parse_request
from replay.trace.model import APIS as TRACE_APIS

pytestmark = pytest.mark.anyio

NAMES = {
    "the engine's registry (replay.engine.apis.APIS)": set(ENGINE_APIS),
    "the trace format (replay.trace.model.APIS)": set(TRACE_APIS),
    "the thinking switches (replay.engine.exchange.THINK_FIELDS)": set(THINK_FIELDS),
    "the proxy's recorded routes (replay.record.proxy.RECORDED_ROUTES)": set(RECORDED_ROUTES.values()),
}


def test_every_list_of_api_names_holds_the_same_names() -> None:
    every = set().union(*NAMES.values())
    missing = {where: sorted(every - names) for where, names in NAMES.items() if every - names}
    assert not missing, f"API names missing: {missing}"
    assert len(TRACE_APIS) == len(set(TRACE_APIS))


def test_each_api_switches_thinking_every_way() -> None:
    for api, switches in THINK_FIELDS.items():
        assert set(switches) == {"off", "on", "auto"}, api
        assert switches["auto"] == {}, api  # "auto" leaves the server's default alone


@pytest.mark.parametrize("api", sorted(ENGINE_APIS))
async def test_the_engine_posts_each_api_to_a_route_the_proxy_records_as_that_api(api: str) -> None:
    """The engine's request goes to a path the proxy maps back to the same API, in a body the
    proxy's request parser for that API reads."""
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(400, json={"error": {"message": "only looking"}})

    call = ApiCall(
        base_url="https://replay.test",
        model="m",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=8,
        think="off",
    )
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        await ENGINE_APIS[api].send(client, call)
    assert len(sent) == 1
    assert RECORDED_ROUTES.get(sent[0].url.path) == api
    parsed = parse_request(api, sent[0].content)
    assert (parsed.api, parsed.model, parsed.messages) == (api, "m", [{"role": "user", "content": "hello"}])
    body = orjson.loads(sent[0].content)
    assert all(body.get(k) == v for k, v in THINK_FIELDS[api]["off"].items())
