"""A worker's peak RSS is its own, not the size of the process that started it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from replay.runs.workers import peak_rss_mib


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM is read from Linux's /proc")
def test_a_child_of_a_big_parent_reports_its_own_peak() -> None:
    ballast = bytearray(300 * 2**20)  # the parent holds 300 MiB, touched
    ballast[::4096] = b"x" * len(ballast[::4096])
    assert peak_rss_mib() > 300
    code = "from replay.runs.workers import peak_rss_mib; print(peak_rss_mib())"
    child = float(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    )
    # ru_maxrss would say >= 300 here: exec records the parent's memory map's peak in it.
    assert child < 200, child
    del ballast
