"""glibc's float32 functions, called as ggml calls them for the constants of an op (a RoPE base's powers,
ALiBi's slopes): numpy's float32 pow and friends may take SIMD routines that differ from libm in the last bit."""

from __future__ import annotations

import ctypes
import ctypes.util

libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
for _f, _n in (("powf", 2), ("logf", 1), ("cosf", 1), ("sinf", 1)):
    getattr(libm, _f).restype, getattr(libm, _f).argtypes = ctypes.c_float, [ctypes.c_float] * _n
