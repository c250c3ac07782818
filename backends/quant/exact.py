"""Q4_1 and Q8_0: llama.cpp's dot products bit for bit, in a layout of their own.

ggml_vec_dot_q4_1_q8_1 and ggml_vec_dot_q8_0_q8_0 (x86 quants.c, AVX2 path; tinyBLAS_Q0_AVX, which takes
Q8_0 x Q8_0 when n >= 2, keeps the same order per output element): per 32-block, eight int32 lane sums of
four consecutive products (VNNI dpbusd / maddubs+madd), converted to float and accumulated lane-wise as
acc[l] = fma(d_w * d_x, lane[l], acc[l]) in block order; the result is hsum8(acc), plus for Q4_1 the min
term summs = fma(m_w, s_x, summs) chained over the blocks (a scalar vfmadd231ss in the build) and added last.
Layout: weight rows in groups of _G; inside a group the values of one element for all of the group's rows
sit side by side ([element][row]), so the innermost loops run over rows (16 per zmm) and every lane of the
emulation is plain vector code. The lane sums are integers, exact in any order: Q4_1's GEMV forms them in
int16 (32 rows a register), the rest in float (all partial sums are integers below 2^24). Q4_1 bytes hold
lane l's elements 4l+p (low nibble) and 4l+p+2 (high nibble), p = 0, 1. Activations: the int8 quants in
natural order (int16 for the GEMV, float32 for the GEMM), d and s per block.
The two formats share one GEMV and one GEMM (exact_gemv, exact_gemm; several weights on one x run as one
GEMV over their rows laid one after another, quant.weight.QWeightGroup): the format is a closure constant that picks its lane and expansion functions, and numba compiles
only that branch. (A closure over the functions themselves would change numba's cache key in every
process: the key pickles a dispatcher with a per-process uuid, and the kernels would compile again at each
start.)
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from numba import njit, prange

from graphir.backends.kernels_util import fma, hsum8
from graphir.backends.quant.activation import q8_blocks
from graphir.backends.quant.blocks import block_f16

_F32 = np.float32
_exact = dict(parallel=True, cache=True)                  # no FMA contraction but the written ones: bit-exact

_G = 64                    # weight rows per group (4 zmm); the last group of a tensor may be narrower
_RC = 32                   # activation rows per GEMM task

_U4, _U15 = np.uint8(4), np.uint8(15)


def _grouped(a: np.ndarray) -> np.ndarray:
    """(rows, ...) -> 1-D: rows in groups of _G, each group stored element-major ([element][row in group])."""
    rows = a.shape[0]
    flat = a.reshape(rows, -1)
    width = flat.shape[1]
    full = rows // _G * _G
    out = np.empty(rows * width, a.dtype)
    out[:full * width] = flat[:full].reshape(-1, _G, width).transpose(0, 2, 1).reshape(-1)
    out[full * width:] = flat[full:].T.reshape(-1)
    return out


def pack_q4_1(b):
    qs = b[:, :, 4:20]
    q = np.concatenate([qs & 15, qs >> 4], axis=2).reshape(b.shape[0], b.shape[1], 8, 4)   # [row][b][l][e]
    return _grouped(q[..., 0:2] | (q[..., 2:4] << 4)), _grouped(block_f16(b, 0)), _grouped(block_f16(b, 2))


def pack_q8_0(b):
    return _grouped(b[:, :, 2:34].view(np.int8)), _grouped(block_f16(b, 0)), np.empty(0, _F32)   # no min term


@njit(cache=True, inline="always")
def _finish(acc, summ, out, r, i0, w, with_min):
    for t in range(w):
        v = hsum8(acc[0, t], acc[1, t], acc[2, t], acc[3, t], acc[4, t], acc[5, t], acc[6, t], acc[7, t])
        out[r, i0 + t] = v + summ[t] if with_min else v


@njit(cache=True, inline="always")
def _scales(dg, mg, b, w, ydb, ysb, dd, summ, with_min):
    """dd = d_w * d_x (one f32 product, as llama.cpp's d0*d1) and the min-term chain for block b."""
    db = dg[b * w:(b + 1) * w]
    for t in range(w):
        dd[t] = db[t] * ydb
    if with_min:
        mb = mg[b * w:(b + 1) * w]
        for t in range(w):
            summ[t] = fma(mb[t], ysb, summ[t])


@njit(cache=True, inline="always")
def _lane_q4_1(qg, b, lane, w, y0, y1, y2, y3, dd, al):
    """al[t] = fma(dd[t], lane sum, al[t]) for the w rows of a group: lane `lane` of block b of Q4_1, whose
    bytes pair the lane's elements (low nibbles 0 and 1, high nibbles 2 and 3). y0..y3: the activation quants
    as int16. The lane sum is formed in int16, where it is exact (|sum| <= 4 * 15 * 127 = 7620): the
    truncation to int16 lets the loop run 32 rows a register, twice the float width."""
    base = (b * 8 + lane) * 2 * w
    q0, q1 = qg[base:base + w], qg[base + w:base + 2 * w]
    for t in range(w):
        a, c = np.int16(q0[t]), np.int16(q1[t])
        s = np.int16(np.int16(a & 15) * y0 + np.int16(c & 15) * y1 + np.int16(a >> 4) * y2 + np.int16(c >> 4) * y3)
        al[t] = fma(dd[t], _F32(s), al[t])


@njit(cache=True, inline="always")
def _lane_q8_0(qg, b, lane, w, y0, y1, y2, y3, dd, al):
    """As _lane_q4_1 for Q8_0: the lane's four int8 quants, one element-major run of w bytes each. The lane sum
    in float, exact (|sum| <= 4 * 128 * 127 < 2^24): int16 does not hold it, and int32 measured slower."""
    o = b * 32 + 4 * lane
    q0, q1 = qg[o * w:(o + 1) * w], qg[(o + 1) * w:(o + 2) * w]
    q2, q3 = qg[(o + 2) * w:(o + 3) * w], qg[(o + 3) * w:(o + 4) * w]
    f0, f1, f2, f3 = _F32(y0), _F32(y1), _F32(y2), _F32(y3)
    for t in range(w):
        s = fma(_F32(q3[t]), f3, fma(_F32(q2[t]), f2, fma(_F32(q1[t]), f1, _F32(q0[t]) * f0)))
        al[t] = fma(dd[t], s, al[t])


@njit(cache=True, inline="always")
def _gemv_group(qs, d, m, y, yd, ys, out, i0, q4_1):
    """out[:, i0:i0 + _G] (fewer at the end of the tensor): one group of weight rows against the quantized
    activation rows y (int16), yd, ys; per activation row, block and lane, the format's lane function forms
    the lane sums of the group's rows and accumulates them. Q4_1 adds the min term of m; Q8_0's m is empty."""
    n, k = y.shape
    rows, nb = out.shape[1], k >> 5
    rb = qs.shape[0] // rows                           # bytes of a weight row
    w = min(_G, rows - i0)
    qg, dg, mg = qs[i0 * rb:(i0 + w) * rb], d[i0 * nb:(i0 + w) * nb], m[i0 * nb:(i0 + w) * nb]
    acc = np.empty((8, w), _F32)
    summ = np.empty(w if q4_1 else 0, _F32)
    dd = np.empty(w, _F32)
    for r in range(n):
        acc[:] = 0.0
        summ[:] = 0.0
        yr = y[r]
        for b in range(nb):
            _scales(dg, mg, b, w, yd[r, b], ys[r, b], dd, summ, q4_1)
            for lane in range(8):
                o = b * 32 + 4 * lane
                if q4_1:
                    _lane_q4_1(qg, b, lane, w, yr[o], yr[o + 1], yr[o + 2], yr[o + 3], dd, acc[lane])
                else:
                    _lane_q8_0(qg, b, lane, w, yr[o], yr[o + 1], yr[o + 2], yr[o + 3], dd, acc[lane])
        _finish(acc, summ, out, r, i0, w, q4_1)


@njit(cache=True, inline="always")
def _q8_int16(x):
    """x's Q8_0/Q8_1 blocks (q8_blocks) with the quants as int16, what the GEMV's lane functions take."""
    n, k = x.shape
    y, yd, ys = np.empty((n, k), np.int16), np.empty((n, k >> 5), _F32), np.empty((n, k >> 5), _F32)
    q8_blocks(x, y, yd, ys)
    return y, yd, ys


def exact_gemv(q4_1: bool) -> Callable:
    """ggml_vec_dot_q4_1_q8_1 (q4_1) or ggml_vec_dot_q8_0_q8_0 for n < gemm_from: prange over groups of _G
    weight rows (_gemv_group)."""

    @njit(**_exact)
    def gemv(qs, d, m, x, out):
        y, yd, ys = _q8_int16(x)
        for g in prange((out.shape[1] + _G - 1) // _G):
            _gemv_group(qs, d, m, y, yd, ys, out, g * _G, q4_1)

    return gemv


@njit(cache=True, inline="always")
def _gemm_rows(wf, dg, mg, y, yd, ys, out, i0, w, r0, r1, with_min):
    """Activation rows [r0, r1) against the group's weights expanded to float, wf (nb*8, 4, _G) (zero past w);
    four rows at a time share the weight loads. Every buffer is _G wide and every row loop runs over _G: with
    a compile-time width numba's loops vectorize (with w they measured 7x slower)."""
    nb = y.shape[1] >> 5
    acc = np.empty((8, 4, _G), _F32)
    summ = np.zeros((4, _G), _F32)
    dd = np.zeros((4, _G), _F32)
    for ra in range(r0, r1, 4):
        nr = min(4, r1 - ra)
        acc[:] = 0.0
        summ[:] = 0.0
        for b in range(nb):
            for u in range(nr):
                _scales(dg, mg, b, w, yd[ra + u, b], ys[ra + u, b], dd[u], summ[u], with_min)
            for lane in range(8):
                fb, aa = wf[b * 8 + lane], acc[lane]
                o = b * 32 + 4 * lane
                if nr == 4:
                    ya, yb, yc, ye = y[ra, o:o + 4], y[ra + 1, o:o + 4], y[ra + 2, o:o + 4], y[ra + 3, o:o + 4]
                    y00, y01, y02, y03 = ya[0], ya[1], ya[2], ya[3]
                    y10, y11, y12, y13 = yb[0], yb[1], yb[2], yb[3]
                    y20, y21, y22, y23 = yc[0], yc[1], yc[2], yc[3]
                    y30, y31, y32, y33 = ye[0], ye[1], ye[2], ye[3]
                    for t in range(_G):
                        x0, x1, x2, x3 = fb[0, t], fb[1, t], fb[2, t], fb[3, t]
                        aa[0, t] = fma(dd[0, t], fma(x3, y03, fma(x2, y02, fma(x1, y01, x0 * y00))), aa[0, t])
                        aa[1, t] = fma(dd[1, t], fma(x3, y13, fma(x2, y12, fma(x1, y11, x0 * y10))), aa[1, t])
                        aa[2, t] = fma(dd[2, t], fma(x3, y23, fma(x2, y22, fma(x1, y21, x0 * y20))), aa[2, t])
                        aa[3, t] = fma(dd[3, t], fma(x3, y33, fma(x2, y32, fma(x1, y31, x0 * y30))), aa[3, t])
                else:
                    for u in range(nr):
                        yu = y[ra + u, o:o + 4]
                        y0, y1, y2, y3 = yu[0], yu[1], yu[2], yu[3]
                        al, du = aa[u], dd[u]
                        for t in range(_G):
                            al[t] = fma(du[t], fma(fb[3, t], y3, fma(fb[2, t], y2, fma(fb[1, t], y1, fb[0, t] * y0))),
                                        al[t])
        for u in range(nr):
            for t in range(w):
                v = hsum8(acc[0, u, t], acc[1, u, t], acc[2, u, t], acc[3, u, t],
                          acc[4, u, t], acc[5, u, t], acc[6, u, t], acc[7, u, t])
                out[ra + u, i0 + t] = v + summ[u, t] if with_min else v


@njit(cache=True, inline="always")
def _expand_q4_1(qg, w, wf):
    """A group's Q4_1 quants (lane-paired nibbles) -> wf[block * 8 + lane, element of the lane, row]."""
    for bl in range(wf.shape[0]):
        q0, q1, fb = qg[bl * 2 * w:bl * 2 * w + w], qg[bl * 2 * w + w:bl * 2 * w + 2 * w], wf[bl]
        for t in range(w):
            fb[0, t] = _F32(q0[t] & _U15)
            fb[1, t] = _F32(q1[t] & _U15)
            fb[2, t] = _F32(q0[t] >> _U4)
            fb[3, t] = _F32(q1[t] >> _U4)


@njit(cache=True, inline="always")
def _expand_q8_0(qg, w, wf):
    """A group's Q8_0 quants -> wf, as _expand_q4_1."""
    for j in range(wf.shape[0] * 4):
        qj, fj = qg[j * w:(j + 1) * w], wf[j >> 2, j & 3]
        for t in range(w):
            fj[t] = _F32(qj[t])


def exact_gemm(q4_1: bool) -> Callable:
    """The same dot products for n >= gemm_from: a task takes one group of weight rows, expanded to float once
    by the format's expansion function, and _RC activation rows (_gemm_rows)."""
    with_min = q4_1

    @njit(**_exact)
    def gemm(qs, d, m, x, out):
        n, k = x.shape
        rows, nb = out.shape[1], k >> 5
        rb = qs.shape[0] // rows
        y, yd, ys = np.empty((n, k), _F32), np.empty((n, nb), _F32), np.empty((n, nb), _F32)
        q8_blocks(x, y, yd, ys)
        nc = (n + _RC - 1) // _RC
        for task in prange((rows + _G - 1) // _G * nc):
            i0, r0 = task // nc * _G, task % nc * _RC
            w = min(_G, rows - i0)
            qg, dg, mg = qs[i0 * rb:(i0 + w) * rb], d[i0 * nb:(i0 + w) * nb], m[i0 * nb:(i0 + w) * nb]
            wf = np.zeros((nb * 8, 4, _G), _F32)
            if q4_1:
                _expand_q4_1(qg, w, wf)
            else:
                _expand_q8_0(qg, w, wf)
            _gemm_rows(wf, dg, mg, y, yd, ys, out, i0, w, r0, min(n, r0 + _RC), with_min)

    return gemm
