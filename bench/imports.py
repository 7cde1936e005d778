"""Every importer on big inputs: peak memory (RSS) and speed.

`python -m bench --only imports [--imports-mb 2048]` runs it as a section of `just bench` (100 MB a
kind by default, 20 in a quick run; the 2 GB figure with `--imports-mb 2048`), and
`python -m bench.imports [--mb 2048] [--kinds weka,otel,...] [--work DIR]` alone. It generates,
for each kind, an input of about that many MB in its real shape: the public corpora (WEKA
`traces.jsonl` with subagents; an OTLP JSON document as one `.json` file, so the ijson path is the
one measured; a folder of Mini-SWE-agent trajectories; TraceLab rows of sessions running side by
side; a ShareGPT JSON array; a Mooncake trace) and the agents' own stores (a Claude Code projects
folder, a Codex sessions folder, a Hermes `state.db`, an OpenCode `opencode.db`). It imports each
in a child process (`replay import`'s own code, so the child's peak RSS is the importer's), and
prints one JSON object per kind: input MB, output MB, seconds, MB/s, MB per CPU-second (what a
loaded host changes least) and peak RSS MiB. Each import includes `replay import`'s validation of
what it wrote. The inputs are deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

KINDS = (
    "weka",
    "otel",
    "swe-agent",
    "tracelab",
    "claude-code",
    "codex",
    "hermes",
    "opencode",
    "sharegpt",
    "mooncake",
)
RSS_TARGET_MIB = 512.0  # bounded: far below the input, whatever its size


def gen_weka(path: Path, size: int, seed: int = 1) -> int:
    """WEKA traces, one a line: 30 turns whose hash ids grow, one subagent of 6 turns each."""
    rng = random.Random(seed)
    written = 0
    n = 0
    next_id = 1
    with open(path, "wb") as out:
        while written < size:
            n += 1
            ids: list[int] = []
            reqs: list[dict[str, Any]] = []
            t = 0.0
            for k in range(30):
                grow = rng.randint(4, 40)
                ids = ids + list(range(next_id, next_id + grow))
                next_id += grow
                length = len(ids) * 64 - rng.randint(0, 63)
                reqs.append(
                    {
                        "t": t,
                        "type": "s",
                        "model": "claude-opus",
                        "in": length,
                        "out": rng.randint(20, 800),
                        "hash_ids": ids,
                        "api_time": rng.uniform(1, 20),
                    }
                )
                t += rng.uniform(2, 60)
                if k == 10:
                    sub_ids = ids[:8]
                    subs = []
                    for j in range(6):
                        sub_ids = sub_ids + list(range(next_id, next_id + 10))
                        next_id += 10
                        subs.append(
                            {
                                "t": t + j * 5,
                                "type": "n",
                                "model": "claude-haiku",
                                "in": len(sub_ids) * 64,
                                "out": 50,
                                "hash_ids": sub_ids,
                                "api_time": 3.0,
                            }
                        )
                    reqs.append(
                        {
                            "t": t,
                            "type": "subagent",
                            "agent_id": f"a{n}",
                            "subagent_type": "Explore",
                            "duration_ms": 40_000,
                            "requests": subs,
                        }
                    )
            line = orjson.dumps(
                {"id": f"trace-{n}", "models": ["claude-opus"], "block_size": 64, "requests": reqs}
            )
            out.write(line + b"\n")
            written += len(line) + 1
    return written


def _words(rng: random.Random, n: int) -> str:
    return " ".join(
        rng.choice(("the", "file", "parser", "returns", "value", "test", "error", "fix")) for _ in range(n)
    )


def gen_otel(path: Path, size: int, seed: int = 2) -> int:
    """One OTLP JSON document: conversations of 20 chat spans, each carrying its whole history."""
    rng = random.Random(seed)
    written = 0
    t0 = 1_790_000_000 * 10**9
    with open(path, "wb") as out:
        out.write(
            b'{"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "agent"}}]}, "scopeSpans": [{"spans": ['
        )
        first = True
        c = 0
        while written < size:
            c += 1
            history: list[dict[str, Any]] = [
                {"role": "user", "parts": [{"type": "text", "content": _words(rng, 60)}]}
            ]
            for k in range(20):
                start = t0 + (c * 7 + k * 30) * 10**9
                reply = {"role": "assistant", "parts": [{"type": "text", "content": _words(rng, 40)}]}
                attrs = [
                    {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
                    {"key": "gen_ai.conversation.id", "value": {"stringValue": f"c{c}"}},
                    {"key": "gen_ai.request.model", "value": {"stringValue": "m"}},
                    {
                        "key": "gen_ai.input.messages",
                        "value": {"stringValue": orjson.dumps(history).decode()},
                    },
                    {
                        "key": "gen_ai.output.messages",
                        "value": {"stringValue": orjson.dumps([reply]).decode()},
                    },
                    {"key": "gen_ai.usage.output_tokens", "value": {"intValue": "40"}},
                ]
                span = {
                    "traceId": f"t{c}",
                    "spanId": f"s{c}-{k}",
                    "name": "chat m",
                    "startTimeUnixNano": str(start),
                    "endTimeUnixNano": str(start + 5 * 10**9),
                    "attributes": attrs,
                }
                chunk = (b"" if first else b",") + orjson.dumps(span)
                first = False
                out.write(chunk)
                written += len(chunk)
                history = [
                    *history,
                    reply,
                    {"role": "user", "parts": [{"type": "text", "content": _words(rng, 30)}]},
                ]
        out.write(b"]}]}]}\n")
    return written + 200


def gen_swe(folder: Path, size: int, seed: int = 3) -> int:
    """A folder of Mini-SWE-agent 1.1 trajectories, 40 steps each."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    written = 0
    n = 0
    while written < size:
        n += 1
        t = 1_790_000_000.0 + n * 11
        msgs: list[dict[str, Any]] = [
            {"role": "system", "content": _words(rng, 200)},
            {"role": "user", "content": _words(rng, 300)},
        ]
        for k in range(40):
            t += rng.uniform(1, 30)
            call = {
                "id": f"c{k}",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"command": "ls"}'},
            }
            msgs.append(
                {
                    "role": "assistant",
                    "content": _words(rng, 30),
                    "tool_calls": [call],
                    "extra": {
                        "response": {
                            "created": int(t),
                            "usage": {"prompt_tokens": 1000 + 100 * k, "completion_tokens": 30},
                        },
                        "timestamp": t + 2,
                    },
                }
            )
            t += 2
            msgs.append({"role": "tool", "tool_call_id": f"c{k}", "content": _words(rng, 150)})
        data = orjson.dumps({"messages": msgs, "trajectory_format": "mini-swe-agent-1.1", "info": {}})
        (folder / f"run-{n:06d}.traj.json").write_bytes(data)
        written += len(data)
    return written


