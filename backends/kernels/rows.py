"""Row kernels a planned graph runs without numpy: the add of two values of one shape, and set_rows into an f16
cache (each row rounded to f16 as numpy's float32 -> float16 conversion does, NaN payloads included)."""

from __future__ import annotations

import numpy as np
from numba import njit

from graphir.backends.kernels.jit import SER
from graphir.backends.kernels_util import bits_u32

_U16, _U32 = np.uint16, np.uint32


@njit(**SER)
def add_flat(x, y, out):
    """out = x + y, element by element (float32: the bits of np.add)."""
    for i in range(out.shape[0]):
        out[i] = x[i] + y[i]


@njit(cache=True, inline="always")
def f16_bits_of(v):
    """The bits of float16(v), rounded to nearest even, as numpy converts: overflow to inf, gradual underflow, a
    NaN's payload shifted down (kept a NaN)."""
    f = bits_u32(v)
    sign = _U16((f >> _U32(16)) & _U32(0x8000))
    e = f & _U32(0x7F800000)
    if e >= _U32(0x7F800000):                              # inf, nan
        m = f & _U32(0x007FFFFF)
        if m == 0:
            return sign | _U16(0x7C00)
        h = _U32(0x7C00) + (m >> _U32(13))
        return sign | _U16(h + _U32(1) if h == _U32(0x7C00) else h)
    if e >= _U32(0x47800000):                              # beyond the largest half
        return sign | _U16(0x7C00)
    if e <= _U32(0x38000000):                              # subnormal half or zero
        if e < _U32(0x33000000):
            return sign
        m = (_U32(0x00800000) + (f & _U32(0x007FFFFF))) >> (_U32(113) - (e >> _U32(23)))
        if (m & _U32(0x3FFF)) != _U32(0x1000) or (f & _U32(0x7FF)) != 0:
            m += _U32(0x1000)
        return sign | _U16(m >> _U32(13))
    m = f & _U32(0x007FFFFF)
    if (m & _U32(0x3FFF)) != _U32(0x1000):
        m += _U32(0x1000)
    return sign | _U16((m >> _U32(13)) + ((e - _U32(0x38000000)) >> _U32(13)))


@njit(**SER)
def set_rows_f16(dst, src, ids):
    """dst[ids[i]] = float16(src[i]): dst the f16 cache's bits (uint16), src float32 rows of its width."""
    for i in range(ids.shape[0]):
        row = ids[i]
        for c in range(src.shape[1]):
            dst[row, c] = f16_bits_of(src[i, c])
