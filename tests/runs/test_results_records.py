"""The records a replay's readers use (usage check, server-log correlation) are read back from its
results file, not kept per request while it runs (memory per finished session)."""

from __future__ import annotations

import orjson

from replay.runs.recording import KEPT_FIELDS, ResultsRecords


def line(seq: int, status: str = "ok", **extra: object) -> dict[str, object]:
    base = {"kind": "request", "seq": seq, "id": seq + 100, "status": status, "prompt_tokens": 10 * seq}
    return {**base, "cached_tokens": None, "output_tokens": 7, "latency_s": 0.5, **extra}


def test_the_request_lines_read_back_with_the_kept_fields_and_a_cancelled_one_whole(tmp_path) -> None:
    lines = [line(1), line(2, "http_error"), line(3, prompt_tokens=2**40), line(4, backend="http://a:1")]
    cancelled = line(5, "cancelled")
    others = [
        {"kind": "run", "format": "x"},
        {"kind": "summary", "requests": 4},
        {"kind": "server", "seq": 1},
    ]
    path = tmp_path / "r.jsonl"
    rows = [others[0], *lines, cancelled, others[1], others[2]]
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    records = ResultsRecords(path)
    expected = [{k: x[k] for k in KEPT_FIELDS if k in x} for x in lines] + [cancelled]
    assert list(records) == expected
    assert list(records) == expected  # read again: each reader reads the file afresh
    assert len(records) == 5 and records[-1]["id"] == 105 and records[1:3] == expected[1:3]