def gen_tracelab(path: Path, size: int, seed: int = 4) -> int:
    """TraceLab rows: sessions of 60 rounds whose prompts grow, 40 sessions running side by side
    (the rows in time order, as the corpus interleaves its developers' sessions)."""
    rng = random.Random(seed)
    written = 0
    base = 1_790_000_000.0
    with open(path, "wb") as out:
        wave = 0
        while written < size:
            wave += 1
            live = []
            for k in range(40):
                live.append(
                    {
                        "id": f"claude:{wave:05d}-{k:02d}",
                        "at": base + wave * 3600 + k * 13.0,
                        "size": 20_000,
                        "n": 0,
                    }
                )
            while live and written < size:
                s = min(live, key=lambda x: x["at"])
                at, n = s["at"], s["n"]
                out_tokens = rng.randint(20, 1500)

                def stamp(dt: float, at: float = at) -> str:
                    return datetime.fromtimestamp(at + dt, UTC).isoformat(timespec="milliseconds")

                events = [
                    {"event_type": "tool_result", "timestamp": stamp(0), "source": "user.content.tool_result",
                     "tool_call_id": f"toolu_{n}", "result_chars": rng.randint(50, 9000), "is_error": False},
                    {"event_type": "reasoning", "timestamp": stamp(1.5), "source": "assistant.content.thinking",
                     "content_chars": 0},
                    {"event_type": "tool_call", "timestamp": stamp(3.0), "source": "assistant.content.tool_use",
                     "tool_call_id": f"toolu_{n + 1}", "tool_name": "Bash", "tool_index": 0},
                ]  # fmt: skip
                row = {
                    "provider": "claude",
                    "project": f"project_{wave:04d}",
                    "session_id": s["id"],
                    "round_index": n,
                    "round_id": f"msg_{wave}_{n}",
                    "model": "claude-opus-4-8",
                    "input_tokens_total": s["size"],
                    "prefix_tokens": max(0, s["size"] - rng.randint(100, 3000)),
                    "newly_append_tokens": rng.randint(100, 3000),
                    "claude_cache_creation_input_tokens": rng.randint(0, 3000),
                    "output_tokens": out_tokens,
                    "reasoning_output_tokens": None,
                    "timing_events": events,
                    "tools": [{"tool_index": 0, "tool_name": "Bash", "tool_call_id": f"toolu_{n + 1}",
                               "input_chars": 120, "result_chars": 800, "tool_wall_latency_ms": 900}],
                    "first_input_event_type": "tool_result",
                    "store": ".claude",
                }  # fmt: skip
                line = orjson.dumps(row) + b"\n"
                out.write(line)
                written += len(line)
                s["size"] += out_tokens + rng.randint(50, 4000)
                s["at"] += 3.0 + rng.uniform(1, 90)
                s["n"] += 1
                if s["n"] == 60:
                    live.remove(s)
    return written


