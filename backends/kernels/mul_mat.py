"""mul_mat of two activations (attention's KQ and KQV) against an f16 or f32 cache, in ggml's summation order.

ggml converts the other operand to the cache type (f32 -> f16, nearest even), then per output element takes
either tinyBLAS (llamafile sgemm: one FMA chain per lane, then the register's sum) or ggml_vec_dot_f16/f32
(four registers of FMA chains, reduced, plus a scalar tail); which one depends on the shapes and on the KV
padding a soft_max result carries (see mul_mat).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from graphir.backends import isa
from graphir.backends.kernels.jit import INL, PAR, SER
from graphir.backends.kernels_util import bits_f32, bits_u32, f16_bits, fma, hsum, vec_reduce

F32 = np.float32
_INF = F32(np.inf)


_TINYBLAS, _VEC_F16, _VEC_F32 = 0, 1, 2
_REDUCE_HADD = isa.REDUCE_HADD
_MM_PAR_MIN = 1 << 14    # multiply-adds from which the parallel variant is faster (measured)


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
def _to_f32_row(s, kind, d):
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


@njit(**INL)
def _mm_task(w1, wb0, wsm, x1, xo, kq, k, kp, mm, reg, reduce, simd, mode, acc, s16, out_row):
    """One (b, n): out_row[m] = dot(w row wb0 + m * wsm, x row at xo) for every m (see _mm_par). Flat arrays
    indexed with unsigned offsets: no views per row, no negative-index wrap, so the lane loops vectorize."""
    lanes = reg if mode == _TINYBLAS else 4 * reg
    u = np.uint64
    xb = u(xo)
    for m in range(mm):
        wb = u((wb0 + m * wsm) * kq)
        if simd > 0:
            for t in range(lanes):
                acc[t] = w1[wb + u(t)] * x1[xb + u(t)]
            for c in range(lanes, simd, lanes):
                for t in range(lanes):
                    j = u(c) + u(t)
                    acc[t] = fma(w1[wb + j], x1[xb + j], acc[t])
        else:
            acc[:] = 0.0
        if mode == _TINYBLAS:
            v = hsum(acc, 0, reg)                            # tinyBLAS's hsum of its one register
        else:
            v = vec_reduce(acc, reg, reduce == _REDUCE_HADD, s16)
        if mode == _VEC_F16:
            s = np.float64(v)
            for c in range(simd, k):
                s += np.float64(w1[wb + u(c)] * x1[xb + u(c)])
            v = F32(s)
        elif mode == _VEC_F32:
            # the leftovers, `sumf += x[i]*y[i]` as GCC vectorizes it: the products of whole half-registers are
            # added in order, the last few (under half a register) fused
            cut = min(k, simd + (kp - simd) // (reg // 2) * (reg // 2))
            for c in range(simd, cut):
                v = v + w1[wb + u(c)] * x1[xb + u(c)]
            for c in range(cut, k):
                v = fma(w1[wb + u(c)], x1[xb + u(c)], v)
        out_row[m] = v


@njit(**PAR)
def _rows_par(src, kind, out):
    """out[r, :k] = src row r as float32 (_to_f32_row kinds), zeros after: rows padded to a multiple of 64."""
    for r in prange(src.shape[0]):
        _to_f32_row(src[r], kind, out[r])


@njit(**SER)
def _rows_ser(src, kind, out):
    for r in range(src.shape[0]):
        _to_f32_row(src[r], kind, out[r])


@njit(**PAR)
def _mm_par(w, x, k, wsb, wsm, xsb, xsn, bx, nn, mm, ratio, kp, reg, reduce, mode, out):
    """out[b, n, m] = dot(w row (b // ratio) * wsb + m * wsm, x row b * xsb + n * xsn) over the first k elements of
    the float32 rows of w and x (R, kq), zero-padded to kq (a multiple of 64).

    The lanes of one dot product run along the contraction axis, as in ggml, with `reg` lanes a register:
    element c goes to lane c % reg (tinyBLAS: one FMA chain per lane) or c % (4 reg) (vec_dot: lane t of
    sum[j], j = c % (4 reg) // reg); elements past the SIMD part of vec_dot (c >= kp - kp % (4 reg)) form its
    scalar tail. kp: the padded length ggml sees; its extra elements are zeros, which leave every FMA chain
    unchanged. (Loop bounds are runtime values on purpose: constant-trip loops get unrolled instead of
    vectorized.) _mm_ser: the same, one thread."""
    kq = w.shape[1]
    simd = kq if mode == _TINYBLAS else min(kq, kp // (4 * reg) * (4 * reg))
    w1, x1 = w.reshape(-1), x.reshape(-1)
    for task in prange(bx * nn):
        b, i = task // nn, task % nn
        acc, s16 = np.empty(64, F32), np.empty(16, F32)
        _mm_task(w1, (b // ratio) * wsb, wsm, x1, (b * xsb + i * xsn) * kq, kq, k, kp, mm, reg, reduce, simd, mode, acc,
                 s16, out[b, i])


@njit(**SER)
def _mm_ser(w, x, k, wsb, wsm, xsb, xsn, bx, nn, mm, ratio, kp, reg, reduce, mode, out):
    kq = w.shape[1]
    simd = kq if mode == _TINYBLAS else min(kq, kp // (4 * reg) * (4 * reg))
    w1, x1 = w.reshape(-1), x.reshape(-1)
    acc, s16 = np.empty(64, F32), np.empty(16, F32)
    for task in range(bx * nn):
        b, i = task // nn, task % nn
        _mm_task(w1, (b // ratio) * wsb, wsm, x1, (b * xsb + i * xsn) * kq, kq, k, kp, mm, reg, reduce, simd, mode, acc,
                 s16, out[b, i])


def padded_rows(rows: np.ndarray, kind: int) -> np.ndarray:
    """Rows (R, k) as float32 rows padded with zeros to a multiple of 64 (kind: 0 f32 or f16 read exactly, 2 f32
    rounded to f16), what the dot products read; an f32 matrix that needs no padding is used as it is."""
    k = rows.shape[1]
    kq = -(-k // 64) * 64
    if kind == 0 and rows.dtype == F32 and kq == k and rows.flags.c_contiguous:
        return rows
    src = _bits(rows)
    out = np.empty((rows.shape[0], kq), F32)
    (_rows_par if rows.size >= _MM_PAR_MIN else _rows_ser)(src, 1 if src.dtype == np.uint16 else kind, out)
    return out


def _as_rows(a: np.ndarray) -> tuple[np.ndarray, int, int]:
    """a (B, M, K) -> (rows (R, K) C-contiguous, row stride of b, row stride of m), without copying when a
    is C-contiguous or a (M, B, K) block seen transposed (the KV-cache views, permuted q)."""
    if a.flags.c_contiguous:
        return a.reshape(-1, a.shape[2]), a.shape[1], 1
    t = a.transpose(1, 0, 2)
    if t.flags.c_contiguous:
        return t.reshape(-1, a.shape[2]), 1, a.shape[0]
    return np.ascontiguousarray(a).reshape(-1, a.shape[2]), a.shape[1], 1


def mul_mat(w: np.ndarray, x: np.ndarray, path: isa.IsaPath, pad: int | None = None,
            contiguous: bool | None = None, w_rows: np.ndarray | None = None, vec_dot: bool = False) -> np.ndarray:
    """Activation x activation (attention): out[b, n, m] = sum_k w[b', m, k] x[b, n, k], with ggml's broadcast
    b' = b // (B/A) per batch dim (query head h reads kv head h // (n_head / n_head_kv)).

    w f16 (the f16 KV cache): x is rounded to f16 first, as ggml converts src1 to the vec_dot type.
    Path per ggml_compute_forward_mul_mat: tinyBLAS for n >= 2 columns when the (padded) inner length is a
    multiple of the register's lanes (f16 always, after the conversion; f32 only when src1 is contiguous,
    i.e. soft_max's output), else ggml_vec_dot_f16/f32. (tinyBLAS also wants m % 4 == 0, which attention
    always meets: m is the padded KV length or the head size.) pad: the contraction length llama.cpp sees is
    a multiple of this (default: the kv_pad of a soft_max result, else 1). Only the path choice depends on
    it. contiguous: whether ggml sees src1 contiguous (default: only a soft_max result, which carries kv_pad;
    an f32 or f16 weight's activations are). w_rows: a 2-D w's padded_rows, prepared once (weights).
    vec_dot: always ggml_vec_dot_f16/f32, never tinyBLAS (what ggml's mul_mat_id does, expert by expert)."""
    if contiguous is None:
        contiguous = hasattr(x, "kv_pad")
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
    if not vec_dot and n >= 2 and kp % path.lanes == 0 and (mode16 or contiguous):
        mode = _TINYBLAS
    else:
        mode = _VEC_F16 if mode16 else _VEC_F32
    kq = -(-k // 64) * 64
    out = np.empty(x4.shape[:-1] + (m,), F32)
    for a in range(x4.shape[0]):                              # dim 3: few (usually 1)
        wa, xa = w4[a // (x4.shape[0] // w4.shape[0])], x4[a]
        wrows, wsb, wsm = _as_rows(wa)
        xrows, xsb, xsn = _as_rows(xa)
        if w_rows is None or w4.shape[0] * w4.shape[1] != 1:
            w_rows = padded_rows(wrows, 0)
        xkind = 2 if mode16 and xa.dtype != np.float16 else 0  # ggml converts src1 to f16 for an f16 src0
        fn = _mm_par if xa.shape[0] * n * m * kq >= _MM_PAR_MIN else _mm_ser
        fn(w_rows, padded_rows(xrows, xkind), k, wsb, wsm, xsb, xsn, xa.shape[0], n, m, xa.shape[0] // wa.shape[0],
           kp, path.lanes, path.reduce, mode, out[a])
    return out.reshape(out.shape[4 - r:])


def _bits(a: np.ndarray) -> np.ndarray:
    """f16 arrays as their uint16 bits (numba has no float16); other dtypes as float32."""
    return a.view(np.uint16) if a.dtype == np.float16 else a.astype(F32, copy=False)
