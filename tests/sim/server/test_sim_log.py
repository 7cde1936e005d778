"""Every line the simulator logs matches ds4-server's format (reference section 3, regexes verbatim).

The same parser reads both servers' logs, so a drift here silently zeroes someone's counts.
"""

from __future__ import annotations

import functools
import re

from replay.sim.model import events as ev
from replay.sim.model.config import config_for
from replay.sim.model.engine import CacheModel
from replay.sim.server import log as simlog
from tests.support.sim_workloads import Convo, system_message

FLAGS = r"(?: (?P<flags>[A-Z_]+(?: [A-Z_]+)*))?"
PREFIX = re.compile(r"^\d{4} \d{2}:\d{2}:\d{2} ds4-server: (?P<msg>.*)$")
PATTERNS = {
    "live_miss": r"live kv cache miss(?: RESPPROTO)? live=(\d+) prompt=(\d+) common=(\d+)(?: vision=(\S+))? reason=(\S+)$",
    "thinking_cont": r"thinking live continuation match=visible-prefix cached=(\d+) prompt=(\d+)$",
    "prompt_start": rf"(chat|completion) ctx=(\d+)\.\.(\d+):(\d+){FLAGS} prompt start$",
    "prefill": rf"(chat|completion) ctx=(\d+)\.\.(\d+):(\d+){FLAGS} (prefill|tool checkpoint rebuild) chunk (\d+)/(\d+) \(([\d.]+)%\) chunk=([\d.]+) t/s avg=([\d.]+) t/s ([\d.]+)s$",
    "prompt_done": rf"(chat|completion) ctx=(\d+)\.\.(\d+):(\d+){FLAGS} prompt done ([\d.]+)s$",
    "decoding": rf"(chat|completion) ctx=(\d+)\.\.(\d+):(\d+) gen=(\d+){FLAGS} decoding chunk=([\d.]+) t/s avg=([\d.]+) t/s ([\d.]+)s$",
    "tool_calls": r"tool calls ctx=(\S+)(?: RESPPROTO)? n=(\d+) raw_(?:dsml|tool_text)=(\d) ids=\[(.*)\] names=\[(.*)\]$",
    "remembered": r"thinking live checkpoint remembered ctx=(\S+) live=(\d+) visible=(\d+)$",
    "finish": rf"(chat|completion) ctx=(\d+)\.\.(\d+):(\d+) gen=(\d+){FLAGS} finish=(stop|length|tool_calls|error)(?: error=\"(.*)\")? ([\d.]+)s$",
    "kv_disk": r"KV disk cache (.+) \(budget=(\d+) MiB, cross-quant=(\w+), min=(\d+), cold_max=(\d+), continued=(\d+), trim=(\d+), align=(\d+), hit_half_life=(\d+)s\)$",
    "stored": r"kv cache stored tokens=(\d+) trimmed=(\d+) reason=(cold|continued|evict|shutdown) key=(\S+) size=([\d.]+) MiB save=([\d.]+) ms$",
    "hit": r"kv cache hit text(?: RESPPROTO)? tokens=(\d+) text=(\d+) quant=(\d+) key=(\S+) load=([\d.]+) ms(?: (consumed))? file=(.+)$",
    "evicted": r"kv cache evicted reason=disk-cache-full tokens=(\d+) hits=(\d+) size=([\d.]+) MiB file=(.+)$",
    "skipped": r"kv cache skipped tokens=(\d+)(?: reason=(\S+))? because (.+)$",
    "context_buffers": r"context buffers ([\d.]+) MiB \(ctx=(\d+), backend=(\S+), prefill_chunk=(\d+), raw_kv_rows=(\d+), compressed_kv_rows=(\d+)\)$",
    "resident": r"(\d+) resident sessions request at least ([\d.]+) GiB of context buffers$",
    "batched": r"batched mode enabled resident_sessions=(\d+) prefill_quantum=(\d+) mixed_prefill_quantum=(\d+) decode_coalesce_us=(\d+)$",
    "listening": r"listening on http://([\d.]+):(\d+)$",
    "persist_b": r"persisting resident KV cache before shutdown slot=(\d+) tokens=(\d+)$",
    "persist_a": r"persisting current KV cache before shutdown tokens=(\d+)$",
    "shutdown": r"shutdown requested, draining requests$",
}
COMPILED = {k: re.compile(v) for k, v in PATTERNS.items()}


def classify(message: str) -> str:
    kinds = [k for k, rx in COMPILED.items() if rx.match(message)]
    assert len(kinds) == 1, f"{message!r} matched {kinds}"
    return kinds[0]