# ---- the agents' own stores (shapes as tests/support/agentstores.py writes them; ours, not copied) ----


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def gen_claude_code(folder: Path, size: int, seed: int = 5) -> int:
    """A Claude Code projects folder: one transcript a session (a prompt, 30 tool calls each
    answered on a line of its own, a closing reply), sessions starting a minute apart (about ten
    running side by side)."""
    rng = random.Random(seed)
    proj = folder / "-home-dev-proj"
    proj.mkdir(parents=True, exist_ok=True)
    written = 0
    n = 0
    while written < size:
        n += 1
        sid = f"{n:08x}-0000-4000-8000-{n:012x}"
        t = 1_790_000_000.0 + n * 60
        lines: list[bytes] = []
        parent: str | None = None
        k = 0

        def entry(
            kind: str, message: dict[str, Any], when: float, sid: str = sid, lines: list[bytes] = lines
        ) -> None:
            nonlocal parent, k
            k += 1
            uuid = f"{sid[:8]}-{k:04d}-4000-8000-000000000000"
            obj = {"parentUuid": parent, "isSidechain": False, "sessionId": sid, "type": kind,
                   "uuid": uuid, "timestamp": _iso(when), "cwd": "/home/dev/proj", "version": "2.1.197",
                   "message": message}  # fmt: skip
            lines.append(orjson.dumps(obj))
            parent = uuid

        entry("user", {"role": "user", "content": _words(rng, 80)}, t)
        prompt = 20_000
        for c in range(30):
            t += rng.uniform(2, 20)
            usage = {"input_tokens": 5, "cache_read_input_tokens": prompt, "cache_creation_input_tokens": 400,
                     "output_tokens": 60}  # fmt: skip
            call = {
                "type": "tool_use",
                "id": f"toolu_{n}_{c}",
                "name": "Bash",
                "input": {"command": "ls -la"},
            }
            entry("assistant", {"id": f"msg_{n}_{c}", "type": "message", "role": "assistant",
                                "model": "claude-opus-4-8", "content": [{"type": "text", "text": _words(rng, 25)}, call],
                                "stop_reason": "tool_use", "usage": usage}, t)  # fmt: skip
            t += rng.uniform(1, 10)
            result = {"type": "tool_result", "tool_use_id": f"toolu_{n}_{c}", "content": _words(rng, 150)}
            entry("user", {"role": "user", "content": [result]}, t)
            prompt += 405 + 60
        t += 5
        entry("assistant", {"id": f"msg_{n}_end", "type": "message", "role": "assistant", "model": "claude-opus-4-8",
                            "content": [{"type": "text", "text": _words(rng, 40)}], "stop_reason": "end_turn",
                            "usage": {"input_tokens": 5, "cache_read_input_tokens": prompt, "output_tokens": 40}}, t)  # fmt: skip
        data = b"\n".join(lines) + b"\n"
        (proj / f"{sid}.jsonl").write_bytes(data)
        written += len(data)
    return written


