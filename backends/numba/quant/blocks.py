"""GGUF weight blocks in the stream layout: raw blocks repacked into flat arrays, and rows of those back to floats.

The repack (numpy) runs once per tensor, or per get_rows request for the rows asked for. The row dequantizers
are the one place each format's arithmetic is written: the GEMM kernels of quant.stream inline them to expand
weight rows into a tile, and the dequantizer kernels below (get_rows, dequantize) to build whole rows.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import numpy as np
from gguf import GGMLQuantizationType
from numba import njit, prange

from graphir.backends.numba.primitives.bits import f16_bits
from graphir.backends.numba.quant import grid

_F32 = np.float32
_exact = dict(parallel=True, cache=True)                  # dequantization: no FMA contraction, bit-exact


# ---------------------------------------------------------------------------------------------------------
# Repack (numpy, once per tensor or per get_rows request): raw GGUF rows -> tuple of C-contiguous arrays.
# When a type has a min term, the last array is mins (rows, groups) f32.
# ---------------------------------------------------------------------------------------------------------

def _field(blocks: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Bytes [lo, hi) of every block, as a contiguous (rows, nblocks * (hi - lo)) uint8 array."""
    return np.ascontiguousarray(blocks[:, :, lo:hi]).reshape(blocks.shape[0], -1)


def block_f16(blocks: np.ndarray, lo: int) -> np.ndarray:
    """The f16 at byte `lo` of every block, as float32 (rows, nblocks)."""
    return _field(blocks, lo, lo + 2).view(np.float16).astype(_F32)


def k_scales(sc12: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K 12-byte packed 6-bit (scale, min) pairs -> two (rows, nblocks, 8) float32 arrays."""
    a, b, c = sc12[..., 0:4].astype(np.uint8), sc12[..., 4:8], sc12[..., 8:12]
    sc = np.concatenate([a & 63, (c & 15) | ((a >> 6) << 4)], axis=-1)
    mn = np.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=-1)
    return sc.astype(_F32), mn.astype(_F32)


def repack_q8_0(b):
    return _field(b, 2, 34).view(np.int8), block_f16(b, 0)


def repack_q4_0(b):
    return _field(b, 2, 18), block_f16(b, 0)


def _fifth_bits_per_byte(b, lo):
    """The 32 fifth bits at byte ``lo`` of every block, regrouped per qs byte (bit 0: the low nibble's element j,
    bit 1: the high nibble's element j + 16)."""
    hbits = _field(b, lo, lo + 4).view(np.uint32).reshape(b.shape[0], b.shape[1], 1)
    j = np.arange(16, dtype=np.uint32)
    qh = ((hbits >> j) & 1) | (((hbits >> (j + 16)) & 1) << 1)
    return np.ascontiguousarray(qh.astype(np.uint8)).reshape(b.shape[0], -1)


def repack_q5_0(b):
    """qs, the fifth bits per qs byte and d."""
    return _field(b, 6, 22), _fifth_bits_per_byte(b, 2), block_f16(b, 0)


def repack_q5_1(b):
    """qs, the fifth bits per qs byte, d and m."""
    return _field(b, 8, 24), _fifth_bits_per_byte(b, 4), block_f16(b, 0), block_f16(b, 2)


MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)  # e2m1, doubled
IQ4_NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                         np.float32)  # kvalues_iq4nl: IQ4_NL's and IQ4_XS's non-linear grid


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """An MXFP4 block's E8M0 scale 2^(e - 127), halved as the doubled e2m1 values need (ggml's
    GGML_E8M0_TO_FP32_HALF: e < 2 gives the subnormals 2^-128 and 2^-127), as float32."""
    e = np.asarray(e, np.uint32)
    return np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23)).astype(np.uint32).view(_F32)


def repack_mxfp4(b):
    """qs (byte j: element j in the low nibble, j + 16 in the high one, as Q4_0), the halved scales and the
    codes' values (row_lut4)."""
    return _field(b, 1, 17), np.ascontiguousarray(e8m0_half(b[:, :, 0])), MXFP4_VALUES


def repack_iq4_nl(b):
    """qs (as Q4_0's), d and the codes' values (row_lut4)."""
    return _field(b, 2, 18), block_f16(b, 0), IQ4_NL_VALUES


