"""Weight side of the numba backend: GGUF weight tensors as matmul / get_rows operands.

Why this module exists
    The conformance target is llama.cpp's CPU backend, and its matmul is not "dequantize, then float GEMM":
    the activation rows are first converted to the weight type's *vec_dot type* (Q4_0/Q8_0 -> Q8_0,
    Q4_1 -> Q8_1, Q4_K/Q5_K/Q6_K -> Q8_K, F16 -> f16, BF16 -> bf16) and the dot products are taken between
    the two quantized operands. A float engine that skips this lands 0.1-1.4 logit away on SmolLM2; one that
    copies it lands within float-summation noise, which the next layers' 8-bit activation quantization then
    amplifies (~0.2 in the residual after 10 layers). So `QWeight.matmul` quantizes x exactly like llama.cpp,
    then multiplies, for Q4_1 and Q8_0 in llama.cpp's exact operation order. Speed matters as much (decode
    must run near memory bandwidth), hence repacked layouts and flat numba loops.

API
    QWeight.prepare(raw, qtype, ne0) wraps the raw GGUF data of one 2-D weight: uint8 (rows, row_bytes) for
    quantized types (usually a memmap), float32 / float16 (rows, ne0) for F32 / F16, BF16 as 2-byte words.
    Nothing is copied. The first matmul repacks the tensor once into the kernel layout below and keeps it
    (`packed_nbytes`); get_rows on a tensor never multiplied (always, for Q4_1/Q8_0) repacks only the rows
    asked for. matmul(x) is
    x @ W.T for x (n, ne0) float32; get_rows(ids) and dequantize() equal gguf.quants.dequantize bit for bit.

The table `_TYPES` has one row per type: activation format, the stream layout of a row, repack function and
    the three kernels (GEMV, GEMM, dequantize). Q4_1 and Q8_0 (the SmolLM2 types) have their own exact kernels
    and layout, see below. Every other kernel computes
        out[r, i] = sum_j w'[i, j] * xq[r, j]  +  sum_g mins[i, g] * asum[r, g]
    where w' is the weight without its additive min term, xq the quantized activation dequantized (exact in
    f32), and the second sum is llama.cpp's min term (Q4_K/Q5_K: dmin*m * d*bsums).
    Elements are taken in "stream order": for Q4_x all low nibbles of a row, then all high nibbles (Q6_K: four
    streams), so each weight byte meets activations at j and kp + j and every load/store is contiguous.

    type  act   matmul layout                                      bytes/weight   [raw GGUF]
    Q8_0  Q8_0  int8 q + f32 d per 32, rows in groups of 64 (*)       1.125       [1.0625]
    Q4_0  Q8_0  nibbles + f32 d per 32                                0.625       [0.5625]
    Q4_1  Q8_1  lane-paired nibbles + f32 d, m per 32, groups (*)     0.75        [0.625]
    Q4_K  Q8_K  nibbles + f32 d*sc and -dmin*m per 32                 0.75        [0.5625]
    Q5_K  Q8_K  as Q4_K + the 5th bits spread to one byte per nibble  1.25        [0.6875]
    Q6_K  Q8_K  two low-nibble streams + qh + f32 d*sc per 16         1.0         [0.8203]
    F32, F16, BF16: no copy; the kernels read the data in place (F16/BF16 converted per row in registers/L1).
    (Q5_K's 5th bits in place would cost a gather per element: GEMV 109 us instead of 32 us on 1536x512.)
    (*) element-major inside a group of 64 rows: the 64 rows' values of one element are adjacent, so the
    innermost loops run over rows (see "Q4_1 and Q8_0" above the kernels). get_rows of Q4_1/Q8_0 repacks just
    the rows asked for, from the raw data, into the stream layout.

Numerics: what is bit-exact and what is only close
    Bit-exact: every dequantized weight value, and the activation quantization: Q8_0/Q8_1 as llama.cpp's x86
    (AVX2) code does it (d = amax/127 rounded to f16, q = round-half-even(x * (127/amax)), Q8_1's
    s = f16(d * sum q) with the unrounded d), Q8_K as quantize_row_q8_K_ref (scale -127/max of the first
    largest-magnitude value, nearest-even, clamp at 127, d = 1/iscale in f32), f16/bf16 nearest-even rounding
    of x for F16/BF16 weights. (llama.cpp's portable reference Q8_0/Q8_1 quantizer uses id = 1/d and rounds
    half away from zero; it differs in rare 1-ulp/tie cases; this machine's llama.cpp runs the x86 code.)
    Bit-exact also: Q4_1 and Q8_0 matmuls, every output element, for any number of rows: they replay
    ggml_vec_dot_q4_1_q8_1 / ggml_vec_dot_q8_0_q8_0 of the x86 build (AVX2 + VNNI: eight int32 lane sums per
    block, fma(d_w*d_x, lane, acc) per lane in block order, hsum_float_8, Q4_1's min term as an FMA chain
    added last); tinyBLAS_Q0_AVX, which llama.cpp takes for Q8_0 with n >= 2, has the same per-element order.
    Checked against llama.cpp's own tensors in tests/test_llama_exact.py (SmolLM2: all 30 layers identical).
    Only close (max error ~4e-7 of max|y| against an exact emulation, tests/test_quant.py): the other types'
    products, accumulated in f32 in numba's vector order. (For Q4_0 and the K-quants llama.cpp itself uses
    repacked or tiled kernels with yet other orders.)

Speed choices (2 threads, this machine; bench/bench_quant.py)
    Q4_1/Q8_0, n = 1, GEMV: prange over groups of 64 weight rows; per block and lane the four products are
    formed for the 64 rows at once (exact in float: integers below 2^24), then one FMA with d_w*d_x. Q4_1
    ffn_up 1536x576 in 26 us, Q8_0 LM head 49152x576 in 0.5 ms. n >= 2, GEMM: each task expands one group's
    weights to float once (L2) and runs 4 activation rows at a time against it; ffn_up at n = 128 in 1.3 ms
    (~170 GFLOP/s). Two numba details matter: row loops of the compile-time width _G (with a runtime width
    they measured 7x slower) and few distinct arrays per loop (beyond ~8 runtime alias checks the loop is not
    vectorized; hence the (4, 64) accumulator blocks).
    Other types, n < 4, GEMV: prange over weight rows, one flat loop over a row's bytes with the block scale
    read as d[i, j >> 4]; every weight row is reused from L1 for the n activation rows.
    Nested 32-element block loops or exact int32 block sums measured 4-8x slower.
    n >= 4, GEMM: each task dequantizes 6 weight rows (w' only) into an L1 buffer and multiplies them with 4
    activation rows at a time in 24 register accumulators; the min term goes through the same tile. 240-400
    GFLOP/s at n = 128, above OpenBLAS sgemm here (~240) even though the weights are dequantized on the fly.
    BLAS is not used at all, F32 included: right after a numba parallel region the OpenMP workers keep
    spinning (GOMP_SPINCOUNT) and starve OpenBLAS's threads, so a 1 ms sgemm took ~8 ms.
    Crossover n = 4 was measured for every type (GEMV costs ~n times its n=1 time; GEMM is flat until ~8).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

import gguf
import numpy as np
from numba import njit, prange

from graphir.backends.kernels_util import f16_bits, f16_round, fma, hsum8, round_bf16, round_f16

__all__ = ["QWeight", "SUPPORTED"]

T = gguf.GGMLQuantizationType
_F32 = np.float32

_fast = dict(parallel=True, fastmath=True, cache=True)   # GEMV: float reassociation allowed (vectorizes)
_exact = dict(parallel=True, cache=True)                  # dequantization: no FMA contraction, bit-exact


# ---------------------------------------------------------------------------------------------------------
# Activation quantizers. Each writes the *dequantized* quantized activation (q * d, exact in f32) of element k
# at position inv[k] (stream order) of a row of xq, and the per-group sums llama.cpp's min term needs into
# asum. No fastmath: scale formulas must round exactly like llama.cpp's (a/127 must not become a*(1/127)).
# ---------------------------------------------------------------------------------------------------------

@njit(cache=True)
def _act_q8_0(x, inv, xq, asum):
    n, k = x.shape
    for r in range(n):
        for b in range(k >> 5):
            o = b << 5
            amax = _F32(0.0)
            for j in range(32):
                amax = max(amax, abs(x[r, o + j]))
            d = f16_round(amax / _F32(127.0))
            iscale = _F32(127.0) / amax if amax != _F32(0.0) else _F32(0.0)
            for j in range(32):
                xq[r, inv[o + j]] = np.rint(x[r, o + j] * iscale) * d


@njit(cache=True)
def _act_q8_1(x, inv, xq, asum):
    n, k = x.shape
    for r in range(n):
        for b in range(k >> 5):
            o = b << 5
            amax = _F32(0.0)
            for j in range(32):
                amax = max(amax, abs(x[r, o + j]))
            d32 = amax / _F32(127.0)
            d = f16_round(d32)
            iscale = _F32(127.0) / amax if amax != _F32(0.0) else _F32(0.0)
            qsum = 0
            for j in range(32):
                q = np.rint(x[r, o + j] * iscale)
                qsum += int(q)
                xq[r, inv[o + j]] = q * d
            asum[r, b] = f16_round(d32 * _F32(qsum))       # Q8_1's s, stored as f16 by llama.cpp


@njit(cache=True)
def _act_q8_k(x, inv, xq, asum):
    n, k = x.shape
    for r in range(n):
        for sb in range(k >> 8):
            o = sb << 8
            amax = _F32(0.0)
            vmax = _F32(0.0)
            for j in range(256):                              # first element of largest magnitude, signed
                a = abs(x[r, o + j])
                if a > amax:
                    amax = a
                    vmax = x[r, o + j]
            if amax == _F32(0.0):
                for j in range(256):
                    xq[r, inv[o + j]] = _F32(0.0)
                for g in range(8):
                    asum[r, sb * 8 + g] = _F32(0.0)
                continue
            iscale = _F32(-127.0) / vmax
            d = _F32(1.0) / iscale
            for g in range(8):
                qsum = 0
                for j in range(32):
                    q = min(np.rint(iscale * x[r, o + g * 32 + j]), _F32(127.0))
                    qsum += int(q)
                    xq[r, inv[o + g * 32 + j]] = q * d
                asum[r, sb * 8 + g] = d * _F32(qsum)


def _act_f32(x, inv, xq, asum):
    xq[:] = x


def _act_f16(x, inv, xq, asum):
    xq[:] = round_f16(x)


def _act_bf16(x, inv, xq, asum):
    xq[:] = round_bf16(x)


# activation format -> (quantizer, elements per asum entry; 0 = no min term)
_ACT: dict[str, tuple[Callable, int]] = {
    "q8_0": (_act_q8_0, 0),
    "q8_1": (_act_q8_1, 32),
    "q8_K": (_act_q8_k, 32),
    "f32": (_act_f32, 0),
    "f16": (_act_f16, 0),
    "bf16": (_act_bf16, 0),
}


# ---------------------------------------------------------------------------------------------------------
# Repack (numpy, once per tensor or per get_rows request): raw GGUF rows -> tuple of C-contiguous arrays.
# When a type has a min term, the last array is mins (rows, groups) f32.
# ---------------------------------------------------------------------------------------------------------

def _field(blocks: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Bytes [lo, hi) of every block, as a contiguous (rows, nblocks * (hi - lo)) uint8 array."""
    return np.ascontiguousarray(blocks[:, :, lo:hi]).reshape(blocks.shape[0], -1)