def gen_codex(folder: Path, size: int, seed: int = 6) -> int:
    """A Codex sessions folder: one rollout a session (meta, context items, 30 shell calls each with
    its token_count and output, a closing reply), sessions starting a minute apart."""
    rng = random.Random(seed)
    day = folder / "2026" / "09" / "21"
    day.mkdir(parents=True, exist_ok=True)
    written = 0
    n = 0
    while written < size:
        n += 1
        sid = f"0199a1b2-{n:04x}-7e5f-8a9b-{n:012x}"
        t = 1_790_000_000.0 + n * 60
        lines: list[bytes] = []

        def add(when: float, kind: str, payload: dict[str, Any], lines: list[bytes] = lines) -> None:
            lines.append(orjson.dumps({"timestamp": _iso(when), "type": kind, "payload": payload}))

        def msg(role: str, text: str) -> dict[str, Any]:
            kind = "output_text" if role == "assistant" else "input_text"
            return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}

        def usage(when: float, inp: int, out: int) -> None:
            last = {"input_tokens": inp, "cached_input_tokens": max(0, inp - 500), "output_tokens": out,
                    "reasoning_output_tokens": 0, "total_tokens": inp + out}  # fmt: skip
            add(when, "event_msg", {"type": "token_count", "info": {"total_token_usage": last,
                "last_token_usage": last, "model_context_window": 128000}, "rate_limits": None})  # fmt: skip

        add(t, "session_meta", {"id": sid, "timestamp": _iso(t), "cwd": "/home/dev/proj", "originator": "codex_exec",
                                "cli_version": "0.171.0", "instructions": _words(rng, 300), "source": "exec"})  # fmt: skip
        add(t, "response_item", msg("developer", "<permissions instructions> " + _words(rng, 200)))
        add(t, "turn_context", {"cwd": "/home/dev/proj", "approval_policy": "never", "model": "gpt-oss-20b",
                                "effort": "medium", "summary": "auto"})  # fmt: skip
        add(t + 1, "response_item", msg("user", _words(rng, 60)))
        prompt = 8_000
        for c in range(30):
            t += rng.uniform(2, 20)
            add(t, "response_item", {"type": "reasoning", "id": f"rs_{c}", "content": None,
                                     "summary": [{"type": "summary_text", "text": _words(rng, 20)}]})  # fmt: skip
            add(t, "response_item", {"type": "function_call", "name": "shell", "call_id": f"call_{c}",
                                     "arguments": '{"command":["ls","-la"]}'})  # fmt: skip
            usage(t, prompt, 60)
            t += rng.uniform(1, 10)
            add(t, "response_item", {"type": "function_call_output", "call_id": f"call_{c}",
                                     "output": _words(rng, 150)})  # fmt: skip
            prompt += 300
        t += 5
        add(t, "response_item", msg("assistant", _words(rng, 40)))
        usage(t, prompt, 40)
        data = b"\n".join(lines) + b"\n"
        (day / f"rollout-2026-09-21T00-00-00-{sid}.jsonl").write_bytes(data)
        written += len(data)
    return written


_HERMES_SCHEMA = """
CREATE TABLE system_prompts (hash TEXT PRIMARY KEY, prompt TEXT NOT NULL);
CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT NOT NULL, model TEXT, model_config TEXT,
    system_prompt_hash TEXT, parent_session_id TEXT, started_at REAL NOT NULL, ended_at REAL, end_reason TEXT,
    input_tokens INTEGER DEFAULT 0, output_tokens INTEGER DEFAULT 0, cache_read_tokens INTEGER DEFAULT 0,
    cache_write_tokens INTEGER DEFAULT 0, title TEXT, api_call_count INTEGER DEFAULT 0, tool_names TEXT);
CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, role TEXT NOT NULL,
    content TEXT, tool_call_id TEXT, tool_calls TEXT, tool_name TEXT, timestamp REAL NOT NULL,
    token_count INTEGER, finish_reason TEXT, reasoning TEXT, _compressed_summary INTEGER NOT NULL DEFAULT 0,
    api_content TEXT);
CREATE INDEX idx_messages_session ON messages(session_id, timestamp);
"""


