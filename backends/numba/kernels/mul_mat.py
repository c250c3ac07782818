"""mul_mat with a float first operand (attention's KQ and KQV against an f16 or f32 cache; F16 and F32 weights and
experts), in ggml's summation order.

ggml converts the other operand to the first's type (f32 -> f16, nearest even), then per output element takes
either tinyBLAS (llamafile sgemm: one FMA chain per lane, then the register's sum) or ggml_vec_dot_f16/f32
(four registers of FMA chains, reduced, plus a scalar tail); which one depends on the shapes and on the KV
padding a soft_max result carries (see mul_mat). The chains are kept in registers (kernels.simd): tinyBLAS in
tiles of outputs, vec_dot four rows at a time, and a V cache seen transposed read in place (_columns).
"""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np
from numba import njit, prange

from graphir.backends.numba.primitives import isa
from graphir.backends.numba.primitives.jit import INL, PAR, SER, call_at, native_address, parallel_and_serial
from graphir.backends.numba.primitives import simd
from graphir.backends.numba.primitives.simd import (as_f32, prefetch, vadd, vfma, vhadd_sum, vhadd_sums8, vhsum,
                                                    vhsums16, vlane, vload, vload_part, vmul, vreduce4, vsplat,
                                                    vsplat_at, vstore, vzero, width)
from graphir.backends.numba.primitives.bits import bits_f32, bits_u32, f16_bits, fma

F32 = np.float32
_INF = F32(np.inf)


TINYBLAS, VEC_F16, VEC_F32 = 0, 1, 2
_REDUCE_HADD = isa.REDUCE_HADD
MM_PAR_MIN = 1 << 14    # multiply-adds from which the parallel variant is faster (measured)


@njit(**INL)
def _half_to_f32(h):
    """IEEE half (bits in an integer) -> float32, exactly and branch-free (vectorizes)."""
    h = np.uint32(h)
    em = h & np.uint32(0x7FFF)
    sign = h & np.uint32(0x8000)
    normal = bits_f32(f16_bits(h))
    sub = F32(em) * F32(5.9604644775390625e-08)              # zero / subnormal: m * 2**-24
    sub = -sub if sign else sub
    return normal if em >= np.uint32(0x400) else sub


@njit(**INL)
def _round_f16(v):
    """float32 -> nearest-even float16 -> float32 (ggml's FP32_TO_FP16, F16C), branch-free."""
    u = bits_u32(v)
    a = abs(v)
    sign = u & np.uint32(0x80000000)
    lsb = (u >> np.uint32(13)) & np.uint32(1)
    nrm = bits_f32(((u & np.uint32(0x7FFFFFFF)) + np.uint32(0xFFF) + lsb) & np.uint32(0x7FFFE000))
    sub = np.rint(a * F32(16777216.0)) * F32(5.9604644775390625e-08)     # below 2**-14: multiples of 2**-24
    r = sub if a < F32(6.103515625e-05) else nrm
    r = _INF if a >= F32(65520.0) else r
    r = a if a != a else r                                                 # nan stays nan
    return bits_f32(bits_u32(r) | sign)


@njit(**INL)
def to_f32_row(s, kind, d):
    """d[:K] = s as float32, zeros after K. kind 0: s f32; 1: s f16 bits (uint16); 2: s f32 rounded to f16
    (ggml's conversion of src1 to the f16 vec_dot type)."""
    for c in range(s.shape[0]):
        if kind == 1:
            d[c] = _half_to_f32(s[c])
        elif kind == 2:
            d[c] = _round_f16(F32(s[c]))
        else:
            d[c] = F32(s[c])
    for c in range(s.shape[0], d.shape[0]):
        d[c] = 0.0


NO_REACH = np.zeros(0, np.int64)    # _products' reach where every product is computed
_TILE_M = 4                             # tinyBLAS tile: rows of w (by tile_rows(v) rows of x) held in registers
_BLOCK_M, _BLOCK_N = 64, 64             # rows of w and of x per parallel task


@njit(**INL)
def _tiny_dot(v, w1, wb, x1, xb, k):
    """tinyBLAS's one output: an FMA chain per lane over the row's registers, then the register's sum. A last
    partial register (k not a multiple of the lanes: ggml's KV padding) reads zeros past k."""
    n = width(v)
    full = k - k % n
    acc = vzero(v)
    for c in range(0, full, n):
        acc = vfma(vload(v, w1, wb + c), vload(v, x1, xb + c), acc)
    if full < k:
        acc = vfma(vload_part(v, w1, wb + full, k - full), vload_part(v, x1, xb + full, k - full),
                   acc)
    return vhsum(acc)


@njit(**INL)
def _tiny_tile(v, w1, wa, wb, wc, wd, x1, xa, xb, xc, xd, k):
    """tinyBLAS on a tile of 4 rows of w (starting at wa..wd) by 4 rows of x (starting at xa..xd; k a multiple of
    the lanes): the same chains as _tiny_dot, sixteen at once in registers, each w and x register loaded once per
    step. The tile's shape changes no output's chain, only how many run side by side. Its sixteen sums come as
    one register (16 lanes), lane 4j + i the product of w row i and x row j: summed together (vhsums16) rather
    than one by one (an F16 1536x384 product of 8 rows, called from Python, 62 -> 52 us)."""
    n = width(v)
    a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = c0 = c1 = c2 = c3 = d0 = d1 = d2 = d3 = vzero(v)
    for c in range(0, k, n):
        y0, y1, y2, y3 = vload(v, x1, xa + c), vload(v, x1, xb + c), vload(v, x1, xc + c), vload(v, x1, xd + c)
        p = vload(v, w1, wa + c)
        a0, a1, a2, a3 = vfma(p, y0, a0), vfma(p, y1, a1), vfma(p, y2, a2), vfma(p, y3, a3)
        p = vload(v, w1, wb + c)
        b0, b1, b2, b3 = vfma(p, y0, b0), vfma(p, y1, b1), vfma(p, y2, b2), vfma(p, y3, b3)
        p = vload(v, w1, wc + c)
        c0, c1, c2, c3 = vfma(p, y0, c0), vfma(p, y1, c1), vfma(p, y2, c2), vfma(p, y3, c3)
        p = vload(v, w1, wd + c)
        d0, d1, d2, d3 = vfma(p, y0, d0), vfma(p, y1, d1), vfma(p, y2, d2), vfma(p, y3, d3)
    return vhsums16(a0, b0, c0, d0, a1, b1, c1, d1, a2, b2, c2, d2, a3, b3, c3, d3)


