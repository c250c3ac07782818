"""Matmul kernels of the stream-layout weight kinds (F32, F16, BF16).

They multiply the stream-order quantized activation of quant.activation with the weight: below GEMM_FROM
activation rows one flat GEMV loop per format, from it a register-tiled GEMM fed by the format's row
dequantizer (quant.blocks).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from numba import njit, prange

from graphir.backends.numba.quant.blocks import per_format, row_bf16, row_f16, row_f32

_F32 = np.float32
_fast = dict(parallel=True, fastmath=True, cache=True)   # GEMV: float reassociation allowed (vectorizes)


# ---------------------------------------------------------------------------------------------------------
# GEMV kernels (n < GEMM_FROM): prange over weight rows i; for each activation row r one flat loop over the
# row's bytes with the block scale fetched as s[i, j >> k]. xq (n, k) is in stream order, so the values that
# meet byte j of a Q4 row are xq[r, j] and xq[r, kp + j].
# ---------------------------------------------------------------------------------------------------------

@njit(**_fast)
def gemv_f32(w, xq, asum, out):
    rows, k = w.shape
    for i in prange(rows):
        for r in range(xq.shape[0]):
            acc = _F32(0.0)
            for j in range(k):
                acc += w[i, j] * xq[r, j]
            out[r, i] = acc


def converting_gemv(bf16: bool) -> Callable:
    """The GEMV of F16 or (bf16) BF16 weights: 64 weight rows per task, each converted in turn to f32 into one
    row buffer (row_f16 / row_bf16) and multiplied with every activation row. The format is a closure constant,
    so numba compiles only its branch; a closure over the row function itself would change numba's cache key
    in every process (the key pickles a dispatcher with a per-process uuid), and the kernel would compile again
    at each start."""

    @njit(**_fast)
    def gemv(w0, xq, asum, out):
        rows, k = w0.shape
        for c in prange((rows + 63) >> 6):
            w = np.empty((1, k), _F32)
            for i in range(c << 6, min(rows, (c + 1) << 6)):
                if bf16:
                    row_bf16(w0, i, w, 0, False)
                else:
                    row_f16(w0, i, w, 0, False)
                for r in range(xq.shape[0]):
                    acc = _F32(0.0)
                    for j in range(k):
                        acc += w[0, j] * xq[r, j]
                    out[r, i] = acc

    return gemv


# ---------------------------------------------------------------------------------------------------------
# GEMM kernels (n >= GEMM_FROM): each task dequantizes 6 weight rows at a time (w' only) into an L1-resident
# buffer and multiplies them with 4 activation rows at a time held in 24 register accumulators; the min term
# goes through the same tile. Why no BLAS: see the package docstring.
# ---------------------------------------------------------------------------------------------------------

_TR = 6                    # weight rows per tile (x 4 activation rows = 24 accumulators)
GEMM_FROM = 4             # n from which GEMM beats GEMV, for every type (measured: bench/bench_quant.py)


@njit(fastmath=True, cache=True)
def _tile(w, cnt, xq, out, i0):
    """out[r, i0 + a] = w[a] . xq[r] for a < cnt; w is (_TR, k), xq (n, k)."""
    n, k = xq.shape
    r = 0
    if cnt == _TR:
        z = _F32(0.0)
        while r + 4 <= n:
            a00 = a01 = a02 = a03 = a10 = a11 = a12 = a13 = a20 = a21 = a22 = a23 = z
            a30 = a31 = a32 = a33 = a40 = a41 = a42 = a43 = a50 = a51 = a52 = a53 = z
            for j in range(k):
                x0, x1, x2, x3 = xq[r, j], xq[r + 1, j], xq[r + 2, j], xq[r + 3, j]
                v = w[0, j]
                a00 += v * x0; a01 += v * x1; a02 += v * x2; a03 += v * x3   # noqa: E702
                v = w[1, j]
                a10 += v * x0; a11 += v * x1; a12 += v * x2; a13 += v * x3   # noqa: E702
                v = w[2, j]
                a20 += v * x0; a21 += v * x1; a22 += v * x2; a23 += v * x3   # noqa: E702
                v = w[3, j]
                a30 += v * x0; a31 += v * x1; a32 += v * x2; a33 += v * x3   # noqa: E702
                v = w[4, j]
                a40 += v * x0; a41 += v * x1; a42 += v * x2; a43 += v * x3   # noqa: E702
                v = w[5, j]
                a50 += v * x0; a51 += v * x1; a52 += v * x2; a53 += v * x3   # noqa: E702
            for a, (c0, c1, c2, c3) in enumerate(((a00, a01, a02, a03), (a10, a11, a12, a13), (a20, a21, a22, a23),
                                                  (a30, a31, a32, a33), (a40, a41, a42, a43), (a50, a51, a52, a53))):
                out[r, i0 + a] = c0
                out[r + 1, i0 + a] = c1
                out[r + 2, i0 + a] = c2
                out[r + 3, i0 + a] = c3
            r += 4
    for rr in range(r, n):
        for a in range(cnt):
            acc = _F32(0.0)
            for j in range(k):
                acc += w[a, j] * xq[rr, j]
            out[rr, i0 + a] = acc


@njit(cache=True)
def _tasks(rows):
    nblk = (rows + _TR - 1) // _TR
    return min(nblk, 64), nblk


_GEMM = """
def gemm_{fmt}({arrays}, xq, asum, out):
    rows = {first}.shape[0]
    ntask, nblk = _tasks(rows)
    for t in prange(ntask):
        w = np.empty((_TR, xq.shape[1]), _F32)
        for c in range(t * nblk // ntask, (t + 1) * nblk // ntask):
            i0, cnt = c * _TR, min(_TR, rows - c * _TR)
            for a in range(cnt):
                {row}({arrays}, i0 + a, w, a, False)
            _tile(w, cnt, xq, out, i0)
"""


def tiled_gemm(row: Callable) -> Callable:
    """The GEMM of ``row``'s format, (*packed, xq, asum, out): each task expands _TR weight rows into a tile and
    multiplies it with every activation row."""
    return per_format(_GEMM, row, globals(), _fast)
