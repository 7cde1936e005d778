"""The cache-probe scenario (E1-E5) end to end against the real llama.cpp server, restart included.

`replay.runs.probe.run_cache_probe` generates the scenario's trace, replays it with the engine against a
server the drivers start, and before E5 saves the slot, stops the server by its PID, starts a new
one and restores the slot into it. The shapes asserted are the real server's (`timings.prompt_n`):

| step | llama | llama, --cache-ram 0 | gemma2 (sliding window 256) |
|---|---|---|---|
| first read | all | all | all |
| E1 same prompt | 1 | 1 | 1 |
| E2 other question | question + tail | question + tail | question + tail |
| E3 line inserted at 50% | all after the edit | all after the edit | all (no checkpoint before the edit) |
| E4 other document | all | all | all |
| E4 back | question + tail: the host cache holds E2's variant | all | question + tail |
| E5 save, restart, restore | 1 | 1 | a few: this build's slot file carries the checkpoints |

Seed figures section 4 (a hybrid model on an older build) had E5 re-read everything because its slot
file held no checkpoints; this build appends them to the file (`appended N context checkpoint(s)`).
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from drivers.target import Target
from replay.metrics.results import read_results
from replay.runs.probe import ProbeReport, probe_table, run_cache_probe
from tests.support.llamakit import require_xllamacpp

pytestmark = pytest.mark.llama

DOCUMENT = 2000  # content tokens of the probe's document (the scenario's default is 32000)
QUESTION = 40  # the scenario's question_tokens
TAIL = 20  # ChatML markers after the question, with room to spare
HEAD = 8  # what two different documents share: BOS and the opening ChatML markers
BREAKS = 16  # the document's paragraphs and the question are joined by newlines
FLAGS = ("-c", "16384", "-np", "1", "-t", "1", "-lv", "4")


def probe(model: Path, out: Path, *flags: str) -> ProbeReport:
    require_xllamacpp()
    target = Target(
        kind="llamacpp",
        name=model.stem,
        binary="xllamacpp",
        model=str(model),
        flags=(*FLAGS, *flags),
        ready_timeout=60,
        stop_timeout=10,
    )
    report = run_cache_probe(target, out, params={"document": DOCUMENT, "defaults.reply_tokens": 16})
    assert [s.status for s in report.steps] == ["ok"] * 7
    assert all(s.reprocessed_source == "server" for s in report.steps)
    return report


STEPS = ("first", "E1", "E2", "E3", "E4 other", "E4 back", "E5")  # the scenario's seven requests


def steps(report: ProbeReport) -> dict[str, tuple[int, int, int]]:
    """Step -> (prompt, cached, prompt_n), by position; the labels must still name the same steps."""
    assert [s.label.split()[0] for s in report.steps] == ["first", "E1", "E2", "E3", "E4", "E4", "E5"]
    assert [s.tag for s in report.steps] == ["turn"] * 6 + ["probe"]
    out = {}
    for name, s in zip(STEPS, report.steps, strict=True):
        assert (
            s.prompt_tokens is not None and s.cached_tokens is not None and s.reprocessed_tokens is not None
        )
        assert s.prompt_tokens == s.cached_tokens + s.reprocessed_tokens
        out[name] = (s.prompt_tokens, s.cached_tokens, s.reprocessed_tokens)
    return out


def assert_common(s: dict[str, tuple[int, int, int]]) -> None:
    prompt, cached, _ = s["first"]
    assert DOCUMENT + QUESTION <= prompt <= DOCUMENT + QUESTION + BREAKS + TAIL and cached == 0
    assert s["E1"][2] == 1  # the server always re-evaluates the last prompt token
    assert QUESTION <= s["E2"][2] <= QUESTION + TAIL
    assert s["E4 other"][1] <= HEAD  # another document: nothing but the template's head is shared


def assert_restart(report: ProbeReport) -> None:
    """E5 ran on a second server process whose PID differs, after a slot save and restore."""
    (restart,) = report.restarts
    assert restart.old_pid != restart.new_pid and restart.before_request == 7
    assert restart.save["n_saved"] == restart.restore["n_restored"] > DOCUMENT
    assert restart.restore["n_read"] == restart.save["n_written"] > 0
    assert [s.server_process for s in report.steps] == [0] * 6 + [1]
    assert len(report.logs) == 2 and all(p.exists() for p in report.logs)
    results = read_results(report.results)
    assert [r["label"] for r in results.requests] == [s.label for s in report.steps]
    assert all(m["ok"] for m in report.metrics), [m["disagreements"] for m in report.metrics]


def test_llama_with_host_prompt_cache(tiny_llama: Path, tmp_path: Path) -> None:
    report = probe(tiny_llama, tmp_path)
    s = steps(report)
    assert_common(s)
    prompt, cached, reprocessed = s["E3"]
    assert 0.4 * prompt < cached < 0.6 * prompt  # the inserted line sits at half the document
    assert s["E4 back"][2] == s["E2"][2]  # back from the host cache: E2's variant is what it holds
    assert s["E5"][2] == 1
    assert list(report.prompt_n().values()) == [s[name][2] for name in STEPS]
    assert_restart(report)
    events = report.log_events[0]
    assert events["prompt_cache_load"] == 1 and events["prompt_cache_save"] == 3
    assert report.settings[0]["cache_ram_mib"] == 8192 and report.settings[1]["n_parallel"] == 1
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(probe_table(report))
    table = console.export_text()
    assert report.steps[-1].label in table
    assert f"{s['first'][0]:,}" in table


def test_llama_without_host_prompt_cache(tiny_llama: Path, tmp_path: Path) -> None:
    report = probe(tiny_llama, tmp_path, "--cache-ram", "0")
    s = steps(report)
    assert_common(s)
    assert s["E4 back"][1] <= HEAD  # nothing kept the document once the other one took the slot
    assert s["E5"][2] == 1
    assert_restart(report)
    assert report.settings[0]["cache_ram_mib"] == 0
    assert report.log_events[0].get("prompt_cache_load", 0) == 0


def test_gemma2_sliding_window(tiny_gemma2: Path, tmp_path: Path) -> None:
    report = probe(tiny_gemma2, tmp_path)
    s = steps(report)
    assert_common(s)
    prompt, cached, reprocessed = s["E3"]
    assert cached <= 1 and reprocessed >= prompt - 1  # like seed figures section 4: everything again
    assert QUESTION <= s["E4 back"][2] <= QUESTION + TAIL
    assert 1 <= s["E5"][2] <= 8  # resumed at a checkpoint a few tokens before the end
    assert_restart(report)
    first, second = report.log_events
    assert first["checkpoint_created"] > 0 and first["checkpoint_restored"] >= 1
    assert second["slot_file_checkpoints"] == 1 and second["checkpoint_restored"] == 1
    assert report.settings[1]["swa_cache_cells"] > 0 and report.settings[1]["swa_full"] is False
