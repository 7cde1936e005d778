"""`replay import tracelab`: TraceLab round traces (uw-syfi/TraceLab, the rows its sanitizer
publishes), on rows written here in that shape: every request at its recorded size, extending the
session's previous one, sent when its input was ready."""

from __future__ import annotations

import datetime as _dt
import gzip
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay.errors import TraceError, UsageError
from replay.importers.base import ImportOptions, rendered_tokens
from replay.importers.registry import list_formats, run_import
from replay.importers.tracelab import _sizes, import_tracelab
from replay.trace import materialize, read_trace, recorded_reply, validate
from replay.trace.materialize import text_of

T0 = _dt.datetime(2026, 6, 1, 5, 40, tzinfo=_dt.UTC)


def _iso(seconds: float) -> str:
    return (T0 + _dt.timedelta(seconds=seconds)).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def row(
    session: str,
    index: int,
    at: float,
    size: int,
    out: int,
    prefix: int = 0,
    provider: str = "claude",
    first: str = "tool_result",
    model_s: float = 2.0,
) -> dict[str, Any]:
    """One round as TraceLab's sanitized rows hold it: its input event at `at`, the model's events
    `model_s` later (a reasoning block, text, a tool call)."""
    events: list[dict[str, Any]] = [
        {"event_type": first, "timestamp": _iso(at - 0.5), "source": "user.content"},
        {"event_type": first, "timestamp": _iso(at), "source": "user.content"},
        {
            "event_type": "reasoning",
            "timestamp": _iso(at + model_s / 2),
            "source": "assistant.content.thinking",
        },
        {"event_type": "text", "timestamp": _iso(at + model_s * 0.8), "source": "assistant.content.text"},
        {
            "event_type": "tool_call",
            "timestamp": _iso(at + model_s),
            "source": "assistant.content.tool_use",
            "tool_name": "Bash",
            "tool_index": 0,
        },
    ]
    return {
        "provider": provider,
        "project": "project_0001",
        "session_id": f"{provider}:{session}",
        "round_index": index,
        "round_id": f"round_{session}_{index}",
        "model": "claude-opus-4-8" if provider == "claude" else "gpt-5.4",
        "input_tokens_total": size,
        "prefix_tokens": prefix,
        "newly_append_tokens": size - prefix,
        "claude_cache_creation_input_tokens": 100 if provider == "claude" else None,
        "output_tokens": out,
        "reasoning_output_tokens": None,
        "timing_events": events,
        "tools": [{"tool_index": 0, "tool_name": "Bash", "input_chars": 12, "result_chars": 300}],
        "first_input_event_type": first,
        "store": f".{provider}",
    }


def write(path: Path, rows: list[dict[str, Any]]) -> Path:
    data = b"".join(orjson.dumps(r) + b"\n" for r in rows)
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def prompt_tokens(trace, req) -> int:
    """The request's prompt as the simulator renders it, replies spliced in as recorded."""
    sent = materialize(req, recorded_reply(trace.by_id()))
    return rendered_tokens([{"role": m["role"], "content": text_of(m.get("content"))} for m in sent])


MORNING = [
    row("a", 0, 0.0, 30_000, 900, first="user_message"),
    row("b", 0, 5.0, 9_000, 400, provider="codex", first="user_message"),
    row("a", 1, 12.0, 33_500, 1_000, prefix=29_000),
    row("b", 1, 20.0, 9_900, 90, prefix=8_900, provider="codex"),
    row("a", 2, 40.0, 36_000, 200, prefix=33_000),
    row("b", 2, 60.0, 4_000, 50, provider="codex"),  # smaller than before: the context was compacted
]


def test_each_round_is_a_request_at_its_recorded_size(tmp_path: Path) -> None:
    counts = import_tracelab(write(tmp_path / "rows.jsonl", MORNING), tmp_path / "t.jsonl")
    assert counts["rounds"] == 6 and counts["sessions"] == 2 and counts["compactions"] == 1
    validate(tmp_path / "t.jsonl")
    trace = read_trace(tmp_path / "t.jsonl")
    assert [s.api for s in trace.sessions.values()] == ["anthropic", "openai-responses"]
    reqs = trace.requests
    assert [(r.session, r.t) for r in reqs] == [
        ("claude:a", 0.0),
        ("codex:b", 5.0),
        ("claude:a", 12.0),
        ("codex:b", 20.0),
        ("claude:a", 40.0),
        ("codex:b", 60.0),
    ]
    assert [prompt_tokens(trace, r) for r in reqs] == [r["input_tokens_total"] for r in MORNING]
    assert [r.tag for r in reqs] == ["turn"] * 5 + ["compaction"]
    # a later round extends the one before: the previous prompt and its reply, then the new input
    a0, a1 = (
        materialize(reqs[0], recorded_reply(trace.by_id())),
        materialize(reqs[2], recorded_reply(trace.by_id())),
    )
    assert a1[: len(a0)] == a0 and a1[len(a0)]["role"] == "assistant" and len(a1) == len(a0) + 2
    assert reqs[0].reply["output_tokens"] == 900
    # after: from the previous reply's last event (sent + 2 s) to this input's readiness
    assert reqs[2].after == {"request": reqs[0].id, "delay_s": 10.0}
    assert reqs[2].usage == {
        "prompt_tokens": 33_500,
        "cached_tokens": 29_000,
        "cache_write_tokens": 100,
        "output_tokens": 1_000,
    }
    assert reqs[1].usage == {"prompt_tokens": 9_000, "cached_tokens": 0, "output_tokens": 400}


