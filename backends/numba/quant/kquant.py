"""Q4_K bit for bit: the order of llama.cpp's repacked 8x8 kernels.

On an x86 host with AVX2, llama.cpp moves every Q4_K matrix whose rows come in eights into its repack buffer
(ggml-cpu/repack.cpp, block_q4_Kx8) and multiplies it with ggml_gemv_q4_K_8x8_q8_K (one activation row) or
ggml_gemm_q4_K_8x8_q8_K (four at a time); AVX2 and AVX-512 builds keep the same arithmetic per output:
exact integers isum = sum_j sc_j * (q4 . q8 over sub-block j) and imin = sum_j m_j * (sum of q8 over sub-block j),
then two float chains,
    acc = fma(float(isum), d_w * d_x, acc),    acc_min = fma(float(imin), dmin_w * d_x, acc_min),
and the result acc - acc_min. The GEMV forms the integers per 256-element super-block, the GEMM per pair of
32-element sub-blocks (four links of the chains a super-block); a ubatch's rows go to the GEMM in fours and
its last n % 4 rows to the GEMV. The activation is Q8_K (quantize_row_q8_K_ref; the 4-row quantizer of the
GEMM gives the same numbers). Integer sums are exact however they are formed, so the kernel forms them in
plain loops and keeps only the float order.
Layout (pack_q4_k): the GGUF quant bytes as they are, and per row and super-block the eight 6-bit scales and
eight mins unpacked to bytes and d, dmin as float32.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from numba import njit, prange

from graphir.backends.numba.primitives.bits import fma
from graphir.backends.numba.primitives.simd import lanes, vfma, vhsum, vsplat, vzero
from graphir.backends.numba.quant.blocks import k_scales
from graphir.backends.numba.quant.int8_dot import nibble_lanes

_V8 = lanes(8)
_low, _high = nibble_lanes(False), nibble_lanes(True)

_F32 = np.float32
_I32 = np.int32
_exact = dict(parallel=True, cache=True)                  # no FMA contraction but the written ones: bit-exact


def pack_q4_k(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K blocks (rows, nb, 144) -> quant bytes (rows, nb * 128), scales and mins (rows, nb, 16) uint8 (eight
    scales, then eight mins) and (rows, nb, 2) float32 d, dmin."""
    rows, nb = b.shape[:2]
    sc, mn = k_scales(b[:, :, 4:16])
    d = np.ascontiguousarray(b[:, :, 0:4]).view(np.float16).astype(_F32).reshape(rows, nb, 2)
    return (np.ascontiguousarray(b[:, :, 16:144]).reshape(rows, -1),
            np.ascontiguousarray(np.concatenate([sc, mn], axis=-1).astype(np.uint8)), d)


@njit(cache=True)
def q8_k_rows(x, y, yd, ysum):
    """quantize_row_q8_K_ref over each row of x: per super-block the scale -127 / (the first value of largest
    magnitude), quants round-half-even clamped at 127 into y, d = 1 / scale into yd, and each 32-block's sum of
    quants into ysum (llama.cpp's bsums, added in pairs)."""
    n, k = x.shape
    for r in range(n):
        for sb in range(k >> 8):
            o = sb << 8
            amax, vmax = _F32(0.0), _F32(0.0)
            for j in range(256):
                a = abs(x[r, o + j])
                if a > amax:
                    amax, vmax = a, x[r, o + j]
            if amax == _F32(0.0):
                yd[r, sb] = _F32(0.0)
                for j in range(256):
                    y[r, o + j] = 0
                for g in range(8):
                    ysum[r, sb * 8 + g] = 0
                continue
            iscale = _F32(-127.0) / vmax
            yd[r, sb] = _F32(1.0) / iscale
            for g in range(8):
                t = 0
                for j in range(32):
                    q = _I32(min(np.rint(iscale * x[r, o + g * 32 + j]), _F32(127.0)))
                    y[r, o + g * 32 + j] = q
                    t += q
                ysum[r, sb * 8 + g] = t