def gen_hermes(path: Path, size: int, seed: int = 7) -> int:
    """A Hermes `state.db` (the columns its importer reads, its session index): one system prompt
    shared by every session, sessions of 30 tool calls with their usage sums, a minute apart."""
    import hashlib
    import sqlite3

    rng = random.Random(seed)
    system = _words(rng, 1400)
    digest = hashlib.sha256(system.encode()).hexdigest()
    conn = sqlite3.connect(path)
    conn.executescript(_HERMES_SCHEMA)
    conn.execute("INSERT INTO system_prompts VALUES (?, ?)", (digest, system))
    written = len(system)
    n = 0
    while written < size:
        n += 1
        sid = f"20260921_{n:06d}_{n % 9973:04x}"
        t0 = t = 1_790_000_000.0 + n * 60
        rows: list[tuple[Any, ...]] = [(sid, "user", _words(rng, 60), None, None, None, t, None, None)]
        for c in range(30):
            t += rng.uniform(2, 20)
            call = [{"id": f"call_{c}", "type": "function",
                     "function": {"name": "terminal", "arguments": '{"command": "ls -la"}'}}]  # fmt: skip
            rows.append(
                (
                    sid,
                    "assistant",
                    _words(rng, 20),
                    None,
                    orjson.dumps(call).decode(),
                    None,
                    t,
                    40,
                    "tool_calls",
                )
            )
            t += rng.uniform(1, 10)
            rows.append((sid, "tool", _words(rng, 150), f"call_{c}", None, "terminal", t, None, None))
        t += 5
        rows.append((sid, "assistant", _words(rng, 40), None, None, None, t, 50, "stop"))
        conn.executemany(
            "INSERT INTO messages (session_id, role, content, tool_call_id, tool_calls, tool_name, timestamp,"
            " token_count, finish_reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        conn.execute(
            "INSERT INTO sessions (id, source, model, model_config, system_prompt_hash, started_at, ended_at,"
            " input_tokens, output_tokens, cache_read_tokens, api_call_count, tool_names)"
            " VALUES (?, 'cli', 'qwen3.8-flash', '{}', ?, ?, ?, ?, ?, ?, 31, '[\"terminal\"]')",
            (sid, digest, t0, t, 31 * 3_000, 31 * 40, 31 * 20_000),
        )
        written += sum(len(r[2]) + len(r[4] or "") + 60 for r in rows)
        if n % 200 == 0:
            conn.commit()
    conn.commit()
    conn.close()
    return path.stat().st_size


_OPENCODE_SCHEMA = """
CREATE TABLE session (id TEXT PRIMARY KEY, project_id TEXT NOT NULL, parent_id TEXT, slug TEXT NOT NULL,
    directory TEXT NOT NULL, title TEXT NOT NULL, version TEXT NOT NULL, time_created INTEGER NOT NULL,
    time_updated INTEGER NOT NULL);
CREATE TABLE message (id TEXT PRIMARY KEY, session_id TEXT NOT NULL, time_created INTEGER NOT NULL,
    time_updated INTEGER NOT NULL, data TEXT NOT NULL);
CREATE TABLE part (id TEXT PRIMARY KEY, message_id TEXT NOT NULL, session_id TEXT NOT NULL,
    time_created INTEGER NOT NULL, time_updated INTEGER NOT NULL, data TEXT NOT NULL);
CREATE INDEX message_session_idx ON message(session_id);
CREATE INDEX part_message_idx ON part(message_id);
"""


