"""Anonymisation: no word of the original survives; structure, counts and sharing do."""

from __future__ import annotations

import re

import anyio
import orjson
import pytest

from replay.engine.apis import make_client
from replay.errors import TraceError, UsageError
from replay.record.anonymize import Anonymizer, anonymize_trace, run_anonymize
from replay.record.serve import RecordingServer
from replay.record.tokens import count_tokens
from replay.trace import TraceWriter, materialize, read_trace, recorded_reply, validate
from replay.trace.synth import WORDS
from tests.support.recordkit import Agent, jsonl, tool, user
from tests.support.scripted_server import Script

LONG_SHARED = " ".join(f"zorblaxian{i} quuxification{i}, frobnicated;" for i in range(120))  # ~600 tokens
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "grimblefetch",
            "description": "Grimblefetch the snarfwidget from the vorpalstore",
            "parameters": {
                "type": "object",
                "properties": {"snarfpath": {"type": "string", "description": "Path of the flibbertigibbet"}},
                "required": ["snarfpath"],
            },
        },
    }
]


def original(path) -> str:
    with TraceWriter(path, source="record", notes="Kept by Wobblethorpe on bazquuxhost") as w:
        w.session("wobble-main", api="openai", model="m", labels={"label_source": "path"})
        w.session("wobble-cron", role="cron", api="anthropic", model="m")
        tools = w.blob("wobbletools", TOOLS)
        system = {"role": "system", "content": "You are Xyzzyplugh, keeper of " + LONG_SHARED}
        m1 = [system, {"role": "user", "content": "Please grimblefetch the quarglefile, Frobozz!"}]
        call = {
            "id": "call_zardoz_1",
            "name": "grimblefetch",
            "arguments": '{"snarfpath": "/home/plughbert/quarglefile.txt"}',
        }
        r1 = {"role": "assistant", "content": "Fetching quarglefile now.", "tool_calls": [call]}
        usage = {"prompt_tokens": 812, "cached_tokens": 400, "output_tokens": 17}
        params = {
            "max_tokens": 64,
            "tools": tools,
            "stream": True,
            "extra": {
                "stop": ["Blorptastic"],
                "tool_choice": {"type": "function", "function": {"name": "grimblefetch"}},
            },
        }
        w.request(
            "wobble-main",
            0.0,
            m1,
            params=params,
            reply={"message": r1, "finish": "tool_calls", "output_tokens": 17},
            usage=usage,
        )
        m2 = [
            *m1,
            r1,
            {"role": "tool", "tool_call_id": "call_zardoz_1", "content": "Quarglefile says: snorkelwhacker"},
        ]
        r2 = {
            "role": "assistant",
            "content": "The quarglefile mentions snorkelwhacker.",
            "reasoning": "Hmmph plonkitude",
        }
        w.request(
            "wobble-main",
            2.5,
            m2,
            params=params,
            reply={"message": r2, "finish": "stop", "output_tokens": 9},
            usage=usage,
            after={"request": 1, "delay_s": 1.25},
        )
        c1 = [
            {
                "role": "system",
                "content": "You are Xyzzyplugh, keeper of " + LONG_SHARED + " and also Wumpusfeeder",
            },
            {"role": "user", "content": "Nightly grimblefetch"},
        ]
        w.request(
            "wobble-cron",
            3.0,
            c1,
            reply={
                "status": "http_error",
                "http_status": 500,
                "error": "HTTP 500: Kablooey in the frobnostication",
            },
        )
        w.request(
            "wobble-main",
            9.0,
            [system, {"role": "user", "content": "Summary: snorkelwhacker quarglefile"}],
            tag="compaction",
        )
    return str(path)


def value_words(path) -> set[str]:
    """Words of a trace's text values (JSON keys and structural vocabulary left out)."""
    words: set[str] = set()

    def walk(obj, key=None):
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, k)
        elif isinstance(obj, list):
            for v in obj:
                walk(v, key)
        elif isinstance(obj, str) and key not in (
            "kind",
            "format",
            "created",
            "source",
            "role",
            "type",
            "finish",
            "status",
            "tag",
            "api",
            "model",
            "label_source",
        ):
            words.update(w.lower() for w in re.findall(r"[A-Za-z]{4,}", obj))

    for line in jsonl(path):
        walk(line)
    return words


def secret_words(path) -> set[str]:
    """Words of the original that the synthetic vocabulary could not produce."""
    return {w for w in value_words(path) if w not in WORDS}


