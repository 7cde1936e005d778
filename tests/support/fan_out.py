"""A parent that fans out to two subagents and waits for them (trace format /2): the engine's
fan-out tests and the report's subagents section read the same trace."""

from __future__ import annotations

from pathlib import Path

from replay.trace import TraceWriter

REPLY = {"message": {"role": "assistant", "content": "ok"}, "finish": "stop", "output_tokens": 3}


def fan_out_trace(path: Path, wait_delay_s: float = 0.05, goes_on: bool = False) -> Path:
    """main #1 spawns sa1 (#2, #3) and sa2 (#4, #5), two turns each; main #6 waits for both, then
    `wait_delay_s`; with `goes_on`, main #7 follows #6."""
    with TraceWriter(path, source="test") as w:
        w.session("main")
        w.session("sa1", role="subagent")
        w.session("sa2", role="subagent")
        p = [{"role": "user", "content": "go"}]
        r1 = w.request("main", 0.0, p, {}, reply=REPLY)
        last = []
        for sid in ("sa1", "sa2"):
            m = [{"role": "user", "content": f"task {sid}"}]
            a = w.request(sid, 0.1, m, {}, reply=REPLY, after={"request": r1, "delay_s": 0.0, "spawn": True})
            m2 = [*m, REPLY["message"], {"role": "user", "content": "more"}]
            last.append(w.request(sid, 0.2, m2, {}, reply=REPLY, after={"request": a, "delay_s": 0.1}))
        p2 = [*p, REPLY["message"], {"role": "user", "content": "results"}]
        after = {"request": r1, "delay_s": wait_delay_s, "waits": last}
        r6 = w.request("main", 0.3, p2, {}, reply=REPLY, after=after)
        if goes_on:
            p3 = [*p2, REPLY["message"], {"role": "user", "content": "thanks"}]
            w.request("main", 0.4, p3, {}, reply=REPLY, after={"request": r6, "delay_s": 0.0})
    return path
