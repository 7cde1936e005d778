"""Scenario spec -> trace: plays the steps against per-session message lists, writes via TraceWriter.

Generation is deterministic (same spec and parameters, same bytes): every synthetic piece gets a
seed derived from the scenario seed and what the piece is (never Python's randomised `hash`), the
trace's `created` comes from the spec, and requests are ordered by their estimated send time with
the generation order breaking ties.

Sizes in a spec are content tokens (synthetic words); a server's prompt count adds its template and
the tool definitions on top. Send times `t` are estimates at nominal speeds (prefill 500 tok/s,
decode 40 tok/s): the `timed` and `closed-loop` plans use them for when sessions start, a server
decides everything else.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from replay.errors import TraceError
from replay.scenario.spec import Scenario, SessionSpec, Step
from replay.trace.model import Trace
from replay.trace.select import PROBE_TAG
from replay.trace.writer import TraceWriter

Message = dict[str, Any]

NOMINAL_PREFILL_TPS = 500.0
NOMINAL_DECODE_TPS = 40.0
CALL_TOKENS = 14  # what a short tool-call message in the history costs, about
MIN_TOOL_RESULT = 8
MAX_TURNS = 10_000
PROBE_NOTICE = (
    "{n} request(s) tagged 'probe' ({ids}) stand for 'save the slot, restart the server, restore, "
    "resend': they need a driver that restarts the server before them. `replay probe --server FILE` "
    "runs them so; `replay run` leaves them out and says so."
)

TOOL_SCHEMAS: dict[str, tuple[str, dict[str, Any]]] = {
    "read_file": ("Read a file from the workspace", {"path": {"type": "string"}}),
    "run_command": ("Run a shell command and return its output", {"command": {"type": "string"}}),
    "search": ("Search the workspace for text", {"query": {"type": "string"}}),
    "write_file": (
        "Write a file in the workspace",
        {"path": {"type": "string"}, "content": {"type": "string"}},
    ),
    "fetch_prices": ("Fetch market prices for a list of symbols", {"symbols": {"type": "string"}}),
}


def tool_definitions(names: tuple[str, ...]) -> list[dict[str, Any]]:
    out = []
    for name in names:
        about, props = TOOL_SCHEMAS.get(name, (f"The {name} tool", {"input": {"type": "string"}}))
        out.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": about,
                    "parameters": {"type": "object", "properties": props, "required": sorted(props)},
                },
            }
        )
    return out


def system_overhead(tools: tuple[str, ...]) -> int:
    """Tokens the simulator's chat template and these tools' definitions add to a system turn."""
    from replay.sim.model.render import render

    probe = render(
        [{"role": "system", "content": ""}, {"role": "user", "content": ""}], tool_definitions(tools)
    )
    return probe.anchor or 0


@dataclass(slots=True)
class GenerateResult:
    path: str
    requests: int
    sessions: int
    tags: dict[str, int]
    labels: list[str]
    notice: str | None


@dataclass(eq=False, slots=True)
class _Planned:
    index: int
    session: str
    t: float
    messages: list[Message]
    params: dict[str, Any]
    reply: dict[str, Any]
    after: _Planned | None
    delay_s: float
    tag: str
    label: str
    rid: int = 0
    ends: float = 0.0  # estimated


@dataclass(slots=True)
class _State:
    spec: SessionSpec
    messages: list[Message]
    tokens: int
    base: list[Message]
    last: _Planned | None = None
    pending_reply: Message | None = None
    pending_call: str | None = None
    real_requests: int = 0
    ready_at: float = 0.0
    turns: int = 0
    doc_index: int = -1  # which message holds the document (document sessions)
    last_sent: tuple[list[Message], int] | None = None  # the prompt sent last, and its new tokens


class _Builder:
    def __init__(self, spec: Scenario) -> None:
        self.spec = spec
        self.scale = float(spec.params["scale"])
        self.planned: list[_Planned] = []
        self.now = 0.0
        self.states = {sid: self._initial(s) for sid, s in spec.sessions.items()}

    # --- sizes and content ------------------------------------------------------------------

    def size(self, tokens: int) -> int:
        return 0 if tokens <= 0 else max(1, round(tokens * self.scale))

    def seed(self, *parts: object) -> int:
        key = "|".join([str(self.spec.seed), *map(str, parts)]).encode()
        return int.from_bytes(hashlib.blake2b(key, digest_size=4).digest(), "big") & 0x7FFFFFFF

    def synth(self, tokens: int, *parts: object) -> dict[str, Any]:
        return {"synth": {"tokens": max(0, tokens), "seed": self.seed(*parts)}}

    def shared_system_content(self) -> int:
        """Content tokens of the shared system prompt. With `system_turn_tokens` the spec gives
        the rendered system turn (prompt + tools + template, what ds4 reports cached on a switch),
        so the content is that less what the simulator's template and the tools add."""
        turn = self.spec.system_turn_tokens
        if not turn:
            return self.size(self.spec.system_tokens)
        return max(1, self.size(turn) - system_overhead(self.spec.tools))

    def _initial(self, s: SessionSpec) -> _State:
        msgs: list[Message] = []
        tokens = 0
        if s.system == "shared":
            n = self.shared_system_content()
            msgs.append({"role": "system", "content": self.synth(n, "shared-system")})
            tokens += n
        elif s.system == "own":
            n = self.size(s.system_tokens)
            msgs.append({"role": "system", "content": self.synth(n, s.id, "system")})
            tokens += n
        state = _State(spec=s, messages=msgs, tokens=tokens, base=[])
        if s.document_tokens:
            parts, n = self._document(s)
            parts.append(self.synth(self.size(s.question_tokens), s.id, "question", 0))
            msgs.append({"role": "user", "content": parts})
            state.doc_index = len(msgs) - 1
            state.tokens += n + self.size(s.question_tokens)
        else:
            task = self.size(s.task_tokens)
            msgs.append({"role": "user", "content": self.synth(task, s.id, "task")})
            state.tokens += task
            self._history(state)
        state.base = list(msgs)
        return state

    def _document(self, s: SessionSpec) -> tuple[list[Any], int]:
        total = self.size(s.document_tokens)
        k = max(1, min(s.paragraphs, total))
        sizes = [total // k + (1 if i < total % k else 0) for i in range(k)]
        return [self.synth(n, s.id, "paragraph", i) for i, n in enumerate(sizes)], total

    def _history(self, state: _State) -> None:
        """Earlier turns up to `start_tokens`: tool calls and their results, or text exchanges."""
        s = state.spec
        remaining = self.size(s.start_tokens) - state.tokens
        if remaining <= 0:
            return
        if s.start_messages:
            pairs = max(1, (s.start_messages - len(state.messages)) // 2)
        else:
            pairs = max(1, math.ceil(remaining / self.size(s.history_chunk)))
        first = CALL_TOKENS if s.reply == "tool" else min(s.reply_tokens, max(1, remaining // (2 * pairs)))
        body = max(pairs, remaining - pairs * first)
        for i in range(pairs):
            n = body // pairs + (1 if i < body % pairs else 0)
            if s.reply == "tool":
                call_id = f"call_{s.id}_h{i}"
                name = self.spec.tools[i % len(self.spec.tools)]
                state.messages.append(
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [{"id": call_id, "name": name, "arguments": _arguments(name, f"h{i}")}],
                    }
                )
                state.messages.append(
                    {"role": "tool", "tool_call_id": call_id, "content": self.synth(n, s.id, "h", i)}
                )
            else:
                state.messages.append({"role": "assistant", "content": self.synth(first, s.id, "ha", i)})
                state.messages.append({"role": "user", "content": self.synth(n, s.id, "hu", i)})
            state.tokens += first + n

    def _reply(self, state: _State) -> dict[str, Any]:
        s = state.spec
        k = state.real_requests
        if s.reply == "tool":
            name = self.spec.tools[k % len(self.spec.tools)]
            call = {"id": f"call_{s.id}_{k}", "name": name, "arguments": _arguments(name, str(k))}
            message: Message = {"role": "assistant", "content": "", "tool_calls": [call]}
            finish = "tool_calls"
        else:
            message = {"role": "assistant", "content": self.synth(s.reply_tokens, s.id, "reply", k)}
            finish = "stop"
        return {"message": message, "finish": finish, "output_tokens": s.reply_tokens}

    def _growth(self, state: _State, tokens: int) -> Message:
        s = state.spec
        k = state.turns
        if state.pending_call is not None:
            n = max(tokens, MIN_TOOL_RESULT)
            state.tokens += n
            return {
                "role": "tool",
                "tool_call_id": state.pending_call,
                "content": self.synth(n, s.id, "result", k),
            }
        n = max(tokens, 1)
        state.tokens += n
        return {"role": "user", "content": self.synth(n, s.id, "user", k)}

    # --- requests ---------------------------------------------------------------------------

    def _plan(
        self,
        state: _State,
        t: float,
        messages: list[Message],
        new_tokens: int,
        tag: str,
        label: str,
        delay_s: float,
        prewarm: bool = False,
        after: _Planned | None = None,
    ) -> _Planned:
        s = state.spec
        state.last_sent = (list(messages), new_tokens)
        params: dict[str, Any] = {"temperature": 0, "stream": True}
        if s.tools:
            params["tools"] = {"$blob": "tools"}
        if prewarm:
            params["max_tokens"] = 0
            reply: dict[str, Any] = {
                "message": {"role": "assistant", "content": ""},
                "finish": "length",
                "output_tokens": 0,
            }
        else:
            reply = self._reply(state)
            params["max_tokens"] = s.reply_tokens
        p = _Planned(
            index=len(self.planned),
            session=s.id,
            t=t,
            messages=list(messages),
            params=params,
            reply=reply,
            after=after or state.last,
            delay_s=delay_s,
            tag=tag,
            label=label,
        )
        self.planned.append(p)
        decode = 0 if prewarm else s.reply_tokens
        p.ends = t + new_tokens / NOMINAL_PREFILL_TPS + decode / NOMINAL_DECODE_TPS
        state.ready_at = p.ends
        state.last = p
        if not prewarm:
            state.real_requests += 1
            state.pending_reply = reply["message"]
            calls = reply["message"].get("tool_calls")
            state.pending_call = calls[0]["id"] if calls else None
        return p

    def turn(
        self,
        state: _State,
        t: float,
        grow: int,
        delay_s: float,
        label: str,
        tag: str | None,
        after: _Planned | None = None,
    ) -> _Planned:
        if state.real_requests == 0:
            new = state.tokens
        else:
            if state.pending_reply is not None:
                state.messages.append(state.pending_reply)
                state.pending_reply = None
            before = state.tokens
            state.messages.append(self._growth(state, grow))
            new = state.tokens - before
        state.turns += 1
        return self._plan(
            state, t, state.messages, new, tag or _default_tag(state.spec), label, delay_s, after=after
        )

    def prewarm(self, state: _State, t: float, delay_s: float, label: str) -> None:
        if state.pending_reply is not None:
            state.messages.append(state.pending_reply)
            state.pending_reply = None
        self._plan(state, t, state.messages, state.tokens, "prewarm", label, delay_s, prewarm=True)

    def compaction(self, state: _State, step: Step, t: float, delay_s: float) -> None:
        """System prompt + a summary + condensed history: `keep_messages` messages, `keep_tokens` tokens."""
        s = state.spec
        msgs = [m for m in state.messages[:1] if m.get("role") == "system"]
        kept = sum(_content_tokens(m) for m in msgs)
        summary = self.size(step.summary_tokens)
        msgs.append({"role": "user", "content": self.synth(summary, s.id, "summary", state.turns)})
        kept += summary
        pairs = max(1, (step.keep_messages - len(msgs)) // 2)
        body = max(pairs * MIN_TOOL_RESULT, self.size(step.keep_tokens) - kept - pairs * CALL_TOKENS)
        for i in range(pairs):
            n = body // pairs + (1 if i < body % pairs else 0)
            call_id = f"call_{s.id}_c{state.turns}_{i}"
            name = self.spec.tools[i % len(self.spec.tools)]
            msgs.append(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": call_id, "name": name, "arguments": _arguments(name, f"c{i}")}],
                }
            )
            msgs.append(
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "content": self.synth(n, s.id, "kept", state.turns, i),
                }
            )
        state.messages = msgs
        state.tokens = kept + pairs * CALL_TOKENS + body
        state.pending_reply = None
        state.pending_call = None
        state.turns += 1
        self._plan(state, t, msgs, state.tokens, step.tag or "compaction", step.label, delay_s)

    def probe(self, state: _State, step: Step, t: float, delay_s: float) -> None:
        """A variant of the session's first prompt (cache-probe's E1-E5)."""
        s = state.spec
        msgs = list(state.base)
        new = state.tokens
        if step.op == "resend" and step.latest and state.last_sent is not None:
            msgs, new = list(state.last_sent[0]), state.last_sent[1]
        if step.op in ("ask", "edit"):
            doc = dict(msgs[state.doc_index])
            parts = list(doc["content"])
            if step.op == "ask":
                parts[-1] = self.synth(self.size(s.question_tokens), s.id, "question", len(self.planned))
                new = self.size(s.question_tokens)
            else:
                paragraphs = len(parts) - 1
                at = round(step.fraction * paragraphs)
                parts.insert(at, step.text)
            doc["content"] = parts
            msgs[state.doc_index] = doc
        tag = step.tag or (PROBE_TAG if step.restart else _default_tag(s))
        pending = state.pending_reply, state.pending_call
        self._plan(state, t, msgs, new, tag, step.label, delay_s)
        state.pending_reply, state.pending_call = pending  # a probe is not a turn: the conversation stays

    # --- steps ------------------------------------------------------------------------------

    def step(self, step: Step) -> None:
        if step.at is not None:
            self.now = max(self.now, step.at)
        if step.op == "turn":
            counts = {sid: self._turn_count(step, sid) for sid in step.sessions}
            if step.order == "parallel":
                self._parallel(step, counts)
            else:
                for r in range(max(counts.values(), default=0)):
                    for sid in step.sessions:
                        if r < counts[sid]:
                            self._sequenced(
                                step,
                                sid,
                                lambda st, t, sid=sid, r=r: self._one_turn(step, sid, st, t, counts, r),
                                r,
                            )
            return
        for sid in step.sessions:
            delay = self._delay(step, sid, 0)
            if step.op == "prewarm":
                self._sequenced(step, sid, lambda st, t, d=delay: self.prewarm(st, t, d, step.label))
            elif step.op == "compaction":
                self._sequenced(step, sid, lambda st, t, d=delay: self.compaction(st, step, t, d))
            else:
                self._sequenced(step, sid, lambda st, t, d=delay: self.probe(st, step, t, d))

    def _sequenced(self, step: Step, sid: str, act: Any, r: int = 0) -> None:
        state = self.states[sid]
        t = max(self.now + step.start[sid], state.ready_at + self._delay(step, sid, r) if state.last else 0.0)
        act(state, t)
        self.now = max(self.now, state.ready_at)

    def _parallel(self, step: Step, counts: dict[str, int]) -> None:
        start = self.now
        end = start
        firsts: dict[str, _Planned] = {}
        led = {**step.follows, **step.alongside}
        leaders = [sid for sid in step.sessions if sid not in led]
        for sid in leaders + [sid for sid in step.sessions if sid in led]:
            state = self.states[sid]
            for r in range(counts[sid]):
                first = start + step.start[sid]
                t = max(first, state.ready_at + self._delay(step, sid, r)) if state.last else first
                after = None
                if r == 0 and sid in step.follows and step.follows[sid] in firsts:
                    after = firsts[step.follows[sid]]
                    t = max(t, after.ends + step.gap_s[sid])
                elif r == 0 and sid in step.alongside and step.alongside[sid] in firsts:
                    after = firsts[step.alongside[sid]].after
                    if after is not None:
                        t = max(first, after.ends + self._delay(step, sid, r))
                firsts.setdefault(sid, self._one_turn(step, sid, state, t, counts, r, after))
            end = max(end, state.ready_at)
        self.now = end

    @staticmethod
    def _delay(step: Step, sid: str, r: int) -> float:
        """What a request waits after its session's previous reply: tool time, or the user's pause."""
        return step.pause_s[sid] if r == 0 and step.pause_s[sid] else step.gap_s[sid]

    def _turn_count(self, step: Step, sid: str) -> int:
        state = self.states[sid]
        until = self.size(step.until[sid])
        if not until:
            return step.repeat[sid]
        grow = self.size(step.grow[sid])
        if grow <= 0:
            raise TraceError(self.spec.path, 0, f"step with 'until' for {sid!r} needs grow > 0")
        first = 1 if state.real_requests == 0 else 0
        return first + max(0, math.ceil((until - state.tokens) / grow))

    def _one_turn(
        self,
        step: Step,
        sid: str,
        state: _State,
        t: float,
        counts: dict[str, int],
        r: int,
        after: _Planned | None = None,
    ) -> _Planned:
        grow = self.size(step.grow[sid])
        target = self.size(step.grow_to[sid])
        if target and state.real_requests:
            left = counts[sid] - r
            grow = max(0, math.ceil((target - state.tokens) / max(1, left)))
        label = step.label if r == 0 or not step.label else f"{step.label} ({r + 1})"
        return self.turn(state, t, grow, self._delay(step, sid, r), label, step.tag, after)


def _default_tag(s: SessionSpec) -> str:
    return {"cron": "cron", "review": "review", "subagent": "subagent"}.get(s.role, "turn")


def _arguments(name: str, key: str) -> str:
    field_name = next(iter(TOOL_SCHEMAS.get(name, ("", {"input": {}}))[1]))
    return orjson.dumps({field_name: f"work/{key}"}).decode()


def _content_tokens(msg: Message) -> int:
    content = msg.get("content")
    if isinstance(content, dict) and "synth" in content:
        return int(content["synth"]["tokens"])
    if isinstance(content, list):
        return sum(_content_tokens({"content": c}) for c in content)
    if isinstance(content, str):
        return len(content.split())
    return 0


def plan_requests(spec: Scenario) -> list[_Planned]:
    """Every request the scenario sends, in send order, ids assigned (1, 2, ...)."""
    builder = _Builder(spec)
    for step in spec.steps:
        if step.when is not None and not spec.params.get(step.when):
            continue
        builder.step(step)
    ordered = sorted(builder.planned, key=lambda p: (round(p.t, 6), p.index))
    for rid, p in enumerate(ordered, 1):
        p.rid = rid
    return ordered


def generate(spec: Scenario, out: str | Path) -> GenerateResult:
    """Write the scenario's trace to `out` (overwritten)."""
    planned = plan_requests(spec)
    if not planned:
        raise TraceError(spec.path, 0, "the scenario sends no requests (every step is switched off)")
    used = {p.session for p in planned}
    labels = [f"request {p.rid} ({p.session}): {p.label}" for p in planned if p.label]
    notes = spec.title + (". " + "; ".join(labels) if labels else "")
    probes = [p.rid for p in planned if p.tag == PROBE_TAG]
    with TraceWriter(
        out,
        source=f"scenario:{spec.name}",
        notes=notes,
        created=spec.created,
        start=spec.clock,
        shared_messages=True,  # a session's histories grow by appending the same message objects
    ) as writer:
        for sid, s in spec.sessions.items():
            if sid in used:
                labels_out = dict(s.labels)
                writer.session(sid, role=s.role, api=s.api, model=s.model, labels=labels_out)
        if any(s.tools for s in spec.sessions.values()):
            writer.blob("tools", tool_definitions(spec.tools))
        for p in planned:
            after = {"request": p.after.rid, "delay_s": round(p.delay_s, 3)} if p.after is not None else None
            writer.request(
                p.session, p.t, p.messages, params=p.params, reply=p.reply, after=after, tag=p.tag, rid=p.rid
            )
    tags: dict[str, int] = {}
    for p in planned:
        tags[p.tag] = tags.get(p.tag, 0) + 1
    return GenerateResult(
        path=str(out),
        requests=len(planned),
        sessions=len(used),
        tags=tags,
        labels=labels,
        notice=probe_notice(probes),
    )


def trace_probe_notice(trace: Trace) -> str | None:
    """`probe_notice` for a loaded trace (what `replay run` prints before sending it)."""
    return probe_notice([r.id for r in trace.requests if r.tag == PROBE_TAG])


def probe_notice(probe_ids: list[int]) -> str | None:
    """The message to print when a trace with 'probe' requests is run without a restarting driver."""
    if not probe_ids:
        return None
    ids = ", ".join(f"#{i}" for i in probe_ids[:8]) + (" ..." if len(probe_ids) > 8 else "")
    return PROBE_NOTICE.format(n=len(probe_ids), ids=ids)
