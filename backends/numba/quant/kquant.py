"""The K-quants (and IQ4_XS, on their super-blocks) bit for bit: Q4_K (and, on AVX-512, Q2_K) in the order of
llama.cpp's repacked 8x8 kernels, Q6_K, Q5_K, Q3_K, IQ4_XS and the Q4_K and Q2_K matrices it does not repack in
that of its vec_dot and tiled kernels; IQ1_S and IQ1_M likewise.

On an x86 host with AVX2, llama.cpp moves every Q4_K matrix whose rows come in eights into its repack buffer
(ggml-cpu/repack.cpp, block_q4_Kx8) and multiplies it with ggml_gemv_q4_K_8x8_q8_K (one activation row) or
ggml_gemm_q4_K_8x8_q8_K (four at a time); AVX2 and AVX-512 builds keep the same arithmetic per output:
exact integers isum = sum_j sc_j * (q4 . q8 over sub-block j) and imin = sum_j m_j * (sum of q8 over sub-block j),
then two float chains,
    acc = fma(float(isum), d_w * d_x, acc),    acc_min = fma(float(imin), dmin_w * d_x, acc_min),
and the result acc - acc_min. The GEMV forms the integers per 256-element super-block, the GEMM per pair of
32-element sub-blocks (four links of the chains a super-block); a ubatch's rows go to the GEMM in fours and
its last n % 4 rows to the GEMV. The activation is Q8_K (quantize_row_q8_K_ref; the 4-row quantizer of the
GEMM gives the same numbers). Integer sums are exact however they are formed, so the kernel forms them as
ggml's GEMM does, with a register's lanes holding as many weight rows (int8_dot.row_nibble_dots), and keeps
the float order of each row's chains.
Layout (pack_q4_k): per group of rows a register holds and super-block, the GGUF quant bytes in chunks of four a
row, the eight 6-bit scales and the eight mins as bytes a row each, d and dmin as f16.
AVX-512 builds repack Q2_K matrices whose rows come in eights the same way (block_q2_Kx8, q2_k_x8): the same two
chains, the GEMM's links per half super-block.
Q6_K, Q5_K and Q3_K, which x86 builds never repack, and the Q4_K and Q2_K matrices they do not (rows not in eights,
one of a 3-D weight's; Q2_K on AVX2 always) go through ggml_vec_dot_q6_K_q8_K / _q5_K_q8_K / ... below 8
activation rows and through ggml-cpu/tiled from 8 (k_product). Both form per super-block exact int32 lane sums
of unsigned values times Q8_K quants, which the host's integer dot product forms here too (int8_dot.k_lanes).
Layout (pack_q6_k, pack_q5_k, pack_q4_k_values, pack_q3_k, pack_q2_k): the values, Q6_K's, Q5_K's and Q4_K's in
their bit fields as GGUF keeps them (0.75 / 0.625 / 0.5 bytes a weight), which the lane sums unpack in registers as
ggml's vec_dots do (int8_dot.PLANES), Q3_K's and Q2_K's as bytes in element order (1 byte a weight against 0.43 /
0.33 in GGUF), which they read 32 at a time as ggml's do after assembling them; the scale bytes of a super-block
(Q6_K's int8 scales; Q5_K's and Q4_K's scales and mins as pack_q4_k's; Q3_K's sixteen scales less 32; Q2_K's sixteen
scales, then its sixteen mins) and d, dmin as float32 (Q6_K's and Q3_K's d alone). A generation streams every weight
once a token, so its speed is the bytes a weight: Q6_K's 0.83 and Q5_K's 0.72 here against 0.82 and 0.69 in GGUF.
IQ4_XS (256-element super-blocks of 4-bit codes into kvalues_iq4nl, an f16 d and eight 6-bit scales less 32) is
never repacked either and takes the same two kernels (ggml_vec_dot_iq4_xs_q8_K, tiled's sign-trick MAC): Q6_K's
arithmetic on signed values (pack_iq4_xs: the codes as GGUF keeps them, looked up in registers as ggml does).
IQ2_XXS, IQ2_XS and IQ2_S (quant.grid: signed grid values, odd scales 2s + 1 per 16 or 32, an f16 d) take the
same two kernels on the same lanes (ggml_vec_dot_iq2_xxs_q8_K / _xs_ / _s_, tiled's act-bias MAC), with their
factor 1/8 where llama.cpp applies it: on the vec_dot's hsum, on the tiled kernels' d (pack_iq2_*: the values as
int8 bytes, the scales per 16, 1 byte a weight against 0.26 / 0.29 / 0.32 in GGUF).
IQ1_S and IQ1_M (rows of eight values -1, 0, 1 from iq1s_grid, a delta of +-1/8 per 32 or per 8, 3-bit scales per
32 or 16) take the same two kernels too: ggml-cpu/tiled's values 8 * grid + delta as int8 bytes (pack_iq1), whose
two parts the vec_dot's two sums take apart (k_lanes' part).
TQ1_0 and TQ2_0 (ternary: 256 values -1, 0, 1 and one f16 d) are neither repacked nor tiled: every activation row
goes through ggml_vec_dot_tq1_0_q8_K / _tq2_0_q8_K, which multiply the values plus 1 (0-2) and take the offset
out through the activation's sums, lane by lane as Q6_K's vec_dot does, with every scale 1 (pack_tq1_0,
pack_tq2_0: the values plus 1 two bits each in TQ2_0's order, unpacked in registers, and one shared row of unit
scales; 0.28 bytes a weight against 0.21 / 0.26 in GGUF).
IQ3_S (per four elements an index into its grid, a sign bit per element, a 4-bit scale s per 32 that counts as
1 + 2s) is IQ4_XS's format to both kernels (ggml_vec_dot_iq3_s_q8_K, tiled's act-bias MAC: the same exact
integers): pack_iq3_s, its signed grid values as int8 bytes (quant.grid), 1 byte a weight against 0.43 in GGUF.
IQ3_XXS (an index per four elements into its own grid, seven sign bits per eight with their parity the eighth, a
4-bit scale per 32) likewise, its grid holding twice the values' steps and the scale counting 1 + 2s: a factor of
1/4, which its vec_dot applies to the total and its tiled kernels to d (pack_iq3_xxs, 0.38 bytes a weight in GGUF).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from numba import njit, prange

from graphir.backends.numba.primitives.bits import bits_u32, fma
from graphir.backends.numba.primitives.simd import (lanes, prefetch, vfma, vhsum, vlane, vload, vmul, vsplat, vstore,
                                                    vsub, vtranspose, vzero, width)
from graphir.backends.numba.quant.activation import cvt_i32, maxps
from graphir.backends.numba.quant.blocks import (IQ4_NL_VALUES, block_f16, iq1_m_fields, iq1_s_fields,
                                                 iq2_s_fields, iq2_xs_fields, iq2_xxs_fields, iq3_s_fields,
                                                 iq3_xxs_fields, iq4_xs_fields, k_scales, tq1_0_values)
from graphir.backends.numba.quant.int8_dot import (PLANES, WIDE_LANES, k_lanes, k_mins, k_start, plane_values,
                                                   row_k_dots, row_nibble_dots)

_V8 = lanes(8)
_VW = lanes(WIDE_LANES)     # rows side by side: a register of the widest width the host has byte instructions for
_AHEAD = 4              # super-blocks of a group that the GEMV asks the memory for ahead of their use
# bytes of values k_product's vec_dot rows ask for ahead of their reads: with the hardware's prefetchers alone a
# 1B-class model's GEMVs streamed Q6_K at 40-48 GB/s and Q5_K at 39-40, with this 45-49 and 44-48 (alternating runs)
_VALUES_AHEAD = 4096
_GEMM_ROWS = 4          # activation rows of Q4_K's GEMM that meet a group's values at once
# pack_q4_k's bytes a row and super-block, and where its scales, mins and d (then dmin) start, in bytes a row
_Q4K_BYTES, _Q4K_SC, _Q4K_MN, _Q4K_D = 148, 128, 136, 144
_pair_dots, _block_dots = row_nibble_dots(1, rows=_GEMM_ROWS), row_nibble_dots(4)

_F32 = np.float32
_I32 = np.int32
_exact = dict(parallel=True, cache=True)                  # no FMA contraction but the written ones: bit-exact


def _scales_mins_d(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K blocks (rows, nb, size) -> scales and mins (rows, nb, 16) uint8 (eight 6-bit scales, then
    eight mins) and (rows, nb, 2) float32 d, dmin."""
    sc, mn = k_scales(b[:, :, 4:16])
    d = np.ascontiguousarray(b[:, :, 0:4]).view(np.float16).astype(_F32).reshape(*b.shape[:2], 2)
    return np.ascontiguousarray(np.concatenate([sc, mn], axis=-1).astype(np.uint8)), d


