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
    finish_reason TEXT, reasoning TEXT, reasoning_content TEXT, _compressed_summary INTEGER NOT NULL DEFAULT 0,
    active INTEGER NOT NULL DEFAULT 1,
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
    # The session's usage sums as Hermes 0.19 keeps them (input_tokens, cache_read_tokens,
    # cache_write_tokens, api_call_count); None: the 1000-token placeholder of older fixtures.
    usage: dict[str, int] | None = None

    def add(self, t: float, role: str, content: str = "", **extra: Any) -> None:
        self.rows.append({"timestamp": t, "role": role, "content": content, **extra})

    def call(self, t: float, call_id: str, name: str, args: dict[str, Any], tokens: int = 12) -> None:
        calls = [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": orjson.dumps(args).decode()},
            }
        ]
        self.add(
            t,
            "assistant",
            "",
            tool_calls=orjson.dumps(calls).decode(),
            finish_reason="tool_calls",
            token_count=tokens,
        )

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
            usage = {"input_tokens": 1000, **(s.usage or {})}
            conn.execute(
                "INSERT INTO sessions (id, source, model, model_config, system_prompt_hash, parent_session_id,"
                " started_at, ended_at, end_reason, message_count, tool_names, output_tokens, "
                f"{', '.join(usage)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {', '.join('?' for _ in usage)})",
                (
                    s.id, s.source, s.model, orjson.dumps(s.model_config or {}).decode(), digest, s.parent,
                    start, end, s.end_reason, len(s.rows), orjson.dumps(names).decode(), 100, *usage.values(),
                ),
            )  # fmt: skip
        for r in s.rows:
            keys = [
                k
                for k in r
                if not old or k in ("role", "content", "tool_call_id", "tool_calls", "tool_name", "timestamp")
            ]
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
    # 06:45-07:41: tool loop, one call every 150 s; each tool runs a minute, so main is still in
    # its loop when fin1 starts, however fast a replay serves the calls in between
    for i in range(8):
        main.call(t + 20, f"m{i}", "read_file", {"path": f"notes/{i}.md"})
        main.result(t + 80, f"m{i}", "read_file", words(150, 100 + i))
        t += 150
    main.reply(t + 20, "Done with the morning notes.")
    crons = []
    for job, start, seed in (("fin1", 60, 300), ("fin2", 900, 400)):
        cron = HermesSession(
            f"cron_{job}_20261130_{6 + (45 * 60 + start) // 3600:02d}{(45 + start // 60) % 60:02d}00",
            "cron",
            HERMES_SYSTEM,
        )
        ts = t0 + start
        cron.add(ts, "user", f"Run the scheduled job {job}: " + words(100, seed))
        for k in range(8):  # growing by a tool result per call
            cron.call(ts + 10, f"{job}{k}", "run_command", {"cmd": f"fetch {job} {k}"})
            cron.result(ts + 12, f"{job}{k}", "run_command", words(500, seed + k))
            ts += 40
        cron.reply(ts + 10, f"{job} report written.")
        crons.append(cron)
    # 07:46 compression: the child starts with the summary, then goes on
    t = t0 + 61 * 60
    cont = HermesSession("20261130_074600_d4e5f6", "cli", HERMES_SYSTEM, parent=main.id)
    cont.add(t, "user", "[CONTEXT COMPACTION] Summary of the earlier conversation: " + words(900, 5))
    cont.add(t + 1, "user", "Go on with the portfolio notes.")
    end = t + 9 * 60  # 07:55, when that reply ended
    cont.reply(end, "Continuing from the summary.", tokens=200)
    for k in range(4):  # main turns, each with a background review of the turn before running alongside
        cont.add(end + 2, "user", f"Next: section {k}. " + words(40, 600 + k))
        cont.call(end + 30, f"c{k}", "read_file", {"path": f"section/{k}.md"}, tokens=200)
        cont.result(end + 32, f"c{k}", "read_file", words(200, 700 + k))
        # the review forked when the turn ended, written when it finished: the prompt and its reply
        cont.add(end + 60, "user", REVIEW)
        cont.reply(end + 60.5, f"Saved skill s{k}.", tokens=300)
        cont.reply(end + 80, f"Section {k} summarised.", tokens=200)
        end += 80
    # rows are written as they happen: sort each session's rows by time
    for s in (main, *crons, cont):
        s.rows.sort(key=lambda r: r["timestamp"])
    return write_hermes(path, [main, *crons, cont])


