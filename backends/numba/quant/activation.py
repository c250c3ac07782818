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
def _q8_scales(x, r, o):
    """Of the Q8_0/Q8_1 block x[r, o:o + 32]: d before its rounding to f16, amax / 127, and the quantizing
    scale 127 / amax (0 for an all-zero block)."""
    amax = _F32(0.0)
    for j in range(32):
        amax = max(amax, abs(x[r, o + j]))
    return amax / _F32(127.0), (_F32(127.0) / amax if amax != _F32(0.0) else _F32(0.0))


@njit(cache=True)
def q8_blocks(x, y, yd, ys):
    """quantize_row_q8_1 as the x86 build runs it, per block of 32: d = f16(amax / 127), the quants
    q = round-half-even(x * (127 / amax)) into y (as float32, natural order), d into yd and Q8_1's
    s = f16(d * sum q) with the unrounded d into ys. quantize_row_q8_0 is the same without s."""
    n, k = x.shape
    for r in range(n):
        for b in range(k >> 5):
            o = b << 5
            d32, iscale = _q8_scales(x, r, o)
            qsum = 0
            for j in range(32):
                q = np.rint(x[r, o + j] * iscale)
                qsum += int(q)
                y[r, o + j] = q
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
                xq[r, inv[o + j]] = np.rint(x[r, o + j] * iscale) * d


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
