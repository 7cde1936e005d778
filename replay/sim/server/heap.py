"""A fixed glibc mmap threshold for the simulator's process, so its bounded caches stay flat in RSS.

The tokenizer's text cache (an OrderedDict of up to 65,536 texts) turns over with every request,
and CPython never reuses a dict's deleted entries: a dict of constant size is still copied into a
fresh table every ~100,000 insertions (about 7 MB of tables at that size, old and new alive
together for the copy). glibc serves such large blocks with mmap, but the first time one is freed
it raises its mmap threshold to that block's size (the "dynamic threshold"), so every later copy
comes from the heap, between small live objects; the pages the old copies leave there stay
resident. RSS then rises in steps of a table's size while the Python heap stays flat (the
30-minute soak: +14 MB after the cache was full). With the threshold fixed, blocks of 1 MiB and more
are always mapped on their own and unmapped when freed. Elsewhere (no glibc) a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)
MMAP_THRESHOLD = 1 << 20  # 1 MiB: a cache table, a large request body; never a per-token object


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Set glibc's mmap threshold once, which also turns its dynamic adjustment off; True if set."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, threshold))