def gen_opencode(path: Path, size: int, seed: int = 8) -> int:
    """An OpenCode `opencode.db` (session, message, part tables with their indexes): sessions of
    a prompt and one assistant message of 30 steps (a tool call each, its output) and a closing
    step, a minute apart."""
    import sqlite3

    rng = random.Random(seed)
    conn = sqlite3.connect(path)
    conn.executescript(_OPENCODE_SCHEMA)
    written = 0
    n = 0
    while written < size:
        n += 1
        sid = f"ses_{n:08d}"
        t = 1_790_000_000_000 + n * 60_000
        conn.execute(
            "INSERT INTO session VALUES (?, 'prj_1', NULL, 'calm-fox', '/home/dev/proj', ?, '1.18.33', ?, ?)",
            (sid, f"Task {n}", t - 500, t + 600_000),
        )
        umid, amid = f"msg_{n:08d}a", f"msg_{n:08d}b"
        user = {"role": "user", "time": {"created": t}, "agent": "build"}
        conn.execute(
            "INSERT INTO message VALUES (?, ?, ?, ?, ?)", (umid, sid, t, t, orjson.dumps(user).decode())
        )
        parts: list[tuple[Any, ...]] = [
            (
                f"prt_{n:08d}_0000",
                umid,
                sid,
                t,
                t,
                orjson.dumps({"type": "text", "text": _words(rng, 60)}).decode(),
            )
        ]
        clock = t + 1000
        prompt = 12_000
        k = 0
        for c in range(31):
            tokens = {"input": 500, "output": 60, "reasoning": 0, "cache": {"read": prompt, "write": 0}}
            step: list[dict[str, Any]] = [{"type": "step-start"}, {"type": "text", "text": _words(rng, 25),
                                           "time": {"start": clock, "end": clock + 800}}]  # fmt: skip
            if c < 30:
                step.append({"type": "tool", "callID": f"call_{c}", "tool": "bash", "state": {
                    "status": "completed", "input": {"command": "ls -la"}, "output": _words(rng, 150),
                    "title": "bash", "metadata": {}, "time": {"start": clock + 900, "end": clock + 1900}}})  # fmt: skip
            step.append({"type": "step-finish", "reason": "tool-calls" if c < 30 else "stop", "cost": 0,
                         "tokens": tokens})  # fmt: skip
            for p in step:
                k += 1
                parts.append((f"prt_{n:08d}_{k:04d}", amid, sid, clock, clock, orjson.dumps(p).decode()))
            clock += int(rng.uniform(3000, 30000))
            prompt += 560
        info = {"role": "assistant", "time": {"created": t + 1000, "completed": clock}, "parentID": umid,
                "modelID": "qwen3.8", "providerID": "local", "mode": "build"}  # fmt: skip
        conn.execute(
            "INSERT INTO message VALUES (?, ?, ?, ?, ?)",
            (amid, sid, t + 1000, clock, orjson.dumps(info).decode()),
        )
        conn.executemany("INSERT INTO part VALUES (?, ?, ?, ?, ?, ?)", parts)
        written += sum(len(p[5]) + 80 for p in parts)
        if n % 200 == 0:
            conn.commit()
    conn.commit()
    conn.close()
    return path.stat().st_size


def gen_sharegpt(path: Path, size: int, seed: int = 9) -> int:
    """ShareGPT as its corpora publish it: one JSON array of conversations of 4-20 turns."""
    rng = random.Random(seed)
    written = 0
    n = 0
    with open(path, "wb") as out:
        out.write(b"[")
        while written < size:
            n += 1
            turns = [
                {"from": "human" if i % 2 == 0 else "gpt", "value": _words(rng, rng.randint(20, 400))}
                for i in range(rng.randint(2, 10) * 2)
            ]
            chunk = (b"," if n > 1 else b"") + orjson.dumps({"id": f"conv{n}", "conversations": turns})
            out.write(chunk)
            written += len(chunk)
        out.write(b"]\n")
    return written + 2


def gen_mooncake(path: Path, size: int, seed: int = 10) -> int:
    """A Mooncake trace: conversations of 20 turns whose hash ids grow, 20 running side by side,
    every request starting with the same 4 system-prompt blocks."""
    rng = random.Random(seed)
    written = 0
    next_id = 100
    t = 0
    with open(path, "wb") as out:
        live: list[list[int]] = []
        turns: list[int] = []
        while written < size:
            if len(live) < 20:
                live.append([0, 1, 2, 3])
                turns.append(0)
            i = rng.randrange(len(live))
            grow = rng.randint(1, 6)
            live[i] = live[i] + list(range(next_id, next_id + grow))
            next_id += grow
            length = len(live[i]) * 512 - rng.randint(0, 511)
            t += rng.randint(10, 3000)
            line = orjson.dumps(
                {
                    "timestamp": t,
                    "input_length": length,
                    "output_length": rng.randint(20, 800),
                    "hash_ids": live[i],
                }
            )
            out.write(line + b"\n")
            written += len(line) + 1
            turns[i] += 1
            if turns[i] == 20:
                del live[i], turns[i]
    return written


