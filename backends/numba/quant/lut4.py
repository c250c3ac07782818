"""4-bit codes into a table of values, one scale per 32 (MXFP4, IQ4_NL): llama.cpp's dot products bit for bit.

A block is 32 codes, two per byte (byte j: element j low, j + 16 high), and a scale: MXFP4's E8M0 exponent e,
its codes indexing ggml's doubled e2m1 table (so the scale is 2^(e - 128), GGML_E8M0_TO_FP32_HALF); IQ4_NL's f16
d, its codes indexing kvalues_iq4nl (-127 .. 113). The activation is quantized to Q8_0 (vec_dot_type).
Where llama.cpp's x86 build repacks the weight (a 2-D matrix whose rows come in eights, or a mul_mat_id stack:
its CPU "repack" buffer, one 8x8 GEMV and GEMM template for both types, lut_matmul): per output element and
block, the exact integer sum of the 32 value * quant products, then acc = fma(float(sum), d_w * d_x, acc) in
block order (here with a register's lanes holding as many weight rows, their codes as GGUF keeps them and
looked up in registers). Those steps are the same in its GEMV and GEMM, so the result does not depend on the
number of activation rows.
IQ4_NL where it does not repack (rows not in eights, a 3-D weight's matrices; iq4_nl_unrepacked): one
activation row through ggml_vec_dot_iq4_nl_q8_0, whose AVX2 code (the AVX-512 build's too) forms Q8_0's eight
lane sums per block and chains the even blocks in one register and the odd ones in another,
acc = fma(d_x * d_w, lane, acc), then hsum_float_8 of the two registers added, and an odd last block as
fma(d_x * d_w, float(sum), total) (the compiler contracts it); from two rows tinyBLAS_Q0_AVX, whose order is
Q8_0's on the values (quant.exact). mul_mat_id never takes tinyBLAS: an expert's rows stay on the vec_dot.
(An MXFP4 weight llama.cpp does not repack takes ggml_vec_dot_mxfp4_q8_0, the same two chains on an f32 scale:
not reproduced, within float rounding of it.)
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from numba import njit, prange

from graphir.backends.numba.primitives.bits import fma
from graphir.backends.numba.primitives.simd import (as_f32, lanes, prefetch, vadd, vfma, vhsum, vload, vmul, vsplat,
                                                    vstore, vzero, width)
from graphir.backends.numba.quant.activation import q8_blocks
from graphir.backends.numba.quant.blocks import IQ4_NL_VALUES, MXFP4_VALUES, e8m0_half
from graphir.backends.numba.quant.exact import _AHEAD, _G, exact_gemv
from graphir.backends.numba.quant.int8_dot import WIDE_LANES, block_lanes, row_code_dots

_F32 = np.float32
_exact = dict(parallel=True, cache=True)                  # no FMA contraction but the written ones: bit-exact
_V8 = lanes(8)
_VW = lanes(WIDE_LANES)
_lanes_q8_0 = block_lanes("q8_0")
_Q8_0 = exact_gemv("q8_0")


def _side_by_side(b: np.ndarray, at: int, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows, nblocks, size) raw blocks with 16 code bytes from byte ``at`` -> the code bytes in groups of
    G = WIDE_LANES rows side by side (int8_dot.row_code_dots: per block four chunks of four bytes a row) and the
    scales (rows, nblocks) as float32 [group][block][row]; rows padded with zero blocks to whole groups (their
    results are never written)."""
    g = WIDE_LANES
    if b.shape[0] % g:
        pad = -b.shape[0] % g
        b = np.concatenate([b, np.zeros((pad, *b.shape[1:]), b.dtype)])
        scale = np.concatenate([scale, np.zeros((pad, scale.shape[1]), scale.dtype)])
    rows, nb = b.shape[:2]
    codes = b[:, :, at:at + 16].reshape(rows // g, g, nb, 4, 4).transpose(0, 2, 3, 1, 4)
    return (np.ascontiguousarray(codes).reshape(-1),
            np.ascontiguousarray(scale.astype(_F32).reshape(rows // g, g, nb).transpose(0, 2, 1)).reshape(-1))


def pack_mxfp4(b):
    """(rows, nblocks, 17) raw blocks -> their codes and halved scales side by side."""
    return _side_by_side(b, 1, e8m0_half(b[:, :, 0]))


def pack_iq4_nl(b):
    """(rows, nblocks, 18) raw blocks -> their codes and d side by side."""
    return _side_by_side(b, 2, np.ascontiguousarray(b[:, :, 0:2]).view(np.float16)[..., 0])


_MXFP4_DOTS, _IQ4_NL_DOTS = row_code_dots(MXFP4_VALUES.tolist()), row_code_dots(IQ4_NL_VALUES.tolist())


@njit(cache=True, inline="always")
def _code_dots(mxfp4, v, qs, qo, yf, yo, ysum):
    """The rows' exact block sums of MXFP4's codes (``mxfp4``) or IQ4_NL's against one activation row's block."""
    return _MXFP4_DOTS(v, qs, qo, yf, yo, ysum) if mxfp4 else _IQ4_NL_DOTS(v, qs, qo, yf, yo, ysum)


def _lut_matmul(mxfp4: bool) -> Callable:
    """out[r, i] = row i of the weight . x[r] in the order of llama.cpp's repacked 8x8 kernels (see the module
    docstring), MXFP4's codes or IQ4_NL's: prange over groups of rows side by side (_side_by_side), lane l
    holding row l's chain, each block met by four activation rows at a time (then one at a time), which share its
    loads and lookups (one at a time, Gemma-3-270M's IQ4_NL matrices of a layer took 1.86 ms against 1.58 for
    128 rows); the one-row GEMV asks for the memory _AHEAD blocks on (1B-class matrices on two Zen 5 cores: 36-40
    -> 39-42 GB/s). (The format is a closure constant, not the intrinsic itself, which would change numba's
    cache key in every process.)"""

    @njit(**_exact)
    def lut_matmul(qs, d, x, out):
        v = _VW
        g_rows = width(v)
        n, k = x.shape
        rows, nb = out.shape[1], k >> 5
        y, yd, ys = np.empty((n, k), np.int8), np.empty((n, nb), _F32), np.empty((n, nb), _F32)
        q8_blocks(x, y, yd, ys)
        yf = y.reshape(-1)
        ysum = np.zeros((n, nb), np.int32)
        for r in range(n):
            for b in range(nb):
                for j in range(32):
                    ysum[r, b] += yf[r * k + b * 32 + j]
        in_fours = n - (n & 3)
        for g in prange((rows + g_rows - 1) // g_rows):
            res = np.empty(4 * g_rows, _F32)
            for r in range(0, in_fours, 4):
                a0 = a1 = a2 = a3 = vzero(v)
                for b in range(nb):
                    o = g * nb + b
                    dw, qo, yo = vload(v, d, o * g_rows), o * 16 * g_rows, r * k + b * 32
                    a0 = vfma(_code_dots(mxfp4, v, qs, qo, yf, yo, ysum[r, b]), vmul(dw, vsplat(v, yd[r, b])), a0)
                    a1 = vfma(_code_dots(mxfp4, v, qs, qo, yf, yo + k, ysum[r + 1, b]),
                              vmul(dw, vsplat(v, yd[r + 1, b])), a1)
                    a2 = vfma(_code_dots(mxfp4, v, qs, qo, yf, yo + 2 * k, ysum[r + 2, b]),
                              vmul(dw, vsplat(v, yd[r + 2, b])), a2)
                    a3 = vfma(_code_dots(mxfp4, v, qs, qo, yf, yo + 3 * k, ysum[r + 3, b]),
                              vmul(dw, vsplat(v, yd[r + 3, b])), a3)
                vstore(res, 0, a0)
                vstore(res, g_rows, a1)
                vstore(res, 2 * g_rows, a2)
                vstore(res, 3 * g_rows, a3)
                for i in range(4):
                    for j in range(min(g_rows, rows - g * g_rows)):
                        out[r + i, g * g_rows + j] = res[i * g_rows + j]
            for r in range(in_fours, n):
                acc = vzero(v)
                for b in range(nb):
                    o = g * nb + b
                    if r == in_fours:
                        for j in range(0, 16 * g_rows, 64):
                            prefetch(qs, (o + _AHEAD) * 16 * g_rows + j)
                        prefetch(d, (o + _AHEAD) * g_rows)
                    dwx = vmul(vload(v, d, o * g_rows), vsplat(v, yd[r, b]))
                    acc = vfma(_code_dots(mxfp4, v, qs, o * 16 * g_rows, yf, r * k + b * 32, ysum[r, b]), dwx, acc)
                vstore(res, 0, acc)
                for j in range(min(g_rows, rows - g * g_rows)):
                    out[r, g * g_rows + j] = res[j]

    return lut_matmul


mxfp4_matmul, iq4_nl_matmul = _lut_matmul(True), _lut_matmul(False)


@njit(**_exact)
def _iq4_nl_vec_dot(qs, d, m, x, out, split):
    """ggml_vec_dot_iq4_nl_q8_0 of every weight row with every row of x, on IQ4_NL's values packed as Q8_0
    blocks (quant.exact's grouped layout: a block's quant bytes at ((g * nb + b) * _G + j) * 32 for row
    g * _G + j, its f16 d at (g * nb + b) * _G + j). ``split``: the build's (isa.IsaPath.split_chains) last odd
    block's ``sumf += d * sum`` is a multiply and an add, not one FMA."""
    n, k = x.shape
    nb, rows = k >> 5, out.shape[1]
    y, yd, ys = np.empty((n, k), np.int8), np.empty((n, nb), _F32), np.empty((n, nb), _F32)
    q8_blocks(x, y, yd, ys)
    yf = y.reshape(-1)
    for i in prange(rows):
        g, j = i // _G, i % _G
        for r in range(n):
            even, odd = vzero(_V8), vzero(_V8)
            for b in range(0, nb - 1, 2):
                o = (g * nb + b) * _G + j
                even = vfma(vsplat(_V8, yd[r, b] * as_f32(d[o])), _lanes_q8_0(_V8, qs, o * 32, yf, r * k + b * 32),
                            even)
                o += _G
                odd = vfma(vsplat(_V8, yd[r, b + 1] * as_f32(d[o])),
                           _lanes_q8_0(_V8, qs, o * 32, yf, r * k + b * 32 + 32), odd)
            total = vhsum(vadd(even, odd))
            if nb & 1:                                        # the last block alone: its sum, exact in float32
                o = (g * nb + nb - 1) * _G + j
                scale = yd[r, nb - 1] * as_f32(d[o])
                last = vhsum(_lanes_q8_0(_V8, qs, o * 32, yf, r * k + (nb - 1) * 32))
                total = total + scale * last if split else fma(scale, last, total)
            out[r, i] = total


def iq4_nl_unrepacked(tiny_blas: bool, split: bool = False) -> Callable:
    """The product of IQ4_NL rows llama.cpp does not repack (values packed as Q8_0 blocks, quant.exact), x
    quantized inside: one activation row through its vec_dot; more through tinyBLAS (Q8_0's order) where
    ``tiny_blas`` (mul_mat), else through the vec_dot too (mul_mat_id). ``split``: for a build with
    isa.IsaPath.split_chains."""
    from_rows = 2 if tiny_blas else 1 << 62

    @njit(cache=True)
    def product(qs, d, m, x, out):
        if x.shape[0] >= from_rows:
            _Q8_0(qs, d, m, x, out)
        else:
            _iq4_nl_vec_dot(qs, d, m, x, out, split)

    return product