def _half(blocks: np.ndarray, lo: int) -> np.ndarray:
    """The f16 at byte `lo` of every block, as float32 (rows, nblocks)."""
    return _field(blocks, lo, lo + 2).view(np.float16).astype(_F32)


def _k_scales(sc12: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K 12-byte packed 6-bit (scale, min) pairs -> two (rows, nblocks, 8) float32 arrays."""
    a, b, c = sc12[..., 0:4].astype(np.uint8), sc12[..., 4:8], sc12[..., 8:12]
    sc = np.concatenate([a & 63, (c & 15) | ((a >> 6) << 4)], axis=-1)
    mn = np.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=-1)
    return sc.astype(_F32), mn.astype(_F32)


def _repack_q8_0(b):
    return _field(b, 2, 34).view(np.int8), _half(b, 0)


def _repack_q4_0(b):
    return _field(b, 2, 18), _half(b, 0)


def _repack_q4_1(b):
    return _field(b, 4, 20), _half(b, 0), _half(b, 2)


def _repack_k_common(b, qs_lo):
    rows, nb = b.shape[:2]
    d, dmin = _half(b, 0)[..., None], _half(b, 2)[..., None]
    sc, mn = _k_scales(b[:, :, 4:16])
    dsc = d * sc                                            # same f32 products as gguf's dequantizer
    mins = -(dmin * mn)
    return (_field(b, qs_lo, qs_lo + 128),
            np.ascontiguousarray(dsc[..., 0::2]).reshape(rows, nb * 4),
            np.ascontiguousarray(dsc[..., 1::2]).reshape(rows, nb * 4),
            mins.reshape(rows, nb * 8))


def _repack_q4_k(b):
    return _repack_k_common(b, 16)


def _repack_q5_k(b):
    qs, slo, shi, mins = _repack_k_common(b, 48)
    rows, nb = b.shape[:2]
    qh = b[:, :, 16:48].reshape(rows, nb, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    return qs, (qh & 3).reshape(rows, nb * 128), slo, shi, mins     # high bits of both nibbles of qs[j]


def _repack_q6_k(b):
    rows, nb = b.shape[:2]
    ql = b[:, :, 0:128].reshape(rows, nb, 2, 2, 32)         # [half][first/second 32 bytes][l]
    qa = np.ascontiguousarray(ql[:, :, :, 0]).reshape(rows, nb * 64)
    qb = np.ascontiguousarray(ql[:, :, :, 1]).reshape(rows, nb * 64)
    qh = _field(b, 128, 192)
    sc = b[:, :, 192:208].view(np.int8).astype(_F32).reshape(rows, nb, 2, 4, 2)   # [half][k][l>>4]
    dsc = _half(b, 208)[:, :, None, None, None] * sc
    s = np.ascontiguousarray(dsc.transpose(0, 3, 1, 2, 4)).reshape(rows, 4, nb * 4)
    return qa, qb, qh, s


# ---------------------------------------------------------------------------------------------------------
# Row dequantizers: row i of the packed tensor -> w[a, :] (float32, length k) in *stream order*: the same
# permuted element order as the activation (for Q4_x all low-nibble values, then all high-nibble values), so
# every store is contiguous. with_min=False drops the additive min term (GEMM adds it as a separate product).
# The arithmetic is gguf.quants.dequantize's, operation for operation; inlined into the _deq_* kernels, which
# have no fastmath, the values are bit-exact (no FMA contraction of d*q + m).
# Two numba details decide their speed (5x): inline="always" (as a call, numba loses the knowledge that w is a
# fresh local array and the stores stop vectorizing) and offsets written as max(n, 0) (numba wraps negative
# indices; an offset of unknown sign keeps a per-element select in the loop that blocks vectorization).
# ---------------------------------------------------------------------------------------------------------

_inl = dict(cache=True, inline="always")


@njit(**_inl)
def _row_f32(w0, i, w, a, with_min):
    for j in range(w0.shape[1]):
        w[a, j] = w0[i, j]


@njit(**_inl)
def _row_f16(w0, i, w, a, with_min):
    bits = w.view(np.uint32)
    for j in range(w0.shape[1]):
        bits[a, j] = f16_bits(w0[i, j])
    for j in range(w0.shape[1]):                # zero and subnormal halves: m * 2**-24, exact in f32
        h = np.int32(w0[i, j])
        v = _F32(h & 0x3FF) * _F32(5.9604644775390625e-08)
        w[a, j] = (-v if h & 0x8000 else v) if (h & 0x7C00) == 0 else w[a, j]


@njit(**_inl)
def _row_bf16(w0, i, w, a, with_min):
    bits = w.view(np.uint32)
    for j in range(w0.shape[1]):
        bits[a, j] = np.uint32(w0[i, j]) << np.uint32(16)


@njit(**_inl)
def _row_q8_0(qs, d, i, w, a, with_min):
    for j in range(qs.shape[1]):
        w[a, j] = _F32(qs[i, j]) * d[i, j >> 5]


@njit(**_inl)
def _row_q4_0(qs, d, i, w, a, with_min):
    kp = max(qs.shape[1], 0)
    for j in range(kp):
        q = np.int32(qs[i, j])
        w[a, j] = d[i, j >> 4] * _F32((q & 15) - 8)
        w[a, kp + j] = d[i, j >> 4] * _F32((q >> 4) - 8)


@njit(**_inl)
def _row_q4_1(qs, d, m, i, w, a, with_min):
    kp = max(qs.shape[1], 0)
    for j in range(kp):
        q = qs[i, j]
        add = m[i, j >> 4] if with_min else _F32(0.0)
        w[a, j] = d[i, j >> 4] * _F32(q & 15) + add
        w[a, kp + j] = d[i, j >> 4] * _F32(q >> 4) + add


@njit(**_inl)
def _row_q4_k(qs, slo, shi, mins, i, w, a, with_min):
    kp = max(qs.shape[1], 0)
    for j in range(kp):
        q = qs[i, j]
        c = j >> 5
        alo = mins[i, 2 * c] if with_min else _F32(0.0)
        ahi = mins[i, 2 * c + 1] if with_min else _F32(0.0)
        w[a, j] = slo[i, c] * _F32(q & 15) + alo
        w[a, kp + j] = shi[i, c] * _F32(q >> 4) + ahi


@njit(**_inl)
def _row_q5_k(qs, qh, slo, shi, mins, i, w, a, with_min):
    kp = max(qs.shape[1], 0)
    for j in range(kp):
        q = np.int32(qs[i, j])
        h = np.int32(qh[i, j])
        c = j >> 5
        alo = mins[i, 2 * c] if with_min else _F32(0.0)
        ahi = mins[i, 2 * c + 1] if with_min else _F32(0.0)
        w[a, j] = slo[i, c] * _F32((q & 15) | ((h & 1) << 4)) + alo
        w[a, kp + j] = shi[i, c] * _F32((q >> 4) | ((h & 2) << 3)) + ahi


@njit(**_inl)
def _row_q6_k(qa, qb, qh, s, i, w, a, with_min):
    kp = max(qh.shape[1], 0)
    for t in range(kp):
        x = np.int32(qa[i, t])
        y = np.int32(qb[i, t])
        h = np.int32(qh[i, t])
        u = t >> 4
        w[a, t] = s[i, 0, u] * _F32(((x & 15) | ((h & 3) << 4)) - 32)
        w[a, kp + t] = s[i, 1, u] * _F32(((y & 15) | ((h & 12) << 2)) - 32)
        w[a, 2 * kp + t] = s[i, 2, u] * _F32(((x >> 4) | (h & 48)) - 32)
        w[a, 3 * kp + t] = s[i, 3, u] * _F32(((y >> 4) | ((h >> 2) & 48)) - 32)


# ---------------------------------------------------------------------------------------------------------
# GEMV kernels (n < _GEMM_FROM): prange over weight rows i; for each activation row r one flat loop over the
# row's bytes with the block scale fetched as s[i, j >> k]. xq (n, k) is in stream order, so the values that
# meet byte j of a Q4 row are xq[r, j] and xq[r, kp + j].
# ---------------------------------------------------------------------------------------------------------

@njit(**_fast)
def _gemv_f32(w, xq, asum, out):
    rows, k = w.shape
    for i in prange(rows):
        for r in range(xq.shape[0]):
            acc = _F32(0.0)
            for j in range(k):
                acc += w[i, j] * xq[r, j]
            out[r, i] = acc


@njit(**_fast)
def _gemv_f16(w0, xq, asum, out):
    rows, k = w0.shape
    for c in prange((rows + 63) >> 6):              # 64 rows per task, one f32 row buffer per task
        w = np.empty((1, k), _F32)
        for i in range(c << 6, min(rows, (c + 1) << 6)):
            _row_f16(w0, i, w, 0, False)
            for r in range(xq.shape[0]):
                acc = _F32(0.0)
                for j in range(k):
                    acc += w[0, j] * xq[r, j]
                out[r, i] = acc


@njit(**_fast)
def _gemv_bf16(w0, xq, asum, out):
    rows, k = w0.shape
    for c in prange((rows + 63) >> 6):
        w = np.empty((1, k), _F32)
        for i in range(c << 6, min(rows, (c + 1) << 6)):
            _row_bf16(w0, i, w, 0, False)
            for r in range(xq.shape[0]):
                acc = _F32(0.0)
                for j in range(k):
                    acc += w[0, j] * xq[r, j]
                out[r, i] = acc


@njit(**_fast)
def _gemv_q4_0(qs, d, xq, asum, out):
    rows, kp = qs.shape[0], max(qs.shape[1], 0)
    for i in prange(rows):
        for r in range(xq.shape[0]):
            acc = _F32(0.0)
            for j in range(kp):
                q = np.int32(qs[i, j])
                acc += (_F32((q & 15) - 8) * xq[r, j] + _F32((q >> 4) - 8) * xq[r, kp + j]) * d[i, j >> 4]
            out[r, i] = acc


@njit(**_fast)
def _gemv_q4_k(qs, slo, shi, mins, xq, asum, out):
    rows, kp = qs.shape[0], max(qs.shape[1], 0)
    for i in prange(rows):
        for r in range(xq.shape[0]):
            acc = _F32(0.0)
            for j in range(kp):
                q = qs[i, j]
                acc += _F32(q & 15) * xq[r, j] * slo[i, j >> 5] + _F32(q >> 4) * xq[r, kp + j] * shi[i, j >> 5]
            for g in range(mins.shape[1]):
                acc += mins[i, g] * asum[r, g]
            out[r, i] = acc


@njit(**_fast)
def _gemv_q5_k(qs, qh, slo, shi, mins, xq, asum, out):
    rows, kp = qs.shape[0], max(qs.shape[1], 0)
    for i in prange(rows):
        for r in range(xq.shape[0]):
            acc = _F32(0.0)
            for j in range(kp):
                q = np.int32(qs[i, j])
                h = np.int32(qh[i, j])
                lo = (q & 15) | ((h & 1) << 4)
                hi = (q >> 4) | ((h & 2) << 3)
                acc += _F32(lo) * xq[r, j] * slo[i, j >> 5] + _F32(hi) * xq[r, kp + j] * shi[i, j >> 5]
            for g in range(mins.shape[1]):
                acc += mins[i, g] * asum[r, g]
            out[r, i] = acc


@njit(**_fast)
def _gemv_q6_k(qa, qb, qh, s, xq, asum, out):
    rows, kp = qh.shape[0], max(qh.shape[1], 0)
    for i in prange(rows):
        for r in range(xq.shape[0]):
            acc = _F32(0.0)
            for t in range(kp):
                a = np.int32(qa[i, t])
                b = np.int32(qb[i, t])
                h = np.int32(qh[i, t])
                u = t >> 4
                acc += (_F32(((a & 15) | ((h & 3) << 4)) - 32) * xq[r, t] * s[i, 0, u]
                        + _F32(((b & 15) | ((h & 12) << 2)) - 32) * xq[r, kp + t] * s[i, 1, u]
                        + _F32(((a >> 4) | (h & 48)) - 32) * xq[r, 2 * kp + t] * s[i, 2, u]
                        + _F32(((b >> 4) | ((h >> 2) & 48)) - 32) * xq[r, 3 * kp + t] * s[i, 3, u])
            out[r, i] = acc


# ---------------------------------------------------------------------------------------------------------
# GEMM kernels (n >= _GEMM_FROM): each task dequantizes 6 weight rows at a time (w' only) into an L1-resident
# buffer and multiplies them with 4 activation rows at a time held in 24 register accumulators; the min term
# goes through the same tile. Why no BLAS: see the module docstring.
# ---------------------------------------------------------------------------------------------------------

_TR = 6                    # weight rows per tile (x 4 activation rows = 24 accumulators)
_GEMM_FROM = 4             # n from which GEMM beats GEMV, for every type (measured: bench/bench_quant.py)


@njit(fastmath=True, cache=True)
def _tile(w, cnt, xq, out, i0, add):
    """out[r, i0 + a] (+)= w[a] . xq[r] for a < cnt; w is (_TR, k), xq (n, k)."""
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
                if add:
                    c0 += out[r, i0 + a]
                    c1 += out[r + 1, i0 + a]
                    c2 += out[r + 2, i0 + a]
                    c3 += out[r + 3, i0 + a]
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
            out[rr, i0 + a] = acc + out[rr, i0 + a] if add else acc


@njit(fastmath=True, cache=True)
def _add_mins(mins, wm, asum, i0, cnt, out):
    """out[r, i0 + a] += mins[i0 + a] . asum[r] (the min term, through the same register tile)."""
    for a in range(cnt):
        for g in range(mins.shape[1]):
            wm[a, g] = mins[i0 + a, g]
    _tile(wm, cnt, asum, out, i0, True)


@njit(cache=True)
def _tasks(rows):
    nblk = (rows + _TR - 1) // _TR
    return min(nblk, 64), nblk


@njit(**_fast)
def _gemm_f32(w0, xq, asum, out):
    rows = w0.shape[0]
    ntask, nblk = _tasks(rows)
    for t in prange(ntask):
        w = np.empty((_TR, xq.shape[1]), _F32)
        for c in range(t * nblk // ntask, (t + 1) * nblk // ntask):
            i0, cnt = c * _TR, min(_TR, rows - c * _TR)
            for a in range(cnt):
                _row_f32(w0, i0 + a, w, a, False)
            _tile(w, cnt, xq, out, i0, False)


@njit(**_fast)
def _gemm_f16(w0, xq, asum, out):
    rows = w0.shape[0]
    ntask, nblk = _tasks(rows)
    for t in prange(ntask):
        w = np.empty((_TR, xq.shape[1]), _F32)
        for c in range(t * nblk // ntask, (t + 1) * nblk // ntask):
            i0, cnt = c * _TR, min(_TR, rows - c * _TR)
            for a in range(cnt):
                _row_f16(w0, i0 + a, w, a, False)
            _tile(w, cnt, xq, out, i0, False)


@njit(**_fast)
def _gemm_bf16(w0, xq, asum, out):
    rows = w0.shape[0]
    ntask, nblk = _tasks(rows)
    for t in prange(ntask):
        w = np.empty((_TR, xq.shape[1]), _F32)
        for c in range(t * nblk // ntask, (t + 1) * nblk // ntask):
            i0, cnt = c * _TR, min(_TR, rows - c * _TR)
            for a in range(cnt):
                _row_bf16(w0, i0 + a, w, a, False)
            _tile(w, cnt, xq, out, i0, False)


@njit(**_fast)
def _gemm_q4_0(qs, d, xq, asum, out):
    rows = qs.shape[0]
    ntask, nblk = _tasks(rows)
    for t in prange(ntask):
        w = np.empty((_TR, xq.shape[1]), _F32)
        for c in range(t * nblk // ntask, (t + 1) * nblk // ntask):
            i0, cnt = c * _TR, min(_TR, rows - c * _TR)
            for a in range(cnt):
                _row_q4_0(qs, d, i0 + a, w, a, False)
            _tile(w, cnt, xq, out, i0, False)


@njit(**_fast)
def _gemm_q4_k(qs, slo, shi, mins, xq, asum, out):
    rows = qs.shape[0]
    ntask, nblk = _tasks(rows)
    for t in prange(ntask):
        w = np.empty((_TR, xq.shape[1]), _F32)
        wm = np.empty((_TR, mins.shape[1]), _F32)
        for c in range(t * nblk // ntask, (t + 1) * nblk // ntask):
            i0, cnt = c * _TR, min(_TR, rows - c * _TR)
            for a in range(cnt):
                _row_q4_k(qs, slo, shi, mins, i0 + a, w, a, False)
            _tile(w, cnt, xq, out, i0, False)
            _add_mins(mins, wm, asum, i0, cnt, out)


@njit(**_fast)
def _gemm_q5_k(qs, qh, slo, shi, mins, xq, asum, out):
    rows = qs.shape[0]
    ntask, nblk = _tasks(rows)
    for t in prange(ntask):
        w = np.empty((_TR, xq.shape[1]), _F32)
        wm = np.empty((_TR, mins.shape[1]), _F32)
        for c in range(t * nblk // ntask, (t + 1) * nblk // ntask):
            i0, cnt = c * _TR, min(_TR, rows - c * _TR)
            for a in range(cnt):
                _row_q5_k(qs, qh, slo, shi, mins, i0 + a, w, a, False)
            _tile(w, cnt, xq, out, i0, False)
            _add_mins(mins, wm, asum, i0, cnt, out)


@njit(**_fast)
def _gemm_q6_k(qa, qb, qh, s, xq, asum, out):
    rows = qa.shape[0]
    ntask, nblk = _tasks(rows)
    for t in prange(ntask):
        w = np.empty((_TR, xq.shape[1]), _F32)
        for c in range(t * nblk // ntask, (t + 1) * nblk // ntask):
            i0, cnt = c * _TR, min(_TR, rows - c * _TR)
            for a in range(cnt):
                _row_q6_k(qa, qb, qh, s, i0 + a, w, a, False)
            _tile(w, cnt, xq, out, i0, False)


# ---------------------------------------------------------------------------------------------------------
# Q4_1 and Q8_0: llama.cpp's dot products bit for bit.
# ggml_vec_dot_q4_1_q8_1 and ggml_vec_dot_q8_0_q8_0 (x86 quants.c, AVX2 path; tinyBLAS_Q0_AVX, which takes
# Q8_0 x Q8_0 when n >= 2, keeps the same order per output element): per 32-block, eight int32 lane sums of
# four consecutive products (VNNI dpbusd / maddubs+madd), converted to float and accumulated lane-wise as
# acc[l] = fma(d_w * d_x, lane[l], acc[l]) in block order; the result is hsum8(acc), plus for Q4_1 the min
# term summs = fma(m_w, s_x, summs) chained over the blocks (a scalar vfmadd231ss in the build) and added last.
# Layout: weight rows in groups of _G; inside a group the values of one element for all of the group's rows
# sit side by side ([element][row]), so the innermost loops run over rows (16 per zmm) and every lane of the
# emulation is plain vector code. The lane sums are computed in float: all partial sums are integers below
# 2^24 (|lane| <= 4 * 127 * 127), exact in any order. Q4_1 bytes hold lane l's elements 4l+p (low nibble) and
# 4l+p+2 (high nibble), p = 0, 1. Activations: the int8 quants as float32 in natural order, d and s per block.
# ---------------------------------------------------------------------------------------------------------

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


def _pack_q4_1(b):
    qs = b[:, :, 4:20]
    q = np.concatenate([qs & 15, qs >> 4], axis=2).reshape(b.shape[0], b.shape[1], 8, 4)   # [row][b][l][e]
    return _grouped(q[..., 0:2] | (q[..., 2:4] << 4)), _grouped(_half(b, 0)), _grouped(_half(b, 2))


def _pack_q8_0(b):
    return _grouped(b[:, :, 2:34].view(np.int8)), _grouped(_half(b, 0))


@njit(cache=True)
def _xq_q8_1(x, y, yd, ys):
    """quantize_row_q8_1 as the x86 build runs it (see _act_q8_1); quants as float32 in natural order."""
    n, k = x.shape
    for r in range(n):
        for b in range(k >> 5):
            o = b << 5
            amax = _F32(0.0)
            for j in range(32):
                amax = max(amax, abs(x[r, o + j]))
            d32 = amax / _F32(127.0)
            iscale = _F32(127.0) / amax if amax != _F32(0.0) else _F32(0.0)
            qsum = 0
            for j in range(32):
                q = np.rint(x[r, o + j] * iscale)
                qsum += int(q)
                y[r, o + j] = q
            yd[r, b] = f16_round(d32)
            ys[r, b] = f16_round(d32 * _F32(qsum))


@njit(cache=True)
def _xq_q8_0(x, y, yd, ys):
    """quantize_row_q8_0 (x86): as _xq_q8_1 without s (ys is not written)."""
    n, k = x.shape
    for r in range(n):
        for b in range(k >> 5):
            o = b << 5
            amax = _F32(0.0)
            for j in range(32):
                amax = max(amax, abs(x[r, o + j]))
            iscale = _F32(127.0) / amax if amax != _F32(0.0) else _F32(0.0)
            for j in range(32):
                y[r, o + j] = np.rint(x[r, o + j] * iscale)
            yd[r, b] = f16_round(amax / _F32(127.0))


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


@njit(**_exact)
def _gemv_q4_1(qs, d, m, x, out):
    n, k = x.shape
    rows, nb = out.shape[1], k >> 5
    y, yd, ys = np.empty((n, k), _F32), np.empty((n, nb), _F32), np.empty((n, nb), _F32)
    _xq_q8_1(x, y, yd, ys)
    for g in prange((rows + _G - 1) // _G):
        i0 = g * _G
        w = min(_G, rows - i0)
        qg, dg, mg = qs[i0 * (k >> 1):(i0 + w) * (k >> 1)], d[i0 * nb:(i0 + w) * nb], m[i0 * nb:(i0 + w) * nb]
        acc = np.empty((8, w), _F32)
        summ = np.empty(w, _F32)
        dd = np.empty(w, _F32)
        for r in range(n):
            acc[:] = 0.0
            summ[:] = 0.0
            yr = y[r]
            for b in range(nb):
                _scales(dg, mg, b, w, yd[r, b], ys[r, b], dd, summ, True)
                for lane in range(8):
                    yl = yr[b * 32 + 4 * lane:b * 32 + 4 * lane + 4]
                    y0, y1, y2, y3 = yl[0], yl[1], yl[2], yl[3]
                    base = (b * 8 + lane) * 2 * w
                    q0, q1, al = qg[base:base + w], qg[base + w:base + 2 * w], acc[lane]
                    for t in range(w):
                        a, c = q0[t], q1[t]
                        s = fma(_F32(c >> _U4), y3,
                                fma(_F32(a >> _U4), y2, fma(_F32(c & _U15), y1, _F32(a & _U15) * y0)))
                        al[t] = fma(dd[t], s, al[t])
            _finish(acc, summ, out, r, i0, w, True)


@njit(**_exact)
def _gemv_q8_0(qs, d, x, out):
    n, k = x.shape
    rows, nb = out.shape[1], k >> 5
    y, yd = np.empty((n, k), _F32), np.empty((n, nb), _F32)
    _xq_q8_0(x, y, yd, yd)
    for g in prange((rows + _G - 1) // _G):
        i0 = g * _G
        w = min(_G, rows - i0)
        qg, dg = qs[i0 * k:(i0 + w) * k], d[i0 * nb:(i0 + w) * nb]
        acc = np.empty((8, w), _F32)
        summ = np.empty(0, _F32)
        dd = np.empty(w, _F32)
        for r in range(n):
            acc[:] = 0.0
            yr = y[r]
            for b in range(nb):
                _scales(dg, dg, b, w, yd[r, b], _F32(0.0), dd, summ, False)
                for lane in range(8):
                    o = b * 32 + 4 * lane
                    y0, y1, y2, y3 = yr[o], yr[o + 1], yr[o + 2], yr[o + 3]
                    q0, q1 = qg[o * w:(o + 1) * w], qg[(o + 1) * w:(o + 2) * w]
                    q2, q3 = qg[(o + 2) * w:(o + 3) * w], qg[(o + 3) * w:(o + 4) * w]
                    al = acc[lane]
                    for t in range(w):
                        s = fma(_F32(q3[t]), y3, fma(_F32(q2[t]), y2, fma(_F32(q1[t]), y1, _F32(q0[t]) * y0)))
                        al[t] = fma(dd[t], s, al[t])
            _finish(acc, summ, out, r, i0, w, False)


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


@njit(**_exact)
def _gemm_q4_1(qs, d, m, x, out):
    n, k = x.shape
    rows, nb = out.shape[1], k >> 5
    y, yd, ys = np.empty((n, k), _F32), np.empty((n, nb), _F32), np.empty((n, nb), _F32)
    _xq_q8_1(x, y, yd, ys)
    nc = (n + _RC - 1) // _RC
    for task in prange((rows + _G - 1) // _G * nc):
        i0, r0 = task // nc * _G, task % nc * _RC
        w = min(_G, rows - i0)
        qg, dg, mg = qs[i0 * (k >> 1):(i0 + w) * (k >> 1)], d[i0 * nb:(i0 + w) * nb], m[i0 * nb:(i0 + w) * nb]
        wf = np.zeros((nb * 8, 4, _G), _F32)
        for bl in range(nb * 8):
            q0, q1, fb = qg[bl * 2 * w:bl * 2 * w + w], qg[bl * 2 * w + w:bl * 2 * w + 2 * w], wf[bl]
            for t in range(w):
                fb[0, t] = _F32(q0[t] & _U15)
                fb[1, t] = _F32(q1[t] & _U15)
                fb[2, t] = _F32(q0[t] >> _U4)
                fb[3, t] = _F32(q1[t] >> _U4)
        _gemm_rows(wf, dg, mg, y, yd, ys, out, i0, w, r0, min(n, r0 + _RC), True)


@njit(**_exact)
def _gemm_q8_0(qs, d, x, out):
    n, k = x.shape
    rows, nb = out.shape[1], k >> 5
    y, yd = np.empty((n, k), _F32), np.empty((n, nb), _F32)
    ys = yd
    _xq_q8_0(x, y, yd, yd)
    nc = (n + _RC - 1) // _RC
    for task in prange((rows + _G - 1) // _G * nc):
        i0, r0 = task // nc * _G, task % nc * _RC
        w = min(_G, rows - i0)
        qg, dg = qs[i0 * k:(i0 + w) * k], d[i0 * nb:(i0 + w) * nb]
        wf = np.zeros((nb * 8, 4, _G), _F32)
        for j in range(k):
            qj, fj = qg[j * w:(j + 1) * w], wf[j >> 2, j & 3]
            for t in range(w):
                fj[t] = _F32(qj[t])
        _gemm_rows(wf, dg, dg, y, yd, ys, out, i0, w, r0, min(n, r0 + _RC), False)


# ---------------------------------------------------------------------------------------------------------
# Dequantizers for get_rows / dequantize: rows ids -> out (len(ids), k) in natural order (a row is built in
# stream order, then gathered through inv), min term included. Exact: no fastmath.
# ---------------------------------------------------------------------------------------------------------

@njit(**_exact)
def _deq_f32(w0, ids, inv, out):
    for m in prange(ids.shape[0]):
        w = np.empty((1, out.shape[1]), _F32)
        _row_f32(w0, ids[m], w, 0, True)
        for e in range(out.shape[1]):
            out[m, e] = w[0, inv[e]]


@njit(**_exact)
def _deq_f16(w0, ids, inv, out):
    for m in prange(ids.shape[0]):
        w = np.empty((1, out.shape[1]), _F32)
        _row_f16(w0, ids[m], w, 0, True)
        for e in range(out.shape[1]):
            out[m, e] = w[0, inv[e]]


@njit(**_exact)
def _deq_bf16(w0, ids, inv, out):
    for m in prange(ids.shape[0]):
        w = np.empty((1, out.shape[1]), _F32)
        _row_bf16(w0, ids[m], w, 0, True)
        for e in range(out.shape[1]):
            out[m, e] = w[0, inv[e]]


@njit(**_exact)
def _deq_q8_0(qs, d, ids, inv, out):
    for m in prange(ids.shape[0]):
        w = np.empty((1, out.shape[1]), _F32)
        _row_q8_0(qs, d, ids[m], w, 0, True)
        for e in range(out.shape[1]):
            out[m, e] = w[0, inv[e]]


@njit(**_exact)
def _deq_q4_0(qs, d, ids, inv, out):
    for m in prange(ids.shape[0]):
        w = np.empty((1, out.shape[1]), _F32)
        _row_q4_0(qs, d, ids[m], w, 0, True)
        for e in range(out.shape[1]):
            out[m, e] = w[0, inv[e]]


@njit(**_exact)
def _deq_q4_1(qs, d, mn, ids, inv, out):
    for m in prange(ids.shape[0]):
        w = np.empty((1, out.shape[1]), _F32)
        _row_q4_1(qs, d, mn, ids[m], w, 0, True)
        for e in range(out.shape[1]):
            out[m, e] = w[0, inv[e]]


@njit(**_exact)
def _deq_q4_k(qs, slo, shi, mins, ids, inv, out):
    for m in prange(ids.shape[0]):
        w = np.empty((1, out.shape[1]), _F32)
        _row_q4_k(qs, slo, shi, mins, ids[m], w, 0, True)
        for e in range(out.shape[1]):
            out[m, e] = w[0, inv[e]]


@njit(**_exact)
def _deq_q5_k(qs, qh, slo, shi, mins, ids, inv, out):
    for m in prange(ids.shape[0]):
        w = np.empty((1, out.shape[1]), _F32)
        _row_q5_k(qs, qh, slo, shi, mins, ids[m], w, 0, True)
        for e in range(out.shape[1]):
            out[m, e] = w[0, inv[e]]


@njit(**_exact)
def _deq_q6_k(qa, qb, qh, s, ids, inv, out):
    for m in prange(ids.shape[0]):
        w = np.empty((1, out.shape[1]), _F32)
        _row_q6_k(qa, qb, qh, s, ids[m], w, 0, True)
        for e in range(out.shape[1]):
            out[m, e] = w[0, inv[e]]


# ---------------------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Kind:
    dtype: type                    # element type the kernels read the GGUF data as
    act: str                       # activation format (key of _ACT); block sizes come from gguf.GGML_QUANT_SIZES
    parts: int                     # streams a row is split into (stream order, see module docstring)
    run: int                       # consecutive natural elements that go to one stream before the next
    repack: Callable | None        # (rows, nblocks, type_size) uint8 blocks -> packed arrays; None: use data as is
    gemv: Callable                 # (*packed, xq, asum, out), n < _GEMM_FROM
    gemm: Callable                 # (*packed, xq, asum, out), n >= _GEMM_FROM
    deq: Callable                  # (*packed, ids, inv, out)
    # Exact kinds (Q4_1, Q8_0): matmul uses its own layout, `pack`, and gemv/gemm take (*packed, x, out) and
    # quantize x themselves; GEMM from n >= gemm_from. `repack`/`deq` then serve get_rows only (from raw rows).
    pack: Callable | None = None
    gemm_from: int = 0


# gemm_from (exact kinds), measured: ffn_up 1536x576 GEMV 26/48/69 us at n = 1/2/3, GEMM 51/58/63 us; Q8_0's
# weight expansion costs about as much as its GEMV, so the LM head's crossover is at n ~ 7.
_TYPES: dict[T, _Kind] = {
    T.F32: _Kind(np.float32, "f32", 1, 1, None, _gemv_f32, _gemm_f32, _deq_f32),
    T.F16: _Kind(np.uint16, "f16", 1, 1, None, _gemv_f16, _gemm_f16, _deq_f16),
    T.BF16: _Kind(np.uint16, "bf16", 1, 1, None, _gemv_bf16, _gemm_bf16, _deq_bf16),
    T.Q8_0: _Kind(np.uint8, "q8_0", 1, 32, _repack_q8_0, _gemv_q8_0, _gemm_q8_0, _deq_q8_0, _pack_q8_0, 7),
    T.Q4_0: _Kind(np.uint8, "q8_0", 2, 16, _repack_q4_0, _gemv_q4_0, _gemm_q4_0, _deq_q4_0),
    T.Q4_1: _Kind(np.uint8, "q8_1", 2, 16, _repack_q4_1, _gemv_q4_1, _gemm_q4_1, _deq_q4_1, _pack_q4_1, 3),
    T.Q4_K: _Kind(np.uint8, "q8_K", 2, 32, _repack_q4_k, _gemv_q4_k, _gemm_q4_k, _deq_q4_k),
    T.Q5_K: _Kind(np.uint8, "q8_K", 2, 32, _repack_q5_k, _gemv_q5_k, _gemm_q5_k, _deq_q5_k),
    T.Q6_K: _Kind(np.uint8, "q8_K", 4, 32, _repack_q6_k, _gemv_q6_k, _gemm_q6_k, _deq_q6_k),
}
SUPPORTED = frozenset(_TYPES)

_perm_cache: dict[tuple[int, int, int], np.ndarray] = {}


def _inverse_perm(parts: int, run: int, k: int) -> np.ndarray:
    """Index in the (parts, k/parts) stream layout of each natural activation element (identity if parts=1)."""
    key = (parts, run, k)
    inv = _perm_cache.get(key)
    if inv is None:
        g, w = np.divmod(np.arange(k), parts * run)
        inv = _perm_cache[key] = (w // run) * (k // parts) + g * run + w % run
    return inv


class QWeight:
    """A weight matrix (rows, ne0) in its GGUF storage type, ready for x @ W.T and row lookups."""

    __slots__ = ("raw", "qtype", "rows", "ne0", "_kind", "_inv", "_packed", "_lock")

    def __init__(self, raw: np.ndarray, qtype: T, ne0: int):
        self.raw, self.qtype, self.ne0, self.rows = raw, T(qtype), int(ne0), int(raw.shape[0])
        self._kind = _TYPES[self.qtype]
        self._inv = _inverse_perm(self._kind.parts, self._kind.run, self.ne0)
        self._packed: tuple[np.ndarray, ...] | None = None
        self._lock = threading.Lock()

    @staticmethod
    def prepare(raw: np.ndarray, qtype: gguf.GGMLQuantizationType, ne0: int) -> "QWeight":
        """Wrap raw GGUF tensor data (no copy; the repack happens on first use)."""
        qtype = T(qtype)
        if qtype not in _TYPES:
            raise NotImplementedError(f"weight type {qtype.name} is not supported ({sorted(t.name for t in _TYPES)})")
        block, tsize = gguf.GGML_QUANT_SIZES[qtype]
        want = np.dtype(_TYPES[qtype].dtype)
        raw = np.asarray(raw)                                  # a memmap becomes a plain ndarray view
        if raw.ndim == 2 and raw.flags.c_contiguous and (raw.dtype == np.uint8 or raw.dtype == np.float16) \
                and raw.dtype != want:
            raw = raw.view(want)                               # bytes or float16 -> what the kernels read
        width = ne0 // block * tsize // want.itemsize
        if raw.ndim != 2 or ne0 % block or raw.shape[1] != width or raw.dtype != want or not raw.flags.c_contiguous:
            raise ValueError(f"{qtype.name} weight with ne0={ne0} must be C-contiguous {want.name} (rows, {width}) "
                             f"or its bytes; got {raw.dtype} {raw.shape}")
        return QWeight(raw, qtype, ne0)

    # -- storage ------------------------------------------------------------------------------------------

    def _repack(self, raw_rows: np.ndarray) -> tuple[np.ndarray, ...]:
        if self._kind.repack is None:
            return (raw_rows,)
        tsize = gguf.GGML_QUANT_SIZES[self.qtype][1]
        return self._kind.repack(raw_rows.reshape(raw_rows.shape[0], -1, tsize))

    @property
    def packed(self) -> tuple[np.ndarray, ...]:
        """The kernel layout of the whole tensor, built on first use and kept (see module docstring)."""
        if self._packed is None:
            with self._lock:
                if self._packed is None:
                    if self._kind.pack is not None:
                        tsize = gguf.GGML_QUANT_SIZES[self.qtype][1]
                        self._packed = self._kind.pack(self.raw.reshape(self.rows, -1, tsize))
                    else:
                        self._packed = self._repack(self.raw)
        return self._packed

    @property
    def nbytes(self) -> int:
        """Bytes of the GGUF data."""
        return int(self.raw.nbytes)

    @property
    def packed_nbytes(self) -> int:
        """Extra memory held by the repacked copy (0 until the first matmul, and always 0 for float types)."""
        if self._packed is None or self._kind.repack is None:
            return 0
        return sum(int(a.nbytes) for a in self._packed)

    # -- operations ---------------------------------------------------------------------------------------

    def matmul(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """x (n, ne0) float32 -> (n, rows) float32 = x @ W.T, with llama.cpp's activation rounding."""
        if x.ndim != 2 or x.shape[1] != self.ne0 or x.dtype != _F32 or not x.flags.c_contiguous:
            raise ValueError(f"x must be C-contiguous float32 (n, {self.ne0}), got {x.dtype} {x.shape}")
        n, k = x.shape[0], self._kind
        if out is None:
            out = np.empty((n, self.rows), _F32)
        elif out.shape != (n, self.rows) or out.dtype != _F32 or not out.flags.c_contiguous:
            raise ValueError(f"out must be C-contiguous float32 {(n, self.rows)}, got {out.dtype} {out.shape}")
        if k.pack is not None:                                 # exact kinds: llama.cpp's vec_dot order
            (k.gemv if n < k.gemm_from else k.gemm)(*self.packed, x, out)
            return out
        quantize, group = _ACT[k.act]
        asum = np.empty((n, self.ne0 // group if group else 0), _F32)
        xq = np.empty((n, self.ne0), _F32)                     # quantized activation, in stream order
        quantize(x, self._inv, xq, asum)
        (k.gemv if n < _GEMM_FROM else k.gemm)(*self.packed, xq, asum, out)
        return out

    def get_rows(self, ids: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """(len(ids), ne0) float32 rows of W, bit-equal to gguf.quants.dequantize."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.rows):
            raise IndexError(f"row ids must be in [0, {self.rows})")
        if out is None:
            out = np.empty((ids.size, self.ne0), _F32)
        elif out.shape != (ids.size, self.ne0) or out.dtype != _F32 or not out.flags.c_contiguous:
            raise ValueError(f"out must be C-contiguous float32 {(ids.size, self.ne0)}, got {out.dtype} {out.shape}")
        if self._packed is not None and self._kind.pack is None:
            self._kind.deq(*self._packed, ids, self._inv, out)
        else:                                                  # never multiplied: repack just these rows
            self._kind.deq(*self._repack(self.raw[ids]), np.arange(ids.size), self._inv, out)
        return out

    def dequantize(self) -> np.ndarray:
        """The whole (rows, ne0) float32 matrix (for tests and debugging)."""
        return self.get_rows(np.arange(self.rows))

    def __repr__(self) -> str:
        return f"QWeight({self.qtype.name}, rows={self.rows}, ne0={self.ne0})"
