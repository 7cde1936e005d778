"""The verdict at the top of every report: the budget to set, or whether switching hurt and where."""

from __future__ import annotations

from pathlib import Path

from test_html_report import _request, make_results

from replay.metrics.results import ResultsWriter
from replay.report.html import digest, load_run, render_page, summary_markdown
from replay.report.verdict import verdict


def _verdict(*paths: Path) -> str:
    runs = [load_run(p) for p in paths]
    return verdict(runs, [digest(r) for r in runs])


def test_a_budget_comparison_names_the_smallest_budget_that_keeps_switches_cheap(tmp_path: Path) -> None:
    low = make_results(tmp_path / "4g.jsonl", "4G", reread=True, budget_mib=4096)
    mid = make_results(tmp_path / "64g.jsonl", "64G", reread=False, budget_mib=65536)
    high = make_results(tmp_path / "128g.jsonl", "128G", reread=False, budget_mib=131072)
    said = _verdict(high, low, mid)
    assert said.startswith("Set `--kv-disk-space-mb 65536`: 64G is the smallest budget tried")
    assert "at 4G a switch re-read 95,000 tokens" in said
    assert "replay size sweep" in said
    assert said.endswith("Action: set `--kv-disk-space-mb 65536`.")  # every verdict ends with what to do


def test_when_every_budget_is_cheap_the_smallest_is_enough(tmp_path: Path) -> None:
    a = make_results(tmp_path / "a.jsonl", "32G", reread=False, budget_mib=32768)
    b = make_results(tmp_path / "b.jsonl", "64G", reread=False, budget_mib=65536)
    said = _verdict(a, b)
    assert said.startswith("Every budget tried keeps switches cheap: the smallest, 32G")
    assert said.endswith("Action: set `--kv-disk-space-mb 32768` or a smaller budget the sweep finds.")


def test_one_run_whose_switches_re_read_says_the_pathology_appeared_and_where(tmp_path: Path) -> None:
    said = _verdict(make_results(tmp_path / "r.jsonl", "4G", reread=True))
    assert said.startswith(
        "the switch pathology appeared: 4 of 4 switches re-read most of their conversation"
    )
    assert "(modelled)" in said and "session" in said


def test_one_run_whose_switches_resume_says_switching_did_not_hurt(tmp_path: Path) -> None:
    said = _verdict(make_results(tmp_path / "r.jsonl", "64G", reread=False))
    assert said.startswith("switching did not hurt: all 4 switches resumed their conversation")


def test_a_run_without_switches_says_so(tmp_path: Path) -> None:
    path = tmp_path / "one.jsonl"
    writer = ResultsWriter(path, {"target": {"kind": "external"}})
    writer.request(_request(1, "a", ["cold"], 0.0, 1000, 0, None))
    writer.close()
    assert _verdict(path) == (
        "no conversation switch in this run (1 requests). Action: nothing to change; no conversation switched."
    )


def test_the_verdict_leads_the_page_and_the_summary_and_uses_the_trace_clock(tmp_path: Path) -> None:
    path = make_results(tmp_path / "r.jsonl", "24G", reread=True)
    text = path.read_text().replace(
        '"source":"scenario:switching"', '"source":"scenario:switching","start":"06:45"'
    )
    path.write_text(text)
    run = load_run(path)
    assert run.clock_start == 6 * 3600 + 45 * 60
    said = verdict([run], [digest(run)])
    assert "between 06:49 and 06:58; the worst, in session b at 06:58" in said
    page = render_page([run])
    assert page.index('id="verdict"') < page.index('id="digest"')
    assert "time of day" in page
    assert (
        "<title>waiting for the server: another request held the slot</title>queued<" in page
    )  # legend tooltip
    assert '<th title="time to first token, median">TTFT p50 s (modelled)</th>' in page
    assert "<dt>live miss</dt>" in page
    md = summary_markdown([run])
    assert md.splitlines()[2] == said


def test_arms_that_differ_in_more_than_a_budget_end_with_the_flag_to_set(tmp_path: Path) -> None:
    """Issue #38: slow-morning's three arms (24G, 64G, 24G with a longer interval) got a paragraph
    per arm and no recommendation. The verdict names the flag the best arm differs in from every
    other arm."""
    import orjson

    def argv(*flags: str) -> list[str]:
        return [
            "python3",
            "-m",
            "replay.sim",
            "--port",
            "1",
            "--kv-disk-dir",
            "/tmp/x",
            "--build",
            "sept",
            *flags,
        ]

    arms = {
        "24G": (True, 24576, argv("--kv-disk-space-mb", "24576")),
        "64G": (False, 65536, argv("--kv-disk-space-mb", "65536")),
        "24G-20480": (
            True,
            24576,
            argv("--kv-disk-space-mb", "24576", "--kv-cache-continued-interval-tokens", "20480"),
        ),
    }
    runs = []
    for name, (reread, budget, flags) in arms.items():
        path = make_results(tmp_path / f"{name}.jsonl", name, reread=reread, budget_mib=budget)
        lines = path.read_bytes().split(b"\n")
        header = orjson.loads(lines[0])
        header["target"]["build"] = {"argv": flags}
        path.write_bytes(b"\n".join([orjson.dumps(header), *lines[1:]]))
        runs.append(load_run(path))
    text = verdict(runs, [digest(r) for r in runs])
    assert text.count(". ") <= 4, text  # a sentence per arm and the action, not a paragraph each
    assert text.split("Action: ")[1].startswith("set `--kv-disk-space-mb 65536` (64G: "), text
