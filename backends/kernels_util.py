"""Small numba helpers shared by the backend's kernels.

numba has no float16 type, so everything that must round like llama.cpp's fp16/bf16 conversions is done here
with integer or exact float arithmetic. None of these helpers uses fastmath: they are bit-exact.
numba's on-disk cache is keyed on the caller's source file: after editing an inlined helper here, clear the
callers' caches (__pycache__/*.nbi, *.nbc of backends/) or they keep the old code.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

__all__ = ["f16_round", "f16_bits", "round_f16", "round_bf16"]


@njit(cache=True)
def f16_round(v):
    """float32 value of float16(v), round-to-nearest-even (what F16C / `np.float16` do), as float32."""
    a = np.float64(v)
    if a == 0.0 or not np.isfinite(a):
        return np.float32(a)
    _, e = math.frexp(a)                       # 2**(e-1) <= |a| < 2**e
    ue = max(e - 11, -24)                      # exponent of one f16 ulp at |a| (subnormals: 2**-24)
    r = math.ldexp(np.rint(math.ldexp(a, -ue)), ue)   # exact scalings; np.rint is half-to-even
    if abs(r) > 65504.0:
        r = math.copysign(np.inf, a)
    return np.float32(r)


@njit(cache=True, inline="always")
def f16_bits(h):
    """float32 bit pattern of the half with bits h, exact for normals, zeros, inf and nan. Subnormal halves
    (exponent 0, nonzero mantissa) come out wrong and must be patched by the caller as m * 2**-24 (integer
    code cannot normalize them without a loop; float code needs no bit tricks for them)."""
    h = np.uint32(h)
    em = h & np.uint32(0x7FFF)
    b = ((h & np.uint32(0x8000)) << np.uint32(16)) | ((em << np.uint32(13)) + np.uint32(0x38000000))
    if em >= np.uint32(0x7C00):                # inf / nan: all-ones exponent
        b |= np.uint32(0x7F800000)
    return b


def round_f16(x: np.ndarray) -> np.ndarray:
    """x rounded to float16 and back (llama.cpp's fp32->fp16 conversion of activations: nearest-even)."""
    return x.astype(np.float16).astype(np.float32)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """x rounded to bfloat16 and back, nearest-even with NaN kept quiet (llama.cpp's fp32->bf16)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    r = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) & np.uint32(0xFFFF0000)
    r = np.where(nan, (u & np.uint32(0xFFFF0000)) | np.uint32(0x00400000), r)
    return r.view(np.float32)