def pack_q4_k(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K blocks (rows, nb, 144) -> the repacked kernels' layout for groups of G = WIDE_LANES rows side by side
    (rows padded with zero blocks to whole groups; their results are never written), one run of _Q4K_BYTES * G
    bytes per group and super-block, its parts from _Q4K_SC, _Q4K_MN, _Q4K_D: the quant bytes in chunks of four a
    row (int8_dot.row_nibble_dots), the eight 6-bit scales and the eight mins as bytes, each [sub-block][row], and
    d, dmin as f16 bits [d | dmin][row] (vload converts both exactly); as bytes, and as the f16 words they hold.
    148 bytes a row and super-block against GGUF's 144 (mins and d as float32 took 176: 19% more to stream a
    token), in one stream: four arrays of the parts streamed 5-10% slower (the GEMV on 1B-class matrices, two
    Zen 5 cores)."""
    g = WIDE_LANES
    if b.shape[0] % g:
        b = np.concatenate([b, np.zeros((-b.shape[0] % g, *b.shape[1:]), b.dtype)])
    rows, nb = b.shape[:2]
    qs = b[:, :, 16:144].reshape(rows // g, g, nb, 4, 8, 4).transpose(0, 2, 3, 4, 1, 5)
    sc, mn = (a.reshape(rows // g, g, nb, 8).transpose(0, 2, 3, 1) for a in k_scales(b[:, :, 4:16]))
    d = np.ascontiguousarray(b[:, :, 0:4]).reshape(rows // g, g, nb, 2, 2).transpose(0, 2, 3, 1, 4)
    parts = (qs, sc.astype(np.uint8), mn.astype(np.uint8), d)
    blob = np.concatenate([np.ascontiguousarray(a).reshape(rows // g, nb, -1) for a in parts], axis=-1).reshape(-1)
    return blob, blob.view(np.uint16)


@njit(cache=True, inline="always")
def _nearest_int(v):
    """ggml's nearest_int: v + 1.5 * 2^23 in float32, whose low 23 bits less 2^22 are round-half-even(v) for
    |v| < 2^22, and for what no healthy row holds (a NaN from an infinite scale) whatever those bits are."""
    return np.int32(bits_u32(v + _F32(12582912.0)) & np.uint32(0x7FFFFF)) - np.int32(0x400000)


@njit(cache=True, error_model="numpy", inline="always")   # 1 / -0 is -inf (an infinite row), as in C
def _q8_k_row(x, y, yd, ysum):
    """quantize_row_q8_K_ref over one row (q8_k_rows). Written in passes a loop of selects each (the largest
    magnitude, its first value, then the quants and their sums), which LLVM turns into vector code: the same
    arithmetic per value as the one scalar pass the reference writes."""
    for sb in range(x.shape[0] >> 8):
        o = sb << 8
        amax = _F32(0.0)
        for j in range(256):
            a = abs(x[o + j])
            amax = a if a > amax else amax                    # NaN never counts
        if amax == _F32(0.0):
            yd[sb] = _F32(0.0)
            for j in range(256):
                y[o + j] = 0
            for g in range(16):
                ysum[sb * 16 + g] = 0
            continue
        first = 0
        while abs(x[o + first]) != amax:
            first += 1
        iscale = _F32(-127.0) / x[o + first]
        yd[sb] = _F32(1.0) / iscale
        for j in range(256):
            q = min(_nearest_int(iscale * x[o + j]), 127) & 255     # stored to a byte
            y[o + j] = q - 256 if q > 127 else q
        for g in range(16):
            t = _I32(0)
            for j in range(16):
                t += _I32(y[o + g * 16 + j])
            ysum[sb * 16 + g] = t


@njit(parallel=True, cache=True, error_model="numpy")
def q8_k_rows(x, y, yd, ysum, first=0):
    """quantize_row_q8_K_ref over x's rows from ``first`` on, in parallel: per super-block the scale -127 / (the
    first value of largest magnitude, NaNs never), quants round-half-even (nearest_int) clamped at 127 and kept as
    a byte into y, d = 1 / scale into yd, and each 16 quants' sum into ysum (llama.cpp's bsums). The rows are
    indexed, not sliced: a slice's layout is not known to be contiguous, and its loops did not vectorize."""
    for r in prange(first, x.shape[0]):
        _q8_k_row(x[r], y[r], yd[r], ysum[r])


@njit(cache=True, error_model="numpy")
def q8_k_fours(x, y, yd, ysum, rows):
    """ggml_quantize_mat_q8_K_4x8 (its AVX2 code, which AVX-512 builds take too) over x's first ``rows`` rows,
    which the repacked GEMM takes in fours. Per super-block, eight lanes keep the largest |x| of their column
    of 32 registers (maxps: a NaN counts or not by where it sits) and whether a positive value reached it since
    it last grew; the maximum is the lanes' folded as quantize_row_q8_0 folds them, and its sign is + where any
    lane holding it saw it positive (quantize_row_q8_K_ref takes the first value of that magnitude: the two
    differ only where +max and -max both occur, and where NaN or infinity does). Quants convert and saturate as
    quantize_row_q8_0's (q8_blocks); d = 1 / scale unless the maximum is 0."""
    m, pos = np.empty(8, _F32), np.empty(8, np.bool_)
    for r in range(rows):
        for sb in range(x.shape[1] >> 8):
            o = sb << 8
            for l in range(8):
                a = abs(x[r, o + l])
                for g in range(1, 4):
                    a = maxps(a, abs(x[r, o + 8 * g + l]))
                seen = False
                for g in range(4):
                    seen |= x[r, o + 8 * g + l] == a
                for s in range(1, 8):
                    before = a
                    for g in range(4):
                        a = maxps(a, abs(x[r, o + 32 * s + 8 * g + l]))
                    seen &= before == a
                    for g in range(4):
                        seen |= x[r, o + 32 * s + 8 * g + l] == a
                m[l], pos[l] = a, seen
            vmax = maxps(maxps(maxps(m[4], m[0]), maxps(m[6], m[2])),
                          maxps(maxps(m[5], m[1]), maxps(m[7], m[3])))
            positive = False
            for l in range(8):
                positive |= pos[l] and m[l] == vmax
            iscale = _F32(0.0) if vmax == _F32(0.0) else (_F32(-127.0) if positive else _F32(127.0)) / vmax
            yd[r, sb] = _F32(0.0) if vmax == _F32(0.0) else _F32(1.0) / iscale
            for g in range(16):
                t = 0
                for j in range(16):
                    q = min(max(cvt_i32(np.rint(x[r, o + g * 16 + j] * iscale)), -128), 127)
                    y[r, o + g * 16 + j] = q
                    t += q
                ysum[r, sb * 16 + g] = t


@njit(cache=True, inline="always")
def _q8_k(x, fours=0):
    """x quantized to Q8_K: the quants of all rows flat, d per super-block, the sums per 16; the first ``fours``
    rows as the repacked GEMM quantizes them (q8_k_fours), the others as quantize_row_q8_K_ref (q8_k_rows)."""
    n, k = x.shape
    y, yd, ysum = np.empty((n, k), np.int8), np.empty((n, k >> 8), _F32), np.empty((n, k >> 4), _I32)
    q8_k_fours(x, y, yd, ysum, fours)
    q8_k_rows(x, y, yd, ysum, fours)
    return y.reshape(-1), yd, ysum


