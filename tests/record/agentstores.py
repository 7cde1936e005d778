"""Stores written the way the agents write them (shapes learnt from their public source and docs;
written here, not copied): a Hermes `state.db`, OpenCode storage folders / SQLite / export /
event streams, Codex CLI rollouts. Each builder takes plain Python conversations so a test says
what happened, and the builder writes it in the agent's own layout.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import random
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

MORNING = _dt.datetime(2026, 11, 30, 6, 45, tzinfo=_dt.UTC).timestamp()
WORDS = "the data report file value table list market price fund stock cash order line note total".split()


def words(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


# ---- Hermes -------------------------------------------------------------------------------------

# The columns this importer reads, in a current store (Hermes adds more; an old store has fewer).
HERMES_SCHEMA = """
CREATE TABLE system_prompts (hash TEXT PRIMARY KEY, prompt TEXT NOT NULL);
CREATE TABLE sessions (
    id TEXT PRIMARY KEY, source TEXT NOT NULL, user_id TEXT, model TEXT, model_config TEXT,
    system_prompt TEXT, system_prompt_hash TEXT, parent_session_id TEXT, started_at REAL NOT NULL,
    ended_at REAL, end_reason TEXT, message_count INTEGER DEFAULT 0, tool_call_count INTEGER DEFAULT 0,
    input_tokens INTEGER DEFAULT 0, output_tokens INTEGER DEFAULT 0, cache_read_tokens INTEGER DEFAULT 0,
    cache_write_tokens INTEGER DEFAULT 0, reasoning_tokens INTEGER DEFAULT 0, title TEXT,
    api_call_count INTEGER DEFAULT 0, tool_names TEXT
);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, role TEXT NOT NULL, content TEXT,
    tool_call_id TEXT, tool_calls TEXT, tool_name TEXT, timestamp REAL NOT NULL, token_count INTEGER,
    finish_reason TEXT, reasoning TEXT, reasoning_content TEXT, active INTEGER NOT NULL DEFAULT 1,
    compacted INTEGER NOT NULL DEFAULT 0, api_content TEXT, display_kind TEXT
);
CREATE INDEX idx_messages_session ON messages(session_id, timestamp);
"""
# An early store: the system prompt inline, no hash table, no token or reasoning columns.
HERMES_OLD_SCHEMA = """
CREATE TABLE sessions (
    id TEXT PRIMARY KEY, source TEXT NOT NULL, model TEXT, system_prompt TEXT,
    parent_session_id TEXT, started_at REAL NOT NULL, ended_at REAL, end_reason TEXT
);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, role TEXT NOT NULL, content TEXT,
    tool_call_id TEXT, tool_calls TEXT, tool_name TEXT, timestamp REAL NOT NULL
);
"""


@dataclass
class HermesSession:
    id: str
    source: str = "cli"
    system: str = ""
    parent: str | None = None
    end_reason: str | None = None
    model: str = "qwen3.8-flash"
    model_config: dict[str, Any] | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)  # message rows, each with a timestamp

    def add(self, t: float, role: str, content: str = "", **extra: Any) -> None:
        self.rows.append({"timestamp": t, "role": role, "content": content, **extra})

    def call(self, t: float, call_id: str, name: str, args: dict[str, Any], tokens: int = 12) -> None:
        calls = [{"id": call_id, "type": "function", "function": {"name": name, "arguments": orjson.dumps(args).decode()}}]
        self.add(t, "assistant", "", tool_calls=orjson.dumps(calls).decode(), finish_reason="tool_calls", token_count=tokens)

    def result(self, t: float, call_id: str, name: str, text: str) -> None:
        self.add(t, "tool", text, tool_call_id=call_id, tool_name=name)

    def reply(self, t: float, text: str, tokens: int | None = None) -> None:
        self.add(t, "assistant", text, finish_reason="stop", token_count=tokens or len(text.split()))


def write_hermes(path: Path, sessions: list[HermesSession], old: bool = False) -> Path:
    conn = sqlite3.connect(path)
    conn.executescript(HERMES_OLD_SCHEMA if old else HERMES_SCHEMA)
    for s in sessions:
        start = min(r["timestamp"] for r in s.rows)
        end = max(r["timestamp"] for r in s.rows)
        if old:
            conn.execute(
                "INSERT INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (s.id, s.source, s.model, s.system or None, s.parent, start, end, s.end_reason),
            )
        else:
            digest = hashlib.sha256(s.system.encode()).hexdigest() if s.system else None
            if digest:
                conn.execute("INSERT OR IGNORE INTO system_prompts VALUES (?, ?)", (digest, s.system))
            names = sorted({r["tool_name"] for r in s.rows if r.get("tool_name")})
            conn.execute(
                "INSERT INTO sessions (id, source, model, model_config, system_prompt_hash, parent_session_id,"
                " started_at, ended_at, end_reason, message_count, tool_names, input_tokens, output_tokens)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    s.id, s.source, s.model, orjson.dumps(s.model_config or {}).decode(), digest, s.parent,
                    start, end, s.end_reason, len(s.rows), orjson.dumps(names).decode(), 1000, 100,
                ),
            )  # fmt: skip
        for r in s.rows:
            keys = [k for k in r if not old or k in ("role", "content", "tool_call_id", "tool_calls", "tool_name", "timestamp")]
            conn.execute(
                f"INSERT INTO messages (session_id, {', '.join(keys)}) VALUES (?, {', '.join('?' for _ in keys)})",
                (s.id, *(r[k] for k in keys)),
            )
    conn.commit()
    conn.close()
    return path


HERMES_SYSTEM = words(1400, 1)  # the agent's prompt, shared by every conversation (14K in the field)
REVIEW = "Review the conversation above and update the skill library with anything worth keeping."


def slow_morning_hermes(path: Path) -> Path:
    """The slow morning, scaled down 50x in tokens: main session compressed once, two cron jobs
    growing by tool output, then main turns with background reviews running alongside."""
    t0 = MORNING
    main = HermesSession("20261130_064500_a1b2c3", "cli", HERMES_SYSTEM, end_reason="compression")
    main.add(t0 - 5, "user", words(1500, 2))  # the morning's conversation so far (87K in the field)
    t = t0
    for i in range(8):  # 06:45-07:41: tool loop, one call every 150 s
        main.call(t + 20, f"m{i}", "read_file", {"path": f"notes/{i}.md"})
        main.result(t + 22, f"m{i}", "read_file", words(150, 100 + i))
        t += 150
    main.reply(t + 20, "Done with the morning notes.")
    crons = []
    for job, start, seed in (("fin1", 60, 300), ("fin2", 900, 400)):
        cron = HermesSession(f"cron_{job}_20261130_0646{start % 60:02d}", "cron", HERMES_SYSTEM)
        ts = t0 + start
        cron.add(ts, "user", f"Run the scheduled job {job}: " + words(100, seed))
        for k in range(8):  # growing by a tool result per call
            cron.call(ts + 10, f"{job}{k}", "run_command", {"cmd": f"fetch {job} {k}"})
            cron.result(ts + 12, f"{job}{k}", "run_command", words(500, seed + k))
            ts += 40
        cron.reply(ts + 10, f"{job} report written.")
        crons.append(cron)
    # 07:46 compression: the child starts with the summary and the kept tail, then goes on
    t = t0 + 61 * 60
    cont = HermesSession("20261130_074600_d4e5f6", "cli", HERMES_SYSTEM, parent=main.id)
    cont.add(t, "user", "[CONTEXT COMPACTION] Summary of the earlier conversation: " + words(900, 5))
    cont.add(t + 1, "user", "Go on with the portfolio notes.")
    cont.reply(t + 40, "Continuing from the summary.")
    t += 40 + 9 * 60  # 07:55: main turns, each with a background review of the turn before
    for k in range(4):
        cont.add(t + 2, "user", f"Next: section {k}. " + words(40, 600 + k))
        cont.call(t + 30, f"c{k}", "read_file", {"path": f"section/{k}.md"})
        cont.result(t + 32, f"c{k}", "read_file", words(200, 700 + k))
        # the review forked at t, written when it finished: the harness prompt and its reply
        cont.add(t + 60, "user", REVIEW)
        cont.reply(t + 60.5, f"Saved skill s{k}.")
        cont.reply(t + 80, f"Section {k} summarised.")
        t += 100
    # rows are written as they happen: sort each session's rows by time
    for s in (main, *crons, cont):
        s.rows.sort(key=lambda r: r["timestamp"])
    return write_hermes(path, [main, *crons, cont])
