"""The K-quants (and IQ4_XS, on their super-blocks) bit for bit: Q4_K in the order of llama.cpp's repacked 8x8
kernels, Q6_K, Q5_K, IQ4_XS and the Q4_K matrices it does not repack in that of its vec_dot and tiled kernels.

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
Q6_K and Q5_K, which x86 builds never repack, and Q4_K matrices whose rows do not come in eights or that are
one of a 3-D weight's (never repacked either) go through ggml_vec_dot_q6_K_q8_K / _q5_K_q8_K / _q4_K_q8_K below 8
activation rows and through ggml-cpu/tiled from 8 (k_product). Both form per super-block exact int32 lane sums
of unsigned values times Q8_K quants, which the host's integer dot product forms here too (int8_dot.k_lanes).
Layout (pack_q6_k, pack_q5_k, pack_q4_k_values): the values as bytes in element order (1 byte a weight: 0.82 /
0.69 / 0.56 in GGUF), 16 scale bytes a super-block (Q6_K's int8 scales; Q5_K's and Q4_K's scales and mins as
pack_q4_k's) and d, dmin as
float32 (Q6_K's dmin 0): the lane sums read 32 values with one load, as ggml's do after it has assembled them.
IQ4_XS (256-element super-blocks of 4-bit codes into kvalues_iq4nl, an f16 d and eight 6-bit scales less 32) is
never repacked either and takes the same two kernels (ggml_vec_dot_iq4_xs_q8_K, tiled's sign-trick MAC): Q6_K's
arithmetic on signed values (pack_iq4_xs: the values as int8 bytes, 1 byte a weight against 0.53 in GGUF).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from numba import njit, prange

from graphir.backends.numba.primitives.bits import fma
from graphir.backends.numba.primitives.simd import lanes, vfma, vhsum, vlane, vload, vmul, vsplat, vzero
from graphir.backends.numba.quant.blocks import iq4_xs_fields, k_scales
from graphir.backends.numba.quant.int8_dot import k_lanes, k_mins, nibble_lanes

_V8 = lanes(8)
_low, _high = nibble_lanes(False), nibble_lanes(True)

_F32 = np.float32
_I32 = np.int32
_exact = dict(parallel=True, cache=True)                  # no FMA contraction but the written ones: bit-exact


def _scales_mins_d(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K blocks (rows, nb, size) -> scales and mins (rows, nb, 16) uint8 (eight 6-bit scales, then
    eight mins) and (rows, nb, 2) float32 d, dmin."""
    sc, mn = k_scales(b[:, :, 4:16])
    d = np.ascontiguousarray(b[:, :, 0:4]).view(np.float16).astype(_F32).reshape(*b.shape[:2], 2)
    return np.ascontiguousarray(np.concatenate([sc, mn], axis=-1).astype(np.uint8)), d


