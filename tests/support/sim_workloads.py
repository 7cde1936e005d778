"""Conversations for the simulator tests, built the way an agent grows them.

A `Convo` holds one conversation's messages; `request()` gives what the agent sends next, and
`answer()` appends the server's reply (live history, as a real agent resends it) plus a tool result.
Sizes are exact in the simulator's tokens, so figures from the field reports can be set up precisely.
"""

from __future__ import annotations

from typing import Any

from replay.sim.model import events as ev
from replay.sim.model.config import SimConfig
from replay.sim.model.engine import CacheModel
from replay.sim.model.job import Job, build_job
from replay.sim.model.render import render
from replay.sim.model.reply import Reply
from replay.sizing import SweepRequest
from replay.trace.synth import synth_text

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {"name": "bash", "description": "run a command", "parameters": {"type": "object"}},
    }
]


def system_message(anchor: int, seed: int = 1, tools: list[dict[str, Any]] | None = TOOLS) -> dict[str, Any]:
    """A system prompt whose rendered system turn (with `tools`) is exactly `anchor` tokens."""
    probe = render(
        [{"role": "system", "content": synth_text(100, seed)}, {"role": "user", "content": "x"}], tools
    )
    assert probe.anchor is not None
    overhead = probe.anchor - 100
    msg = {"role": "system", "content": synth_text(anchor - overhead, seed)}
    assert render([msg, {"role": "user", "content": "x"}], tools).anchor == anchor
    return msg


class Convo:
    def __init__(
        self,
        name: str,
        system: dict[str, Any],
        tokens: int,
        seed: int,
        *,
        tools: list[dict[str, Any]] | None = TOOLS,
        finish: str = "tool_calls",
    ) -> None:
        """A conversation whose first prompt is about `tokens` tokens (system prompt included)."""
        self.name = name
        self.tools = tools
        self.finish = finish
        anchor = render([system, {"role": "user", "content": ""}], tools).anchor or 0
        self.messages: list[dict[str, Any]] = [
            system,
            {"role": "user", "content": synth_text(max(1, tokens - anchor - 8), seed)},
        ]
        self.seed = seed
        self.turn = 0

    def job(self, job_id: int, cfg: SimConfig, max_tokens: int = 100) -> Job:
        return build_job(
            job_id, list(self.messages), self.tools, max_tokens, cfg, finish=self.finish, session=self.name
        )

    def request(self, max_tokens: int = 100) -> SweepRequest:
        return SweepRequest(self.name, list(self.messages), max_tokens, tools=self.tools, finish=self.finish)

    def answer(self, reply: Reply, tool_tokens: int) -> None:
        """Append the server's reply as the client resends it, and the next tool result (or user turn)."""
        self.turn += 1
        msg = reply.message()
        msg.pop("reasoning", None)  # clients never send the server's reasoning back
        self.messages.append(msg)
        seed = self.seed * 1000 + self.turn
        if reply.tool_calls:
            self.messages.append(
                {
                    "role": "tool",
                    "tool_call_id": reply.tool_calls[0]["id"],
                    "content": synth_text(tool_tokens, seed),
                }
            )
        else:
            self.messages.append({"role": "user", "content": synth_text(tool_tokens, seed)})


def run_turn(
    model: CacheModel, convo: Convo, job_id: int, cfg: SimConfig, *, grow: int, gap_s: float = 5.0
) -> tuple[ev.Result, list[ev.Event]]:
    """Send the conversation's next request after the model is idle, run it, and grow the conversation."""
    model.run_until_idle()
    job = convo.job(job_id, cfg)
    model.submit(job, model.now + gap_s)
    events = model.run_until_idle()
    result = next(e.result for e in events if isinstance(e, ev.Finished) and e.job_id == job_id)
    convo.answer(job.reply, grow)
    return result, events


def of(events: list[ev.Event], kind: type) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]