@functools.cache
def lines_of_a_busy_run(batched: bool) -> list[str]:
    cfg = config_for(
        "qwen38-q2",
        batched_sessions=2 if batched else None,
        kv_disk_space_mb=1_500,
        hidden_reasoning=True,
        visible_key="no-tools",
        # The workload was laid out (restores and evictions both) for files of equal density
        # and cold saves cut at the chat anchor (the shared system turn every conversation
        # restores); this test is about line formats, not which file the score picks.
        fixed_bytes=0,
        chat_anchor=True,
    )
    model = CacheModel(cfg)
    lines = [simlog.line(m) for m in simlog.startup_lines(cfg)]
    lines.append(simlog.line(simlog.kv_disk_line(cfg, "/tmp/kv")))
    lines.append(simlog.line(simlog.listening_line("127.0.0.1", 43210)))
    system = system_message(2_000)
    aligned = system_message(2_048, seed=5)  # chunks after an aligned cold cut land on 10240
    convos = [Convo("a", system, 12_000, 1), Convo("b", aligned, 21_000, 2), Convo("c", system, 9_000, 3)]
    convos.append(Convo("d", system_message(2_000, tools=None), 8_000, 4, tools=None, finish="stop"))
    jid = 0
    for _ in range(2):
        for convo in convos:
            jid += 1
            job = convo.job(jid, cfg, max_tokens=120)
            model.submit(job, model.now + 1.0)
            for event in model.run_until_idle():
                message = simlog.format_event(event, cfg, "/tmp/kv")
                if message:
                    lines.append(simlog.line(message))
            convo.answer(job.reply, 700)
    lines.append(simlog.line(simlog.SHUTDOWN_REQUESTED))
    model.shutdown()
    for event in model.run_until_idle():
        message = simlog.format_event(event, cfg, "/tmp/kv")
        if message:
            lines.append(simlog.line(message))
    return lines


def test_every_line_has_the_ds4_prefix_and_one_known_format() -> None:
    seen: set[str] = set()
    for batched in (False, True):
        for text in lines_of_a_busy_run(batched):
            m = PREFIX.match(text)
            assert m, text
            seen.add(classify(m.group("msg")))
    expected = set(PATTERNS) - {"thinking_cont", "skipped"}
    assert expected <= seen, expected - seen


def test_flags_and_spans_are_where_a_parser_expects_them() -> None:
    lines = [PREFIX.match(t).group("msg") for t in lines_of_a_busy_run(False)]  # type: ignore[union-attr]
    finishes = [COMPILED["finish"].match(m) for m in lines if COMPILED["finish"].match(m)]
    assert any(
        f.group("flags") == "TOOLS DSML_START DSML_END" and f.group(7) == "tool_calls" for f in finishes
    )
    for f in finishes:
        cached, prompt, prefill = int(f.group(2)), int(f.group(3)), int(f.group(4))
        assert prefill == prompt - cached
    stored = [COMPILED["stored"].match(m) for m in lines if COMPILED["stored"].match(m)]
    assert {s.group(3) for s in stored} >= {"cold", "continued", "evict", "shutdown"}


def test_skipped_and_thinking_continuation_lines() -> None:
    cfg = config_for("qwen38-q2", kv_disk_space_mb=50, hidden_reasoning=True, visible_key="no-tools")
    model = CacheModel(cfg)
    convo = Convo("d", system_message(2_000, tools=None), 8_000, 4, tools=None, finish="stop")
    messages: list[str] = []
    for jid in (1, 2):
        job = convo.job(jid, cfg)
        model.submit(job, model.now + 1)
        messages += [m for e in model.run_until_idle() if (m := simlog.format_event(e, cfg, "/kv"))]
        convo.answer(job.reply, 100)
    kinds = [classify(m) for m in messages]
    assert "skipped" in kinds and "thinking_cont" in kinds


def test_modelled_durations_in_lines_are_the_models() -> None:
    cfg = config_for("qwen38-q2", disk=False)
    model = CacheModel(cfg)
    convo = Convo("a", system_message(2_000), 10_200, 1)
    model.submit(convo.job(1, cfg, max_tokens=100), 0.0)
    events = model.run_until_idle()
    done = next(e for e in events if isinstance(e, ev.PromptDone))
    message = simlog.format_event(done, cfg)
    assert message is not None and message.endswith(f"prompt done {done.prompt / cfg.prefill_tps:.3f}s")