def pack_q4_k(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K blocks (rows, nb, 144) -> quant bytes (rows, nb * 128), _scales_mins_d."""
    return (np.ascontiguousarray(b[:, :, 16:144]).reshape(b.shape[0], -1), *_scales_mins_d(b))


@njit(cache=True)
def q8_k_rows(x, y, yd, ysum):
    """quantize_row_q8_K_ref over each row of x: per super-block the scale -127 / (the first value of largest
    magnitude), quants round-half-even clamped at 127 into y, d = 1 / scale into yd, and each 16 quants' sum
    into ysum (llama.cpp's bsums)."""
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
                for g in range(16):
                    ysum[r, sb * 16 + g] = 0
                continue
            iscale = _F32(-127.0) / vmax
            yd[r, sb] = _F32(1.0) / iscale
            for g in range(16):
                t = 0
                for j in range(16):
                    q = _I32(min(np.rint(iscale * x[r, o + g * 16 + j]), _F32(127.0)))
                    y[r, o + g * 16 + j] = q
                    t += q
                ysum[r, sb * 16 + g] = t


@njit(cache=True, inline="always")
def _q8_k(x):
    """x quantized to Q8_K (q8_k_rows): the quants of all rows flat, d per super-block, the sums per 16."""
    n, k = x.shape
    y, yd, ysum = np.empty((n, k), np.int8), np.empty((n, k >> 8), _F32), np.empty((n, k >> 4), _I32)
    q8_k_rows(x, y, yd, ysum)
    return y.reshape(-1), yd, ysum


@njit(cache=True, inline="always")
def _sub_block_sum(ysum, r, b, j):
    """The sum of activation row r's quants over 32-element sub-block j of super-block b (two bsums)."""
    return ysum[r, b * 16 + 2 * j] + ysum[r, b * 16 + 2 * j + 1]


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
        yf, yd, ysum = _q8_k(x)
        qf, sf = qs.reshape(-1), sm.reshape(-1)
        in_fours = n - (n & 3) if gemm else 0                 # rows the GEMM takes; the rest go one by one
        for i in prange(rows):
            for r in range(n):
                acc, acc_min = _F32(0.0), _F32(0.0)
                for b in range(nb):
                    dw, dm = dd[i, b, 0] * yd[r, b], dd[i, b, 1] * yd[r, b]
                    qo, yo, so = max((i * nb + b) * 128, 0), max(r * k + b * 256, 0), max((i * nb + b) * 16, 0)
                    if r < in_fours:                          # the GEMM: one FMA per pair of sub-blocks
                        for p in range(4):
                            imin = _I32(sf[so + 8 + 2 * p]) * _sub_block_sum(ysum, r, b, 2 * p) \
                                + _I32(sf[so + 9 + 2 * p]) * _sub_block_sum(ysum, r, b, 2 * p + 1)
                            acc = fma(_scaled_dots(qf, qo + 32 * p, yf, yo + 64 * p, sf, so + 2 * p, 1), dw, acc)
                            acc_min = fma(_F32(imin), dm, acc_min)
                    else:                                     # the GEMV: one FMA per super-block
                        imin = 0
                        for j in range(8):
                            imin += _I32(sf[so + 8 + j]) * _sub_block_sum(ysum, r, b, j)
                        acc = fma(_scaled_dots(qf, qo, yf, yo, sf, so, 4), dw, acc)
                        acc_min = fma(_F32(imin), dm, acc_min)
                out[r, i] = acc - acc_min

    return product


# --- Q6_K and Q5_K: llama.cpp's vec_dot and its tiled kernels -------------------------------------------------

def pack_q6_k(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q6_K blocks (rows, nb, 210) -> the values 0-63 as bytes in element order (rows, nb * 256), the sixteen
    int8 scales (rows, nb, 16) and (rows, nb, 2) float32 d, 0 (no min)."""
    rows, nb = b.shape[:2]
    ql, qh = b[:, :, 0:128].reshape(rows, nb, 2, 1, 64), b[:, :, 128:192].reshape(rows, nb, 2, 1, 32)
    low = np.concatenate([ql[..., :32] & 15, ql[..., 32:] & 15, ql[..., :32] >> 4, ql[..., 32:] >> 4], axis=3)
    high = qh >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1) & 3              # [half][run of 32][l]
    d = np.zeros((rows, nb, 2), _F32)
    d[:, :, 0] = np.ascontiguousarray(b[:, :, 208:210]).view(np.float16)[..., 0]
    return (low | high << 4).reshape(rows, -1), np.ascontiguousarray(b[:, :, 192:208]).view(np.int8), d


def _nibble_runs(qs: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K nibble bytes (rows, nb, 128) -> (rows, nb, 8, 32): run 2j + t of 32 elements, the low (t = 0)
    or high nibbles of bytes 32j .. 32j + 31."""
    qs = qs.reshape(*qs.shape[:2], 4, 1, 32)
    return np.concatenate([qs & 15, qs >> 4], axis=3).reshape(*qs.shape[:2], 8, 32)


def pack_q5_k(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q5_K blocks (rows, nb, 176) -> the values 0-31 as bytes in element order (rows, nb * 256), then as
    _scales_mins_d (the scales and mins as int8)."""
    rows, nb = b.shape[:2]
    fifth = b[:, :, 16:48].reshape(rows, nb, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(8, 1) & 1  # run g: bit g
    sm, d = _scales_mins_d(b)
    return (_nibble_runs(b[:, :, 48:176]) | fifth << 4).reshape(rows, -1), sm.view(np.int8), d


def pack_iq4_xs(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IQ4_XS blocks (rows, nb, 136) -> the values (kvalues_iq4nl) as int8 bytes in element order (rows, nb * 256),
    the eight scales less 32 as int8 then eight zero bytes (rows, nb, 16: the sixteen bytes k_lanes reads) and
    (rows, nb, 2) float32 d, 0 (no min)."""
    values, scales, d = iq4_xs_fields(b)
    rows, nb = b.shape[:2]
    sc = np.zeros((rows, nb, 16), np.int8)
    sc[:, :, :8] = scales
    return values.view(np.uint8), sc, np.stack([d, np.zeros_like(d)], axis=-1)


def pack_q4_k_values(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K blocks (rows, nb, 144) -> as pack_q5_k (the values 0-15): Q4_K rows k_product multiplies."""
    sm, d = _scales_mins_d(b)
    return _nibble_runs(b[:, :, 16:144]).reshape(b.shape[0], -1), sm.view(np.int8), d


_TILED_FROM = 8          # activation rows from which llama.cpp's mul_mat(_id) takes its tiled K-quant kernels
_q6_lanes, _q6_sums, _q6_sums8 = k_lanes(16, 32, 0), k_lanes(16, 32, 1), k_lanes(16, 32, 8)
_q5_lanes, _q5_sums, _q5_sums8 = k_lanes(32, 0, 0), k_lanes(32, 0, 1), k_lanes(32, 0, 8)
_iq4_lanes, _iq4_sums, _iq4_sums8 = (k_lanes(32, 0, rows, signed=True) for rows in (0, 1, 8))
# the lane shapes of k_product's formats: Q6_K's (sub-blocks of 16, values offset by 32), Q5_K's (and unrepacked
# Q4_K's, whose values are Q5_K's without the fifth bit; with a min term), IQ4_XS's (signed values, no min)
_Q6, _Q5, _IQ4 = 0, 1, 2
_mins, _mins8, _min_pairs = k_mins(1), k_mins(8), k_mins(1, True)


@njit(cache=True, inline="always")
def _lanes(shape, q, qo, y, yo, sc, so, bs, bo):
    """A super-block's eight lanes (int8_dot.k_lanes) of the lane shape ``shape``, for one activation row."""
    if shape == _Q6:
        return _q6_lanes(_V8, q, qo, y, yo, 0, sc, so, bs, bo, 0)
    if shape == _IQ4:
        return _iq4_lanes(_V8, q, qo, y, yo, 0, sc, so, bs, bo, 0)
    return _q5_lanes(_V8, q, qo, y, yo, 0, sc, so, bs, bo, 0)


@njit(cache=True, inline="always")
def _tiled_link(shape, eight, dd, i, b, q, qo, y, yo, ystep, sc, so, bs, bo, bstep, dx, acc):
    """One super-block of the tiled kernels' chain for eight activation rows (``eight``, lane t row t) or one
    (lane 0): s1 the lanes' exact sum, imin Q5_K's min integer, res = d * s1, res = fnmadd(dmin, imin, res),
    acc = fma(res, d_x, acc), lane by lane."""
    if shape != _Q5:                                          # no min term
        if shape == _Q6:
            s1 = _q6_sums8(_V8, q, qo, y, yo, ystep, sc, so, bs, bo, bstep) if eight else \
                _q6_sums(_V8, q, qo, y, yo, ystep, sc, so, bs, bo, bstep)
        else:
            s1 = _iq4_sums8(_V8, q, qo, y, yo, ystep, sc, so, bs, bo, bstep) if eight else \
                _iq4_sums(_V8, q, qo, y, yo, ystep, sc, so, bs, bo, bstep)
        return vfma(vmul(vsplat(_V8, dd[i, b, 0]), s1), dx, acc)
    s1 = _q5_sums8(_V8, q, qo, y, yo, ystep, sc, so, bs, bo, bstep) if eight else \
        _q5_sums(_V8, q, qo, y, yo, ystep, sc, so, bs, bo, bstep)
    imin = _mins8(_V8, sc, so, bs, bo, bstep) if eight else _mins(_V8, sc, so, bs, bo, bstep)
    return vfma(vfma(vsplat(_V8, -dd[i, b, 1]), imin, vmul(vsplat(_V8, dd[i, b, 0]), s1)), dx, acc)


@njit(cache=True, inline="always")
def _min_lanes(q4, sc, so, bs, bo):
    """The min term of one activation row's vec_dot as its register gets it: Q4_K's four halves or Q5_K's
    integer (k_mins)."""
    return _min_pairs(_V8, sc, so, bs, bo, 0) if q4 else _mins(_V8, sc, so, bs, bo, 0)


@njit(cache=True, inline="always")
def _vec_dot_total(no_min, q4, lanes_acc, mins_acc):
    """hsum_float_8 of the lanes, plus the min term: Q5_K's chain, or Q4_K's four lanes added (0 + 2) + (1 + 3)."""
    if no_min:
        return vhsum(lanes_acc)
    if q4:
        return vhsum(lanes_acc) + ((vlane(mins_acc, 0) + vlane(mins_acc, 2)) + (vlane(mins_acc, 1) + vlane(mins_acc, 3)))
    return vhsum(lanes_acc) + vlane(mins_acc, 0)


def k_product(fmt: str) -> Callable:
    """The product of Q6_K (fmt "q6_k"), Q5_K ("q5_k"), Q4_K ("q4_k") or IQ4_XS ("iq4_xs") rows with x (n, k),
    quantizing x itself (Q8_K), as llama.cpp's mul_mat and mul_mat_id multiply a matrix it does not repack: below
    _TILED_FROM rows, ggml_vec_dot_q6_K_q8_K / _q5_K_q8_K / _q4_K_q8_K (their AVX2 code, which AVX-512 builds
    take too): per super-block eight int32 lanes (int8_dot.k_lanes; Q4_K's as Q5_K's), acc = fma(d_x * d_w,
    float(lane), acc) lane by lane, hsum_float_8 at the end, and the min term chained apart, added last: Q5_K's
    summs = fma(-d_x * dmin_w, float(imin), summs) (the build contracts it), Q4_K's the same in four lanes, lane p
    the terms of sub-blocks 2p and 2p + 1, added (0 + 2) + (1 + 3). From _TILED_FROM rows, ggml-cpu/tiled
    (Q4_K's as Q5_K's): per super-block the
    exact integer s1 (all lanes' sum) and Q5_K's imin, res = d_w * float(s1), res = fnmadd(dmin_w, float(imin),
    res), acc = fma(res, d_x, acc) (AVX2 and AVX512-VNNI microkernels alike; their final add is contracted);
    here eight activation rows at a time, one in each lane, which share the weight's loads.
    imin = sum_j m_j * (the activation's sum over sub-block j).
    IQ4_XS (ggml_vec_dot_iq4_xs_q8_K's AVX2 code, the tiled kernels' sign-trick MAC) is Q6_K's arithmetic on
    its own lanes: the values signed, sub-blocks of 32, no offset and no min term."""
    if fmt not in ("q6_k", "q5_k", "q4_k", "iq4_xs"):
        raise ValueError(f"k_product: unknown format {fmt!r}")
    shape = {"q6_k": _Q6, "iq4_xs": _IQ4}.get(fmt, _Q5)
    no_min, q4 = shape != _Q5, fmt == "q4_k"

    @njit(**_exact)
    def product(qv, sc, dd, x, out):
        n, k = x.shape
        nb, rows = k >> 8, out.shape[1]
        yf, yd, ysum = _q8_k(x)
        qf, sf, bf = qv.reshape(-1), sc.reshape(-1), ysum.reshape(-1)
        ydt = np.ascontiguousarray(yd.T).reshape(-1)         # d_x of rows r .. r + 7 side by side
        tiled = n >= _TILED_FROM
        in_eights = n - (n & 7) if tiled else 0
        for i in prange(rows):
            for r in range(0, in_eights, 8):                  # the tiled kernels, eight rows at a time
                acc = vzero(_V8)
                for b in range(nb):
                    acc = _tiled_link(shape, True, dd, i, b, qf, max((i * nb + b) * 256, 0), yf, max(r * k + b * 256, 0),
                                      k, sf, max((i * nb + b) * 16, 0), bf, max((r * nb + b) * 16, 0), nb * 16,
                                      vload(_V8, ydt, max(b * n + r, 0)), acc)
                for t in range(8):
                    out[r + t, i] = vlane(acc, t)
            for r in range(in_eights, n):
                acc, mins_acc, lanes_acc = vzero(_V8), vzero(_V8), vzero(_V8)
                for b in range(nb):
                    qo, yo = max((i * nb + b) * 256, 0), max(r * k + b * 256, 0)
                    so, bo = max((i * nb + b) * 16, 0), max((r * nb + b) * 16, 0)
                    if tiled:                                 # the tiled kernels' last rows
                        acc = _tiled_link(shape, False, dd, i, b, qf, qo, yf, yo, 0, sf, so, bf, bo, 0,
                                          vsplat(_V8, yd[r, b]), acc)
                    else:                                     # the vec_dot
                        lanes = _lanes(shape, qf, qo, yf, yo, sf, so, bf, bo)
                        lanes_acc = vfma(vsplat(_V8, yd[r, b] * dd[i, b, 0]), lanes, lanes_acc)
                        if not no_min:
                            mins_acc = vfma(vsplat(_V8, -yd[r, b] * dd[i, b, 1]), _min_lanes(q4, sf, so, bf, bo),
                                            mins_acc)
                out[r, i] = vlane(acc, 0) if tiled else _vec_dot_total(no_min, q4, lanes_acc, mins_acc)

    return product