@njit(**INL)
def _tiny_tile3(v, w1, wa, wb, wc, wd, x1, xa, xb, xc, k):
    """_tiny_tile on 4 rows of w by 3 of x: twelve chains, for 8-lane registers, of which AVX2 has 16 (4 by 4
    needs 21 with its operands, and spilled: SmolLM2-sized F16 products at 12 tokens 272 -> 146 us)."""
    n = width(v)
    a0 = a1 = a2 = b0 = b1 = b2 = c0 = c1 = c2 = d0 = d1 = d2 = vzero(v)
    for c in range(0, k, n):
        y0, y1, y2 = vload(v, x1, xa + c), vload(v, x1, xb + c), vload(v, x1, xc + c)
        p = vload(v, w1, wa + c)
        a0, a1, a2 = vfma(p, y0, a0), vfma(p, y1, a1), vfma(p, y2, a2)
        p = vload(v, w1, wb + c)
        b0, b1, b2 = vfma(p, y0, b0), vfma(p, y1, b1), vfma(p, y2, b2)
        p = vload(v, w1, wc + c)
        c0, c1, c2 = vfma(p, y0, c0), vfma(p, y1, c1), vfma(p, y2, c2)
        p = vload(v, w1, wd + c)
        d0, d1, d2 = vfma(p, y0, d0), vfma(p, y1, d1), vfma(p, y2, d2)
    z = F32(0.0)
    return ((vhsum(a0), vhsum(a1), vhsum(a2), z), (vhsum(b0), vhsum(b1), vhsum(b2), z),
            (vhsum(c0), vhsum(c1), vhsum(c2), z), (vhsum(d0), vhsum(d1), vhsum(d2), z))


@njit(**INL)
def tile_rows(v):
    """Rows of x a tinyBLAS tile takes: four with 16-lane registers (32 of them), three with 8 (16 of them)."""
    return 4 if width(v) == 16 else 3


@njit(**INL)
def _vec_step(v, w1, wb, x1, xb, c, a0, a1, a2, a3):
    """One step of ggml_vec_dot's loop for one row: four registers of FMAs at c."""
    n = width(v)
    return (vfma(vload(v, w1, wb + c), vload(v, x1, xb + c), a0),
            vfma(vload(v, w1, wb + c + n), vload(v, x1, xb + c + n), a1),
            vfma(vload(v, w1, wb + c + 2 * n), vload(v, x1, xb + c + 2 * n), a2),
            vfma(vload(v, w1, wb + c + 3 * n), vload(v, x1, xb + c + 3 * n), a3))


@njit(**INL)
def _f16_chains(v, w1, wb, x1, xb, k):
    """One row's ggml_vec_dot_f16 chains over whole steps up to k, folded (0 + 2) + (1 + 3) as
    GGML_F32_VEC_REDUCE begins: the register whose lanes the reduction then sums."""
    a0 = a1 = a2 = a3 = vzero(v)
    for c in range(0, k, 4 * width(v)):
        a0, a1, a2, a3 = _vec_step(v, w1, wb, x1, xb, c, a0, a1, a2, a3)
    return vadd(vadd(a0, a2), vadd(a1, a3))


@njit(**INL)
def _eight_rows(v, w1, r, ws, x1, xb, k):
    """_f16_chains of the eight rows from r (ws apart): the registers whose lanes their sums add."""
    return (_f16_chains(v, w1, r, x1, xb, k), _f16_chains(v, w1, r + ws, x1, xb, k),
            _f16_chains(v, w1, r + 2 * ws, x1, xb, k), _f16_chains(v, w1, r + 3 * ws, x1, xb, k),
            _f16_chains(v, w1, r + 4 * ws, x1, xb, k), _f16_chains(v, w1, r + 5 * ws, x1, xb, k),
            _f16_chains(v, w1, r + 6 * ws, x1, xb, k), _f16_chains(v, w1, r + 7 * ws, x1, xb, k))


@njit(**INL)
def whole_register_dots(v, w1, wb, ws, x1, xb, k, m1, out):
    """out[m] = ggml_vec_dot_f16 of x (from xb) with row m of w (from wb + m * ws) for m < m1, for k a multiple of
    four registers (no tail), on the paths whose sum of a register folds it whole (AVX: 8 lanes and hadd sums;
    AVX-512: 16 lanes halved): each row's chains as _vec_dot4's, and the sums of a register's worth of rows at once
    in one register (vhadd_sums8, vhsums16), where one row's took a lane extraction per lane; the last m1 % lanes
    rows one by one. A decode's KQ at 1024 cells 1 KB apart, 16 heads of 64 on one thread, AVX-512: 56 -> 32 us."""
    n = width(v)
    m = 0
    while m + n <= m1:
        r = wb + m * ws
        a = _eight_rows(v, w1, r, ws, x1, xb, k)
        if n == 8:
            vstore(out, m, vhadd_sums8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]))
        else:
            b = _eight_rows(v, w1, r + 8 * ws, ws, x1, xb, k)
            vstore(out, m, vhsums16(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7],
                                    b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]))
        m += n
    for r in range(m, m1):
        out[r] = vhadd_sum(_f16_chains(v, w1, wb + r * ws, x1, xb, k))