_V8 = lanes(8)
_low, _high = nibble_lanes(False), nibble_lanes(True)


@njit(cache=True, inline="always")
def _scaled_dots(q, qo, y, yo, sc, s0, pairs):
    """sum over ``pairs`` 32-byte runs from q[qo] of sc[s0 + 2p] * (low nibbles . 32 quants of y) + sc[s0 + 2p + 1] *
    (high nibbles . the next 32), an exact integer: lanes of float32 integers below 2^24 (at most 8 * 63 * 4 * 15 *
    128), summed across once; a sum whose magnitude reaches 2^24 is formed again in integers."""
    acc = vzero(_V8)
    for p in range(pairs):
        acc = vfma(_low(_V8, q, qo + 32 * p, y, yo + 64 * p), vsplat(_V8, _F32(sc[s0 + 2 * p])), acc)
        acc = vfma(_high(_V8, q, qo + 32 * p, y, yo + 64 * p), vsplat(_V8, _F32(sc[s0 + 2 * p + 1])), acc)
    total = vhsum(acc)
    if abs(total) < _F32(16777216.0):
        return total
    exact = 0
    for p in range(pairs):
        for l in range(32):
            v = _I32(q[qo + 32 * p + l])
            exact += _I32(sc[s0 + 2 * p]) * (v & 15) * _I32(y[yo + 64 * p + l]) \
                + _I32(sc[s0 + 2 * p + 1]) * (v >> 4) * _I32(y[yo + 64 * p + 32 + l])
    return _F32(exact)


def q4_k_x8(gemm: bool) -> Callable:
    """The product of Q4_K rows in eights with x (n, k), quantizing x itself: with ``gemm``, as a mul_mat does it
    (rows in fours through the GEMM, the rest one by one), else every row through the GEMV, as llama.cpp's
    mul_mat_id multiplies an expert's rows."""

    @njit(**_exact)
    def product(qs, sm, dd, x, out):
        n, k = x.shape
        nb, rows = k >> 8, out.shape[1]
        y, yd, ysum = np.empty((n, k), np.int8), np.empty((n, nb), _F32), np.empty((n, nb * 8), _I32)
        q8_k_rows(x, y, yd, ysum)
        yf, qf, sf = y.reshape(-1), qs.reshape(-1), sm.reshape(-1)
        in_fours = n - (n & 3) if gemm else 0                 # rows the GEMM takes; the rest go one by one
        for i in prange(rows):
            for r in range(n):
                acc, acc_min = _F32(0.0), _F32(0.0)
                for b in range(nb):
                    dw, dm = dd[i, b, 0] * yd[r, b], dd[i, b, 1] * yd[r, b]
                    qo, yo, so = max((i * nb + b) * 128, 0), max(r * k + b * 256, 0), max((i * nb + b) * 16, 0)
                    if r < in_fours:                          # the GEMM: one FMA per pair of sub-blocks
                        for p in range(4):
                            imin = _I32(sf[so + 8 + 2 * p]) * ysum[r, b * 8 + 2 * p] \
                                + _I32(sf[so + 9 + 2 * p]) * ysum[r, b * 8 + 2 * p + 1]
                            acc = fma(_scaled_dots(qf, qo + 32 * p, yf, yo + 64 * p, sf, so + 2 * p, 1), dw, acc)
                            acc_min = fma(_F32(imin), dm, acc_min)
                    else:                                     # the GEMV: one FMA per super-block
                        imin = 0
                        for j in range(8):
                            imin += _I32(sf[so + 8 + j]) * ysum[r, b * 8 + j]
                        acc = fma(_scaled_dots(qf, qo, yf, yo, sf, so, 4), dw, acc)
                        acc_min = fma(_F32(imin), dm, acc_min)
                out[r, i] = acc - acc_min

    return product
