"""The process heap as a graph run needs it: freed buffers kept for the next run, not handed back to the kernel.

A prompt's steps allocate their values with numpy (a 1B-class layer's KQ alone is 32 MB at 512 tokens) and free
them a few steps later. glibc serves a large block by mmap and returns it on free (its threshold moves up to 32
MB, then stops), and trims the top of its heap: every run then faults in and zeroes hundreds of MB of fresh pages
(a 1B-class 512-token prompt: 46-64 thousand faults a run), while llama.cpp allocates its compute buffer once.
With the threshold above such blocks and no trimming, the heap keeps what a run freed and the next run's
allocations land on it (0-1,300 faults a run). Set once, when the first graph is compiled; a process that set
glibc's malloc tunables itself, or a libc without mallopt, is left as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
# the largest block served from the heap (larger ones are mmapped as before), then what glibc accepts everywhere
_MMAP_THRESHOLDS = (1 << 30, 32 << 20)
_TRIM_THRESHOLD = 2**31 - 1         # mallopt's int: the heap's top is trimmed only when 2 GiB of it are free
_TUNED = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "glibc.malloc.mmap_threshold",
          "glibc.malloc.trim_threshold")


@functools.cache
def keep_freed_memory() -> bool:
    """glibc's mallopt: blocks up to 1 GiB (32 MiB where glibc refuses more) from the heap, which is trimmed
    only past 2 GiB free. True if it took effect; False where the environment sets either threshold."""
    if any(t in os.environ or t in os.environ.get("GLIBC_TUNABLES", "") for t in _TUNED):
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    if not any(mallopt(_M_MMAP_THRESHOLD, size) for size in _MMAP_THRESHOLDS):
        return False
    return bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
