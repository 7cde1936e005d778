"""Record real agent traffic end to end, then replay the trace: same requests, same order.

The agents are the engine's own clients (`replay.engine.apis`) talking to the recording proxy in
front of the scripted server: two unlabelled sessions interleaved (OpenAI streaming, Anthropic
non-streaming, both with tool calls), a concurrent turn, a compaction carrying a summary, a session
labelled by path prefix and one by header.
"""

from __future__ import annotations

import anyio
import orjson

from replay.engine.apis import make_client
from replay.engine.plans import make_plan
from replay.engine.run import EngineConfig
from replay.record.requests import parse_request
from replay.runs.pipeline import run_trace
from replay.trace import materialize, read_trace, recorded_reply, validate
from tests.support.recordkit import TOOLS, Agent, by_last_message, tool, user
from tests.support.scripted_server import Script

CALL_A = {"id": "call-a1", "name": "read_file", "arguments": '{"path": "a.txt"}'}
CALL_B = {"id": "toolu-b1", "name": "read_file", "arguments": '{"path": "b.txt"}'}
CALL_A3 = {"id": "call-a3", "name": "read_file", "arguments": '{"path": "c.txt"}'}
SUMMARY = Script(tokens=14, token_text="summarised")


def scripts(server) -> None:
    server.by_id.update(
        {
            "A1": Script(tool_calls=[CALL_A], usage={"prompt_tokens": 50, "completion_tokens": 9}),
            "B1": Script(tool_calls=[CALL_B]),
            "A3": Script(first_token_delay_s=0.3, tool_calls=[CALL_A3]),
            "A3r": Script(first_token_delay_s=0.45, token_text="review"),
            "A4": SUMMARY,
        }
    )


async def drive(proxy_url: str) -> None:
    async with make_client() as client:
        a = Agent(
            client, proxy_url, "openai", "You are agent A. Follow the house rules.", stream=True, tools=TOOLS
        )
        b = Agent(
            client, proxy_url, "anthropic", "You are agent B, a careful reviewer.", stream=False, tools=TOOLS
        )
        c = Agent(client, proxy_url + "/s/cron-nightly", "openai", a.system, stream=False)
        d = Agent(
            client,
            proxy_url,
            "anthropic",
            "You are D.",
            stream=True,
            headers={"X-Replay-Session": "review-bot"},
        )
        await a.send("A1", user("A: open a.txt"))
        await b.send("B1", user("B: open b.txt"))
        await a.send("A2", tool("call-a1", "A: contents of a.txt"))
        await b.send("B2", tool("toolu-b1", "B: contents of b.txt"))
        before_a3 = list(a.messages)
        async with anyio.create_task_group() as tg:
            tg.start_soon(a.send, "A3", user("A: now c.txt"))
            await anyio.sleep(0.1)
            # The skill-review case: same history, another prompt, while A3 is in flight.
            tg.start_soon(lambda: a.send("A3r", user("A: review the skills used so far"), history=before_a3))
        await a.send("A4", tool("call-a3", "A: contents of c.txt"), user("A: summarise the conversation"))
        summary = a.messages[-1]["content"]
        await b.send("B3", user("B: anything else?"))
        a.messages = a.messages[:1]  # the agent compacts: system prompt + the summary
        await a.send("A5", user(f"{summary}\nA: continue from the summary"))
        await a.send("A6", user("A: and then?"))
        await c.send("C1", user("C: nightly job"))
        await c.send("C2", user("C: nightly job, step two"))
        await d.send("D1", user("D: hello"))


def sent_sequence(seen) -> list[tuple[str, list]]:
    """(api, neutral messages) of each request the upstream got, in arrival order."""
    out = []
    for s in seen:
        api = "anthropic" if s.path.endswith("/messages") else "openai"
        msgs = parse_request(api, orjson.dumps(s.body)).messages
        out.append((api, [{k: v for k, v in m.items() if k != "reasoning"} for m in msgs]))
    return out