@njit(cache=True)
def _sub_sums(ysum):
    """Each activation row's sums over its 32-element sub-blocks (two bsums each) as float32 (rows, k / 32): what
    the min integers multiply, converted once for every group of weight rows that meets the row."""
    n, m = ysum.shape
    sums = np.empty((n, m >> 1), _F32)
    for r in range(n):
        for j in range(m >> 1):
            sums[r, j] = _F32(ysum[r, 2 * j] + ysum[r, 2 * j + 1])
    return sums


@njit(cache=True, inline="always")
def _side_mins(v, mn, at, ms, r, b):
    """Side by side, each row's min integer of super-block b for activation row r: sum_j m_j * (the activation's
    sum over sub-block j, from ms: _sub_sums), the rows' eight mins (bytes) from mn[at] ([sub-block][row]);
    exact in float32 (at most 8 * 63 * 4096 < 2^24)."""
    g_rows = width(v)
    imin = vmul(vload(v, mn, at), vsplat(v, ms[r, 8 * b]))
    for j in range(1, 8):
        imin = vfma(vload(v, mn, at + j * g_rows), vsplat(v, ms[r, 8 * b + j]), imin)
    return imin


@njit(cache=True, inline="always")
def _gemm_step(v, dots, wd, wm, mn, lo, g_rows, ms, yd, r, b, p, acc, acc_min):
    """One pair p of sub-blocks of super-block b in Q4_K's GEMM for activation row r, side by side: acc =
    fma(dots, d_w * d_x, acc), acc_min = fma(imin, dmin_w * d_x, acc_min), imin the pair's min integer (the high
    sub-block's term fused onto the low one's product)."""
    dx = vsplat(v, yd[r, b])
    imin = vfma(vload(v, mn, lo + g_rows), vsplat(v, ms[r, 8 * b + 2 * p + 1]),
                vmul(vload(v, mn, lo), vsplat(v, ms[r, 8 * b + 2 * p])))
    return vfma(dots, vmul(wd, dx), acc), vfma(imin, vmul(wm, dx), acc_min)


@njit(cache=True, inline="always")
def _ask_ahead(q, o, g_rows):
    """Prefetch super-block o of pack_q4_k's layout for a group of g_rows rows: the GEMV streams a thread's groups
    one after another, and the hardware's prefetch alone left it waiting on memory (1B-class matrices on two Zen 5
    cores, 49 -> 63 GB/s of GGUF bytes)."""
    for j in range(0, _Q4K_BYTES * g_rows, 64):
        prefetch(q, o * _Q4K_BYTES * g_rows + j)


