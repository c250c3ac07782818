"""MXFP4 and Q4_0: llama.cpp's repacked 8x8 dot products bit for bit, on the raw blocks.

llama.cpp's x86 build moves a MXFP4 or Q4_0 matrix whose rows come in eights into its CPU "repack" buffer and
multiplies it there with its 8x8 GEMV and GEMM: the activation is quantized to Q8_0 (vec_dot_type), then per
output element and 32-block, the exact integer sum of the 32 weight values times the activation's quants, and
acc = fma(float(sum), d_w * d_x, acc) in block order. Those steps are the same in its GEMV and GEMM (and in their
AVX-512 forms), so the result does not depend on the number of activation rows.

A block is a scale and 32 four-bit codes, two per byte (byte j: element j low, j + 16 high); a code indexes the
format's table of integer values: MXFP4's doubled e2m1 values with the E8M0 scale halved
(GGML_E8M0_TO_FP32_HALF), Q4_0's code - 8 with its f16 d. (A MXFP4 matrix whose row count is not a multiple of
8 takes ggml_vec_dot_mxfp4_q8_0 instead, whose two interleaved 8-lane accumulators sum in another order: not
reproduced, within float rounding of it. Such a Q4_0 matrix takes ggml_vec_dot_q4_0_q8_0, which quant.exact
replays on its values as Q8_0.)
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from numba import njit, prange

from graphir.backends.kernels_util import fma
from graphir.backends.quant.activation import q8_blocks
from graphir.backends.quant.blocks import MXFP4_VALUES, e8m0_half

_F32 = np.float32


def _packer(codes_at: int, scales: Callable[[np.ndarray], np.ndarray]) -> Callable:
    def pack(b):
        """(rows, nblocks, type size) raw blocks -> the codes' bytes (rows, nblocks * 16), the scales as float32
        (rows, nblocks) and an empty min term (the exact kinds' packed triple)."""
        return (np.ascontiguousarray(b[:, :, codes_at:codes_at + 16]).reshape(b.shape[0], -1),
                np.ascontiguousarray(scales(b)), np.empty(0, _F32))
    return pack


def _nibble_matmul(values: np.ndarray) -> Callable:
    """The kernel of a format whose code c stands for the integer values[c]. The table is a closure constant:
    numba's cache keys it by its bytes, so each format compiles once and loads from the cache after."""
    table = values.astype(np.int32)

    @njit(parallel=True, cache=True)
    def matmul(qs, d, m, x, out):
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
                    w[j] = table[c & 15]
                    w[j + 16] = table[c >> 4]
                dw = d[i, b]
                o = b << 5
                for r in range(n):
                    s = np.int32(0)
                    for j in range(32):
                        s += w[j] * yi[r, o + j]
                    acc[r] = fma(_F32(s), dw * yd[r, b], acc[r])
            for r in range(n):
                out[r, i] = acc[r]

    return matmul


def _f16_scales(b: np.ndarray) -> np.ndarray:
    return b[:, :, 0:2].copy().view(np.float16)[..., 0].astype(_F32)


pack_mxfp4 = _packer(1, lambda b: e8m0_half(b[:, :, 0]))
mxfp4_matmul = _nibble_matmul(MXFP4_VALUES)
pack_q4_0 = _packer(2, _f16_scales)
q4_0_matmul = _nibble_matmul(np.arange(16) - 8)
