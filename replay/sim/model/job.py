"""A request as the cache model runs it: its rendered prompt and its planned reply.

The server (`app.py`) and offline sizing (`size.py`) both make jobs here, so a reply planned for a
sweep is the reply the server would have sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from replay.sim.model.config import SimConfig
from replay.sim.model.render import Prompt, render
from replay.sim.model.reply import Reply, make_reply
from replay.sim.model.seq import TokenSeq

FINISHES = ("stop", "length", "tool_calls")


@dataclass(eq=False, init=False, slots=True)
class Job:
    id: int
    prompt: Prompt
    reply: Reply
    session: str | None
    _full: TokenSeq | None = field(init=False, repr=False)
    _visible: TokenSeq | None = field(init=False, repr=False)

    def __init__(self, id: int, prompt: Prompt, reply: Reply, session: str | None = None) -> None:  # noqa: A002
        self.id = id
        self.prompt = prompt
        self.reply = reply
        self.session = session
        self._full = None
        self._visible = None

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt.seq)

    @property
    def full(self) -> TokenSeq:
        """Prompt plus every generated token: the live state after the reply (computed once, so
        many models over the same job, as in a sweep, share it)."""
        if self._full is None:
            self._full = self.prompt.seq.extend(*self.reply.blocks)
        return self._full

    @property
    def visible(self) -> TokenSeq:
        """Prompt plus the reply as the client sends it back (no hidden reasoning)."""
        if self._visible is None:
            self._visible = self.prompt.seq.extend(*self.reply.visible_blocks)
        return self._visible


class ContextTooLong(ValueError):
    """The prompt does not fit the context: ds4 rejects it up front."""

    def __init__(self, prompt_tokens: int, ctx: int) -> None:
        super().__init__(f"prompt is too long: {prompt_tokens} tokens, the context size is {ctx} tokens")
        self.prompt_tokens = prompt_tokens
        self.ctx = ctx


def build_job(
    job_id: int,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    max_tokens: int | None,
    cfg: SimConfig,
    *,
    finish: str = "stop",
    tool_name: str | None = None,
    session: str | None = None,
    thinking: bool = True,
    tool_arguments: str | None = None,
) -> Job:
    """Render a request and plan its reply, the one way the server and offline sizing both do it.

    `finish="tool_calls"` answers with a call to `tool_name` (default: the first tool), when the
    request has tools; anything else answers in text. With `--hidden-reasoning` the reply starts
    with reasoning unless the request turned thinking off.
    """
    return plan_job(
        job_id,
        render(messages, tools),
        tools,
        max_tokens,
        cfg,
        finish=finish,
        tool_name=tool_name,
        session=session,
        thinking=thinking,
        tool_arguments=tool_arguments,
    )


def plan_job(
    job_id: int,
    prompt: Prompt,
    tools: list[dict[str, Any]] | None,
    max_tokens: int | None,
    cfg: SimConfig,
    *,
    finish: str = "stop",
    tool_name: str | None = None,
    session: str | None = None,
    thinking: bool = True,
    tool_arguments: str | None = None,
) -> Job:
    """`build_job` for a prompt already rendered (offline sizing renders turn by turn)."""
    if len(prompt) >= cfg.ctx:
        raise ContextTooLong(len(prompt), cfg.ctx)
    if finish == "tool_calls" and tools:
        first = tools[0]
        tool_name = tool_name or (first.get("function") or first).get("name")
    else:
        tool_name = None
    reply = make_reply(
        prompt,
        cfg.default_max_tokens if max_tokens is None else max_tokens,
        finish=finish if finish in FINISHES else "stop",
        tool_name=tool_name,
        hidden_reasoning=cfg.hidden_reasoning and thinking,
        reasoning_tokens=cfg.reasoning_tokens,
        room=cfg.ctx - len(prompt),
        tool_arguments=tool_arguments if tool_name else None,
    )
    return Job(job_id, prompt, reply, session)
