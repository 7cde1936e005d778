"""`replay size chain` and the simulator agree on the files one read writes, for every prompt size."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from replay.sim.model import events as ev
from replay.sim.model.config import config_for
from replay.sim.model.disk import Checkpoint
from replay.sim.model.engine import CacheModel
from replay.sim.model.job import Job
from replay.sim.model.render import Prompt
from replay.sim.model.reply import make_reply
from replay.sim.model.seq import TokenSeq
from replay.sizing.sweep import chain


def _written(tokens: int, start: int, **flags: int) -> list[tuple[int, str]]:
    """(tokens, reason) of every file the simulator writes reading `tokens` after restoring `start`."""
    cfg = config_for(kv_disk_space_mb=10_000_000, **flags)  # type: ignore[arg-type]
    seq = TokenSeq((tuple(f" w{i}" for i in range(tokens)),))
    prompt = Prompt(seq, None, False)
    files = []
    if start:
        prefix = seq.prefix(start)
        files.append(Checkpoint(prefix, "continued", "token-text", cfg.file_bytes(start), 0.0, 0.0))
    model = CacheModel(cfg, files, progress=False)
    model.submit(Job(1, prompt, make_reply(prompt, 0)), 0.0)
    return [(e.checkpoint.tokens, e.reason) for e in model.run_until_idle() if isinstance(e, ev.Stored)]


def _listed(tokens: int, start: int, **flags: int) -> list[tuple[int, str]]:
    cfg = config_for(kv_disk_space_mb=10_000_000, **flags)  # type: ignore[arg-type]
    return [(f.tokens, f.reason) for f in chain(tokens, start=start, cfg=cfg, final=False).files]


def test_a_cold_read_below_cold_max_writes_the_continued_saves_before_its_cut() -> None:
    # 23,018 tokens from scratch: continued 10,240 and 20,480, cold 22,528, then the final copy.
    assert _written(23_018, 0) == [(10_240, "continued"), (20_480, "continued"), (22_528, "cold")]
    files = chain(23_018, cfg=config_for()).files
    assert [(f.tokens, f.reason) for f in files] == [
        (10_240, "continued"),
        (20_480, "continued"),
        (22_528, "cold"),
        (23_018, "evict"),
    ]


def test_the_reports_77k_read_after_the_system_prefix_leaves_seven_files() -> None:
    # Seed figures 1: the first file at 20K, seven files, 11.6 GB (GiB) for a 77K conversation.
    c = chain(77_000, start=14_336, cfg=config_for())
    assert [f.tokens for f in c.files][0] == 20_480 and len(c.files) == 7
    assert round(c.total_bytes / 2**30, 1) == 11.6


@settings(max_examples=60, deadline=None)
@given(
    tokens=st.integers(600, 60_000),
    start_share=st.floats(0.0, 0.99),
    interval=st.sampled_from([0, 3000, 4096, 10_000, 20_480]),
    align=st.sampled_from([0, 512, 1024, 2048]),
    cold_max=st.sampled_from([0, 5000, 30_000, 100_000]),
    trim=st.integers(0, 64),
    from_scratch=st.booleans(),
)
def test_size_chain_lists_the_files_the_simulator_writes(
    tokens: int, start_share: float, interval: int, align: int, cold_max: int, trim: int, from_scratch: bool
) -> None:
    flags = {
        "kv_cache_continued_interval_tokens": interval,
        "kv_cache_boundary_align_tokens": align,
        "kv_cache_cold_max_tokens": cold_max,
        "kv_cache_boundary_trim_tokens": trim,
    }
    # A restore needs at least min (512) tokens and leaves something to read.
    start = 0 if from_scratch else max(512, min(tokens - 1, int(tokens * start_share)))
    assert _listed(tokens, start, **flags) == _written(tokens, start, **flags)
