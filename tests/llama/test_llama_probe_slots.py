"""The probe on a llama-server with two slots: it saves and restores the slot that holds the document
(found from `GET /slots`), not slot 0, and E5 is classed by its own session."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from drivers.target import Target
from replay.engine.usage import Usage
from replay.errors import TargetError
from replay.metrics.record import RequestRecord
from replay.metrics.results import read_results
from replay.runs.probe import find_slot, run_cache_probe
from tests.support.llamakit import require_xllamacpp

DOCUMENT = 2000


@pytest.mark.llama
def test_two_slots_the_probe_saves_the_one_holding_the_document(tiny_llama: Path, tmp_path: Path) -> None:
    require_xllamacpp()
    target = Target(
        kind="llamacpp",
        name=tiny_llama.stem,
        binary="xllamacpp",
        model=str(tiny_llama),
        # No host prompt cache: only the slot itself can give the document back.
        flags=("-c", "32768", "-np", "2", "-t", "1", "--cache-ram", "0"),
        ready_timeout=60,
        stop_timeout=10,
    )
    report = run_cache_probe(target, tmp_path, params={"document": DOCUMENT, "defaults.reply_tokens": 16})
    assert [s.status for s in report.steps] == ["ok"] * 7
    (restart,) = report.restarts
    assert restart.slot is not None
    assert restart.save["n_saved"] == restart.restore["n_restored"] > DOCUMENT
    e5 = report.steps[-1]
    assert e5.reprocessed_tokens is not None and e5.reprocessed_tokens <= 4, e5  # the document came back
    switches = [r["switch"] for r in read_results(report.results).requests]
    assert switches[-1] == ["continue"]  # E5 goes on with the document it restored: not "cold"
    assert "cold" not in switches[-1]


class _Slots(BaseHTTPRequestHandler):
    slots: list[dict[str, Any]] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = json.dumps(self.slots).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        pass


def serve_slots(slots: list[dict[str, Any]]) -> tuple[ThreadingHTTPServer, str]:
    handler = type("Slots", (_Slots,), {"slots": slots})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def rec(session: str, prompt: int, output: int) -> RequestRecord:
    return RequestRecord(session=session, usage=Usage(prompt_tokens=prompt, output_tokens=output))


def test_find_slot_picks_the_slot_whose_tokens_match_the_session() -> None:
    server, url = serve_slots(
        [
            {"id": 0, "id_task": 9, "n_prompt_tokens": 717},
            {"id": 1, "id_task": 5, "n_prompt_tokens": 2115},
        ]
    )
    try:
        records = [rec("doc", 2100, 16), rec("other", 702, 16)]
        assert find_slot(url, "doc", records) == 1
        assert find_slot(url, "other", records) == 0
    finally:
        server.shutdown()


def test_find_slot_refuses_when_no_slot_holds_the_document() -> None:
    server, url = serve_slots(
        [{"id": 0, "id_task": 9, "n_prompt_tokens": 717}, {"id": 1, "id_task": 5, "n_prompt_tokens": 90}]
    )
    try:
        with pytest.raises(TargetError, match=r"cannot tell which slot holds session 'doc'.*pass --slot N"):
            find_slot(url, "doc", [rec("doc", 2100, 16)])
    finally:
        server.shutdown()


def test_find_slot_reads_the_log_when_the_slots_endpoint_is_off(tmp_path: Path) -> None:
    log = tmp_path / "llama.log"
    log.write_text(
        "0.00.312.759 I slot      release: id  0 | task 0 | stop processing: n_tokens = 2115, truncated = 0\n"
        "0.00.412.759 I slot      release: id  1 | task 3 | stop processing: n_tokens = 717, truncated = 0\n"
    )
    # Nothing listens here: the endpoint is as good as switched off.
    assert find_slot("http://127.0.0.1:9", "doc", [rec("doc", 2100, 16), rec("b", 702, 16)], log) == 0
    with pytest.raises(TargetError, match=r"GET http://127.0.0.1:9/slots: ConnectError, and the server log"):
        find_slot("http://127.0.0.1:9", "doc", [rec("doc", 2100, 16)], tmp_path / "missing.log")
