"""The engine's per-request tasks (plain asyncio tasks, `run.RequestTasks`) keep a task group's
rules: the run waits for all of them, a failure cancels the rest and is raised, a cancelled run
hands over every started request's record and leaves no task behind."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from replay.engine.plans import make_plan
from replay.engine.run import Engine, EngineConfig, RequestTasks
from replay.metrics.record import RequestRecord
from replay.trace import TraceWriter, read_trace
from tests.support.scripted_server import Script


def _trace(path, sessions=8):
    with TraceWriter(path, source="test") as w:
        for s in range(sessions):
            w.session(f"s{s}")
        for s in range(sessions):
            w.request(f"s{s}", 0.0, [{"role": "user", "content": f"s{s}"}], {"max_tokens": 3})
    return read_trace(path)


def _engine(server, trace, sink, concurrency=4):
    config = EngineConfig(base_url=server.url, timeout_s=5.0, run_id="t")
    return Engine(trace, make_plan("overlap", concurrency=concurrency), config, sink)


def _others() -> set[asyncio.Task]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


def test_a_cancelled_run_hands_over_every_started_record_and_leaves_no_task(scripted_server, tmp_path):
    scripted_server.default = Script(first_token_delay_s=5.0)
    records: list[RequestRecord] = []
    engine = _engine(scripted_server, _trace(tmp_path / "t.jsonl"), records.append)
    left: set[asyncio.Task] = set()

    async def main() -> None:
        nonlocal left
        with anyio.move_on_after(0.5):
            await engine.run()
        left = _others()

    anyio.run(main)
    assert left == set()
    assert len(records) == 4  # the four in flight; the four waiting for a place never went out
    assert all(r.status == "cancelled" for r in records)
    assert engine.progress.waiting == 0


def test_a_failing_request_task_cancels_the_rest_and_is_raised(scripted_server, tmp_path):
    scripted_server.default = Script(first_token_delay_s=0.0)
    calls = 0

    def sink(rec: RequestRecord) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("the sink broke")

    engine = _engine(scripted_server, _trace(tmp_path / "t.jsonl", sessions=40), sink, concurrency=2)
    left: set[asyncio.Task] = set()

    async def main() -> None:
        nonlocal left
        try:
            await engine.run()
        finally:
            left = _others()

    with pytest.raises(RuntimeError, match="the sink broke"):
        anyio.run(main)
    assert left == set()
    assert calls < 40  # the run stopped instead of sending the rest


def test_request_tasks_wait_for_all_and_cancel_on_close() -> None:
    finished: list[int] = []
    cancelled: list[int] = []

    async def one(i: int, delay: float) -> None:
        try:
            await asyncio.sleep(delay)
            finished.append(i)
        except asyncio.CancelledError:
            cancelled.append(i)
            raise

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tasks = RequestTasks(tg.cancel_scope)
            for i in range(5):
                tasks.start(one(i, 0.01 * i))
            await tasks.wait()
            assert len(tasks) == 0 and sorted(finished) == list(range(5))
            for i in range(5, 8):
                tasks.start(one(i, 10.0))
            await asyncio.sleep(0)
            await tasks.close()
            assert len(tasks) == 0 and sorted(cancelled) == [5, 6, 7]
            tasks.reraise()  # nothing failed

    anyio.run(main)
