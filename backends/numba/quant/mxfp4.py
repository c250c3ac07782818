"""MXFP4 (gpt-oss's experts): llama.cpp's dot products bit for bit, on the raw blocks.

A block is one E8M0 exponent e and 32 e2m1 codes, two per byte (byte j: element j low, j + 16 high); a code
indexes ggml's doubled value table, so the scale is 2^(e - 128) (GGML_E8M0_TO_FP32_HALF). The activation is
quantized to Q8_0 (vec_dot_type), then, as llama.cpp's x86 build multiplies a weight whose rows come in eights
(its CPU "repack" buffer, the 8x8 MXFP4 GEMV and GEMM, which every gpt-oss matrix takes): per output element
and block, the exact integer sum of the 32 code * quant products, then acc = fma(float(sum), d_w * d_x, acc)
in block order. Those steps are the same in its GEMV and GEMM, so the result does not depend on the number of
activation rows. (A row count not a multiple of 8 would take ggml_vec_dot_mxfp4_q8_0 instead, whose two
interleaved 8-lane accumulators sum in another order: not reproduced, within float rounding of it.)
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from graphir.backends.numba.primitives.bits import fma
from graphir.backends.numba.quant.activation import q8_blocks
from graphir.backends.numba.quant.blocks import MXFP4_VALUES, e8m0_half

_F32 = np.float32
_CODES = MXFP4_VALUES.astype(np.int32)          # the doubled e2m1 values as integers


def pack_mxfp4(b):
    """(rows, nblocks, 17) raw blocks -> the codes' bytes (rows, nblocks * 16), the halved scales (rows, nblocks)
    and an empty min term (the exact kinds' packed triple)."""
    return (np.ascontiguousarray(b[:, :, 1:17]).reshape(b.shape[0], -1),
            np.ascontiguousarray(e8m0_half(b[:, :, 0])), np.empty(0, _F32))


@njit(parallel=True, cache=True)
def mxfp4_matmul(qs, d, m, x, out):
    """out[r, i] = row i of the weight . x[r] as llama.cpp computes it (see the module docstring); prange over
    weight rows, each block's 32 values decoded once and met by every activation row."""
    n, k = x.shape
    rows, nb = out.shape[1], k >> 5
    y, yd, ys = np.empty((n, k), _F32), np.empty((n, nb), _F32), np.empty((n, nb), _F32)
    q8_blocks(x, y, yd, ys)
    yi = np.empty((n, k), np.int32)
    for r in range(n):
        for j in range(k):
            yi[r, j] = np.int32(y[r, j])
    for i in prange(rows):
        w = np.empty(32, np.int32)
        acc = np.zeros(n, _F32)
        for b in range(nb):
            for j in range(16):
                c = np.int32(qs[i, b * 16 + j])
                w[j] = _CODES[c & 15]
                w[j + 16] = _CODES[c >> 4]
            dw = d[i, b]
            o = b << 5
            for r in range(n):
                s = np.int32(0)
                for j in range(32):
                    s += w[j] * yi[r, o + j]
                acc[r] = fma(_F32(s), dw * yd[r, b], acc[r])
        for r in range(n):
            out[r, i] = acc[r]
