"""Activation quantizers: rows of x converted to a weight type's vec_dot type, rounded as llama.cpp rounds them.

q8_blocks gives the Q8_0/Q8_1 quants, scales and sums in natural order (the exact kinds' kernels take them
as they are). The quantizers of ACT, for the stream-layout kinds, write the *dequantized* quantized activation
(q * d, exact in f32) of element k at position inv[k] (stream order) of a row of xq, and the per-group sums
llama.cpp's min term needs into asum; the Q8_0 one shares q8_blocks' block scales. No fastmath: scale
formulas must round exactly like llama.cpp's (a/127 must not become a*(1/127)).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from numba import njit

from graphir.backends.numba.primitives.bits import f16_round, round_bf16, round_f16

_F32 = np.float32


@njit(cache=True, inline="always")
def maxps(a, b):
    """x86's maxps on one lane: a if a > b, else b (so b whenever either is NaN)."""
    return a if a > b else b


@njit(cache=True, inline="always")
def _lane_max(x, r, o, j):
    """|x| of lane j of the block's four registers folded with maxps, in register order."""
    a = abs(x[r, o + j])
    for g in range(1, 4):
        a = maxps(a, abs(x[r, o + 8 * g + j]))
    return a


@njit(cache=True, inline="always")
def _q8_scales(x, r, o):
    """Of the Q8_0/Q8_1 block x[r, o:o + 32]: d before its rounding to f16, amax / 127, and the quantizing
    scale 127 / amax (0 for an all-zero block). amax is taken as the x86 build takes it: four registers of
    eight |x| folded lane by lane with maxps, then the halves, pairs and the last two, so a NaN counts or not by
    where it sits (the same maximum as any order where there is none; an infinity gives scale 0)."""
    amax = maxps(maxps(maxps(_lane_max(x, r, o, 4), _lane_max(x, r, o, 0)),
                       maxps(_lane_max(x, r, o, 6), _lane_max(x, r, o, 2))),
                 maxps(maxps(_lane_max(x, r, o, 5), _lane_max(x, r, o, 1)),
                       maxps(_lane_max(x, r, o, 7), _lane_max(x, r, o, 3))))
    return amax / _F32(127.0), (_F32(127.0) / amax if amax != _F32(0.0) else _F32(0.0))


_INT_MIN = -2147483648


@njit(cache=True, inline="always")
def cvt_i32(v):
    """x86's float -> int32 conversion of an already rounded value: INT_MIN for NaN and out of range."""
    return int(v) if abs(v) < _F32(2147483648.0) else _INT_MIN


@njit(cache=True)
def q8_blocks(x, y, yd, ys):
    """quantize_row_q8_1 as the x86 build runs it, per block of 32: d = f16(amax / 127), the quants
    q = round-half-even(x * (127 / amax)) into y (natural order), d into yd and Q8_1's s = f16(d * sum q)
    with the unrounded d into ys. quantize_row_q8_0 is the same without s. What no healthy row has is kept too:
    a quant that is NaN or beyond int32 converts to INT_MIN and packs (saturating) to -128, and s sums the
    int32 values with wrap-around, as the vector code does."""
    n, k = x.shape
    for r in range(n):
        for b in range(k >> 5):
            o = b << 5
            d32, iscale = _q8_scales(x, r, o)
            qsum = 0
            for j in range(32):
                q = cvt_i32(np.rint(x[r, o + j] * iscale))
                qsum = (qsum + q + 2147483648) % 4294967296 - 2147483648
                y[r, o + j] = min(max(q, -128), 127)
            yd[r, b] = f16_round(d32)
            ys[r, b] = f16_round(d32 * _F32(qsum))


@njit(cache=True)
def _act_q8_0(x, inv, xq, asum):
    n, k = x.shape
    for r in range(n):
        for b in range(k >> 5):
            o = b << 5
            d32, iscale = _q8_scales(x, r, o)
            d = f16_round(d32)
            for j in range(32):
                xq[r, inv[o + j]] = _F32(min(max(cvt_i32(np.rint(x[r, o + j] * iscale)), -128), 127)) * d


def _act_f32(x, inv, xq, asum):
    xq[:] = x


def _act_f16(x, inv, xq, asum):
    xq[:] = round_f16(x)


def _act_bf16(x, inv, xq, asum):
    xq[:] = round_bf16(x)


# activation format -> (quantizer, elements per asum entry; 0 = no min term). The exact kinds (Q4_1: Q8_1,
# Q8_0: Q8_0) quantize inside their kernels, with q8_blocks.
ACT: dict[str, tuple[Callable, int]] = {
    "q8_0": (_act_q8_0, 0),
    "f32": (_act_f32, 0),
    "f16": (_act_f16, 0),
    "bf16": (_act_bf16, 0),
}