def iq4_xs_fields(b):
    """IQ4_XS blocks (f16 d, 16 high scale bits, 4 bytes of low ones, 128 nibble bytes) -> the values as int8 in
    element order (rows, nb * 256) (sub-block j: bytes 16j .. 16j + 15, element l low, l + 16 high), the eight
    6-bit scales less 32 (rows, nb, 8) int8 and d (rows, nb) float32."""
    rows, nb = b.shape[:2]
    qs = b[:, :, 8:136].reshape(rows, nb, 8, 1, 16)
    codes = np.concatenate([qs & 15, qs >> 4], axis=3).reshape(rows, nb * 256)
    j = np.arange(8)
    high = (b[:, :, 2:4].copy().view(np.uint16) >> (2 * j).astype(np.uint16)) & 3           # (rows, nb, 8)
    low = (b[:, :, 4 + j // 2] >> (4 * (j % 2)).astype(np.uint8)) & 15
    scales = (low.astype(np.int16) | high.astype(np.int16) << 4) - 32
    return (IQ4_NL_VALUES.astype(np.int8)[codes], scales.astype(np.int8),
            block_f16(b, 0).reshape(rows, nb))


def repack_iq4_xs(b):
    """The values as int8 in element order and each sub-block's d * scale (float32, gguf's product)."""
    values, scales, d = iq4_xs_fields(b)
    return values, (d[:, :, None] * scales.astype(_F32)).reshape(b.shape[0], -1)


def iq3_s_fields(b):
    """IQ3_S blocks (f16 d, 64 grid index bytes, 8 bytes of their ninth bits, 32 sign bytes, 4 scale bytes) -> the
    values as int8 in element order (rows, nb * 256), the eight 4-bit scales (rows, nb, 8: sub-block 2k in byte k's
    low nibble, 2k + 1 in its high one) and d (rows, nb) float32."""
    rows, nb = b.shape[:2]
    index = b[:, :, 2:66].astype(np.uint16) | grid.bits(b[:, :, 66:74]).astype(np.uint16) << 8
    scales = (b[:, :, 106:110, None] >> np.array([0, 4], np.uint8)) & 15
    return (grid.signed_values(GGMLQuantizationType.IQ3_S, index, b[:, :, 74:106]).reshape(rows, -1),
            scales.reshape(rows, nb, 8), block_f16(b, 0).reshape(rows, nb))


def repack_iq3_s(b):
    """The values as int8 in element order and each sub-block's d * (1 + 2 * scale) (float32, gguf's product)."""
    values, scales, d = iq3_s_fields(b)
    return values, (d[:, :, None] * (1 + 2 * scales).astype(_F32)).reshape(b.shape[0], -1)


def iq3_xxs_fields(b):
    """IQ3_XXS blocks (f16 d, 64 grid index bytes, per sub-block of 32 a 32-bit word: four groups' seven sign bits,
    then a 4-bit scale) -> the values as int8 in element order (rows, nb * 256), the eight 4-bit scales
    (rows, nb, 8) and d (rows, nb) float32."""
    rows, nb = b.shape[:2]
    words = np.ascontiguousarray(b[:, :, 66:98]).view("<u4")                                  # (rows, nb, 8)
    signs = grid.parity_signs(words[..., None] >> np.array([0, 7, 14, 21], np.uint32))      # (rows, nb, 8, 4)
    values = grid.signed_values(GGMLQuantizationType.IQ3_XXS, b[:, :, 2:66], signs.reshape(rows, nb, 32))
    return values.reshape(rows, -1), (words >> 28).astype(np.uint8), block_f16(b, 0).reshape(rows, nb)


def repack_iq3_xxs(b):
    """The values as int8 in element order and each sub-block's d * (0.5 + scale) * 0.5 (float32, gguf's
    product: the grid holds twice the steps of its values, and the scale counts as 1 + 2s)."""
    values, scales, d = iq3_xxs_fields(b)
    return values, (d[:, :, None] * (_F32(0.5) + scales.astype(_F32)) * _F32(0.5)).reshape(b.shape[0], -1)


def repack_q4_1(b):
    return _field(b, 4, 20), block_f16(b, 0), block_f16(b, 2)


def _repack_k_common(b, qs_lo):
    rows, nb = b.shape[:2]
    d, dmin = block_f16(b, 0)[..., None], block_f16(b, 2)[..., None]
    sc, mn = k_scales(b[:, :, 4:16])
    dsc = d * sc                                            # same f32 products as gguf's dequantizer
    mins = -(dmin * mn)
    return (_field(b, qs_lo, qs_lo + 128),
            np.ascontiguousarray(dsc[..., 0::2]).reshape(rows, nb * 4),
            np.ascontiguousarray(dsc[..., 1::2]).reshape(rows, nb * 4),
            mins.reshape(rows, nb * 8))


def repack_q4_k(b):
    return _repack_k_common(b, 16)


def repack_q5_k(b):
    qs, slo, shi, mins = _repack_k_common(b, 48)
    rows, nb = b.shape[:2]
    qh = b[:, :, 16:48].reshape(rows, nb, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    return qs, (qh & 3).reshape(rows, nb * 128), slo, shi, mins     # high bits of both nibbles of qs[j]


def repack_q6_k(b):
    rows, nb = b.shape[:2]
    ql = b[:, :, 0:128].reshape(rows, nb, 2, 2, 32)         # [half][first/second 32 bytes][l]
    qa = np.ascontiguousarray(ql[:, :, :, 0]).reshape(rows, nb * 64)
    qb = np.ascontiguousarray(ql[:, :, :, 1]).reshape(rows, nb * 64)
    qh = _field(b, 128, 192)
    sc = b[:, :, 192:208].view(np.int8).astype(_F32).reshape(rows, nb, 2, 4, 2)   # [half][k][l>>4]
    dsc = block_f16(b, 208)[:, :, None, None, None] * sc
    s = np.ascontiguousarray(dsc.transpose(0, 3, 1, 2, 4)).reshape(rows, 4, nb * 4)
    return qa, qb, qh, s


# ---------------------------------------------------------------------------------------------------------
# Row dequantizers: row i of the packed tensor -> w[a, :] (float32, length k) in *stream order*: the same
# permuted element order as the activation (for Q4_x all low-nibble values, then all high-nibble values), so
# every store is contiguous. with_min=False drops the additive min term (GEMM adds it as a separate product).
# The arithmetic is gguf.quants.dequantize's, operation for operation; inlined into the dequantizer kernels, which
# have no fastmath, the values are bit-exact (no FMA contraction of d*q + m).
# Two numba details decide their speed (5x): inline="always" (as a call, numba loses the knowledge that w is a
# fresh local array and the stores stop vectorizing) and offsets written as max(n, 0) (numba wraps negative
# indices; an offset of unknown sign keeps a per-element select in the loop that blocks vectorization).
# ---------------------------------------------------------------------------------------------------------

_inl = dict(cache=True, inline="always")


@njit(**_inl)
def row_f32(w0, i, w, a, with_min):
    for j in range(w0.shape[1]):
        w[a, j] = w0[i, j]


@njit(**_inl)
def row_f16(w0, i, w, a, with_min):
    bits = w.view(np.uint32)
    for j in range(w0.shape[1]):
        bits[a, j] = f16_bits(w0[i, j])
    for j in range(w0.shape[1]):                # zero and subnormal halves: m * 2**-24, exact in f32
        h = np.int32(w0[i, j])
        v = _F32(h & 0x3FF) * _F32(5.9604644775390625e-08)
        w[a, j] = (-v if h & 0x8000 else v) if (h & 0x7C00) == 0 else w[a, j]


@njit(**_inl)
def row_bf16(w0, i, w, a, with_min):
    bits = w.view(np.uint32)
    for j in range(w0.shape[1]):
        bits[a, j] = np.uint32(w0[i, j]) << np.uint32(16)


@njit(**_inl)
def row_q8_0(qs, d, i, w, a, with_min):
    for j in range(qs.shape[1]):
        w[a, j] = _F32(qs[i, j]) * d[i, j >> 5]


@njit(**_inl)
def row_q4_0(qs, d, i, w, a, with_min):
    kp = max(qs.shape[1], 0)
    for j in range(kp):
        q = np.int32(qs[i, j])
        w[a, j] = d[i, j >> 4] * _F32((q & 15) - 8)
        w[a, kp + j] = d[i, j >> 4] * _F32((q >> 4) - 8)


@njit(**_inl)
def row_lut4(qs, d, values, i, w, a, with_min):
    """4-bit codes into a table of values (MXFP4's, IQ4_NL's), one scale per 32, laid out as Q4_0's."""
    kp = max(qs.shape[1], 0)
    for j in range(kp):
        q = np.int32(qs[i, j])
        w[a, j] = d[i, j >> 4] * values[q & 15]
        w[a, kp + j] = d[i, j >> 4] * values[q >> 4]


@njit(**_inl)
def row_iq4_xs(q, dl, i, w, a, with_min):
    for j in range(q.shape[1]):
        w[a, j] = dl[i, j >> 5] * _F32(q[i, j])


@njit(**_inl)
def row_q5_0(qs, qh, d, i, w, a, with_min):
    kp = max(qs.shape[1], 0)
    for j in range(kp):
        q = np.int32(qs[i, j])
        h = np.int32(qh[i, j])
        w[a, j] = d[i, j >> 4] * _F32(((q & 15) | ((h & 1) << 4)) - 16)
        w[a, kp + j] = d[i, j >> 4] * _F32(((q >> 4) | ((h & 2) << 3)) - 16)


@njit(**_inl)
def row_q5_1(qs, qh, d, m, i, w, a, with_min):
    kp = max(qs.shape[1], 0)
    for j in range(kp):
        q = np.int32(qs[i, j])
        h = np.int32(qh[i, j])
        add = m[i, j >> 4] if with_min else _F32(0.0)
        w[a, j] = d[i, j >> 4] * _F32((q & 15) | ((h & 1) << 4)) + add
        w[a, kp + j] = d[i, j >> 4] * _F32((q >> 4) | ((h & 2) << 3)) + add


@njit(**_inl)
def row_q4_1(qs, d, m, i, w, a, with_min):
    kp = max(qs.shape[1], 0)
    for j in range(kp):
        q = qs[i, j]
        add = m[i, j >> 4] if with_min else _F32(0.0)
        w[a, j] = d[i, j >> 4] * _F32(q & 15) + add
        w[a, kp + j] = d[i, j >> 4] * _F32(q >> 4) + add


@njit(**_inl)
def row_q4_k(qs, slo, shi, mins, i, w, a, with_min):
    kp = max(qs.shape[1], 0)
    for j in range(kp):
        q = qs[i, j]
        c = j >> 5
        alo = mins[i, 2 * c] if with_min else _F32(0.0)
        ahi = mins[i, 2 * c + 1] if with_min else _F32(0.0)
        w[a, j] = slo[i, c] * _F32(q & 15) + alo
        w[a, kp + j] = shi[i, c] * _F32(q >> 4) + ahi


@njit(**_inl)
def row_q5_k(qs, qh, slo, shi, mins, i, w, a, with_min):
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
def row_q6_k(qa, qb, qh, s, i, w, a, with_min):
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


@njit(**_inl)
def row_q2_k(qv, sm, dd, i, w, a, with_min):
    """From quant.kquant's layout (values as bytes in element order, scales then mins, d and dmin): gguf's
    (d * scale) * q - dmin * min, in natural order."""
    for j in range(qv.shape[1]):
        b, s = j >> 8, (j >> 4) & 15
        sub = dd[i, b, 1] * _F32(sm[i, b, 16 + s]) if with_min else _F32(0.0)
        w[a, j] = dd[i, b, 0] * _F32(sm[i, b, s]) * _F32(qv[i, j]) - sub


@njit(**_inl)
def row_q3_k(qv, sc, dd, i, w, a, with_min):
    """From quant.kquant's layout (the values plus 4 as bytes in element order, the scales, d): gguf's
    (d * scale) * q, in natural order."""
    for j in range(qv.shape[1]):
        b = j >> 8
        w[a, j] = dd[i, b, 0] * _F32(sc[i, b, (j >> 4) & 15]) * _F32(np.int32(qv[i, j]) - 4)

# ---------------------------------------------------------------------------------------------------------
# Dequantizers for get_rows / dequantize: rows ids -> out (len(ids), k) in natural order (a row is built in
# stream order, then gathered through inv), min term included. Exact: no fastmath.
# ---------------------------------------------------------------------------------------------------------

def per_format(template: str, row: Callable, namespace: dict[str, Any], options: dict[str, Any],
               **fields: str) -> Callable:
    """A kernel of the format whose row dequantizer is ``row``, compiled with numba ``options`` from ``template``:
    a def of ``{name}`` that takes the format's packed arrays ``{arrays}`` one by one (``{first}`` the first) and
    calls ``{row}``, in the module of ``namespace`` (its globals). One template serves every format because its
    arrays are spelled out per format: the loops vectorize only over arrays passed one by one (handed over in a
    tuple, the Q4_K GEMM measured 25% slower and its get_rows 2x), and numba's cache keeps only kernels whose
    identity is their name (a closure over the row function pickles a per-process id into the cache key)."""
    arrays = list(inspect.signature(row.py_func).parameters)[:-4]   # the row's (..., i, w, a, with_min)
    name = template.split("def ", 1)[1].split("(", 1)[0].format(fmt=row.__name__.removeprefix("row_"))
    source = template.format(fmt=row.__name__.removeprefix("row_"), arrays=", ".join(arrays), first=arrays[0],
                             row=row.__name__, **fields)
    scope = dict(namespace)
    exec(compile(source, namespace["__file__"], "exec"), scope)
    return njit(**options)(scope[name])


_DEQ = """
def deq_{fmt}({arrays}, ids, inv, out):
    for r in prange(ids.shape[0]):
        w = np.empty((1, out.shape[1]), _F32)
        {row}({arrays}, ids[r], w, 0, True)
        for e in range(out.shape[1]):
            out[r, e] = w[0, inv[e]]
"""


def dequantizer(row: Callable) -> Callable:
    """The get_rows / dequantize kernel of ``row``'s format: (*packed, ids, inv, out)."""
    return per_format(_DEQ, row, globals(), _exact)