def test_no_word_survives_and_structure_counts_and_sharing_do(tmp_path):
    src = original(tmp_path / "orig.jsonl")
    dst = tmp_path / "anon.jsonl"
    counts = anonymize_trace(src, dst, key="k3y")
    assert counts == {"sessions": 2, "blobs": 1, "requests": 4, "messages": 7}
    validate(dst)
    secrets = secret_words(src)
    assert {
        "zorblaxian",
        "grimblefetch",
        "snarfpath",
        "quarglefile",
        "plughbert",
        "kablooey",
        "blorptastic",
        "wobblethorpe",
        "wobble",
    } <= secrets
    survivors = sorted(secrets & value_words(dst))
    assert not survivors, survivors
    text = dst.read_text().lower()
    assert not [w for w in secrets if len(w) > 5 and w in text]  # not even inside keys or ids

    a, b = read_trace(src), read_trace(dst)
    assert [s.role for s in a.sessions.values()] == [s.role for s in b.sessions.values()]
    assert [s.api for s in a.sessions.values()] == [s.api for s in b.sessions.values()]
    for ra, rb in zip(a.requests, b.requests, strict=True):
        assert (ra.id, ra.t, ra.keep, ra.tag, ra.usage, ra.after) == (
            rb.id,
            rb.t,
            rb.keep,
            rb.tag,
            rb.usage,
            rb.after,
        )
        assert (ra.parent and ra.parent.id) == (rb.parent and rb.parent.id)
        assert ["$reply" in m for m in ra.append] == ["$reply" in m for m in rb.append]
        assert (ra.reply or {}).get("output_tokens") == (rb.reply or {}).get("output_tokens")
        assert (ra.reply or {}).get("status") == (rb.reply or {}).get("status")
        ma = materialize(ra, recorded_reply(a.by_id()))
        mb = materialize(rb, recorded_reply(b.by_id()))
        assert [m["role"] for m in ma] == [m["role"] for m in mb]
        for x, y in zip(ma, mb, strict=True):
            assert count_tokens(x["content"]) == count_tokens(y["content"])
            assert len(x.get("tool_calls") or ()) == len(y.get("tool_calls") or ())
        ids = {c["id"] for m in mb for c in m.get("tool_calls") or ()}
        assert all(m["tool_call_id"] in ids for m in mb if m["role"] == "tool")
    # Identical text stays identical, different text different, shared long prefixes shared by block.
    main1, main4, cron = (
        materialize(r, recorded_reply(b.by_id())) for r in (b.requests[0], b.requests[3], b.requests[2])
    )
    assert main1[0]["content"] == main4[0]["content"]
    assert main1[1]["content"] != main4[1]["content"]
    sys_main, sys_cron = main1[0]["content"].split("\n"), cron[0]["content"].split("\n")
    assert (
        len(sys_main) >= 4
        and sys_main[:-1] == sys_cron[: len(sys_main) - 1]
        and sys_main[-1] != sys_cron[len(sys_main) - 1]
    )
    # Names map consistently: the tool, its schema property, the call's argument key, tool_choice.
    tools = b.requests[0].params["tools"]
    name = tools[0]["function"]["name"]
    prop = next(iter(tools[0]["function"]["parameters"]["properties"]))
    call = b.requests[0].reply["message"]["tool_calls"][0]
    assert call["name"] == name and next(iter(orjson.loads(call["arguments"]))) == prop
    assert b.requests[0].params["extra"]["tool_choice"] == {"type": "function", "function": {"name": name}}
    assert tools[0]["function"]["parameters"]["required"] == [prop]


def test_same_key_same_output_other_key_other_output(tmp_path):
    src = original(tmp_path / "orig.jsonl")
    anonymize_trace(src, tmp_path / "a.jsonl", key="one")
    anonymize_trace(src, tmp_path / "b.jsonl", key="one")
    anonymize_trace(src, tmp_path / "c.jsonl", key="two")
    a, b, c = ((tmp_path / f"{x}.jsonl").read_bytes() for x in "abc")
    assert a == b and a != c
    anon = Anonymizer("one")
    assert anon.text("") == "" and anon.name("x") == anon.name("x") != anon.name("y")


def test_recording_with_anonymize_writes_no_original_text(scripted_server, tmp_path):
    scripted_server.by_id["q1"] = Script(
        tool_calls=[{"id": "call_q", "name": "grimblefetch", "arguments": '{"snarfpath": "quarglefile"}'}],
        token_text="Plonkitude",
    )

    async def drive(url: str) -> None:
        async with make_client() as client:
            agent = Agent(client, url, "openai", "You are Xyzzyplugh the frobnicator.", tools=[TOOLS[0]])
            await agent.send("q1", user("Grimblefetch the quarglefile"))
            await agent.send("q2", tool("call_q", "Snorkelwhacker inside"))

    with RecordingServer(scripted_server.url, tmp_path / "t.jsonl", anonymize_key="s3cret") as rec:
        anyio.run(drive, rec.url)
    validate(tmp_path / "t.jsonl")
    data = (tmp_path / "t.jsonl").read_text().lower()
    for word in (
        "xyzzyplugh",
        "frobnicator",
        "grimblefetch",
        "quarglefile",
        "snorkelwhacker",
        "plonkitude",
        "snarfpath",
    ):
        assert word not in data
    trace = read_trace(tmp_path / "t.jsonl")
    assert len(trace.sessions) == 1 and [r.tag for r in trace.requests] == ["turn", "turn"]
    second = trace.requests[1]
    assert second.parent is trace.requests[0] and second.append[0] == {"$reply": 1}
    msgs = materialize(second, recorded_reply(trace.by_id()))
    assert msgs[3]["tool_call_id"] == msgs[2]["tool_calls"][0]["id"] != "call_q"


def test_run_anonymize_reports_and_refuses_bad_input(tmp_path):
    src = original(tmp_path / "orig.jsonl")
    line = run_anonymize(src, tmp_path / "a.jsonl", "k")
    assert line == f"{tmp_path / 'a.jsonl'}: 4 requests in 2 sessions anonymized (7 messages, 1 blobs)"
    with pytest.raises(UsageError):
        run_anonymize(src, tmp_path / "b.jsonl", "")
    with pytest.raises(UsageError):
        run_anonymize(tmp_path / "missing.jsonl", tmp_path / "b.jsonl", "k")
    with pytest.raises(TraceError, match="overwrite"):
        run_anonymize(src, src, "k")
    (tmp_path / "bad.jsonl").write_text('{"kind": "trace"}\n')
    with pytest.raises(TraceError, match="bad.jsonl:1"):
        run_anonymize(tmp_path / "bad.jsonl", tmp_path / "c.jsonl", "k")
