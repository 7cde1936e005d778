"""The proxy under load: 100 concurrent streams, byte for byte, every record intact; added TTFT."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import anyio
import httpx
import orjson
import pytest

from replay.engine.apis import APIS, ApiCall, make_client
from replay.trace import read_trace, validate
from replay.trace.synth import synth_text
from tests.support.recordkit import child, jsonl
from tests.support.scripted_server import Script

N = 100
TOKENS = 20


def body(i: int) -> bytes:
    return orjson.dumps(
        {
            "model": "m",
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": TOKENS,
            "messages": [
                {"role": "system", "content": "shared"},
                {"role": "user", "content": f"stream number {i}"},
            ],
        }
    )


async def fetch(client: httpx.AsyncClient, base: str, i: int) -> bytes:
    headers = {"content-type": "application/json", "x-request-id": f"S{i}"}
    async with client.stream("POST", base + "/v1/chat/completions", content=body(i), headers=headers) as resp:
        assert resp.status_code == 200
        return b"".join([chunk async for chunk in resp.aiter_raw()])


async def fetch_all(base: str) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    async with make_client() as client, anyio.create_task_group() as tg:

        async def one(i: int) -> None:
            out[i] = await fetch(client, base, i)

        for i in range(N):
            tg.start_soon(one, i)
    return out


def test_100_concurrent_streams_are_byte_identical_and_all_recorded(scripted_server, recording):
    for i in range(N):
        scripted_server.by_id[f"S{i}"] = Script(
            first_token_delay_s=0.05, token_interval_s=0.002, tokens=TOKENS, token_text=f"r{i}-", keepalives=2
        )
    direct = anyio.run(fetch_all, scripted_server.url)
    proxied = anyio.run(fetch_all, recording.url)
    assert len(direct) == len(proxied) == N
    for i in range(N):
        assert b": prefill" in direct[i] and f"r{i}-{TOKENS - 1} ".encode() in direct[i]
        assert proxied[i] == direct[i], f"stream {i} differs through the proxy"
    recording.stop()

    assert validate(recording.out)["requests"] == N
    lines = [x for x in jsonl(recording.out) if x["kind"] == "request"]
    assert sorted(x["id"] for x in lines) == list(range(1, N + 1))
    trace = read_trace(recording.out)
    seen = set()
    for req in trace.requests:
        msgs = req.messages()
        i = int(str(msgs[-1]["content"]).rsplit(" ", 1)[1])
        seen.add(i)
        assert req.reply["status"] == "ok"
        assert req.reply["message"]["content"] == "".join(f"r{i}-{k} " for k in range(TOKENS))
        assert req.reply["finish"] == "stop" and req.usage["output_tokens"] == TOKENS
        assert 0.05 <= req.reply["first_token_s"] <= req.reply["last_byte_s"]
    assert seen == set(range(N))
    # Sharing a system prompt makes none of them a continuation (or compaction) of another.
    assert len(trace.sessions) == N


async def ttfts(direct: str, proxied: str, n: int, history: list[dict]) -> tuple[list[float], list[float]]:
    out: dict[str, list[float]] = {direct: [], proxied: []}
    async with make_client() as client:
        for i in range(n):
            for base in (direct, proxied) if i % 2 else (proxied, direct):
                msgs = [*history, {"role": "user", "content": f"q{i}"}]
                call = ApiCall(base_url=base, model="m", messages=msgs, max_tokens=2)
                res = await APIS["openai"].send(client, call, None)
                assert res.ok, res.error
                out[base].append(res.ttft_s)
    return out[direct], out[proxied]


def long_history(turns: int) -> list[dict]:
    """About 120K tokens of conversation: what the proxy must read for the trace on every turn."""
    msgs = [{"role": "system", "content": synth_text(8000, 1)}]
    for i in range(turns):
        msgs.append({"role": "user", "content": synth_text(450, 10 + i)})
        msgs.append({"role": "assistant", "content": synth_text(100, 1000 + i)})
    return msgs


RECORD = "import sys; from replay.record.serve import record; sys.exit(record(sys.argv[1], '127.0.0.1:0', sys.argv[2]))"


def scripted(first_token_delay_s: float) -> list[str]:
    here = Path(__file__).parent.parent
    return [
        sys.executable,
        str(here / "support" / "scripted_server.py"),
        "--first-token-delay-s",
        str(first_token_delay_s),
        "--tokens",
        "2",
    ]


@pytest.mark.timing
@pytest.mark.e2e
@pytest.mark.parametrize(
    ("label", "turns", "first_token_delay_s", "n"),
    [
        ("short prompt", 0, 0.01, 30),
        # A server answers a 120K-token conversation in no less than this, even from cache: the
        # proxy reads the request for the trace meanwhile, so the agent never waits for it.
        ("120K-token conversation", 200, 0.15, 6),
    ],
)
def test_added_ttft_through_the_proxy_is_small(tmp_path, label, turns, first_token_delay_s, n):
    """Upstream, proxy and client in three processes, as in real use (one process would share a GIL)."""
    history = long_history(turns) if turns else []
    with child(scripted(first_token_delay_s), r"PORT (\d+)") as port:
        direct_url = f"http://127.0.0.1:{port.group(1)}"
        proxy = [sys.executable, "-c", RECORD, direct_url, str(tmp_path / "t.jsonl")]
        with child(proxy, r"listening on (http://\S+)", stream="stderr") as listening:
            proxied_url = listening.group(1)
            anyio.run(ttfts, direct_url, proxied_url, 1, history)  # warm up both
            direct, proxied = anyio.run(ttfts, direct_url, proxied_url, n, history)
    added_ms = (statistics.median(proxied) - statistics.median(direct)) * 1000
    print(f"\nadded TTFT through the recording proxy, {label}: median {added_ms:.2f} ms over {n} requests")
    assert added_ms < 20.0
    assert validate(tmp_path / "t.jsonl")["requests"] == 1 + n  # every proxied request recorded