def test_recorded_sessions_are_inferred_and_replay_the_same_sequence(scripted_server, recording, tmp_path):
    scripts(scripted_server)
    anyio.run(drive, recording.url)
    recording.stop()
    recorded_seen = list(scripted_server.seen)
    assert len(recorded_seen) == 13

    counts = validate(recording.out)
    assert counts["requests"] == 13 and counts["sessions"] == 4
    trace = read_trace(recording.out)
    reqs = by_last_message(trace)
    name = {
        "A1": "A: open a.txt",
        "B1": "B: open b.txt",
        "A2": "A: contents of a.txt",
        "B2": "B: contents of b.txt",
        "A3": "A: now c.txt",
        "A3r": "A: review the skills used so far",
        "A4": "A: summarise the conversation",
        "B3": "B: anything else?",
        "A5": "A: continue from the summary",
        "A6": "A: and then?",
        "C1": "C: nightly job",
        "C2": "C: nightly job, step two",
        "D1": "D: hello",
    }
    got = {k: next(r for key, r in reqs.items() if key.endswith(v)) for k, v in name.items()}

    # Session inference: every request in the right session, with the right tag.
    sessions = {k: r.session for k, r in got.items()}
    a_sid, b_sid = sessions["A1"], sessions["B1"]
    assert a_sid != b_sid
    for k in ("A2", "A3", "A3r", "A4", "A5", "A6"):
        assert sessions[k] == a_sid, k
    for k in ("B2", "B3"):
        assert sessions[k] == b_sid, k
    assert sessions["C1"] == sessions["C2"] == "cron-nightly"
    assert sessions["D1"] == "review-bot"
    tags = {k: r.tag for k, r in got.items()}
    assert tags == {**dict.fromkeys(name, "turn"), "A3r": "concurrent", "A5": "compaction"}
    roles = {sid: s.role for sid, s in trace.sessions.items()}
    assert roles == {
        a_sid: "interactive",
        b_sid: "interactive",
        "cron-nightly": "cron",
        "review-bot": "review",
    }
    apis = {sid: s.api for sid, s in trace.sessions.items()}
    assert apis == {a_sid: "openai", b_sid: "anthropic", "cron-nightly": "openai", "review-bot": "anthropic"}

    # Delta encoding follows what each request extends: only the compaction cuts a prefix.
    assert [k for k, r in got.items() if r.is_compaction] == ["A5"]
    assert got["A2"].parent is got["A1"] and got["A2"].append[0] == {"$reply": got["A1"].id}
    assert got["A3r"].parent is got["A2"] and got["A3r"].keep == got["A2"].n_messages
    assert got["A4"].parent is got["A3"] and got["A4"].append[0] == {"$reply": got["A3"].id}
    assert got["A5"].keep == 1  # the system prompt

    # `after`: the reply each request waited for, and the gap since its last byte.
    assert got["A2"].after["request"] == got["A1"].id and 0 <= got["A2"].after["delay_s"] < 1
    assert got["A3r"].after["request"] == got["A2"].id
    assert got["A6"].after["request"] == got["A5"].id
    assert got["A1"].after is None

    # Replies and usage as the agent received them, with wire times.
    a1 = got["A1"]
    assert a1.reply["message"]["tool_calls"] == [CALL_A] and a1.reply["finish"] == "tool_calls"
    assert a1.usage["prompt_tokens"] == 50 and a1.usage["output_tokens"] == 9
    assert a1.reply["status"] == "ok" and 0 <= a1.reply["first_byte_s"] <= a1.reply["last_byte_s"]
    b1 = got["B1"]
    assert b1.reply["message"]["tool_calls"][0]["arguments"] == '{"path":"b.txt"}'
    assert got["A3"].reply["first_token_s"] >= 0.3
    assert b1.params["tools"] == TOOLS and a1.params["stream"] is True and b1.params["stream"] is False
    assert got["A3"].t < got["A3r"].t < got["A3"].t + 0.3 < got["A3r"].t + 0.45

    # Each recorded request materialises to exactly what its agent sent.
    replies = recorded_reply(trace.by_id())
    sent = sent_sequence(recorded_seen)
    recorded_lists = [materialize(r, replies) for r in trace.requests]
    assert sorted(map(repr, recorded_lists)) == sorted(repr(m) for _, m in sent)

    # Replaying the trace sends the same requests in the same order.
    scripted_server.reset()
    config = EngineConfig(base_url=scripted_server.url, history="recorded", timeout_s=10.0, run_id="rp")
    outcome = run_trace(
        trace, make_plan("alternate"), config, tmp_path / "results.jsonl", {"kind": "scripted"}
    )
    assert outcome.exit_code == 0 and outcome.requests == 13
    assert sent_sequence(scripted_server.seen) == sent