# ---- OpenCode -----------------------------------------------------------------------------------

OC_T0 = 1796000000000  # ms


def opencode_session(sid: str = "ses_01main", parent: str | None = None, t0: int = OC_T0) -> dict[str, Any]:
    """One OpenCode session as `opencode export` shows it: info, then messages with their parts.

    Turn 1: a user prompt, an assistant message of two steps (a tool call, then text).
    Turn 2: compaction (a user message with a compaction part, a summary assistant message),
    then a user prompt answered in one step.
    """

    def ids(prefix: str) -> Any:
        n = 0
        while True:
            n += 1
            yield f"{prefix}_{sid[-6:]}{n:04d}"

    mid, pid = ids("msg"), ids("prt")
    tokens = {"input": 900, "output": 30, "reasoning": 0, "cache": {"read": 1200, "write": 0}}

    def user(t: int, text: str, extra: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        m = next(mid)
        parts = (
            [{"id": next(pid), "sessionID": sid, "messageID": m, "type": "text", "text": text}]
            if text
            else []
        )
        for e in extra or ():
            parts.append({"id": next(pid), "sessionID": sid, "messageID": m, **e})
        info = {
            "id": m,
            "sessionID": sid,
            "role": "user",
            "time": {"created": t},
            "agent": "build",
            "model": {"providerID": "local", "modelID": "qwen3.8"},
        }
        return {"info": info, "parts": parts}

    def assistant(
        t: int, parent_id: str, steps: list[list[dict[str, Any]]], summary: bool = False
    ) -> dict[str, Any]:
        m = next(mid)
        parts = []
        clock = t
        for k, step in enumerate(steps):
            parts.append(
                {
                    "id": next(pid),
                    "sessionID": sid,
                    "messageID": m,
                    "type": "step-start",
                    "snapshot": f"snap{k}",
                }
            )
            for p in step:
                parts.append({"id": next(pid), "sessionID": sid, "messageID": m, **p})
            clock += 4000
            reason = "tool-calls" if any(p["type"] == "tool" for p in step) else "stop"
            parts.append(
                {
                    "id": next(pid),
                    "sessionID": sid,
                    "messageID": m,
                    "type": "step-finish",
                    "reason": reason,
                    "snapshot": f"snap{k}",
                    "cost": 0,
                    "tokens": tokens,
                }
            )
        info = {
            "id": m,
            "sessionID": sid,
            "role": "assistant",
            "time": {"created": t, "completed": clock},
            "parentID": parent_id,
            "modelID": "qwen3.8",
            "providerID": "local",
            "mode": "build",
            "path": {"cwd": "/home/dev/proj", "root": "/home/dev/proj"},
            "cost": 0,
            "tokens": tokens,
            "finish": "stop",
        }
        if summary:
            info["summary"] = True
        return {"info": info, "parts": parts}

    def tool(call: str, name: str, inp: dict[str, Any], out: str, start: int) -> dict[str, Any]:
        return {
            "type": "tool",
            "callID": call,
            "tool": name,
            "state": {
                "status": "completed",
                "input": inp,
                "output": out,
                "title": name,
                "metadata": {},
                "time": {"start": start, "end": start + 500},
            },
        }

    def text(s: str, start: int) -> dict[str, Any]:
        return {"type": "text", "text": s, "time": {"start": start, "end": start + 800}}

    u1 = user(t0, "Find where the parser splits fields.")
    a1 = assistant(
        t0 + 1000,
        u1["info"]["id"],
        [
            [
                text("Let me look.", t0 + 2000),
                tool(f"call_{sid[-4:]}1", "read", {"filePath": "parse.py"}, words(120, 9), t0 + 3000),
            ],
            [text("It splits on commas in parse_line.", t0 + 6000)],
        ],
    )
    c = user(t0 + 60000, "", [{"type": "compaction", "auto": True}])
    s = assistant(
        t0 + 61000,
        c["info"]["id"],
        [[text("Summary: we found parse_line splits on commas.", t0 + 62000)]],
        summary=True,
    )
    u2 = user(t0 + 90000, "Now fix it.")
    a2 = assistant(t0 + 91000, u2["info"]["id"], [[text("Fixed by using csv.reader.", t0 + 93000)]])
    info = {
        "id": sid,
        "slug": "calm-fox",
        "projectID": "prj_1",
        "directory": "/home/dev/proj",
        "title": "Parser fields",
        "version": "1.18.33",
        "time": {"created": t0 - 500, "updated": t0 + 95000},
    }
    if parent:
        info["parentID"] = parent
    return {"info": info, "messages": [u1, a1, c, s, u2, a2]}


def write_opencode_storage(root: Path, sessions: list[dict[str, Any]]) -> Path:
    """The older layout: storage/session/<project>/<id>.json, storage/message/<session>/<id>.json,
    storage/part/<message>/<id>.json."""
    for exp in sessions:
        info = exp["info"]
        d = root / "session" / info["projectID"]
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{info['id']}.json").write_bytes(orjson.dumps(info, option=orjson.OPT_INDENT_2))
        for m in exp["messages"]:
            md = root / "message" / info["id"]
            md.mkdir(parents=True, exist_ok=True)
            (md / f"{m['info']['id']}.json").write_bytes(orjson.dumps(m["info"], option=orjson.OPT_INDENT_2))
            pd = root / "part" / m["info"]["id"]
            pd.mkdir(parents=True, exist_ok=True)
            for p in m["parts"]:
                (pd / f"{p['id']}.json").write_bytes(orjson.dumps(p, option=orjson.OPT_INDENT_2))
    return root


def write_opencode_db(path: Path, sessions: list[dict[str, Any]]) -> Path:
    """The newer layout: opencode.db with session, message and part tables; message and part
    rows hold their JSON in `data` (without the ids the columns carry)."""
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE project (id TEXT PRIMARY KEY, worktree TEXT NOT NULL, time_created INTEGER NOT NULL);
        CREATE TABLE session (id TEXT PRIMARY KEY, project_id TEXT NOT NULL, parent_id TEXT, slug TEXT NOT NULL,
            directory TEXT NOT NULL, title TEXT NOT NULL, version TEXT NOT NULL, time_created INTEGER NOT NULL,
            time_updated INTEGER NOT NULL);
        CREATE TABLE message (id TEXT PRIMARY KEY, session_id TEXT NOT NULL, time_created INTEGER NOT NULL,
            time_updated INTEGER NOT NULL, data TEXT NOT NULL);
        CREATE TABLE part (id TEXT PRIMARY KEY, message_id TEXT NOT NULL, session_id TEXT NOT NULL,
            time_created INTEGER NOT NULL, time_updated INTEGER NOT NULL, data TEXT NOT NULL);
        """
    )
    for exp in sessions:
        info = exp["info"]
        conn.execute(
            "INSERT INTO session VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (info["id"], info["projectID"], info.get("parentID"), info["slug"], info["directory"], info["title"],
             info["version"], info["time"]["created"], info["time"]["updated"]),
        )  # fmt: skip
        for m in exp["messages"]:
            mi = m["info"]
            data = {k: v for k, v in mi.items() if k not in ("id", "sessionID")}
            t = mi["time"]["created"]
            conn.execute(
                "INSERT INTO message VALUES (?, ?, ?, ?, ?)",
                (mi["id"], info["id"], t, t, orjson.dumps(data).decode()),
            )
            for p in m["parts"]:
                pdata = {k: v for k, v in p.items() if k not in ("id", "sessionID", "messageID")}
                conn.execute(
                    "INSERT INTO part VALUES (?, ?, ?, ?, ?, ?)",
                    (p["id"], mi["id"], info["id"], t, t, orjson.dumps(pdata).decode()),
                )
    conn.commit()
    conn.close()
    return path


def opencode_events(exp: dict[str, Any]) -> bytes:
    """What `opencode run --format json` prints for the session's assistant parts."""
    names = {"step-start": "step_start", "step-finish": "step_finish", "text": "text", "tool": "tool_use"}
    lines = []
    for m in exp["messages"]:
        if m["info"]["role"] != "assistant":
            continue
        t = m["info"]["time"]["created"]
        for p in m["parts"]:
            t = ((p.get("time") or (p.get("state") or {}).get("time") or {}).get("end")) or t + 10
            lines.append(
                orjson.dumps(
                    {"type": names[p["type"]], "timestamp": t, "sessionID": exp["info"]["id"], "part": p}
                )
            )
    return b"\n".join(lines) + b"\n"


# ---- Codex CLI ----------------------------------------------------------------------------------


def codex_rollout(
    path: Path, sid: str = "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", start: float = MORNING
) -> Path:
    """A rollout as Codex CLI writes it: session_meta, the initial context items, a turn with a
    function call, a token_count after each call, a compaction, and a turn after it."""
    lines: list[dict[str, Any]] = []

    def at(dt: float) -> str:
        return _dt.datetime.fromtimestamp(start + dt, _dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"

    def add(dt: float, kind: str, payload: dict[str, Any]) -> None:
        lines.append({"timestamp": at(dt), "type": kind, "payload": payload})

    def msg(role: str, text: str) -> dict[str, Any]:
        kind = "output_text" if role == "assistant" else "input_text"
        return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}

    def usage(dt: float, inp: int, cached: int, out: int) -> None:
        last = {
            "input_tokens": inp,
            "cached_input_tokens": cached,
            "output_tokens": out,
            "reasoning_output_tokens": 0,
            "total_tokens": inp + out,
        }
        add(
            dt,
            "event_msg",
            {
                "type": "token_count",
                "info": {"total_token_usage": last, "last_token_usage": last, "model_context_window": 128000},
                "rate_limits": None,
            },
        )

    add(
        0,
        "session_meta",
        {
            "id": sid,
            "timestamp": at(0),
            "cwd": "/home/dev/proj",
            "originator": "codex_exec",
            "cli_version": "0.171.0",
            "instructions": words(300, 21),
            "source": "exec",
            "model_provider": "local",
        },
    )
    add(0.1, "response_item", msg("developer", "<permissions instructions> " + words(200, 22)))
    add(0.2, "response_item", msg("user", "<environment_context> cwd /home/dev/proj </environment_context>"))
    add(
        0.3,
        "turn_context",
        {
            "cwd": "/home/dev/proj",
            "approval_policy": "never",
            "sandbox_policy": {"mode": "read-only"},
            "model": "gpt-oss-20b",
            "effort": "medium",
            "summary": "auto",
        },
    )
    add(1.0, "response_item", msg("user", "List the tests and run them."))
    add(1.0, "event_msg", {"type": "user_message", "message": "List the tests and run them.", "images": []})
    add(
        4.0,
        "response_item",
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "Need to list."}],
            "content": None,
            "encrypted_content": "gAAAA",
        },
    )
    add(
        4.5,
        "response_item",
        {
            "type": "function_call",
            "name": "shell",
            "arguments": '{"command":["ls","tests"]}',
            "call_id": "call_1",
        },
    )
    usage(4.6, 1200, 0, 40)
    add(
        5.0,
        "response_item",
        {
            "type": "function_call_output",
            "call_id": "call_1",
            "output": '{"output":"test_a.py\\ntest_b.py","metadata":{"exit_code":0}}',
        },
    )
    add(
        8.0,
        "response_item",
        {
            "type": "function_call",
            "name": "shell",
            "arguments": '{"command":["pytest","-q"]}',
            "call_id": "call_2",
        },
    )
    usage(8.1, 1290, 1200, 30)
    add(
        20.0,
        "response_item",
        {"type": "function_call_output", "call_id": "call_2", "output": "2 passed " + words(80, 23)},
    )
    add(23.0, "response_item", msg("assistant", "Both tests pass."))
    add(23.0, "event_msg", {"type": "agent_message", "message": "Both tests pass."})
    usage(23.1, 1450, 1290, 8)
    add(60.0, "compacted", {"message": "Summary: listed tests, both pass."})
    add(60.0, "event_msg", {"type": "context_compacted"})
    add(61.0, "response_item", msg("user", "Now add a test for empty input."))
    add(65.0, "response_item", msg("assistant", "Added test_empty."))
    usage(65.1, 600, 300, 12)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\n".join(orjson.dumps(x) for x in lines) + b"\n")
    return path