@njit(**INL)
def _vec_last_step(v, w1, wb, x1, xb, c, k, a0, a1, a2, a3):
    """The step reaching past k: what lies past k (up to ggml's padded length) reads as zeros."""
    n = width(v)
    a0 = vfma(vload_part(v, w1, wb + c, k - c), vload_part(v, x1, xb + c, k - c), a0)
    c += n
    a1 = vfma(vload_part(v, w1, wb + c, k - c), vload_part(v, x1, xb + c, k - c), a1)
    c += n
    a2 = vfma(vload_part(v, w1, wb + c, k - c), vload_part(v, x1, xb + c, k - c), a2)
    c += n
    a3 = vfma(vload_part(v, w1, wb + c, k - c), vload_part(v, x1, xb + c, k - c), a3)
    return a0, a1, a2, a3


@njit(**INL)
def _vec_dot4(v, w1, wb0, wb1, wb2, wb3, x1, xb, k, kp, simd, hadd, f16):
    """ggml_vec_dot_f16/f32 of four rows of w with one row of x: per row four registers of FMA chains over
    steps of 4 registers up to ``simd`` (elements past k, up to ggml's padded length, are zeros),
    GGML_F32_VEC_REDUCE, then the scalar tail. The four rows' chains interleave (their tails are serial
    additions, which one row alone would wait on). Each step prefetches the same lines of the next four rows (where
    rows lie one after another: a weight's): a GEMV of F16 rows from memory, 3072x768 in turn with others, 499 ->
    404 us, 7168x2048 2103 -> 1735 us."""
    n = width(v)
    step = 4 * n
    full = min(simd, k - k % step)
    a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = c0 = c1 = c2 = c3 = d0 = d1 = d2 = d3 = vzero(v)
    nxt, line = wb3 + (wb3 - wb2), 32 if f16 else 16      # the next four rows, where rows lie one after another
    for c in range(0, full, step):
        for j in range(0, step, line):
            prefetch(w1, nxt + c + j)
            prefetch(w1, nxt + (wb1 - wb0) + c + j)
            prefetch(w1, nxt + 2 * (wb1 - wb0) + c + j)
            prefetch(w1, nxt + 3 * (wb1 - wb0) + c + j)
        a0, a1, a2, a3 = _vec_step(v, w1, wb0, x1, xb, c, a0, a1, a2, a3)
        b0, b1, b2, b3 = _vec_step(v, w1, wb1, x1, xb, c, b0, b1, b2, b3)
        c0, c1, c2, c3 = _vec_step(v, w1, wb2, x1, xb, c, c0, c1, c2, c3)
        d0, d1, d2, d3 = _vec_step(v, w1, wb3, x1, xb, c, d0, d1, d2, d3)
    if full < simd and full < k:
        a0, a1, a2, a3 = _vec_last_step(v, w1, wb0, x1, xb, full, k, a0, a1, a2, a3)
        b0, b1, b2, b3 = _vec_last_step(v, w1, wb1, x1, xb, full, k, b0, b1, b2, b3)
        c0, c1, c2, c3 = _vec_last_step(v, w1, wb2, x1, xb, full, k, c0, c1, c2, c3)
        d0, d1, d2, d3 = _vec_last_step(v, w1, wb3, x1, xb, full, k, d0, d1, d2, d3)
    ra, rb = vreduce4(a0, a1, a2, a3, hadd), vreduce4(b0, b1, b2, b3, hadd)
    rc, rd = vreduce4(c0, c1, c2, c3, hadd), vreduce4(d0, d1, d2, d3, hadd)
    if f16:                                               # sumf += (ggml_float)(x[i]*y[i])
        sa, sb, sc, sd = np.float64(ra), np.float64(rb), np.float64(rc), np.float64(rd)
        for c in range(simd, k):
            y = x1[xb + c]
            sa += np.float64(as_f32(w1[wb0 + c]) * y)
            sb += np.float64(as_f32(w1[wb1 + c]) * y)
            sc += np.float64(as_f32(w1[wb2 + c]) * y)
            sd += np.float64(as_f32(w1[wb3 + c]) * y)
        return F32(sa), F32(sb), F32(sc), F32(sd)
    # the leftovers, `sumf += x[i]*y[i]` as GCC vectorizes it: the products of whole half-registers are added in
    # order, the last few (under half a register) fused
    half = n // 2
    cut = min(k, simd + (kp - simd) // half * half)
    for c in range(simd, cut):
        y = x1[xb + c]
        ra, rb = ra + as_f32(w1[wb0 + c]) * y, rb + as_f32(w1[wb1 + c]) * y
        rc, rd = rc + as_f32(w1[wb2 + c]) * y, rd + as_f32(w1[wb3 + c]) * y
    for c in range(cut, k):
        y = x1[xb + c]
        ra, rb = fma(as_f32(w1[wb0 + c]), y, ra), fma(as_f32(w1[wb1 + c]), y, rb)
        rc, rd = fma(as_f32(w1[wb2 + c]), y, rc), fma(as_f32(w1[wb3 + c]), y, rd)
    return ra, rb, rc, rd


@njit(**SER)
def products_task(v, w1, ldw, x1, ldx, k, kp, wr, wsm, xr, xsn, hadd, mode, simd, b, n0, n1, m0, m1, out):
    """One task of _products: out[b, n0:n1, m0:m1], from w rows wr + m * wsm and x rows xr + n * xsn."""
    n = width(v)
    tiny = mode == TINYBLAS
    m = m0
    if tiny and k % n == 0:                              # x rows past n1 repeat the last: computed, not stored
        last = n1 - 1
        xa, xb = (xr + n0 * xsn) * ldx, (xr + min(n0 + 1, last) * xsn) * ldx
        xc, xd = (xr + min(n0 + 2, last) * xsn) * ldx, (xr + min(n0 + 3, last) * xsn) * ldx
        while m + _TILE_M <= m1:
            wa, wb = (wr + m * wsm) * ldw, (wr + (m + 1) * wsm) * ldw
            wc, wd = (wr + (m + 2) * wsm) * ldw, (wr + (m + 3) * wsm) * ldw
            if width(v) == 16:
                sums = _tiny_tile(v, w1, wa, wb, wc, wd, x1, xa, xb, xc, xd, k)
                for j in range(n1 - n0):
                    out[b, n0 + j, m], out[b, n0 + j, m + 1] = vlane(sums, 4 * j), vlane(sums, 4 * j + 1)
                    out[b, n0 + j, m + 2], out[b, n0 + j, m + 3] = vlane(sums, 4 * j + 2), vlane(sums, 4 * j + 3)
            else:
                ya, yb, yc, yd = _tiny_tile3(v, w1, wa, wb, wc, wd, x1, xa, xb, xc, k)
                for j in range(n1 - n0):
                    out[b, n0 + j, m], out[b, n0 + j, m + 1] = ya[j], yb[j]
                    out[b, n0 + j, m + 2], out[b, n0 + j, m + 3] = yc[j], yd[j]
            m += _TILE_M
    for i in range(n0, n1):
        xb = (xr + i * xsn) * ldx
        if tiny:
            for mi in range(m, m1):
                out[b, i, mi] = _tiny_dot(v, w1, (wr + mi * wsm) * ldw, x1, xb, k)
            continue
        for mi in range(m, m1, 4):                        # four rows at a time; a last group repeats its last row
            last = m1 - 1
            r = _vec_dot4(v, w1, (wr + mi * wsm) * ldw, (wr + min(mi + 1, last) * wsm) * ldw,
                          (wr + min(mi + 2, last) * wsm) * ldw, (wr + min(mi + 3, last) * wsm) * ldw, x1, xb, k, kp,
                          simd, hadd, mode == VEC_F16)
            for j in range(min(4, m1 - mi)):
                out[b, i, mi + j] = r[j]


@njit(**SER)
def _tail_block(v, w1, ldw, x1, ldx, k, kp, wr, wsm, xr, xsn, b, n0, n1, m0, m1, out):
    """ggml_vec_dot_f32 for rows shorter than its first step (k < four registers: heads of 32): all of it is the
    scalar tail, one sequential chain per output (_vec_dot4's leftovers). Sixteen outputs' chains run side by side
    in the lanes of a register, from the block's w rows laid out column by column once for all its x rows; each
    lane takes its own output's products and additions in their order, so the bits are the same."""
    n = width(v)
    rows = m1 - m0
    mv = (rows + 4 * n - 1) // (4 * n) * 4               # registers across the rows, four chains at a time
    line = mv * n
    wt = np.zeros(k * line, F32)                          # [c][m]: column c of the block's rows, zeros past them
    for j in range(rows):
        row = (wr + (m0 + j) * wsm) * ldw
        for c in range(k):
            wt[c * line + j] = as_f32(w1[row + c])
    cut = min(k, kp // (n // 2) * (n // 2))               # products added in order up to here, fused after
    lanes = np.empty(4 * n, F32)
    for i in range(n0, n1):
        xb = (xr + i * xsn) * ldx
        for g in range(0, mv, 4):
            a0 = a1 = a2 = a3 = vzero(v)
            o = g * n
            for c in range(cut):
                y, at = vsplat(v, x1[xb + c]), c * line + o
                a0, a1 = vadd(a0, vmul(vload(v, wt, at), y)), vadd(a1, vmul(vload(v, wt, at + n), y))
                a2, a3 = vadd(a2, vmul(vload(v, wt, at + 2 * n), y)), vadd(a3, vmul(vload(v, wt, at + 3 * n), y))
            for c in range(cut, k):
                y, at = vsplat(v, x1[xb + c]), c * line + o
                a0, a1 = vfma(vload(v, wt, at), y, a0), vfma(vload(v, wt, at + n), y, a1)
                a2, a3 = vfma(vload(v, wt, at + 2 * n), y, a2), vfma(vload(v, wt, at + 3 * n), y, a3)
            vstore(lanes, 0, a0)
            vstore(lanes, n, a1)
            vstore(lanes, 2 * n, a2)
            vstore(lanes, 3 * n, a3)
            for t in range(min(4 * n, rows - o)):
                out[b, i, m0 + o + t] = lanes[t]


@njit(**SER)
def f16_short_dots(wt, x1, k, out):
    """ggml_vec_dot_f16 of one x row with f16 rows shorter than one step of four registers (Mamba's dt_proj: 48
    long): all of it is the scalar tail, sumf += (double)(w[c] * x[c]) in c order from 0, then float. Here for every
    row at once from w laid out column by column (wt (k, m): the f16 values as float32, exact), the rows' chains
    side by side in the lanes; each chain's additions in their order, so the bits are _vec_dot4's."""
    acc = np.zeros(wt.shape[1], np.float64)
    for c in range(k):
        xc = x1[c]
        for j in range(wt.shape[1]):
            acc[j] += np.float64(wt[c, j] * xc)
    for j in range(wt.shape[1]):
        out[j] = F32(acc[j])


def _short_dots_blocks(wt3, x1, k, out2):
    """f16_short_dots over blocks of w's rows (wt3 (blocks, k, m / blocks), out2 (blocks, m / blocks)), a block a
    thread (Mamba-130M's dt_proj in two: 11.7 -> 8.0 us, its weights out of cache)."""
    for b in prange(wt3.shape[0]):
        f16_short_dots(wt3[b], x1, k, out2[b])


short_dots_blocks_par, short_dots_blocks_ser = parallel_and_serial(_short_dots_blocks)


@njit(**SER)
def f32_short_dots(wt, x1, k, cut, out):
    """ggml_vec_dot_f32 of one x row with f32 rows shorter than one step of four registers (RWKV6's LoRA: 32
    long): all of it is the scalar tail as GCC vectorizes it (_tail_block's chains): products added in order up to
    ``cut``, fused after. Here for every row at once from w laid out column by column (wt (k, m)), the rows'
    chains side by side in the lanes, with no block to lay out per call."""
    for j in range(wt.shape[1]):
        out[j] = F32(0.0)
    for c in range(cut):
        xc = x1[c]
        for j in range(wt.shape[1]):
            out[j] = out[j] + wt[c, j] * xc
    for c in range(cut, k):
        xc = x1[c]
        for j in range(wt.shape[1]):
            out[j] = fma(wt[c, j], xc, out[j])


def _products(task_at, tail_at, v, w1, ldw, x1, ldx, k, kp, wsb, wsm, xsb, xsn, ratio, hadd, mode, reach, over_k,
              out):
    """out[b, n, m] = dot(w row (b // ratio) * wsb + m * wsm, x row b * xsb + n * xsn) over k elements; w1 and x1
    are flat rows of ldw / ldx elements (w: float32 or f16 bits; x: float32, already rounded to f16 where ggml
    converts it). ``mode``: tinyBLAS or vec_dot (f16 or f32), see mul_mat; kp: the padded length ggml sees,
    whose extra elements are zeros. ``reach`` (one per n, or none): tinyBLAS's products past a tile of x rows'
    furthest reach are left out, the m from there on given 0 or (over_k) the k from there on, rounded up to a
    register, not multiplied (see mul_mat). A task is a block of rows of w against up to _BLOCK_N rows of x, in tile
    columns; tasks run in parallel (prange; the serial copy runs them in turn), numbered so that consecutive
    ones share their block of w: prange hands each thread a run of consecutive tasks, so each thread streams its
    own part of w once instead of every thread streaming all of it. products_task and _tail_block are called at
    their native addresses task_at and tail_at (task_addresses): called by name, they compiled again with each
    variant, several times over in the parallel one (its first call took 8.2 s; now products_task compiles once,
    in 2.9 s, and the variants in 0.9 and 0.3 s)."""
    bx, nn, mm = out.shape
    n = width(v)
    tiny = mode == TINYBLAS
    simd = k if tiny else kp // (4 * n) * (4 * n)
    nb = tile_rows(v) if tiny else 1
    n_blocks = (nn + _BLOCK_N - 1) // _BLOCK_N
    m_blocks = (mm + _BLOCK_M - 1) // _BLOCK_M
    if bx * n_blocks == 1:   # w's rows alone are split: into a multiple of 8 blocks, which up to 8 threads share
        m_blocks = (m_blocks + 7) // 8 * 8   # evenly (80 rows in blocks of 64 left one of 2 threads 16 of them)
    bm = ((mm + m_blocks - 1) // m_blocks + 3) // 4 * 4
    m_blocks = (mm + bm - 1) // bm
    for task in prange(bx * m_blocks * n_blocks):
        b, r = np.int64(task // (m_blocks * n_blocks)), np.int64(task % (m_blocks * n_blocks))
        m0, nbl = r // n_blocks * bm, r % n_blocks * _BLOCK_N
        wr, xr = (b // ratio) * wsb, b * xsb
        if mode == VEC_F32 and simd == 0:
            call_at(tail_at, (v, w1, ldw, x1, ldx, k, kp, wr, wsm, xr, xsn, b, nbl, min(nbl + _BLOCK_N, nn),
                              m0, min(m0 + bm, mm), out))
            continue
        for n0 in range(nbl, min(nbl + _BLOCK_N, nn), nb):
            n1, m1, kk = min(n0 + nb, nn), min(m0 + bm, mm), k
            if reach.shape[0] and tiny:
                far = reach[n0:n1].max()
                if over_k:
                    kk = min(k, (far + n - 1) // n * n)
                elif far < m1:
                    cut = max(m0, far)
                    out[b, n0:n1, cut:m1] = 0.0
                    m1 = cut
            call_at(task_at, (v, w1, ldw, x1, ldx, kk, kp, wr, wsm, xr, xsn, hadd, mode, simd, b, n0, n1, m0, m1,
                              out))


@functools.cache
def task_addresses(n_lanes: int, w_dtype: np.dtype, hadd: bool, tail: bool) -> tuple[int, int]:
    """The native addresses of products_task and (tail: else 0, never called) _tail_block for w rows of w_dtype
    (a kernel_view's: read-only uint16 or float32), looked up when a product first needs them; stand-ins give
    their argument types."""
    v, w1, x1, out = simd.lanes(n_lanes), np.zeros(1, w_dtype), np.empty(1, F32), np.empty((1, 1, 1), F32)
    w1.flags.writeable = False
    task = native_address(products_task, v, w1, 0, x1, 0, 0, 0, 0, 0, 0, 0, hadd, 0, 0, 0, 0, 0, 0, 0, out)
    return task, native_address(_tail_block, v, w1, 0, x1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, out) if tail else 0


_products_par, _products_ser = parallel_and_serial(_products)


@njit(**INL)
def _column_load(v, w1, r, left, part):
    """One register of a V column block: a masked load for the block's last register of m where it is partial."""
    return vload_part(v, w1, r, left) if part else vload(v, w1, r)


@njit(**INL)
def _cell_products(v, w1, r, left, nv, part, y, a0, a1, a2, a3):
    """One cell's first nv registers of m (from r, the last partial if ``part``) times its probability y, onto the
    chains a0 .. a3 (nv a constant at each call: the registers past it are left as they are, and gone)."""
    n = width(v)
    a0 = vfma(_column_load(v, w1, r, left, part and nv == 1), y, a0)
    if nv > 1:
        a1 = vfma(_column_load(v, w1, r + n, left - n, part and nv == 2), y, a1)
    if nv > 2:
        a2 = vfma(_column_load(v, w1, r + 2 * n, left - 2 * n, part and nv == 3), y, a2)
    if nv > 3:
        a3 = vfma(_column_load(v, w1, r + 3 * n, left - 3 * n, part and nv == 4), y, a3)
    return a0, a1, a2, a3


def _column_block_of(nv: int) -> Callable:
    """column_dots' block of chains for nv vectors of m (1 to 4), compiled apart, nv a constant of each: the four
    inlined into column_dots, with it into each caller (the head kernel, both _columns), took the head kernel's
    first compile from 6 to 23-29 s (13.6 apart, at the same speed)."""

    @njit(**SER)
    def column_block(v, w1, r0, sc, x1, xb, p, whole, step, left, part, acc, o, e):
        """Over the whole steps, the chains of lanes p, p + 1 (and p + 2, p + 3 with 16-lane registers, which have 32
        of them) for nv vectors of m from r0 (left: the m from there on), held in registers, then stored at acc[o]
        (lane t of vector j at acc[o + (t - p) * e + j * n]). A cell's vectors are its m side by side in the cache's
        row: each line of V is read once, whole, where one vector's chains over every step read it piecemeal and
        came back to it (a V of 1024 cells 1 KB apart, 16 heads of 64 on one thread: 89 -> 41 us on AVX-512, 140 ->
        59 on AVX2)."""
        n = width(v)
        four = n == 16
        a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = c0 = c1 = c2 = c3 = d0 = d1 = d2 = d3 = vzero(v)
        for c in range(p, whole, step):
            r = r0 + c * sc
            a0, a1, a2, a3 = _cell_products(v, w1, r, left, nv, part, vsplat_at(v, x1, xb + c), a0, a1, a2, a3)
            b0, b1, b2, b3 = _cell_products(v, w1, r + sc, left, nv, part, vsplat_at(v, x1, xb + c + 1),
                                            b0, b1, b2, b3)
            if four:
                c0, c1, c2, c3 = _cell_products(v, w1, r + 2 * sc, left, nv, part, vsplat_at(v, x1, xb + c + 2),
                                                c0, c1, c2, c3)
                d0, d1, d2, d3 = _cell_products(v, w1, r + 3 * sc, left, nv, part, vsplat_at(v, x1, xb + c + 3),
                                                d0, d1, d2, d3)
        for j, (a, b, c_, d) in enumerate(((a0, b0, c0, d0), (a1, b1, c1, d1), (a2, b2, c2, d2), (a3, b3, c3, d3))):
            if j < nv:
                vstore(acc, o + j * n, a)
                vstore(acc, o + e + j * n, b)
                if four:
                    vstore(acc, o + 2 * e + j * n, c_)
                    vstore(acc, o + 3 * e + j * n, d)

    return column_block


_block1, _block2, _block3, _block4 = (_column_block_of(nv) for nv in (1, 2, 3, 4))


@njit(**INL)
def column_dots(v, w1, wb, sc, x1, xb, k, kp, hadd, out):
    """ggml_vec_dot_f16 of one row of x (x1 from xb) with every row of a w stored transposed: w[m, c] at
    wb + m + c * sc in w1 (f16 bits), the layout of a V cache permuted for kqv, read without making it
    contiguous; out[m] the results. The same lanes as _vec_dot4, turned around: register lane t of step part j
    (c = j * n + t modulo 4n) becomes vectors across the m, so w is read once, along the cache's rows; then
    GGML_F32_VEC_REDUCE per m, done on those vectors, and the f16 scalar tail. Past k (up to ggml's padded
    length) the products are zeros, which leave every chain as it is. Over the whole steps, a few lanes' chains
    for four vectors of m stay in registers (_column_block_of: a load and an FMA a product, where keeping every chain
    in memory took a load and a store more: 116 against 41 us a layer of SmolLM2's V at 1100 cells on AVX2)."""
    mm = out.shape[0]
    n = width(v)
    step = 4 * n
    simd = kp // step * step
    mv = (mm + n - 1) // n                              # vectors across m
    e = mv * n                                        # one lane's vectors
    acc = np.zeros(step * e, F32)                     # [lane c % step][vector of m]
    cells = min(k, simd)
    whole = cells // step * step
    lanes = 4 if n == 16 else 2                       # a column block's lanes
    part = mm % n != 0
    for j in range(0, mv, 4):                         # four vectors of m at a time, then the one to three left
        left, last = mm - j * n, j + 4 >= mv
        for p in range(0, step, lanes):
            r, o = wb + j * n, p * e + j * n
            if mv - j >= 4:
                _block4(v, w1, r, sc, x1, xb, p, whole, step, left, part and last, acc, o, e)
            elif mv - j == 3:
                _block3(v, w1, r, sc, x1, xb, p, whole, step, left, part, acc, o, e)
            elif mv - j == 2:
                _block2(v, w1, r, sc, x1, xb, p, whole, step, left, part, acc, o, e)
            else:
                _block1(v, w1, r, sc, x1, xb, p, whole, step, left, part, acc, o, e)
    for c in range(whole, cells):                     # the last, partial step: each lane's chain goes on
        y, q, row = vsplat(v, x1[xb + c]), c % step * e, wb + c * sc
        for j in range(mv):
            o = q + j * n
            vstore(acc, o, vfma(vload_part(v, w1, row + j * n, mm - j * n), y, vload(v, acc, o)))
    for o in range(0, e, n):
        for t in range(n):                            # registers (0 + 2) + (1 + 3), lane t of each
            a, b_, c_, d = t * e + o, (2 * n + t) * e + o, (n + t) * e + o, (3 * n + t) * e + o
            s02, s13 = vadd(vload(v, acc, a), vload(v, acc, b_)), vadd(vload(v, acc, c_), vload(v, acc, d))
            vstore(acc, a, vadd(s02, s13))
        if n == 16:                                   # _mm512_reduce_add_ps: high half onto low first
            for t in range(8):
                vstore(acc, t * e + o, vadd(vload(v, acc, t * e + o), vload(v, acc, (t + 8) * e + o)))
        a0, a1, a2, a3 = vload(v, acc, o), vload(v, acc, e + o), vload(v, acc, 2 * e + o), vload(v, acc, 3 * e + o)
        a4, a5, a6, a7 = (vload(v, acc, 4 * e + o), vload(v, acc, 5 * e + o), vload(v, acc, 6 * e + o),
                          vload(v, acc, 7 * e + o))
        if hadd and n == 8:
            r = vadd(vadd(vadd(a0, a4), vadd(a1, a5)), vadd(vadd(a2, a6), vadd(a3, a7)))
        else:
            r = vadd(vadd(vadd(a0, a4), vadd(a2, a6)), vadd(vadd(a1, a5), vadd(a3, a7)))
        vstore(acc, o, r)
    for m in range(mm):
        s = np.float64(acc[m])                        # sumf += (ggml_float)(x[i]*y[i])
        for c in range(simd, k):
            s += np.float64(as_f32(w1[wb + m + c * sc]) * x1[xb + c])
        out[m] = F32(s)


def _columns(v, w1, sb, sc, x1, ldx, k, kp, ratio, hadd, out):
    """column_dots for each row b of x (a query head) against w's part b // ratio (at b // ratio * sb), n = 1;
    a task is one row of x and all m."""
    for b in prange(out.shape[0]):
        column_dots(v, w1, (b // ratio) * sb, sc, x1, b * ldx, k, kp, hadd, out[b, 0])


_columns_par, _columns_ser = parallel_and_serial(_columns)


def transposed_rows(w: np.ndarray) -> tuple[np.ndarray, int, int] | None:
    """A 3-D f16 w whose rows run down its memory (m contiguous, the contracted axis strided), as a flat view
    from its first element and its strides (b, c) in elements; None for any other layout."""
    s = w.strides
    if w.dtype != np.float16 or w.ndim != 3 or s[1] != 2 or s[2] <= 2 or s[0] % 2 or s[2] % 2 or w.shape[2] < 2:
        return None
    span = (w.shape[0] - 1) * (s[0] // 2) + (w.shape[1] - 1) + (w.shape[2] - 1) * (s[2] // 2) + 1
    flat = np.lib.stride_tricks.as_strided(w.view(np.uint16), shape=(span,), strides=(2,), writeable=False)
    return flat, s[0] // 2, s[2] // 2


@njit(**PAR)
def _rows_par(src, kind, out):
    """out[r, :k] = src row r as float32 (to_f32_row kinds), zeros after: rows padded to a multiple of 64."""
    for r in prange(src.shape[0]):
        to_f32_row(src[r], kind, out[r])


@njit(**SER)
def _rows_ser(src, kind, out):
    for r in range(src.shape[0]):
        to_f32_row(src[r], kind, out[r])


def padded_rows(rows: np.ndarray, kind: int) -> np.ndarray:
    """Rows (R, k) as float32 rows padded with zeros to a multiple of 64 (kind: 0 f32 or f16 read exactly, 2 f32
    rounded to f16), what the dot products read; an f32 matrix that needs no padding is used as it is."""
    k = rows.shape[1]
    kq = -(-k // 64) * 64
    if kind == 0 and rows.dtype == F32 and kq == k and rows.flags.c_contiguous:
        return rows
    fn, args = padding_call(rows, kind, np.empty((rows.shape[0], kq), F32))
    fn(*args)
    return args[-1]


def padding_call(rows: np.ndarray, kind: int, out: np.ndarray) -> tuple[Callable, tuple]:
    """padded_rows' kernel and its arguments, into ``out`` (rows, k padded to 64)."""
    src = kernel_view(rows)
    return (_rows_par if rows.size >= MM_PAR_MIN else _rows_ser), (src, 1 if src.dtype == np.uint16 else kind, out)


def product_mode(f16: bool, n: int, kp: int, lanes: int, contiguous: bool, vec_dot: bool,
                 weight_rows: int | None = None) -> int:
    """ggml_compute_forward_mul_mat's path: tinyBLAS for n >= 2 columns when the padded inner length is a
    multiple of the register's lanes (f16 always, f32 only when src1 is contiguous) and w's rows are a multiple
    of 4 (tinyBLAS declines other counts), else vec_dot. ``weight_rows``: a weight's rows, which may be any
    count (Mamba's 258-row x_proj, a 2-expert router); None for attention's operands, whose rows llama.cpp pads
    (n_kv to 256, heads to their size), where graphir may hold fewer cells than llama.cpp multiplies."""
    if not vec_dot and n >= 2 and kp % lanes == 0 and (f16 or contiguous) \
            and (weight_rows is None or weight_rows % 4 == 0):
        return TINYBLAS
    return VEC_F16 if f16 else VEC_F32


def products_call(wa: np.ndarray, x1: np.ndarray, xsb: int, xsn: int, k: int, kp: int, ratio: int, mode: int,
                  path: isa.IsaPath, out: np.ndarray, reach: np.ndarray = NO_REACH,
                  over_k: bool = False) -> tuple[Callable, tuple]:
    """_products' variant and its arguments for w (B, M, K) against x1's rows (padded_rows), into out (B, N, M)."""
    wrows, wsb, wsm = as_rows(wa)
    work = out.shape[0] * out.shape[1] * out.shape[2] * k
    fn = _products_par if work >= MM_PAR_MIN else _products_ser
    w1, hadd = kernel_view(wrows.reshape(-1)), path.reduce == _REDUCE_HADD
    task_at, tail_at = task_addresses(path.lanes, w1.dtype, hadd, mode == VEC_F32 and kp < 4 * path.lanes)
    return fn, (task_at, tail_at, simd.lanes(path.lanes), w1, wrows.shape[1], x1.reshape(-1), x1.shape[1], k, kp, wsb,
                wsm, xsb, xsn, ratio, hadd, mode, reach, over_k, out)


def as_rows(a: np.ndarray) -> tuple[np.ndarray, int, int]:
    """a (B, M, K) -> (rows (R, K) C-contiguous, row stride of b, row stride of m), without copying when a
    is C-contiguous or a (M, B, K) block seen transposed (the KV-cache views, permuted q)."""
    if a.flags.c_contiguous:
        return a.reshape(-1, a.shape[2]), a.shape[1], 1
    t = a.transpose(1, 0, 2)
    if t.flags.c_contiguous:
        return t.reshape(-1, a.shape[2]), 1, a.shape[0]
    return np.ascontiguousarray(a).reshape(-1, a.shape[2]), a.shape[1], 1


def mul_mat(w: np.ndarray, x: np.ndarray, path: isa.IsaPath, pad: int | None = None,
            contiguous: bool | None = None, vec_dot: bool = False, weight: bool = False,
            reach: np.ndarray = NO_REACH) -> np.ndarray:
    """Activation x activation (attention): out[b, n, m] = sum_k w[b', m, k] x[b, n, k], with ggml's broadcast
    b' = b // (B/A) per batch dim (query head h reads kv head h // (n_head / n_head_kv)).

    w f16 (the f16 KV cache): x is rounded to f16 first, as ggml converts src1 to the vec_dot type.
    Path per ggml_compute_forward_mul_mat: tinyBLAS for n >= 2 columns when the (padded) inner length is a
    multiple of the register's lanes (f16 always, after the conversion; f32 only when src1 is contiguous,
    i.e. soft_max's output) and, for a ``weight``'s rows, m is a multiple of 4, else ggml_vec_dot_f16/f32. pad: the contraction length llama.cpp sees is
    a multiple of this (default: the kv_pad of a soft_max result, else 1). Only the path choice depends on
    it. contiguous: whether ggml sees src1 contiguous (default: only a soft_max result, which carries kv_pad;
    an f32 or f16 weight's activations are). w is read as it is stored (f16 converted lane by lane).
    vec_dot: always ggml_vec_dot_f16/f32, never tinyBLAS (what ggml's mul_mat_id does, expert by expert).
    reach (int64, one per n: an attention's cells up to its query's last open one): on tinyBLAS's path, what lies
    past it is not computed. For KQ (x the queries) the products with w rows past it are 0, where the mask's -inf
    makes any finite product -inf alike; for KQV (x a soft_max result, ``kv_pad``) the terms past it, whose
    probabilities are 0, are not added: each chain starts at +0, which x + 0 and +0 + -0 leave as they are, so
    a product 0 * v of a finite v adds nothing. The caller makes sure of the finite values (Attention)."""
    probabilities = hasattr(x, "kv_pad")
    if contiguous is None:
        contiguous = probabilities
    if pad is None:
        pad = getattr(x, "kv_pad", 1)
    x = np.asarray(x)
    mode16 = w.dtype == np.float16
    r = max(w.ndim, x.ndim, 2)
    w4 = w.reshape((1,) * (4 - w.ndim) + w.shape)
    x4 = x.reshape((1,) * (4 - x.ndim) + x.shape)
    if x4.shape[0] % w4.shape[0] or x4.shape[1] % w4.shape[1]:
        raise ValueError(f"mul_mat: cannot broadcast {w.shape} over {x.shape}")
    k, n, m = x4.shape[-1], x4.shape[-2], w4.shape[-2]
    kp = -(-k // pad) * pad
    mode = product_mode(mode16, n, kp, path.lanes, contiguous, vec_dot, m if weight else None)
    out = np.empty(x4.shape[:-1] + (m,), F32)
    for a in range(x4.shape[0]):                              # dim 3: few (usually 1)
        wa, xa = w4[a // (x4.shape[0] // w4.shape[0])], x4[a]
        xrows, xsb, xsn = as_rows(xa)
        xkind = 2 if mode16 and xa.dtype != np.float16 else 0  # ggml converts src1 to f16 for an f16 src0
        x1 = padded_rows(xrows, xkind)
        cols = transposed_rows(wa) if mode == VEC_F16 and n == 1 and not wa.flags.c_contiguous else None
        if cols is not None:                                  # a permuted V cache: read in place
            fn = _columns_par if xa.shape[0] * m * k >= MM_PAR_MIN and xa.shape[0] > 1 else _columns_ser
            fn(simd.lanes(path.lanes), cols[0], cols[1], cols[2], x1.reshape(-1), x1.shape[1] * xsb, k, kp,
               xa.shape[0] // wa.shape[0], path.reduce == _REDUCE_HADD, out[a])
            continue
        fn, args = products_call(wa, x1, xsb, xsn, k, kp, xa.shape[0] // wa.shape[0], mode, path, out[a], reach,
                                 probabilities)
        fn(*args)
    return out.reshape(out.shape[4 - r:])


def kernel_view(a: np.ndarray) -> np.ndarray:
    """f16 arrays as their uint16 bits (numba has no float16), other dtypes as float32; always read-only. numba
    types a read-only array apart from a writable one and compiles a kernel once for each: a cache's rows and a
    mapped file's weights would cost two compiles of each product kernel on a first run (7 s each here)."""
    v = (a.view(np.uint16) if a.dtype == np.float16 else a.astype(F32, copy=False)).view()
    v.flags.writeable = False
    return v