def test_a_gzipped_corpus_imports_as_the_inflated_one_and_errors_name_it(tmp_path: Path) -> None:
    import_tracelab(write(tmp_path / "rows.jsonl", MORNING), tmp_path / "plain.jsonl")
    import_tracelab(write(tmp_path / "rows.jsonl.gz", MORNING), tmp_path / "gz.jsonl")
    strip = lambda p: [x for x in p.read_bytes().splitlines() if b'"kind":"trace"' not in x]  # noqa: E731
    assert strip(tmp_path / "plain.jsonl") == strip(tmp_path / "gz.jsonl")
    bad = [*MORNING[:2], {**MORNING[2], "input_tokens_total": "many"}]
    with pytest.raises(TraceError) as exc:
        import_tracelab(write(tmp_path / "bad.jsonl.gz", bad), tmp_path / "t.jsonl")
    assert (exc.value.path, exc.value.line) == (str(tmp_path / "bad.jsonl.gz"), 3)
    assert "input_tokens_total" in exc.value.problem
    (tmp_path / "junk.jsonl").write_bytes(orjson.dumps(MORNING[0]) + b"\n{not json\n")
    with pytest.raises(TraceError) as exc:
        import_tracelab(tmp_path / "junk.jsonl", tmp_path / "t.jsonl")
    assert exc.value.line == 2 and "bad JSON" in exc.value.problem
    with pytest.raises(TraceError, match="no 'session_id'"):
        import_tracelab(write(tmp_path / "x.jsonl", [{"input_tokens_total": 5}]), tmp_path / "t.jsonl")


def test_through_replay_import_with_filters_and_the_gap_cap(tmp_path: Path) -> None:
    src = write(tmp_path / "rows.jsonl", MORNING)
    line = run_import(
        "tracelab", src, tmp_path / "t.jsonl", ImportOptions(sessions=("codex:",), gap_cap=15.0)
    )
    assert "3 requests in 1 sessions from tracelab" in line
    reqs = read_trace(tmp_path / "t.jsonl").requests
    # the cap applies to the gaps between the corpus's request starts (before --session keeps
    # codex:b): 20 s (20 -> 40) and 20 s (40 -> 60) become 15 s, so b's last round comes 10 s early
    assert [r.t for r in reqs] == [0.0, 15.0, 45.0]
    assert all(r.after is None or r.after["delay_s"] <= 15.0 for r in reqs)
    assert "tracelab: TraceLab round traces" in list_formats()
    with pytest.raises(UsageError, match="no timed TraceLab rounds"):
        import_tracelab(
            write(tmp_path / "none.jsonl", [{**MORNING[0], "timing_events": []}]), tmp_path / "u.jsonl"
        )


FUNC = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


@settings(max_examples=40, deadline=None, suppress_health_check=FUNC)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["s1", "s2", "s3"]),
            st.integers(20, 40_000),  # input tokens
            st.integers(0, 3_000),  # output tokens
            st.floats(0.5, 400.0),  # gap after the session's previous round
        ),
        min_size=1,
        max_size=14,
    )
)
def test_property_every_round_at_its_size_in_session_order(tmp_path: Path, rounds: list) -> None:
    _, each = _sizes()
    clock: dict[str, float] = {}
    index: dict[str, int] = {}
    rows = []
    for session, size, out, gap in rounds:
        at = clock.get(session, len(clock) * 7.0) + gap
        clock[session] = at + 2.0
        rows.append(row(session, index.get(session, 0), at, size, out))
        index[session] = index.get(session, 0) + 1
    counts = import_tracelab(write(tmp_path / "p.jsonl", rows), tmp_path / "p.trace.jsonl")
    validate(tmp_path / "p.trace.jsonl")
    trace = read_trace(tmp_path / "p.trace.jsonl")
    assert counts["rounds"] == len(rows) == len(trace.requests)
    by_session: dict[str, list] = {}
    for r in trace.requests:
        by_session.setdefault(r.session, []).append(r)
    for session, reqs in by_session.items():
        mine = [r for r in rows if r["session_id"] == session]
        assert [prompt_tokens(trace, r) for r in reqs] == [r["input_tokens_total"] for r in mine]
        assert [r.reply["output_tokens"] for r in reqs] == [r["output_tokens"] for r in mine]
        for before, r, prev_row, this_row in zip(reqs, reqs[1:], mine, mine[1:], strict=False):
            new = (
                this_row["input_tokens_total"]
                - prev_row["input_tokens_total"]
                - prev_row["output_tokens"]
                - 2 * each
            )
            grows = new >= 1
            assert (r.tag == "compaction") == (not grows)
            assert r.after is not None and r.after["request"] == before.id
    ts = [r.t for r in trace.requests]
    assert ts == sorted(ts)
