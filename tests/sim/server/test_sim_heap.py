"""The simulator's fixed mmap threshold: a large block freed once does not send later ones of
its size to the heap (where the pages they leave stay resident), as glibc's dynamic threshold does."""

from __future__ import annotations

import ctypes
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's"
)

# In a fresh process: free a 4 MiB block (glibc then raises its threshold to 4 MiB unless it is
# fixed), allocate 2 MiB and print whether that block was mapped on its own (mallinfo2's hblkhd).
PROBE = """
import ctypes, sys
from replay.sim.server import heap
if sys.argv[1] == "fixed":
    assert heap.fix_mmap_threshold()
libc = ctypes.CDLL("libc.so.6")
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc.mallinfo2.restype = Info
big = bytearray(4 << 20)
del big
before = libc.mallinfo2().hblkhd
block = bytearray(2 << 20)
print(libc.mallinfo2().hblkhd - before >= 2 << 20)
"""


def mapped(mode: str) -> bool:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return out.stdout.strip() == "True"


@pytest.mark.skipif(not hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2"), reason="mallinfo2 needs glibc 2.33")
def test_a_fixed_threshold_keeps_large_blocks_mapped_after_one_was_freed() -> None:
    assert not mapped("dynamic")  # glibc's own behaviour: the probe sees the difference
    assert mapped("fixed")
