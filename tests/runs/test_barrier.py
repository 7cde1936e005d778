"""The start barrier: shards begin at one wall-clock instant and say how late each really began."""

from __future__ import annotations

import time

import pytest

from replay.errors import UsageError
from replay.runs.barrier import LATE_WARNING_S, late_notice, parse_instant, spread_s, wait_until


def test_an_instant_needs_its_utc_offset():
    assert parse_instant("2026-12-01T16:30:00Z") == parse_instant("2026-12-01T17:30:00+01:00")
    with pytest.raises(UsageError, match="no UTC offset"):
        parse_instant("2026-12-01T16:30:00")
    with pytest.raises(UsageError, match="ISO 8601"):
        parse_instant("at half past four")


def test_waiting_begins_at_the_instant_not_before():
    target = time.time() + 0.3
    start = wait_until(target)
    assert time.time() >= target
    assert 0.0 <= start["late_s"] < 0.25  # a loaded machine may wake late; never early
    assert start["planned"] < start["actual"]


def test_an_instant_already_past_starts_at_once_and_says_how_late():
    start = wait_until(time.time() - 5.0)
    assert start["late_s"] >= 5.0


def test_spread_is_the_distance_between_the_first_and_last_actual_start():
    headers = [
        {"start": {"actual": "2026-12-01T16:30:00.010000+00:00"}},
        {"start": {"actual": "2026-12-01T16:30:00.045000+00:00"}},
        {"start": {"actual": "2026-12-01T16:30:00.020000+00:00"}},
    ]
    assert spread_s(headers) == pytest.approx(0.035)
    assert spread_s(headers[:1]) is None
    assert spread_s([*headers, {}]) is None


def test_a_start_more_than_a_second_late_is_a_warning_that_says_by_how_much():
    planned = parse_instant("2026-12-01T16:30:00Z")
    assert late_notice(planned, now=planned - 30.0) is None  # early: the barrier waits
    assert late_notice(planned, now=planned + LATE_WARNING_S) is None  # on time, give or take
    notice = late_notice(planned, now=planned + 312.4)
    assert notice is not None
    assert "starts 312.4 s after --start-at 2026-12-01T16:30:00" in notice and "start.late_s" in notice
