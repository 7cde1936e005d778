"""SemiAnalysis/WEKA Claude Code traces (`semianalysisai/cc-traces-weka-*`, as the KV-cache tester
writes them and inference-perf, AIPerf and guidellm replay them) to our trace format.

The input is one trace per JSON object: a `.jsonl` file (one a line, the datasets' `traces.jsonl`),
a `.json` file holding one, or a folder of either. A trace is
`{"id", "models", "block_size", "tool_tokens", "system_tokens", "requests": [...]}`; a request is
`{"t", "type": "n"|"s", "model", "in", "out", "hash_ids", "api_time", "think_time", "ttft"}` (`t` in
seconds from the trace's start, `hash_ids` one id per `block_size` tokens of the prompt) or a
subagent `{"t", "type": "subagent", "agent_id", "subagent_type", "duration_ms", "requests": [...]}`
whose requests are of the first kind (their `t` from the trace's start, or from the subagent's when
smaller than it).

Each trace is a session (`w<n>`), each subagent a session of role `subagent` (`w<n>.<agent_id>`).
Each request is one user message whose content is its blocks: block id h becomes synthetic text
seeded by h and the trace's id (as the Mooncake importer does, scoped to the trace as inference-perf
scopes them), so two requests of a trace (parent or subagent) share prompt text exactly where their
hash ids are equal; the last block may be partial (the prefix of the same
id's full block); each join between blocks is a token, so the prompt is `in` tokens long. The
reply is `out` tokens. `after` is the previous request of the session (for a subagent's first
request: the parent's request that spawned it) with the gap between that reply (`t + api_time`)
and this request: the think and tool time. `--gap-cap S` shortens every gap between request
starts longer than S seconds to S (and `after.delay_s` with it), as inference-perf's
`trace_idle_gap_cap_seconds` does.

Traces are read one at a time (one line, or one file) and written before the next is read.

What the format loses: the text (blocks are hashes: message roles, tool calls and the split
between system prompt, tool definitions and conversation are gone, so a request is one user
message and no request carries an assistant reply in its history); the per-request model within
a session (the session takes its first request's); `ttft` and `api_time` (kept only to place the
next request); `tool_tokens` and `system_tokens` (already inside the first request's blocks; kept
as session labels). A trace's `t` starts at 0, so the traces of one file start together.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from replay.errors import TraceError, UsageError
from replay.importers.base import ImportOptions, jsonl, progress_bar, tree_size
from replay.record.tokens import PART_SEPARATOR_TOKENS
from replay.trace.writer import TraceWriter

SEED_BASE = 0x5745_0000_0000  # keeps WEKA block seeds apart from other synthetic seeds
_SEED_MASK = (1 << 40) - 1


def block_parts(
    ids: list[int], length: int, block: int, tail_seed: int, seed_of: Callable[[int], int] = lambda h: h
) -> list[dict[str, Any]]:
    """`length` tokens of synthetic text from blocks `ids` of `block` tokens: block h is text
    seeded by `seed_of(h)`; the last block may be partial; a join between blocks costs a token. If
    the ids cover fewer tokens than `length`, a tail seeded by `tail_seed` makes up the rest."""
    parts: list[dict[str, Any]] = []
    left = length
    for h in ids:
        if left <= 0:
            break
        size = min(block, left)
        left -= size
        _add(parts, size, seed_of(h))
    if left > 0:
        _add(parts, left, tail_seed)
    return parts


def _add(parts: list[dict[str, Any]], size: int, seed: int) -> None:
    """Append a part of `size` tokens, the join before it included; a part too short to pay for
    its join lengthens the previous one instead (the text of a seed only grows at its end)."""
    if parts:
        size -= PART_SEPARATOR_TOKENS
        if size <= 0:
            parts[-1]["synth"]["tokens"] += size + PART_SEPARATOR_TOKENS
            return
    parts.append({"synth": {"tokens": size, "seed": seed}})


def _tail_seed(*key: object) -> int:
    digest = hashlib.blake2b(repr(key).encode(), digest_size=5).digest()
    return SEED_BASE + (1 << 41) + int.from_bytes(digest, "big")


class _Seeds:
    """Block id -> seed, scoped to one trace (as inference-perf scopes them: a trace's ids are its
    own), so the parent and its subagents share text where their ids are equal, two traces never."""

    def __init__(self, trace_id: str, block: int = 0) -> None:
        self.key = trace_id.encode()
        self.seen: dict[int, int] = {}
        # block id -> its part as JSON when it is neither the prompt's first part nor one of its
        # last two (`block_content`): the same bytes every time the id comes back
        self.middle: dict[int, bytes] = {}
        self.middle_tokens = block - PART_SEPARATOR_TOKENS

    def __call__(self, h: int) -> int:
        seed = self.seen.get(h)
        if seed is None:
            digest = hashlib.blake2b(self.key + h.to_bytes(16, "big", signed=True), digest_size=5).digest()
            seed = self.seen[h] = SEED_BASE + (int.from_bytes(digest, "big") & _SEED_MASK)
        return seed

    def part(self, h: int) -> bytes:
        found = self.middle[h] = b'{"synth":{"tokens":%d,"seed":%d}}' % (self.middle_tokens, self(h))
        return found


def block_content(ids: list[int], length: int, block: int, tail_seed: int, seeds: _Seeds) -> orjson.Fragment:
    """`block_parts(ids, length, block, tail_seed, seeds)` as JSON, built from each block id's
    cached bytes: a prompt of N blocks costs N dict look-ups, not N dicts to build and encode
    (a 2 GB input holds some 300 million block ids). Only the first part and the last few (the
    last block may be partial, a tail may follow, and a part too short for its join lengthens
    the one before) go through `block_parts`' own rule."""
    sep = PART_SEPARATOR_TOKENS
    n = min(len(ids), -(-length // block)) if length > 0 else 0  # the blocks `block_parts` uses
    if block <= sep or n < 3 or seeds.middle_tokens != block - sep:
        return orjson.Fragment(orjson.dumps(block_parts(ids, length, block, tail_seed, seeds)))
    # Parts 0 .. n-3 are whole blocks that nothing after them changes: part 0 holds `block`
    # tokens, each later one `block - sep` (its join paid). Part n-2 is whole too, but the last
    # block or the tail may be folded into it.
    get, make = seeds.middle.get, seeds.part
    middle = [get(h) or make(h) for h in ids[1 : n - 2]]
    end: list[dict[str, Any]] = [{"synth": {"tokens": block - sep, "seed": seeds(ids[n - 2])}}]
    left = length - (n - 1) * block  # > 0: the last block used is not empty
    size = min(block, left)
    _add(end, size, seeds(ids[n - 1]))
    if left > size:
        _add(end, left - size, tail_seed)
    head = orjson.dumps({"synth": {"tokens": block, "seed": seeds(ids[0])}})
    return orjson.Fragment(b"[" + b",".join([head, *middle, *map(orjson.dumps, end)]) + b"]")


@dataclass(slots=True)
class _Call:
    """One request of a trace, placed: its session, start, end and what it waits for."""

    session: str
    t: float
    end: float
    row: dict[str, Any]
    seq: int
    after: int | None = None  # index into the trace's calls of the call it follows
    rid: int = 0
    spawn: bool = False  # a subagent's first request: `after` is the parent request that spawned it
    waits: list[int] = field(default_factory=list)  # indices of subagents' last calls it waited for
    joined: float = 0.0  # when the last subagent it waited for had returned


def _number(src: Path, line: int, where: str, obj: dict[str, Any], key: str, default: Any = None) -> Any:
    value = obj.get(key, default)
    if value is None and default is None:
        raise TraceError(str(src), line, f"{where} is missing '{key}'")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise TraceError(str(src), line, f"{where}: '{key}' must be a number >= 0, not {value!r}")
    return value


def _check_request(src: Path, line: int, where: str, r: Any) -> None:
    if not isinstance(r, dict):
        raise TraceError(str(src), line, f"{where} must be a JSON object")
    _number(src, line, where, r, "t")
    for key in ("in", "out"):
        if not isinstance(r.get(key), int) or isinstance(r.get(key), bool) or r[key] < 0:
            raise TraceError(str(src), line, f"{where}: '{key}' must be an integer >= 0")
    ids = r.get("hash_ids", [])
    if not isinstance(ids, list) or not set(map(type, ids)) <= {int}:  # at C speed (bool is not int)
        raise TraceError(str(src), line, f"{where}: hash_ids must be a list of integers")
    for key in ("api_time", "think_time", "ttft"):
        if r.get(key) is not None:
            _number(src, line, where, r, key)


def check_trace(src: Path, line: int, trace: Any) -> None:
    """A WEKA trace object, checked; a bad one is a `TraceError` at file:line naming the request."""
    if not isinstance(trace, dict):
        raise TraceError(str(src), line, "a WEKA trace must be a JSON object")
    if not isinstance(trace.get("requests"), list):
        raise TraceError(str(src), line, "not a WEKA trace: no 'requests' list")
    block = trace.get("block_size")
    if not isinstance(block, int) or isinstance(block, bool) or block < 1:
        raise TraceError(str(src), line, f"block_size must be an integer >= 1, not {block!r}")
    for i, r in enumerate(trace["requests"]):
        where = f"request {i}"
        if not isinstance(r, dict):
            raise TraceError(str(src), line, f"{where} must be a JSON object")
        kind = r.get("type")
        if kind == "subagent":
            _number(src, line, where, r, "t")
            if not isinstance(r.get("requests", []), list):
                raise TraceError(str(src), line, f"{where}: a subagent's requests must be a list")
            if r.get("duration_ms") is not None:
                _number(src, line, where, r, "duration_ms")
            for j, sub in enumerate(r.get("requests", [])):
                _check_request(src, line, f"{where} (subagent) request {j}", sub)
        elif kind in ("n", "s"):
            _check_request(src, line, where, r)
        else:
            raise TraceError(str(src), line, f"{where}: unknown type {kind!r} (expected n, s or subagent)")


def _files(src: Path) -> list[Path]:
    if src.is_dir():
        found = sorted(p for p in src.rglob("*") if p.suffix in (".json", ".jsonl") and p.is_file())
        if not found:
            raise UsageError(f"{src}: no .json or .jsonl WEKA traces in this folder")
        return found
    return [src]


def traces(src: Path, advance: Callable[[int], None] = lambda n: None) -> Iterator[tuple[Path, int, Any]]:
    """(file, line, trace object) one at a time, each checked."""
    for path in _files(src):
        if path.suffix == ".jsonl":
            for n, obj in jsonl(path, advance):
                check_trace(path, n, obj)
                yield path, n, obj
        else:
            data = path.read_bytes()
            advance(len(data))
            try:
                obj = orjson.loads(data)
            except orjson.JSONDecodeError as exc:
                raise TraceError(str(path), 1, f"bad JSON: {exc}") from None
            check_trace(path, 1, obj)
            yield path, 1, obj


def _warp(starts: list[float], cap: float | None) -> Callable[[float], float]:
    """Trace time -> time with every gap between consecutive request starts capped at `cap`."""
    if cap is None:
        return lambda t: t
    points = sorted(set(starts))
    shifts: list[tuple[float, float]] = []  # (start at or after which, total shift so far)
    total = 0.0
    for a, b in zip(points, points[1:], strict=False):
        if b - a > cap:
            total += b - a - cap
            shifts.append((b, total))

    def warp(t: float) -> float:
        shift = 0.0
        for at, s in shifts:
            if t >= at:
                shift = s
            else:
                break
        # a time inside a shortened gap keeps its distance from the gap's start, up to the cap
        return t - shift

    return warp


def _calls(index: int, trace: dict[str, Any]) -> tuple[list[_Call], dict[str, dict[str, Any]]]:
    """The trace's requests in sending order (parent and subagents), and its sessions."""
    base = f"w{index}"
    sessions: dict[str, dict[str, Any]] = {}
    calls: list[_Call] = []
    last_parent: int | None = None
    pending: list[tuple[int, float]] = []  # subagents not yet waited for: (last call, return time)
    seq = 0
    labels = {
        "source": "weka",
        "trace": str(trace.get("id", index)),
        "tool_tokens": trace.get("tool_tokens", 0),
        "system_tokens": trace.get("system_tokens", 0),
    }
    for r in trace["requests"]:
        if r["type"] == "subagent":
            sid = f"{base}.{r.get('agent_id') or f'sa{len(sessions)}'}"
            while sid in sessions:
                sid += "'"
            subs = r.get("requests", [])
            sessions[sid] = {
                "role": "subagent",
                "model": str(subs[0].get("model", "default")) if subs else "default",
                "labels": {
                    "source": "weka",
                    "parent": base,
                    "agent_id": str(r.get("agent_id", "")),
                    "subagent_type": str(r.get("subagent_type", "")),
                    "tool_tokens": r.get("tool_tokens", 0),
                    "system_tokens": r.get("system_tokens", 0),
                },
                "spawned_by": last_parent,
                "start": float(r["t"]),
                "duration": float(r.get("duration_ms") or 0) / 1000.0,
            }
            prev = last_parent
            for sub in sorted(subs, key=lambda x: float(x["t"])):
                t = float(sub["t"])
                if t + 1e-6 < float(r["t"]):
                    t += float(r["t"])  # relative to the subagent's start
                calls.append(_Call(sid, t, t + float(sub.get("api_time") or 0.0), sub, seq, prev))
                calls[-1].spawn = prev == last_parent and prev is not None
                prev = len(calls) - 1
                seq += 1
            if subs:
                end = max(float(r["t"]) + float(r.get("duration_ms") or 0) / 1000.0, calls[-1].end)
                pending.append((len(calls) - 1, end))
        else:
            if base not in sessions:
                sessions[base] = {
                    "role": "interactive",
                    "model": str(r.get("model", "default")),
                    "labels": labels,
                }
            t = float(r["t"])
            call = _Call(base, t, t + float(r.get("api_time") or 0.0), r, seq, last_parent)
            # the parent's first request after a subagent returned waited for it (fan-in)
            back = [(i, end) for i, end in pending if end <= t + 1e-6]
            if back:
                call.waits = [i for i, _ in back]
                call.joined = max(end for _, end in back)
                pending = [p for p in pending if p not in back]
            calls.append(call)
            last_parent = len(calls) - 1
            seq += 1
    return calls, sessions


def import_weka(src: str | Path, out: str | Path, options: ImportOptions | None = None) -> dict[str, int]:
    """Convert WEKA traces at `src` into a trace at `out` (see the module docstring)."""
    options = options or ImportOptions()
    if options.since is not None or options.until is not None:
        raise UsageError("weka traces have no wall-clock times to filter by (each trace starts at 0)")
    src = Path(src)
    files = _files(src)
    counts = {
        "traces": 0,
        "sessions": 0,
        "subagents": 0,
        "joins": 0,
        "requests": 0,
        "blocks": 0,
        "filtered": 0,
    }
    notes = f"imported from WEKA traces {src.name}; hashed blocks as synthetic text"
    cap = options.gap_cap
    rid = 0
    with (
        TraceWriter(out, source="import:weka", notes=notes) as writer,
        progress_bar(tree_size(files), "weka", options) as advance,
    ):
        for index, (_path, _line, trace) in enumerate(traces(src, advance), 1):
            counts["traces"] += 1
            block = trace["block_size"]
            calls, sessions = _calls(index, trace)
            wanted = {
                sid
                for sid in sessions
                if not options.sessions
                or any(
                    w in (sid, sessions[sid]["labels"].get("trace", "")) or sid.startswith(w)
                    for w in options.sessions
                )
            }
            if not calls:
                continue
            t0 = min(c.t for c in calls)
            warp = _warp([c.t for c in calls], cap)
            declared: set[str] = set()
            seeds = _Seeds(str(trace.get("id", index)), block)
            for c in sorted(calls, key=lambda c: (c.t, c.seq)):
                if c.session not in wanted:
                    counts["filtered"] += 1
                    continue
                info = sessions[c.session]
                if c.session not in declared:
                    writer.session(
                        c.session,
                        role=info["role"],
                        api="anthropic",
                        model=info["model"],
                        labels=info["labels"],
                    )
                    declared.add(c.session)
                    counts["sessions"] += 1
                    counts["subagents"] += info["role"] == "subagent"
                row = c.row
                ids = row.get("hash_ids", [])
                after = None
                if c.after is not None and calls[c.after].rid:
                    w = calls[c.after]
                    waits = [calls[i].rid for i in c.waits if calls[i].rid]
                    gap = round(max(0.0, c.t - max(w.end, c.joined if waits else 0.0)), 3)
                    if cap is not None:
                        gap = min(gap, math.floor(cap * 1000) / 1000)  # never above the cap
                    after = {"request": w.rid, "delay_s": gap}
                    if c.spawn:
                        after["spawn"] = True
                    if waits:
                        after["waits"] = sorted(waits)
                        counts["joins"] += 1
                parts = block_content(ids, row["in"], block, _tail_seed(index, c.seq), seeds)
                # Written whole (no request shares a message with another: each is one message of
                # its blocks), so the line goes out as is, without the writer's delta machinery.
                rid += 1
                line: dict[str, Any] = {
                    "kind": "request",
                    "id": rid,
                    "session": c.session,
                    "t": round(warp(c.t) - warp(t0), 3),
                    "append": [{"role": "user", "content": parts}],
                    "params": {"max_tokens": row["out"], "stream": True},
                    "reply": {"output_tokens": row["out"], "finish": "length"},
                }
                if after is not None:
                    line["after"] = after
                line["tag"] = "subagent" if info["role"] == "subagent" else "turn"
                writer.raw_line(line)
                c.rid = rid
                counts["requests"] += 1
                counts["blocks"] += len(ids)
    if counts["requests"] == 0:
        raise UsageError(
            "nothing to import: no requests" + (" left by --session" if counts["filtered"] else "")
        )
    return counts
