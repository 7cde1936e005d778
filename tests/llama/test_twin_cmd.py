"""`replay twin` (issue #34 item 4): a trace on the real llama-server (xllamacpp, the generated
tiny llama) and on the model configured from that server's startup log and /props, request by
request; then offline, the same results file and the real server's log.

Measured: one slot with a host cache, two conversations taking turns, a resend and a compaction:
agreement 1.000, 7 of 7 requests equal on every figure (re-processed, cached, host-cache restores).
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from rich.console import Console

from replay.commands import twin as twin_cmd
from replay.commands.twin import TwinArgs
from replay.twin.compare import compare, model_flags, render
from tests.support.llamakit import require_xllamacpp
from tests.support.twin_suite import one_slot, write_trace

pytestmark = [pytest.mark.e2e, pytest.mark.llama]


def twin(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replay", "twin", *argv], capture_output=True, text=True, timeout=600, cwd=cwd
    )


def test_twin_live_then_offline_on_the_real_server(tiny_llama: Path, tmp_path: Path) -> None:
    require_xllamacpp()
    trace = write_trace(tmp_path / "trace.jsonl", one_slot)
    toml = tmp_path / "server.toml"
    toml.write_text(
        f'kind = "llamacpp"\nname = "tiny"\nbinary = "xllamacpp"\nmodel = "{tiny_llama}"\n'
        'flags = ["-np", "1", "-c", "8192", "-t", "2", "-lv", "4"]\nready_timeout = 60\nstop_timeout = 10\n'
    )
    done = twin(
        str(trace), "--server", str(toml), "--json", "--min-agreement", "0.99", "--out", "live", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    doc = orjson.loads(done.stdout)
    assert 0.0 <= doc["agreement"] <= 1.0 and doc["agreement"] == 1.0, doc["disagreements"]
    assert doc["requests"] == 7 == len(doc["rows"])
    # The model ran with the settings the real server showed: one slot, its host cache, -lv 4.
    assert doc["real"]["settings"]["cache_ram_mib"] == 8192 and doc["real"]["settings"]["n_parallel"] == 1
    assert doc["real"]["props"]["total_slots"] == 1
    flags = doc["model"]["flags"]
    assert flags[flags.index("--cache-ram") + 1] == "8192" and flags[flags.index("-np") + 1] == "1"
    # The conversation that comes back finds its state in the host cache, on both sides, per request.
    restores = [(r["id"], r["real"]["restores"], r["model"]["restores"]) for r in doc["rows"]]
    assert [r for r in restores if r[1]] == [(4, 1, 1), (5, 1, 1)]
    assert doc["all_fields_equal"] == 7
    results = tmp_path / "live" / "real.results.jsonl"
    assert orjson.loads((tmp_path / "live" / "real.twin.json").read_bytes())["agreement"] == 1.0

    # Offline: the results file and the real server's log; the model runs again from the log's settings.
    (log,) = [p for p in (tmp_path / "live" / "real").glob("*.log") if not p.name.startswith("memory")]
    off = twin(str(results), "--log", str(log), "--out", "offline", cwd=tmp_path)
    assert off.returncode == 0, off.stderr
    assert "agreement 1.000 (7 of 7" in off.stdout and "twin written to" in off.stdout
    offline = orjson.loads((tmp_path / "live" / "real.twin.json").read_bytes())
    assert offline["agreement"] == 1.0 and offline["real"]["settings"] == doc["real"]["settings"]
    assert [r["real"] for r in offline["rows"]] == [r["real"] for r in doc["rows"]]

    # The HTML report of the real run carries the twin beside it.
    page = subprocess.run(
        [sys.executable, "-m", "replay", "report", str(results), "--html", str(tmp_path / "page")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert page.returncode == 0, page.stderr
    html = (tmp_path / "page" / "index.html").read_text()
    assert '<section id="twin"' in html and "agreement 1.000: 7 of 7 requests" in html


def _req(i: int, seq: int, reprocessed: int, cached: int) -> dict[str, object]:
    return {
        "id": i,
        "seq": seq,
        "session": "a",
        "prompt_tokens": reprocessed + cached,
        "reprocessed_tokens": reprocessed,
        "cached_tokens": cached,
        "status": "ok",
    }


def _srv(seq: int, event: str, line: int, **fields: object) -> dict[str, object]:
    return {"kind": "server", "request_seq": seq, "event": event, "line": line, **fields}


def test_a_disagreement_names_its_first_divergence_with_both_sides_evidence() -> None:
    real = [_req(1, 0, 600, 0), _req(2, 1, 10, 590)]
    model = [_req(1, 0, 600, 0), _req(2, 1, 600, 0)]
    real_srv = [
        _srv(0, "request", 10, slot=0, cached=0, prefill=600),
        _srv(1, "restore", 20, source="host_cache", tokens=590, mib=3.5),
        _srv(1, "request", 21, slot=0, cached=590, prefill=10),
    ]
    model_srv = [
        _srv(0, "request", 5, slot=0, cached=0, prefill=600),
        _srv(1, "request", 9, slot=0, cached=0, prefill=600),
    ]
    doc = compare(real, real_srv, model, model_srv)
    assert doc["agreement"] == 0.5 and doc["equal"] == 1 and doc["first_state_divergence"] == 2
    (d,) = doc["disagreements"]
    assert (d["id"], d["real"], d["model"]) == (2, 10, 600)
    assert d["first_divergence"] == {
        "index": 0,
        "real": {"event": "restore", "line": 20, "source": "host_cache", "tokens": 590, "mib": 3.5},
        "model": {"event": "request", "line": 9, "slot": 0, "cached": 0, "prefill": 600},
    }
    assert [e["event"] for e in d["evidence"]["real"]] == ["restore", "request"]
    assert doc["rows"][1]["real"]["restores"] == 1 and doc["rows"][1]["model"]["restores"] == 0
    text = "\n".join(render(doc))
    assert "agreement 0.500 (1 of 2" in text and "real : event=restore line=20 source=host_cache" in text


def test_the_model_takes_the_servers_effective_settings_then_props_then_its_flags() -> None:
    settings = {
        "n_parallel": 2,
        "n_ctx_slot": 4096,
        "kv_unified": False,
        "ctx_checkpoints": 8,
        "log_verbosity": 4,
    }
    flags = model_flags(
        settings, {"total_slots": 9}, ["-sps", "0.5", "-np", "3", "--cache-ram", "99"], "m.gguf"
    )
    assert flags == [
        "-m",
        "m.gguf",
        "-np",
        "2",
        "-no-kvu",
        "-c",
        "8192",
        "--ctx-checkpoints",
        "8",
        "--cache-ram",
        "0",
        "-lv",
        "4",
        "-sps",
        "0.5",
    ]
    by_props = model_flags({}, {"total_slots": 4, "default_generation_settings": {"n_ctx": 1024}}, [], None)
    assert by_props[:4] == ["-np", "4", "-c", "4096"]


@pytest.mark.parametrize(("floor", "code"), [(None, 0), (0.4, 0), (0.5, 0), (0.51, 1), (1.0, 1)])
def test_min_agreement_exits_1_below_it_with_one_line_saying_why(
    floor: float | None, code: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command's exit: 1 when the agreement is below --min-agreement, 0 at or above it (the
    twin's runs stood in for by a document of agreement 0.5: one of two requests equal)."""
    doc = compare([_req(1, 0, 600, 0), _req(2, 1, 10, 590)], [], [_req(1, 0, 600, 0), _req(2, 1, 600, 0)], [])
    assert doc["agreement"] == 0.5
    monkeypatch.setattr(twin_cmd, "twin_offline", lambda *_a: dict(doc))
    results, log = tmp_path / "r.results.jsonl", tmp_path / "server.log"
    results.write_text("")
    log.write_text("")
    out = io.StringIO()
    args = TwinArgs(source=results, log=log, out=tmp_path / "out", min_agreement=floor)
    assert twin_cmd.twin(args, Console(file=out, width=200)) == code
    reasons = [line for line in out.getvalue().splitlines() if "--min-agreement" in line]
    if code:
        assert reasons == [f"agreement 0.500 is below --min-agreement {floor}"]
    else:
        assert reasons == []
    assert orjson.loads((tmp_path / "r.twin.json").read_bytes())["agreement"] == 0.5