def q4_k_x8(gemm: bool) -> Callable:
    """The product of Q4_K rows in eights with x (n, k), quantizing x itself: with ``gemm``, as a mul_mat does it
    (rows in fours through the GEMM, the rest one by one), else every row through the GEMV, as llama.cpp's
    mul_mat_id multiplies an expert's rows. A group of G rows side by side (pack_q4_k) meets the GEMM's
    activation rows _GEMM_ROWS at a time (the GEMV's one at a time), lane l holding row l's two chains; the min
    integers are formed in float32, exactly (_side_mins)."""

    @njit(**_exact)
    def product(q, dd, x, out):
        v = _VW
        g_rows = width(v)
        n, k = x.shape
        nb, rows = k >> 8, out.shape[1]
        in_fours = n - (n & 3) if gemm else 0                 # rows the GEMM takes; the rest go one by one
        yf, yd, ysum = _q8_k(x, in_fours)
        ms = _sub_sums(ysum)
        for g in prange((rows + g_rows - 1) // g_rows):
            res = np.empty(_GEMM_ROWS * g_rows, _F32)
            for r in range(0, in_fours, _GEMM_ROWS):        # the GEMM: one FMA per pair of sub-blocks
                a0 = a1 = a2 = a3 = m0 = m1 = m2 = m3 = vzero(v)
                for b in range(nb):
                    qo, yo = (g * nb + b) * _Q4K_BYTES * g_rows, r * k + b * 256
                    so, mo, do = qo + _Q4K_SC * g_rows, qo + _Q4K_MN * g_rows, (qo + _Q4K_D * g_rows) >> 1
                    wd, wm = vload(v, dd, do), vload(v, dd, do + g_rows)
                    for p in range(4):
                        lo, ml = so + 2 * p * g_rows, mo + 2 * p * g_rows
                        p0, p1, p2, p3 = _pair_dots(v, q, qo + 32 * p * g_rows, yf, yo + 64 * p, k, q, lo)
                        a0, m0 = _gemm_step(v, p0, wd, wm, q, ml, g_rows, ms, yd, r, b, p, a0, m0)
                        a1, m1 = _gemm_step(v, p1, wd, wm, q, ml, g_rows, ms, yd, r + 1, b, p, a1, m1)
                        a2, m2 = _gemm_step(v, p2, wd, wm, q, ml, g_rows, ms, yd, r + 2, b, p, a2, m2)
                        a3, m3 = _gemm_step(v, p3, wd, wm, q, ml, g_rows, ms, yd, r + 3, b, p, a3, m3)
                vstore(res, 0, vsub(a0, m0))
                vstore(res, g_rows, vsub(a1, m1))
                vstore(res, 2 * g_rows, vsub(a2, m2))
                vstore(res, 3 * g_rows, vsub(a3, m3))
                for i in range(_GEMM_ROWS):
                    for j in range(min(g_rows, rows - g * g_rows)):
                        out[r + i, g * g_rows + j] = res[i * g_rows + j]
            for r in range(in_fours, n):                     # the GEMV: one FMA per super-block
                acc = acc_min = vzero(v)
                for b in range(nb):
                    if r == in_fours:
                        _ask_ahead(q, g * nb + b + _AHEAD, g_rows)
                    qo, yo = (g * nb + b) * _Q4K_BYTES * g_rows, r * k + b * 256
                    do = (qo + _Q4K_D * g_rows) >> 1
                    dx = vsplat(v, yd[r, b])
                    dw, dm = vmul(vload(v, dd, do), dx), vmul(vload(v, dd, do + g_rows), dx)
                    acc = vfma(_block_dots(v, q, qo, yf, yo, 0, q, qo + _Q4K_SC * g_rows), dw, acc)
                    acc_min = vfma(_side_mins(v, q, qo + _Q4K_MN * g_rows, ms, r, b), dm, acc_min)
                vstore(res, 0, vsub(acc, acc_min))
                for j in range(min(g_rows, rows - g * g_rows)):
                    out[r, g * g_rows + j] = res[j]

    return product


# --- Q2_K in the order of llama.cpp's repacked kernels (AVX-512 builds) ---------------------------------------

def pack_q2_k(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q2_K blocks (rows, nb, 84) -> the values 0-3 as bytes in element order (rows, nb * 256), the sixteen 4-bit
    scales then the sixteen mins as bytes (rows, nb, 32) int8 and (rows, nb, 2) float32 d, dmin."""
    rows, nb = b.shape[:2]
    values = b[:, :, 16:80].reshape(rows, nb, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1) & 3
    sm = np.concatenate([b[:, :, 0:16] & 15, b[:, :, 0:16] >> 4], axis=-1).view(np.int8)
    d = np.ascontiguousarray(b[:, :, 80:84]).view(np.float16).astype(_F32)
    return values.reshape(rows, -1), np.ascontiguousarray(sm), d


_q2_total, _q2_half = k_lanes(16, 0, 1), k_lanes(16, 0, 1, runs=4)


def q2_k_x8(gemm: bool) -> Callable:
    """The product of Q2_K rows in eights with x (n, k), quantizing x itself, as llama.cpp's AVX-512 builds
    multiply the Q2_K matrices they repack (block_q2_Kx8; AVX2 builds do not): ggml_gemv_q2_K_8x8_q8_K for one
    activation row, ggml_gemm_q2_K_8x8_q8_K for four (``gemm``: rows in fours through the GEMM, the rest one by one;
    else every row through the GEMV, as mul_mat_id multiplies an expert's rows). Both form exact integers
    isum = sum_j sc_j * (q . q8 over sub-block j of 16) and imin = sum_j m_j * bsum_j, the GEMV per super-block and
    the GEMM per half (128 elements, two links a super-block), then Q4_K's two chains,
    acc = fma(float(isum), d_w * d_x, acc), acc_min = fma(float(imin), dmin_w * d_x, acc_min), and acc - acc_min.
    The sums stay below 2^24 (16 * 15 * 16 * 3 * 127), exact as floats."""

    @njit(**_exact)
    def product(qv, sm, dd, x, out):
        n, k = x.shape
        nb, rows = k >> 8, out.shape[1]
        in_fours = n - (n & 3) if gemm else 0
        yf, yd, ysum = _q8_k(x, in_fours)
        qf, sf, bf = qv.reshape(-1), sm.reshape(-1), ysum.reshape(-1)
        for i in prange(rows):
            for r in range(n):
                acc, acc_min = _F32(0.0), _F32(0.0)
                for b in range(nb):
                    dw, dm = dd[i, b, 0] * yd[r, b], dd[i, b, 1] * yd[r, b]
                    qo, yo, so = max((i * nb + b) * 256, 0), max(r * k + b * 256, 0), max((i * nb + b) * 32, 0)
                    links = 2 if r < in_fours else 1          # the GEMM's per half, the GEMV's per super-block
                    for h in range(links):
                        if links == 2:
                            isum = vlane(_q2_half(_V8, qf, qo + 128 * h, yf, yo + 128 * h, 0, sf, so + 8 * h, bf, 0,
                                                  0), 0)
                        else:
                            isum = vlane(_q2_total(_V8, qf, qo, yf, yo, 0, sf, so, bf, 0, 0), 0)
                        imin = 0
                        for j in range(16 // links * h, 16 // links * (h + 1)):
                            imin += _I32(sf[so + 16 + j]) * ysum[r, b * 16 + j]
                        acc = fma(isum, dw, acc)
                        acc_min = fma(_F32(imin), dm, acc_min)
                out[r, i] = acc - acc_min

    return product


# --- Q6_K, Q5_K, Q3_K and unrepacked Q4_K and Q2_K: llama.cpp's vec_dot and its tiled kernels -------------------

def _value_bytes(b: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Blocks (rows, nb, size) -> their bytes start .. stop (the values' bit fields, int8_dot.PLANES), a row's
    super-blocks one after another (rows, nb * (stop - start))."""
    return np.ascontiguousarray(b[:, :, start:stop]).reshape(b.shape[0], -1)


def pack_q6_k(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q6_K blocks (rows, nb, 210) -> the values as GGUF keeps them (ql, then qh: rows, nb * 192), the sixteen
    int8 scales (rows, nb, 16) and d as float32 (rows, nb, 1: no min)."""
    d = block_f16(b, 208)[..., None]
    return _value_bytes(b, 0, 192), np.ascontiguousarray(b[:, :, 192:208]).view(np.int8), d


def pack_q3_k(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q3_K blocks (rows, nb, 110) -> the values plus their offset of 4 (0-7: two low bits, and 4 where the high
    bit is set) as bytes in element order (rows, nb * 256), the sixteen 6-bit scales less 32 (rows, nb, 16) int8
    and d as float32 (rows, nb, 1: no min)."""
    rows, nb = b.shape[:2]
    low = b[:, :, 32:96].reshape(rows, nb, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1) & 3
    high = b[:, :, 0:32].reshape(rows, nb, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(8, 1) & 1   # run g: bit g
    lo = b[:, :, 96:104].reshape(rows, nb, 1, 8) >> np.array([0, 4], np.uint8).reshape(2, 1) & 15
    hi = b[:, :, 104:108].reshape(rows, nb, 1, 4) >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1) & 3
    scales = (lo.reshape(rows, nb, 16) | hi.reshape(rows, nb, 16) << 4).astype(np.int8) - np.int8(32)
    d = block_f16(b, 108)[..., None]
    return (low.reshape(rows, nb, 256) | high.reshape(rows, nb, 256) << 2).reshape(rows, -1), scales, d


def pack_q5_k(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q5_K blocks (rows, nb, 176) -> the values as GGUF keeps them (qh, then qs: rows, nb * 160), then as
    _scales_mins_d (the scales and mins as int8)."""
    sm, d = _scales_mins_d(b)
    return _value_bytes(b, 16, 176), sm.view(np.int8), d


def _signed_layout(values: np.ndarray, scales: np.ndarray,
                   d: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A signed format's values (rows, nb * 256) int8, its scales a super-block (rows, nb, 8 or 16) and d
    (rows, nb) -> the values as bytes, the scales as int8 (eight of them followed by eight zero bytes: rows, nb,
    16, the sixteen bytes k_lanes reads) and d as float32 (rows, nb, 1: no min)."""
    sc = np.zeros((*scales.shape[:2], 16), np.int8)
    sc[:, :, :scales.shape[-1]] = scales
    return values.view(np.uint8), sc, np.ascontiguousarray(d, _F32)[..., None]


def pack_iq4_xs(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IQ4_XS blocks (rows, nb, 136) -> _signed_layout of the codes as GGUF keeps them (rows, nb * 128; k_lanes
    looks them up in kvalues_iq4nl) and the scales less 32."""
    _, scales, d = iq4_xs_fields(b)
    return _signed_layout(np.ascontiguousarray(b[:, :, 8:136]).reshape(b.shape[0], -1).view(np.int8), scales, d)


def pack_iq2_xxs(b: np.ndarray) -> tuple[np.ndarray, ...]:
    """IQ2_XXS blocks (rows, nb, 66) -> _signed_layout (each scale of 32 twice)."""
    return _signed_layout(*iq2_xxs_fields(b))


def pack_iq2_xs(b: np.ndarray) -> tuple[np.ndarray, ...]:
    """IQ2_XS blocks (rows, nb, 74) -> _signed_layout."""
    return _signed_layout(*iq2_xs_fields(b))


def pack_iq2_s(b: np.ndarray) -> tuple[np.ndarray, ...]:
    """IQ2_S blocks (rows, nb, 82) -> _signed_layout."""
    return _signed_layout(*iq2_s_fields(b))


def pack_iq1_s(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IQ1_S blocks (rows, nb, 50) -> _signed_layout of the values 8 * grid + delta (1 byte a weight against 0.195
    in GGUF) and the scales 2s + 1."""
    return _signed_layout(*iq1_s_fields(b))


def pack_iq1_m(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IQ1_M blocks (rows, nb, 56) -> as pack_iq1_s, sixteen scales (0.219 bytes a weight in GGUF)."""
    return _signed_layout(*iq1_m_fields(b))


_UNIT_SCALES = np.ones(16, np.int8)     # the ternary types' scales: one row every super-block reads (stride 0)


def _pack_ternary(crumbs: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return crumbs, _UNIT_SCALES, np.ascontiguousarray(d, _F32)[..., None]


def pack_tq2_0(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TQ2_0 blocks (rows, nb, 66) -> the values plus 1 (0-2; 3, which no quantizer writes, read as llama.cpp reads
    it) two bits each, GGUF's 64 bytes a super-block as they are (rows, nb * 64) (element 128h + 32s + l: bits 2s
    of byte 32h + l), the sixteen unit scales every super-block shares and d as float32 (rows, nb, 1: no min)."""
    rows, nb = b.shape[:2]
    return _pack_ternary(np.ascontiguousarray(b[:, :, 0:64]).reshape(rows, -1), block_f16(b, 64).reshape(rows, nb))


def pack_tq1_0(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TQ1_0 blocks (rows, nb, 54) -> as pack_tq2_0: its base-3 digits (the values plus 1) in TQ2_0's bits."""
    values, d = tq1_0_values(b)
    rows, nb = d.shape
    runs = values.reshape(rows, nb, 2, 4, 32) << np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)
    crumbs = runs[:, :, :, 0] | runs[:, :, :, 1] | runs[:, :, :, 2] | runs[:, :, :, 3]
    return _pack_ternary(crumbs.reshape(rows, -1), d)


def pack_iq3_s(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IQ3_S blocks (rows, nb, 110) -> _signed_layout of the signed grid values and the scales 1 + 2 * field."""
    values, scales, d = iq3_s_fields(b)
    return _signed_layout(values, (1 + 2 * scales).astype(np.int8), d)


def pack_iq3_xxs(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IQ3_XXS blocks (rows, nb, 98) -> _signed_layout of the signed grid values and the scales 1 + 2 * field (the
    kernels apply its factor of 1/4)."""
    values, scales, d = iq3_xxs_fields(b)
    return _signed_layout(values, (1 + 2 * scales).astype(np.int8), d)


def pack_q4_k_values(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K blocks (rows, nb, 144) -> as pack_q5_k (its qs: rows, nb * 128): Q4_K rows k_product multiplies."""
    sm, d = _scales_mins_d(b)
    return _value_bytes(b, 16, 144), sm.view(np.int8), d


_TILED_FROM = 8          # activation rows from which llama.cpp's mul_mat(_id) takes its tiled K-quant kernels
# and from which its Q6_K, Q5_K, Q4_K and IQ4_XS chains are formed with rows side by side (_tiled_side), where
# laying a group out pays for itself (640 x 2048 Q6_K on AVX-512: 0.22 ms at 8 rows, ~0.15 of it the layout; 1.5
# at 128)
_SIDE_FROM = 32
_SIDE_PASS = 4           # super-blocks of a group laid side by side at a time: 16 rows' 16 KB of values, in L1
# the formats k_product multiplies, as the constants its kernels branch on
_Q6, _Q5, _Q4, _Q3, _Q2, _IQ4, _IQ2, _IQ1S, _IQ1M, _TQ, _IQ4C = range(11)
_FORMATS = {"q6_k": _Q6, "q5_k": _Q5, "q4_k": _Q4, "q3_k": _Q3, "q2_k": _Q2, "iq4_xs": _IQ4C, "iq2": _IQ2,
            "iq1_s": _IQ1S, "iq1_m": _IQ1M, "ternary": _TQ}
_SCALE_BYTES = {"q2_k": 32, "ternary": 0}                  # a super-block's scale bytes, where not 16
# and its value bytes, where not 256 (a byte a value)
_VALUE_BYTES = {"ternary": PLANES["tq2_0"][0], "iq4_xs": 128, **{f: PLANES[f][0] for f in ("q4_k", "q5_k", "q6_k")}}
# signed grid values as bytes, a scale per 32: IQ4_XS's arithmetic on values IQ4_XS keeps as codes (_IQ4C)
_FORMATS["iq3_s"] = _FORMATS["iq3_xxs"] = _IQ4
# a format's constant factor: its vec_dot multiplies its total by it, its tiled kernels the weight's d
_FACTORS = {"iq2": 0.125, "iq3_xxs": 0.25}
_q6_lanes, _q6_sums, _q6_sums8 = (k_lanes(16, 32, rows, planes="q6_k") for rows in (0, 1, 8))
_q5_lanes, _q5_sums, _q5_sums8 = (k_lanes(32, 0, rows, planes="q5_k") for rows in (0, 1, 8))
_q4_lanes, _q4_sums, _q4_sums8 = (k_lanes(32, 0, rows, planes="q4_k") for rows in (0, 1, 8))
_q3_lanes, _q3_sums, _q3_sums8 = k_lanes(16, 4, 0, lane_bias=True), k_lanes(16, 4, 1), k_lanes(16, 4, 8)
_q2_lanes, _q2_sums, _q2_sums8 = k_lanes(16, 0, 0), _q2_total, k_lanes(16, 0, 8)
_iq4_lanes, _iq4_sums, _iq4_sums8 = (k_lanes(32, 0, rows, signed=True) for rows in (0, 1, 8))
_iq4c_lanes, _iq4c_sums, _iq4c_sums8 = (k_lanes(32, 0, rows, signed=True, codes=IQ4_NL_VALUES.tolist())
                                        for rows in (0, 1, 8))
_iq2_lanes, _iq2_sums, _iq2_sums8 = (k_lanes(16, 0, rows, signed=True) for rows in (0, 1, 8))
# IQ1_S and IQ1_M: the vec_dot's grid lanes and delta lanes (IQ1_S's summed) apart; the tiled kernels' sums of the
# values whole are IQ4_XS's (sub-blocks of 32) and the IQ2 types' (16)
_iq1s_lanes, _iq1s_delta = k_lanes(32, 0, 0, signed=True, part="grid"), k_lanes(32, 0, 1, signed=True, part="delta")
_iq1m_lanes, _iq1m_delta = k_lanes(16, 0, 0, signed=True, part="grid"), k_lanes(16, 0, 0, signed=True, part="delta")
_tq_lanes = k_lanes(16, 1, 0, planes="tq2_0")               # the values plus 1, the 1 out through the sums
_mins, _mins8, _min_pairs = k_mins(1), k_mins(8), k_mins(1, True)
_q2_mins, _q2_mins8, _q2_min_lanes = k_mins(1, sub=16), k_mins(8, sub=16), k_mins(1, True, sub=16)


@njit(cache=True, inline="always")
def _lanes(f, q, qo, y, yo, sc, so, bs, bo):
    """A super-block's eight lanes (int8_dot.k_lanes) of format f, for one activation row."""
    if f == _Q6:
        return _q6_lanes(_V8, q, qo, y, yo, 0, sc, so, bs, bo, 0)
    if f == _Q3:
        return _q3_lanes(_V8, q, qo, y, yo, 0, sc, so, bs, bo, 0)
    if f == _Q2:
        return _q2_lanes(_V8, q, qo, y, yo, 0, sc, so, bs, bo, 0)
    if f == _IQ4:
        return _iq4_lanes(_V8, q, qo, y, yo, 0, sc, so, bs, bo, 0)
    if f == _IQ4C:
        return _iq4c_lanes(_V8, q, qo, y, yo, 0, sc, so, bs, bo, 0)
    if f == _IQ2:
        return _iq2_lanes(_V8, q, qo, y, yo, 0, sc, so, bs, bo, 0)
    if f == _IQ1S:
        return _iq1s_lanes(_V8, q, qo, y, yo, 0, sc, so, bs, bo, 0)
    if f == _IQ1M:
        return _iq1m_lanes(_V8, q, qo, y, yo, 0, sc, so, bs, bo, 0)
    if f == _TQ:
        return _tq_lanes(_V8, q, qo, y, yo, 0, sc, so, bs, bo, 0)
    if f == _Q4:
        return _q4_lanes(_V8, q, qo, y, yo, 0, sc, so, bs, bo, 0)
    return _q5_lanes(_V8, q, qo, y, yo, 0, sc, so, bs, bo, 0)


@njit(cache=True, inline="always")
def _sums(f, eight, q, qo, y, yo, ystep, sc, so, bs, bo, bstep):
    """The tiled kernels' exact integer s1 of a super-block, for eight activation rows (``eight``, lane t row t)
    or one (lane 0)."""
    if f == _Q6:
        return _q6_sums8(_V8, q, qo, y, yo, ystep, sc, so, bs, bo, bstep) if eight else \
            _q6_sums(_V8, q, qo, y, yo, ystep, sc, so, bs, bo, bstep)
    if f == _Q3:
        return _q3_sums8(_V8, q, qo, y, yo, ystep, sc, so, bs, bo, bstep) if eight else \
            _q3_sums(_V8, q, qo, y, yo, ystep, sc, so, bs, bo, bstep)
    if f == _Q2:
        return _q2_sums8(_V8, q, qo, y, yo, ystep, sc, so, bs, bo, bstep) if eight else \
            _q2_sums(_V8, q, qo, y, yo, ystep, sc, so, bs, bo, bstep)
    if f == _IQ4 or f == _IQ1S:
        return _iq4_sums8(_V8, q, qo, y, yo, ystep, sc, so, bs, bo, bstep) if eight else \
            _iq4_sums(_V8, q, qo, y, yo, ystep, sc, so, bs, bo, bstep)
    if f == _IQ4C:
        return _iq4c_sums8(_V8, q, qo, y, yo, ystep, sc, so, bs, bo, bstep) if eight else \
            _iq4c_sums(_V8, q, qo, y, yo, ystep, sc, so, bs, bo, bstep)
    if f == _IQ2 or f == _IQ1M:
        return _iq2_sums8(_V8, q, qo, y, yo, ystep, sc, so, bs, bo, bstep) if eight else \
            _iq2_sums(_V8, q, qo, y, yo, ystep, sc, so, bs, bo, bstep)
    if f == _Q4:
        return _q4_sums8(_V8, q, qo, y, yo, ystep, sc, so, bs, bo, bstep) if eight else \
            _q4_sums(_V8, q, qo, y, yo, ystep, sc, so, bs, bo, bstep)
    return _q5_sums8(_V8, q, qo, y, yo, ystep, sc, so, bs, bo, bstep) if eight else \
        _q5_sums(_V8, q, qo, y, yo, ystep, sc, so, bs, bo, bstep)


@njit(cache=True, inline="always")
def _imin(f, eight, sc, so, bs, bo, bstep):
    """The min integer imin of a super-block (k_mins), for eight activation rows or one (lane 0)."""
    if f == _Q2:
        return _q2_mins8(_V8, sc, so, bs, bo, bstep) if eight else _q2_mins(_V8, sc, so, bs, bo, bstep)
    return _mins8(_V8, sc, so, bs, bo, bstep) if eight else _mins(_V8, sc, so, bs, bo, bstep)


@njit(cache=True, inline="always")
def _tiled_link(f, eight, dd, i, b, factor, q, qo, y, yo, ystep, sc, so, bs, bo, bstep, dx, acc):
    """One super-block of the tiled kernels' chain for eight activation rows (``eight``, lane t row t) or one
    (lane 0): s1 the lanes' exact sum, imin the min integer of the formats with mins, res = (d * factor) * s1,
    res = fnmadd(dmin, imin, res), acc = fma(res, d_x, acc), lane by lane. IQ1_S's and IQ1_M's values are in
    eighths: d / 8 (exact), as tiled takes it."""
    d = dd[i, b, 0] * (_F32(0.125) if f == _IQ1S or f == _IQ1M else factor)
    res = vmul(vsplat(_V8, d), _sums(f, eight, q, qo, y, yo, ystep, sc, so, bs, bo, bstep))
    if f == _Q6 or f == _Q3 or f == _IQ4 or f == _IQ4C or f == _IQ2 or f == _IQ1S or f == _IQ1M:
        return vfma(res, dx, acc)
    return vfma(vfma(vsplat(_V8, -dd[i, b, 1]), _imin(f, eight, sc, so, bs, bo, bstep), res), dx, acc)


@njit(cache=True, inline="always")
def _min_lanes(f, sc, so, bs, bo):
    """The min term of one activation row's vec_dot as its register gets it: Q4_K's four halves, Q2_K's eight
    pairs or Q5_K's integer (k_mins)."""
    if f == _Q4:
        return _min_pairs(_V8, sc, so, bs, bo, 0)
    if f == _Q2:
        return _q2_min_lanes(_V8, sc, so, bs, bo, 0)
    return _mins(_V8, sc, so, bs, bo, 0)


@njit(cache=True, inline="always")
def _delta_lanes(f, q, qo, y, yo, sc, so, bs, bo):
    """The delta's integers of one activation row's IQ1 vec_dot: IQ1_S's one (in lane 0), IQ1_M's eight lanes."""
    if f == _IQ1S:
        return _iq1s_delta(_V8, q, qo, y, yo, 0, sc, so, bs, bo, 0)
    return _iq1m_delta(_V8, q, qo, y, yo, 0, sc, so, bs, bo, 0)


@njit(cache=True, inline="always")
def _vec_dot_total(f, lanes_acc, mins_acc):
    """hsum_float_8 of the lanes, plus the min term: Q5_K's chain, or Q4_K's four lanes added (0 + 2) + (1 + 3)
    (Q2_K's is in the lanes already; Q6_K, Q3_K, IQ4_XS and the ternary types have none); or the delta's chain
    times IQ1S_DELTA / IQ1M_DELTA, 1/8 (IQ1_S's one lane, IQ1_M's eight through hsum_float_8)."""
    if f == _IQ1S:
        return vhsum(lanes_acc) + _F32(0.125) * vlane(mins_acc, 0)
    if f == _IQ1M:
        return vhsum(lanes_acc) + _F32(0.125) * vhsum(mins_acc)
    if f == _Q4:
        return vhsum(lanes_acc) + ((vlane(mins_acc, 0) + vlane(mins_acc, 2)) + (vlane(mins_acc, 1) + vlane(mins_acc, 3)))
    if f == _Q5:
        return vhsum(lanes_acc) + vlane(mins_acc, 0)
    return vhsum(lanes_acc)


_SIDE_ROWS = 8          # activation rows that meet a group's values at once (their chains side by side)
_q6_side, _q5_side = row_k_dots(16, 32, rows=_SIDE_ROWS), row_k_dots(32, 0, rows=_SIDE_ROWS)
_iq4_side = row_k_dots(32, 0, codes=IQ4_NL_VALUES.tolist(), rows=_SIDE_ROWS)
_Q6_START, _IQ4_START = k_start(32, False), k_start(0, True)   # what their sub-blocks' sums start from


@njit(cache=True)
def _starts(ysum, per, start):
    """Each activation row's start of every sub-block of ``per`` (16 or 32) elements for row_k_dots: ``start``
    times the sum of the row's quants there."""
    n, m = ysum.shape
    runs = per >> 4
    starts = np.empty((n, m // runs), _I32)
    for r in range(n):
        for j in range(m // runs):
            total = 0
            for i in range(runs):
                total += ysum[r, runs * j + i]
            starts[r, j] = start * total
    return starts


@njit(cache=True, inline="always")
def _load_rows(v, chains, at):
    """The _SIDE_ROWS chains of consecutive activation rows from chains[at] (a register's width apart)."""
    g = width(v)
    return (vload(v, chains, at), vload(v, chains, at + g), vload(v, chains, at + 2 * g), vload(v, chains, at + 3 * g),
            vload(v, chains, at + 4 * g), vload(v, chains, at + 5 * g), vload(v, chains, at + 6 * g),
            vload(v, chains, at + 7 * g))


@njit(cache=True, inline="always")
def _store_rows(v, chains, at, a0, a1, a2, a3, a4, a5, a6, a7):
    """_load_rows' way back."""
    g = width(v)
    for i, a in enumerate((a0, a1, a2, a3, a4, a5, a6, a7)):
        vstore(chains, at + i * g, a)


@njit(cache=True)
def _zero_rows(yf, yd, ysum, k):
    """Q8_K activation rows (flat quants, d, sums per 16) with rows of zeros after them up to a multiple of
    _SIDE_ROWS: a run of rows that reaches past the last reads those."""
    n = yd.shape[0]
    n_pad = (n + _SIDE_ROWS - 1) // _SIDE_ROWS * _SIDE_ROWS
    if n_pad == n:
        return yf, yd, ysum
    yf2, yd2 = np.zeros(n_pad * k, np.int8), np.zeros((n_pad, yd.shape[1]), _F32)
    ysum2 = np.zeros((n_pad, ysum.shape[1]), _I32)
    for i in range(n * k):              # loops, not slice copies: those compile numpy's shape errors (seconds)
        yf2[i] = yf[i]
    for r in range(n):
        for b in range(yd.shape[1]):
            yd2[r, b] = yd[r, b]
        for j in range(ysum.shape[1]):
            ysum2[r, j] = ysum[r, j]
    return yf2, yd2, ysum2


@njit(cache=True, inline="always")
def _side_chain(f, v, s1, d, mins, t, ms, yd, r, b, acc):
    """One activation row's chain after super-block b (pass slot t): res = d_w * float(s1), less dmin_w *
    float(imin) for the formats with mins, then acc = fma(res, d_x, acc)."""
    g_rows = width(v)
    res = vmul(vload(v, d, 2 * t * g_rows), s1)
    if f != _Q6 and f != _IQ4C:
        res = vfma(vload(v, d, (2 * t + 1) * g_rows), _side_mins(v, mins, t * 8 * g_rows, ms, r, b), res)
    return vfma(res, vsplat(v, yd[r, b]), acc)


@njit(**_exact)
def _tiled_side(f, qv, sc, dd, yf, yd, ysum, out):
    """ggml-cpu/tiled's chains for Q6_K, Q5_K and Q4_K (their values 0-31 / 0-15, scales and mins) or IQ4_XS (its
    codes) rows, every activation row: per super-block res = d_w * float(s1), less dmin_w * float(imin) (Q5_K,
    Q4_K), acc = fma(res, d_x, acc). A group of G rows is laid side by side (values or codes in chunks of four
    bytes a row, int8_dot.row_k_dots; scales, mins and d a row each), _SIDE_PASS super-blocks at a time, which
    then meet every activation row while they sit in L1, lane l holding row l's chain (kept in memory between
    passes, as float32: the same chain): no sum across lanes, where the eight activation rows in lanes need one
    per super-block. _SIDE_ROWS activation rows meet each loaded chunk of values (rows of zero quants after the
    last, whose chains are not read). imin is formed in float32, exactly (_side_mins)."""
    g_rows = width(_VW)
    yf, yd, ysum = _zero_rows(yf, yd, ysum, yd.shape[1] << 8)
    ms = _sub_sums(ysum)
    st = _starts(ysum, 16, _Q6_START) if f == _Q6 else _starts(ysum, 32, _IQ4_START) if f == _IQ4C else ysum
    for g in prange((out.shape[1] + g_rows - 1) // g_rows):
        _side_group(f, np.int64(g), qv, sc, dd, yf, yd, st, ms, out)    # one signature in and outside the loop


_unpack_q6, _unpack_q5, _unpack_q4 = (plane_values(p, WIDE_LANES) for p in ("q6_k", "q5_k", "q4_k"))


@njit(cache=True, inline="always")
def _unpack(f, q, qo, dst, do):
    """A group's super-block of Q6_K, Q5_K or Q4_K values, side by side, from their bit fields to bytes (a group's
    words of each field side by side: int8_dot.plane_values)."""
    if f == _Q6:
        _unpack_q6(q, qo, dst, do)
    elif f == _Q5:
        _unpack_q5(q, qo, dst, do)
    else:
        _unpack_q4(q, qo, dst, do)


@njit(cache=True)
def _side_group(f, g, qv, sc, dd, yf, yd, st, ms, out):
    """_tiled_side's group g: the body of its parallel loop, a function of its own (inside the loop, numba's
    analysis of parallel code took seconds per format to compile it). A super-block's values as stored are laid
    side by side in 4-byte words, and those kept in bit fields then unpacked side by side (IQ4_XS's codes are
    looked up as they are)."""
    v = _VW
    g_rows = width(v)
    codes = f == _IQ4C
    words = 32 if codes else 64                               # a super-block's 4-byte words a row, side by side
    n, nb, rows = out.shape[0], yd.shape[1], out.shape[1]
    k, kept = nb << 8, qv.shape[1] // (4 * nb)                # kept: a super-block's words a row as stored
    src = qv.reshape(-1).view(np.uint32)
    n_pad = yd.shape[0]                                       # rows up to a multiple of _SIDE_ROWS (_zero_rows)
    starts, per_row = st.reshape(-1), st.shape[1]             # the sub-blocks' starts (_starts), where read
    values = np.zeros(_SIDE_PASS * words * g_rows, np.uint32)   # [super-block][word][row]
    packed = np.zeros(kept * g_rows, np.uint32)                  # one super-block's stored words: [word][row]
    scales = np.zeros(_SIDE_PASS * 16 * g_rows, np.int8)         # [super-block][scale][row]
    mins = np.zeros(_SIDE_PASS * 8 * g_rows, _F32)               # [super-block][min][row]
    d = np.zeros(_SIDE_PASS * 2 * g_rows, _F32)                  # [super-block][d, -dmin][row]
    q = values.view(np.uint8)
    chains = np.zeros(n_pad * g_rows, _F32)                      # [activation row][row]
    live = min(g_rows, rows - g * g_rows)                      # the group's rows (the last group's may be fewer)
    for b0 in range(0, nb, _SIDE_PASS):
        for b in range(b0, min(nb, b0 + _SIDE_PASS)):
            first, t = (g * g_rows * nb + b) * kept, b - b0
            side, at = (values, t * words * g_rows) if codes else (packed, 0)
            for c in range(0, kept if live == g_rows else 0, g_rows):     # a whole group: g_rows words at a time,
                c = min(c, kept - g_rows)                                 # the last ones again where they overlap
                vtranspose(v, src, first + c, nb * kept, side, at + c * g_rows)
            for l in range(live if live < g_rows else 0):
                for c in range(kept):
                    side[at + c * g_rows + l] = src[first + l * nb * kept + c]
            if not codes:
                _unpack(f, packed.view(np.uint8), 0, q, t * 256 * g_rows)
        for l in range(live):
            i = g * g_rows + l
            for b in range(b0, min(nb, b0 + _SIDE_PASS)):
                t = b - b0
                for j in range(16):
                    scales[(t * 16 + j) * g_rows + l] = sc[i, b, j]
                for j in range(8):
                    mins[(t * 8 + j) * g_rows + l] = _F32(sc[i, b, 8 + j])
                d[(t * 2) * g_rows + l] = dd[i, b, 0]
                if f == _Q5 or f == _Q4:                       # the formats with mins (the others keep d alone)
                    d[(t * 2 + 1) * g_rows + l] = -dd[i, b, 1]
        for r in range(0, n_pad, _SIDE_ROWS):
            a0, a1, a2, a3, a4, a5, a6, a7 = _load_rows(v, chains, r * g_rows)
            for b in range(b0, min(nb, b0 + _SIDE_PASS)):
                t = b - b0
                qo, yo, so = t * 4 * words * g_rows, r * k + b * 256, t * 16 * g_rows
                bo = r * per_row + b * (per_row // nb)
                if f == _Q6:
                    s0, s1, s2, s3, s4, s5, s6, s7 = _q6_side(v, q, qo, yf, yo, k, scales, so, starts, bo, per_row)
                elif codes:
                    s0, s1, s2, s3, s4, s5, s6, s7 = _iq4_side(v, q, qo, yf, yo, k, scales, so, starts, bo, per_row)
                else:
                    s0, s1, s2, s3, s4, s5, s6, s7 = _q5_side(v, q, qo, yf, yo, k, scales, so, starts, bo, per_row)
                a0 = _side_chain(f, v, s0, d, mins, t, ms, yd, r, b, a0)
                a1 = _side_chain(f, v, s1, d, mins, t, ms, yd, r + 1, b, a1)
                a2 = _side_chain(f, v, s2, d, mins, t, ms, yd, r + 2, b, a2)
                a3 = _side_chain(f, v, s3, d, mins, t, ms, yd, r + 3, b, a3)
                a4 = _side_chain(f, v, s4, d, mins, t, ms, yd, r + 4, b, a4)
                a5 = _side_chain(f, v, s5, d, mins, t, ms, yd, r + 5, b, a5)
                a6 = _side_chain(f, v, s6, d, mins, t, ms, yd, r + 6, b, a6)
                a7 = _side_chain(f, v, s7, d, mins, t, ms, yd, r + 7, b, a7)
            _store_rows(v, chains, r * g_rows, a0, a1, a2, a3, a4, a5, a6, a7)
    for r in range(n):      # a register a row: copied element by element, LLVM scattered it (14% of the product)
        if live == g_rows:
            vstore(out[r], g * g_rows, vload(v, chains, r * g_rows))
        else:
            for l in range(live):
                out[r, g * g_rows + l] = chains[r * g_rows + l]


def k_product(fmt: str) -> Callable:
    """The product of Q6_K (fmt "q6_k"), Q5_K ("q5_k"), Q4_K ("q4_k"), Q3_K ("q3_k"), Q2_K ("q2_k"), IQ4_XS
    ("iq4_xs"), IQ3_S ("iq3_s", as IQ4_XS), IQ3_XXS ("iq3_xxs", as IQ4_XS with a factor of 1/4), IQ2_XXS, IQ2_XS and
    IQ2_S ("iq2": IQ4_XS's signed lanes over sub-blocks of 16, a factor of 1/8) or TQ1_0 and TQ2_0 ("ternary") rows
    with x (n, k), quantizing x itself (Q8_K), as llama.cpp's mul_mat and mul_mat_id multiply a matrix it does not
    repack: below _TILED_FROM rows (the ternary types: always), ggml_vec_dot_q6_K_q8_K / _q5_K_q8_K / _q4_K_q8_K /
    _q3_K_q8_K / _q2_K_q8_K / _iq4_xs_q8_K / _iq3_s_q8_K / _iq3_xxs_q8_K / _iq2_xxs_q8_K / _iq2_xs_q8_K /
    _iq2_s_q8_K / _tq1_0_q8_K / _tq2_0_q8_K (their AVX2 code, which AVX-512 builds take too; the ternary ones' sum
    of the values plus 1 less the activation's sums in int16 lanes, which cannot overflow, and their mul + add,
    which the build contracts): per super-block eight int32 lanes (int8_dot.k_lanes; Q4_K's as Q5_K's; Q3_K's values
    signed, its offset of 4 out of each lane's own products; IQ4_XS's signed values through the sign trick,
    sub-blocks of 32, no offset; the ternary types' as Q6_K's with unit scales and an offset of 1, from two bits a
    value), acc = fma(d_x * d_w, float(lane), acc) lane by lane, hsum_float_8 at the end, and the min term: Q5_K's
    chained apart, added last, summs = fma(-d_x * dmin_w, float(imin), summs) (the build contracts it), Q4_K's the
    same in four lanes, lane p the terms of sub-blocks 2p and 2p + 1, added (0 + 2) + (1 + 3); Q2_K's in the lanes'
    own chain, each super-block acc = fma(-d_x * dmin_w, float(pair), acc) before its lanes' FMA, pair p the terms
    of its sub-blocks 2p and 2p + 1 (of 16). From _TILED_FROM rows, ggml-cpu/tiled (Q4_K's as Q5_K's): per
    super-block the exact integer s1 (all lanes' sum) and the min integer imin of the formats with mins, res = d_w *
    float(s1), res = fnmadd(dmin_w, float(imin), res), acc = fma(res, d_x, acc) (AVX2 and AVX512-VNNI microkernels
    alike; their final add is contracted); here eight activation rows at a time, one in each lane, which share the
    weight's loads. imin = sum_j m_j * (the activation's sum over sub-block j). A format's factor (_FACTORS:
    IQ3_XXS's 1/4, the IQ2 types' 1/8) goes where llama.cpp puts it: its vec_dot's total is factor * hsum_float_8,
    its tiled kernels' d is f16(d) * factor. IQ1_S ("iq1_s") and IQ1_M ("iq1_m"), values 8 * grid + delta:
    ggml_vec_dot_iq1_s_q8_K / _iq1_m_q8_K chain the grid's lanes (sub-blocks of 32 / 16) as IQ4_XS's and the delta's
    apart, acc1 = fma(d_x * d_w, float(delta), acc1): IQ1_S's one integer (the build contracts its scalar chain),
    IQ1_M's eight lanes; the result hsum_float_8(acc) + 1/8 * acc1 (IQ1_M: hsum_float_8(acc1)). The tiled kernels
    multiply the values whole, with d_w / 8."""
    if fmt not in _FORMATS:
        raise ValueError(f"k_product: unknown format {fmt!r}")
    f, stride, vstride = _FORMATS[fmt], _SCALE_BYTES.get(fmt, 16), _VALUE_BYTES.get(fmt, 256)
    factor = _F32(_FACTORS.get(fmt, 1.0))

    @njit(**_exact)
    def product(qv, sc, dd, x, out):
        n, k = x.shape
        nb, rows = k >> 8, out.shape[1]
        yf, yd, ysum = _q8_k(x)
        qf, sf, bf = qv.reshape(-1), sc.reshape(-1), ysum.reshape(-1)
        ydt = np.ascontiguousarray(yd.T).reshape(-1)         # d_x of rows r .. r + 7 side by side
        tiled = n >= _TILED_FROM and f != _TQ                # ggml-cpu/tiled leaves the ternary types to the vec_dot
        if n >= _SIDE_FROM and (f == _Q6 or f == _Q5 or f == _Q4 or f == _IQ4C):
            _tiled_side(f, qv, sc, dd, yf, yd, ysum, out)
            return
        in_eights = n - (n & 7) if tiled else 0
        for i in prange(rows):
            for r in range(0, in_eights, 8):                  # the tiled kernels, eight rows at a time
                acc = vzero(_V8)
                for b in range(nb):
                    acc = _tiled_link(f, True, dd, i, b, factor, qf, max((i * nb + b) * vstride, 0), yf,
                                      max(r * k + b * 256, 0), k, sf, max((i * nb + b) * stride, 0), bf,
                                      max((r * nb + b) * 16, 0), nb * 16, vload(_V8, ydt, max(b * n + r, 0)), acc)
                for t in range(8):
                    out[r + t, i] = vlane(acc, t)
            for r in range(in_eights, n):
                acc, mins_acc, lanes_acc = vzero(_V8), vzero(_V8), vzero(_V8)
                for b in range(nb):
                    qo, yo = max((i * nb + b) * vstride, 0), max(r * k + b * 256, 0)
                    so, bo = max((i * nb + b) * stride, 0), max((r * nb + b) * 16, 0)
                    for j in range(0, vstride if r == in_eights else 0, 64):     # once, for the first row
                        prefetch(qf, qo + _VALUES_AHEAD + j)
                    if tiled:                                 # the tiled kernels' last rows
                        acc = _tiled_link(f, False, dd, i, b, factor, qf, qo, yf, yo, 0, sf, so, bf, bo, 0,
                                          vsplat(_V8, yd[r, b]), acc)
                        continue
                    if f == _Q2:                              # the vec_dot: Q2_K's mins go first into its chain
                        lanes_acc = vfma(vsplat(_V8, -yd[r, b] * dd[i, b, 1]), _min_lanes(f, sf, so, bf, bo),
                                         lanes_acc)
                    elif f == _Q5 or f == _Q4:
                        mins_acc = vfma(vsplat(_V8, -yd[r, b] * dd[i, b, 1]), _min_lanes(f, sf, so, bf, bo),
                                        mins_acc)
                    elif f == _IQ1S or f == _IQ1M:               # the delta's chain, beside the grid's
                        mins_acc = vfma(vsplat(_V8, yd[r, b] * dd[i, b, 0]),
                                        _delta_lanes(f, qf, qo, yf, yo, sf, so, bf, bo), mins_acc)
                    lanes_acc = vfma(vsplat(_V8, yd[r, b] * dd[i, b, 0]), _lanes(f, qf, qo, yf, yo, sf, so, bf, bo),
                                     lanes_acc)
                out[r, i] = vlane(acc, 0) if tiled else factor * _vec_dot_total(f, lanes_acc, mins_acc)

    return product