def _peak_mib() -> float:
    """This process's own peak RSS: the kernel's high-water mark of its memory since `exec`
    (`VmHWM`). `ru_maxrss` is not that: Linux carries the forking parent's peak across `exec`, so
    every child of a 253 MiB bench read 253 MiB."""
    import resource

    try:
        for row in Path("/proc/self/status").read_text().splitlines():
            if row.startswith("VmHWM:"):
                return int(row.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _one(kind: str, src: str, out: str) -> None:
    """In the child: import, then report our own peak RSS."""
    import resource

    from replay.importers.base import ImportOptions
    from replay.importers.registry import run_import

    def cpu() -> float:
        use = resource.getrusage(resource.RUSAGE_SELF)
        return use.ru_utime + use.ru_stime

    t0, c0 = time.perf_counter(), cpu()
    line = run_import(kind, Path(src), Path(out), ImportOptions(progress=False))
    wall, spent = time.perf_counter() - t0, cpu() - c0
    print(
        json.dumps(
            {
                "wall_s": round(wall, 1),
                "cpu_s": round(spent, 1),
                "peak_rss_mib": round(_peak_mib(), 1),
                "line": line,
            }
        )
    )


# kind -> (input's name in the work folder, its generator)
INPUTS: dict[str, tuple[str, Any]] = {
    "weka": ("traces.jsonl", gen_weka),
    "otel": ("otlp.json", gen_otel),
    "swe-agent": ("runs", gen_swe),
    "tracelab": ("rows.jsonl", gen_tracelab),
    "claude-code": ("projects", gen_claude_code),
    "codex": ("sessions", gen_codex),
    "hermes": ("state.db", gen_hermes),
    "opencode": ("opencode.db", gen_opencode),
    "sharegpt": ("sharegpt.json", gen_sharegpt),
    "mooncake": ("mooncake.jsonl", gen_mooncake),
}


def measure(kind: str, size: int, work: Path) -> dict[str, Any]:
    src = work / INPUTS[kind][0]
    out = work / f"{kind}.trace.jsonl"
    t0 = time.perf_counter()
    made = INPUTS[kind][1](src, size)
    gen_s = time.perf_counter() - t0
    try:
        res = subprocess.run(
            [sys.executable, "-m", "bench.imports", "--one", kind, str(src), str(out)],
            capture_output=True,
            text=True,
            check=False,
        )
        if res.returncode != 0:
            return {"kind": kind, "status": "failed", "error": res.stderr.strip().splitlines()[-1:]}
        got = json.loads(res.stdout.strip().splitlines()[-1])
        out_mb = out.stat().st_size / 1e6
    finally:
        if src.is_dir():
            shutil.rmtree(src, ignore_errors=True)
        else:
            src.unlink(missing_ok=True)
        out.unlink(missing_ok=True)
    return {
        "kind": kind,
        "input_mb": round(made / 1e6, 1),
        "output_mb": round(out_mb, 1),
        "generate_s": round(gen_s, 1),
        "import_s": got["wall_s"],
        "import_cpu_s": got["cpu_s"],
        "mb_per_s": round(made / 1e6 / got["wall_s"], 1) if got["wall_s"] else None,
        "mb_per_cpu_s": round(made / 1e6 / got["cpu_s"], 1) if got["cpu_s"] else None,
        "peak_rss_mib": got["peak_rss_mib"],
        "bounded": got["peak_rss_mib"] <= RSS_TARGET_MIB,
        "result": got["line"].split(" (")[0].split(": ", 1)[-1],
    }


def section(mb: float, work: Path, kinds: tuple[str, ...] = KINDS, log: Any = None) -> dict[str, Any]:
    """`just bench`'s imports section: each kind at `mb` MB, one after another (a failed kind is
    reported as such, the others still measured)."""
    found = []
    for kind in kinds:
        got = measure(kind, int(mb * 1e6), work)
        if log is not None:
            log(
                f"  {kind}: {got.get('input_mb')} MB in {got.get('import_s')} s ({got.get('mb_per_s')} MB/s, "
                f"{got.get('mb_per_cpu_s')} MB per CPU-s), peak RSS {got.get('peak_rss_mib')} MiB"
                if got.get("status") != "failed"
                else f"  {kind}: failed {got.get('error')}"
            )
        found.append(got)
    return {"mb": mb, "rss_target_mib": RSS_TARGET_MIB, "kinds": found}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.imports", description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=2048.0, help="input size per kind, MB (default 2048)")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument(
        "--work", type=Path, default=None, help="where inputs are generated (default: a temp dir)"
    )
    ap.add_argument("--one", nargs=3, metavar=("KIND", "SRC", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        _one(*args.one)
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-imports-", dir=args.work) as tmp:
        for kind in args.kinds.split(","):
            print(json.dumps(measure(kind, int(args.mb * 1e6), Path(tmp))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
