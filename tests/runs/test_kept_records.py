"""The records a replay keeps for its readers (memory per finished session): the same dicts back, in columns."""

from __future__ import annotations

from replay.runs.recording import KEPT_FIELDS, KeptRecords


def line(seq: int, status: str = "ok", **extra: object) -> dict[str, object]:
    base = {"kind": "request", "seq": seq, "id": seq + 100, "status": status, "prompt_tokens": 10 * seq}
    return {**base, "cached_tokens": None, "output_tokens": 7, "latency_s": 0.5, **extra}


def test_kept_fields_read_back_as_the_dicts_a_list_kept() -> None:
    lines = [line(1), line(2, "http_error"), line(3, prompt_tokens=2**40), line(4, output_tokens="x")]
    lines += [
        line(6, backend=None),
        line(7, backend="http://a:1"),
        line(8, backend="http://b:2"),
        line(9, backend=3),
    ]
    kept = KeptRecords()
    for x in lines:
        kept.append(x)
    cancelled = line(5, "cancelled")
    kept.append(cancelled, whole=True)
    expected = [{k: x[k] for k in KEPT_FIELDS if k in x} for x in lines] + [cancelled]
    assert list(kept) == expected
    assert len(kept) == 9 and kept[-1]["id"] == 105 and len(kept._whole) == 4 and kept[1:3] == expected[1:3]
    assert sorted(kept, key=lambda r: r["seq"])[0] == expected[0]


def test_a_kept_line_costs_under_20_bytes() -> None:
    kept = KeptRecords()
    for seq in range(1, 10_001):
        kept.append(line(seq, "ok" if seq % 7 else "timeout", backend=f"http://r{seq % 3}:80"))
    used = sum(col.buffer_info()[1] * col.itemsize for col in kept._numbers.values())
    used += kept._status.buffer_info()[1] * kept._status.itemsize
    used += kept._backend.buffer_info()[1] * kept._backend.itemsize
    assert used / 10_000 <= 20 and not kept._whole
