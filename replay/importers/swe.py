"""Mini-SWE-agent and SWE-agent trajectories to our trace format (`replay import swe-agent`).

SRC is a trajectory file or a folder of them (`*.traj.json`, `*.traj`, `*.json`), one agent run
(one task instance) each; each run is a session named after its file.

- **Mini-SWE-agent** (`"trajectory_format": "mini-swe-agent-1"` or `-1.1`): `messages` is the whole
  conversation (system, user, assistant, tool or user observations, a final `exit`). Each assistant
  message is the reply to one request whose messages are everything before it. Since 1.1 an
  assistant message carries `extra.response` (the chat completion: `created`, `usage`) and
  `extra.timestamp` (when the reply arrived): the request was sent at `created` (else at the
  previous reply's arrival), and `after.delay_s` is the time from the previous reply to it (the
  agent running the command). Without them the requests follow each other with no gap.
- **SWE-agent** (`.traj`): `trajectory` is a list of steps; each step's `query` is the message list
  sent and `response` the model's text (`thought` + `action` when there is no `response`); the
  step's `execution_time` is the tool time before the next request. `query` messages may carry
  `tool_calls` and `tool_call_ids`. SWE-agent keeps no timestamps: a run starts at 0 and its
  requests are spaced by the tool times alone.

`--gap-cap S` caps the gaps at S seconds (and shifts later requests of the run with them).

What the format loses: the tool definitions (Mini-SWE-agent 1.1 and SWE-agent's function-calling
parser send a `bash`-like tool the trajectory does not store; it becomes a stand-in of that name);
the model's own time in SWE-agent runs (only tool times are kept, so requests come earlier than
they did); requests that failed and were retried (only the kept reply is stored); images
(non-text content parts are dropped, counted).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from replay.errors import TraceError, UsageError
from replay.importers.base import (
    ImportOptions,
    SessionInfo,
    Step,
    merge_by_time,
    progress_bar,
    stand_in_tools,
    tree_size,
    write_trace,
)
from replay.trace.model import Message

_ROLES = ("system", "developer", "user", "assistant", "tool")


def _files(src: Path) -> list[Path]:
    if src.is_dir():
        found = sorted(
            p
            for p in src.rglob("*")
            if p.is_file() and (p.name.endswith((".traj", ".traj.json")) or p.suffix == ".json")
        )
        if not found:
            raise UsageError(f"{src}: no trajectory files (*.traj, *.traj.json) in this folder")
        return found
    return [src]


def _load(path: Path) -> dict[str, Any]:
    try:
        obj = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise TraceError(str(path), 1, f"bad JSON: {exc}") from None
    if not isinstance(obj, dict) or not (
        isinstance(obj.get("messages"), list) or isinstance(obj.get("trajectory"), list)
    ):
        raise TraceError(
            str(path), 1, "not a Mini-SWE-agent or SWE-agent trajectory: no 'messages' or 'trajectory' list"
        )
    return obj


def _text(content: Any, dropped: list[int]) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        out = []
        for p in content:
            if isinstance(p, str):
                out.append(p)
            elif isinstance(p, dict) and isinstance(p.get("text"), str):
                out.append(p["text"])
            else:
                dropped[0] += 1
        return "\n".join(out)
    raise ValueError("content must be text or a list of parts")


def _args(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value if value is not None else {}).decode()


def message(m: Any, dropped: list[int], where: str) -> Message:
    """One trajectory message in our shape (`extra`, `agent`, `message_type`... left out)."""
    if not isinstance(m, dict):
        raise ValueError(f"{where} must be an object")
    role = m.get("role")
    if role not in _ROLES:
        raise ValueError(f"{where}: unknown role {role!r}")
    out: Message = {"role": role, "content": _text(m.get("content"), dropped)}
    calls = []
    for c in m.get("tool_calls") or ():
        if not isinstance(c, dict):
            raise ValueError(f"{where}: a tool call must be an object")
        fn = c.get("function") if isinstance(c.get("function"), dict) else c
        calls.append(
            {
                "id": str(c.get("id") or ""),
                "name": str(fn.get("name") or ""),
                "arguments": _args(fn.get("arguments")),
            }
        )
    if calls and role == "assistant":
        out["tool_calls"] = calls
    if role == "tool":
        ids = m.get("tool_call_ids")
        first = ids[0] if isinstance(ids, list) and ids else None
        out["tool_call_id"] = str(m.get("tool_call_id") or first or "")
    return out


def _call_names(messages: Any) -> list[str]:
    names = []
    for m in messages if isinstance(messages, list) else ():
        for c in (m.get("tool_calls") if isinstance(m, dict) else None) or ():
            fn = c.get("function") if isinstance(c, dict) and isinstance(c.get("function"), dict) else c
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                names.append(fn["name"])
    return names


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _mini(
    path: Path, obj: dict[str, Any], info: SessionInfo, counts: dict[str, int], base: float
) -> Iterator[Step]:
    msgs: list[Message] = []
    clock = base  # the previous reply's arrival (the first run's start without timestamps)
    # the agent sends its tools with every request: stand-ins for every tool the run called
    tools = stand_in_tools(_call_names(obj["messages"]))
    for i, m in enumerate(obj["messages"]):
        where = f"messages[{i}]"
        if isinstance(m, dict) and m.get("role") == "exit":
            continue
        dropped = [0]
        try:
            mine = message(m, dropped, where)
        except ValueError as exc:
            raise TraceError(str(path), 1, str(exc)) from None
        counts["dropped_parts"] += dropped[0]
        if mine["role"] == "assistant" and msgs:
            extra = m.get("extra") if isinstance(m.get("extra"), dict) else {}
            response = extra.get("response") if isinstance(extra.get("response"), dict) else {}
            arrived = _num(extra.get("timestamp"))
            created = _num(response.get("created"))
            sent = created if created is not None and (arrived is None or created <= arrived) else clock
            sent = max(sent, clock) if clock > base or created is None else sent
            done = arrived if arrived is not None and arrived >= sent else sent
            usage_raw = response.get("usage") if isinstance(response.get("usage"), dict) else {}
            out_tokens = usage_raw.get("completion_tokens")
            usage = {}
            if isinstance(usage_raw.get("prompt_tokens"), int):
                usage["prompt_tokens"] = usage_raw["prompt_tokens"]
            details = usage_raw.get("prompt_tokens_details")
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                usage["cached_tokens"] = details["cached_tokens"]
            if isinstance(out_tokens, int):
                usage["output_tokens"] = out_tokens
            choices = response.get("choices")
            finish = None
            if isinstance(choices, list) and choices and isinstance(choices[0], dict):
                finish = choices[0].get("finish_reason")
            params: dict[str, Any] = {"stream": True}
            if tools:
                params["tools"] = tools
            counts["timed"] += arrived is not None
            yield Step(
                session=info,
                t=sent,
                messages=list(msgs),
                reply=mine,
                finish=str(finish) if finish else None,
                output_tokens=out_tokens if isinstance(out_tokens, int) else None,
                usage=usage or None,
                done=done,
                params=params,
            )
            clock = done
        msgs.append(mine)


def _swe(
    path: Path, obj: dict[str, Any], info: SessionInfo, counts: dict[str, int], base: float
) -> Iterator[Step]:
    clock = base
    steps = obj["trajectory"]
    # function-calling runs send their tools with every request: stand-ins for those the run called
    whole = obj.get("history")
    if not isinstance(whole, list):
        whole = next((st.get("query") for st in reversed(steps) if isinstance(st, dict)), None)
    tools = stand_in_tools(_call_names(whole))
    for i, step in enumerate(steps):
        where = f"trajectory[{i}]"
        if not isinstance(step, dict):
            raise TraceError(str(path), 1, f"{where} must be an object")
        query = step.get("query")
        if not isinstance(query, list) or not query:
            counts["no_query"] += 1
            continue
        dropped = [0]
        try:
            msgs = [message(m, dropped, f"{where}.query[{k}]") for k, m in enumerate(query)]
        except ValueError as exc:
            raise TraceError(str(path), 1, str(exc)) from None
        counts["dropped_parts"] += dropped[0]
        reply: Message = {"role": "assistant", "content": ""}
        following = (
            steps[i + 1].get("query") if i + 1 < len(steps) and isinstance(steps[i + 1], dict) else None
        )
        if (
            isinstance(following, list)
            and len(following) > len(query)
            and isinstance(following[len(query)], dict)
        ):
            if following[len(query)].get("role") == "assistant":  # the reply as the next request sent it
                try:
                    reply = message(
                        following[len(query)], dropped, f"trajectory[{i + 1}].query[{len(query)}]"
                    )
                except ValueError as exc:
                    raise TraceError(str(path), 1, str(exc)) from None
        else:
            text = step.get("response")
            if not isinstance(text, str):
                text = "\n".join(x for x in (step.get("thought"), step.get("action")) if isinstance(x, str))
            reply = {"role": "assistant", "content": text}
        params: dict[str, Any] = {"stream": True}
        if tools:
            params["tools"] = tools
        yield Step(session=info, t=clock, messages=msgs, reply=reply, done=clock, params=params)
        tool = _num(step.get("execution_time"))
        clock += tool or 0.0


def import_swe(src: str | Path, out: str | Path, options: ImportOptions | None = None) -> dict[str, int]:
    """Convert Mini-SWE-agent / SWE-agent trajectories at `src` into a trace at `out`."""
    options = options or ImportOptions()
    src = Path(src)
    files = _files(src)
    counts = {"files": 0, "timed": 0, "no_query": 0, "dropped_parts": 0}
    starts: list[tuple[float | None, Path]] = []
    for path in files:  # first pass: each run's start, so runs open in time order
        obj = _load(path)
        t = None
        for m in obj.get("messages") or ():
            extra = m.get("extra") if isinstance(m, dict) and isinstance(m.get("extra"), dict) else {}
            resp = extra.get("response") if isinstance(extra.get("response"), dict) else {}
            first = _num(resp.get("created")) or _num(extra.get("timestamp"))
            if first is not None:
                t = first
                break
        starts.append((t, path))
    timed = [t for t, _ in starts if t is not None]
    base = min(timed) if timed else 0.0  # runs without timestamps start with the first timed one
    placed = sorted(((base if t is None else t), p) for t, p in starts)
    names: set[str] = set()

    def run(path: Path) -> Iterator[Step]:
        obj = _load(path)
        counts["files"] += 1
        name = path.name.removesuffix(".json").removesuffix(".traj")
        while name in names:
            name += "'"
        names.add(name)
        kind = "mini-swe-agent" if isinstance(obj.get("messages"), list) else "swe-agent"
        info_obj = obj.get("info") if isinstance(obj.get("info"), dict) else {}
        model = "default"
        config = info_obj.get("config") if isinstance(info_obj.get("config"), dict) else {}
        model_cfg = config.get("model") if isinstance(config.get("model"), dict) else {}
        if isinstance(model_cfg.get("model_name"), str):
            model = model_cfg["model_name"]
        info = SessionInfo(key=name, model=model, labels={"source": kind}, agent_ids=(name,))
        read = _mini if kind == "mini-swe-agent" else _swe
        steps = list(read(path, obj, info, counts, base))
        if steps:
            steps[-1].ends = (info,)
        return iter(steps)

    with progress_bar(tree_size(files), "swe-agent", options) as advance:

        def sources() -> Iterator[tuple[float, Any]]:
            for t, path in placed:
                advance(tree_size([path]))
                yield t, (lambda p=path: run(p))

        result = write_trace(
            cap_gaps(merge_by_time(sources()), options.gap_cap),
            Path(out),
            "import:swe-agent",
            f"imported from SWE-agent trajectories {src.name}",
            options,
        )
    return {**counts, **result}


def cap_gaps(steps: Iterator[Step], cap: float | None) -> Iterator[Step]:
    """Steps in time order, every gap between consecutive request times longer than `cap`
    shortened to `cap` (later steps move earlier with it)."""
    if cap is None:
        yield from steps
        return
    shift = 0.0
    prev: float | None = None
    for step in steps:
        if prev is not None and step.t - prev > cap:
            shift += step.t - prev - cap
        prev = step.t
        step.t -= shift
        if step.done is not None:
            step.done -= shift
        yield step
