"""The reader-side benchmark replays the reference server's own stream, and reads all of it."""

from __future__ import annotations

from bench.readside import measure, read_one, stream_reads


def test_the_recorded_stream_reads_back_whole_through_the_engine_loop() -> None:
    reads = stream_reads(tokens=64)
    res = read_one([(1_000 + i, data) for i, data in enumerate(reads)])
    assert res.status == "ok", res.error
    assert res.n_token_events == 64 and res.n_events == 67  # 64 tokens, finish, usage, [DONE]
    assert res.usage.output_tokens == 64 and res.finish == "length"
    assert res.message is not None and res.message["content"] == "#7" + " tok" * 63


def test_every_mode_measures() -> None:
    for mode in ("all", "parse", "read", "write"):
        assert measure(mode, requests=20, repeat=1, freeze=False) > 0
