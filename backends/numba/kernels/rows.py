"""Row kernels a planned graph's tape runs where its Python steps take numpy: elementwise arithmetic of rows (a
second operand's rows repeat; relu, square, negation, scaling: a prompt's steps run these too, on both threads),
gathering (of a float weight's rows too), scattering and concatenating rows, copying a strided view, and set_rows
into an f16 cache (each row rounded to f16 as numpy's float32 -> float16 conversion does, NaN payloads included).
Each gives the bits numpy gives."""

from __future__ import annotations

from typing import Callable

import numpy as np
from numba import njit, prange

from graphir.backends.numba.primitives.jit import ARITH_PAR_MIN, SER, parallel_and_serial
from graphir.backends.numba.primitives.simd import as_f32
from graphir.backends.numba.primitives.bits import bits_u32

_U16, _U32 = np.uint16, np.uint32


ADD, SUB, MUL, DIV = range(4)
RELU, SQR, NEG, SCALE = range(4)
_ZERO = np.float32(0.0)


def _unary_rows(x, out, op, s):
    """out = op(x): RELU (np.maximum(x, 0): NaN kept, -0 to +0), SQR (x * x), NEG (-x), SCALE (x * s)."""
    for r in prange(x.shape[0]):
        for i in range(x.shape[1]):
            v = x[r, i]
            if op == RELU:
                out[r, i] = v if v > _ZERO or v != v else _ZERO
            elif op == SQR:
                out[r, i] = v * v
            elif op == NEG:
                out[r, i] = -v
            else:
                out[r, i] = v * s


def _binary_rows(x, y, div, out, op):
    """out = x op y row by row (op: ADD, SUB, MUL, DIV); row r takes y's row (r // div) % len(y): y has x's rows,
    one row, rows that x's repeat (div 1), or rows that each cover div of x's in turn."""
    for r in prange(x.shape[0]):
        yr = y[(r // div) % y.shape[0]]
        for i in range(x.shape[1]):
            if op == ADD:
                out[r, i] = x[r, i] + yr[i]
            elif op == SUB:
                out[r, i] = x[r, i] - yr[i]
            elif op == MUL:
                out[r, i] = x[r, i] * yr[i]
            else:
                out[r, i] = x[r, i] / yr[i]


_unary_par, _unary_ser = parallel_and_serial(_unary_rows)
_binary_par, _binary_ser = parallel_and_serial(_binary_rows)


def unary_kernel(size: int) -> Callable:
    """The row unary ops' kernel for x of ``size`` elements, (x, out, op, s): parallel from ARITH_PAR_MIN."""
    return _unary_par if size >= ARITH_PAR_MIN else _unary_ser


def binary_kernel(size: int) -> Callable:
    """The row binary ops' kernel for x of ``size`` elements, (x, y, div, out, op): parallel from ARITH_PAR_MIN."""
    return _binary_par if size >= ARITH_PAR_MIN else _binary_ser


@njit(**SER)
def move_rows(src, dst, ids, scatter):
    """For each i: dst[i] = src[ids[i]] (gathering rows), or with ``scatter`` dst[ids[i]] = src[i]; element by
    element (numba's row assignment took 2.3 s to compile)."""
    for i in range(ids.shape[0]):
        a, b = (i, ids[i]) if scatter else (ids[i], i)
        for c in range(src.shape[1]):
            dst[b, c] = src[a, c]


@njit(**SER)
def weight_rows(w1, ne0, ids, out):
    """out[i] = row ids[i] of a float weight stored flat (w1: f16 bits or float32; ne0 a row), as float32: the
    embedding lookup of an F16 or F32 table. An id outside the table raises IndexError."""
    rows = w1.shape[0] // ne0
    for i in range(ids.shape[0]):
        r = ids[i]
        if r < 0 or r >= rows:
            raise IndexError("get_rows: a row id is outside the weight's rows")
        for c in range(ne0):
            out[i, c] = as_f32(w1[r * ne0 + c])


@njit(**SER)
def concat_cols(x, y, out):
    """out[r] = x[r] then y[r], in one pass over the rows (two passes, one a side, took 8.4 us where this takes 4.9
    on Mamba-130M's conv columns)."""
    n = x.shape[1]
    for r in range(out.shape[0]):
        for c in range(n):
            out[r, c] = x[r, c]
        for c in range(y.shape[1]):
            out[r, n + c] = y[r, c]


@njit(**SER)
def strided_copy(src, off, s0, s1, s2, out):
    """out[i, j, k] = src[off + i*s0 + j*s1 + k*s2]: a permuted or strided view (its strides in elements, of the
    flat array it is a window of) made contiguous."""
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            b = off + i * s0 + j * s1
            for k in range(out.shape[2]):
                out[i, j, k] = src[b + k * s2]


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
