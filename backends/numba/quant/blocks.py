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


def _iq1_values(idx: np.ndarray, negative: np.ndarray) -> np.ndarray:
    """Grid indices (rows, nb, 32) of the groups of eight and their delta signs (True: -1), broadcast to the
    groups -> the values 8 * grid + delta as int8 in element order (rows, nb * 256): ggml-cpu/tiled's codes less
    128, exact in eighths (the delta is 1/8)."""
    rows, nb = idx.shape[:2]
    delta = np.where(negative, np.int8(-1), np.int8(1))
    return (grid.grid(GGMLQuantizationType.IQ1_S)[idx] * np.int8(8) + delta[..., None]).reshape(rows, nb * 256)


def iq1_s_fields(b):
    """IQ1_S blocks (f16 d, 32 index bytes, eight 16-bit words: three high index bits per group of eight, a 3-bit
    scale and the delta's sign per 32) -> the values 8 * grid + delta as int8 in element order (rows, nb * 256),
    the eight scales 2s + 1 (rows, nb, 8) int8 and d (rows, nb) float32."""
    rows, nb = b.shape[:2]
    qh = b[:, :, 34:50].copy().view(np.uint16).astype(np.int32)                        # (rows, nb, 8)
    high = qh[..., None] >> np.array([0, 3, 6, 9]) & 7                                 # (rows, nb, 8, 4)
    idx = b[:, :, 2:34].astype(np.int32) | high.reshape(rows, nb, 32) << 8
    negative = np.repeat(qh & 0x8000 != 0, 4, axis=-1)
    scales = (2 * (qh >> 12 & 7) + 1).astype(np.int8)
    return _iq1_values(idx, negative), scales, block_f16(b, 0).reshape(rows, nb)


def iq1_m_fields(b):
    """IQ1_M blocks (32 index bytes, 16 bytes of a nibble per group of eight: three high index bits and the
    delta's sign, four 16-bit words: four 3-bit scales per 64 and a nibble of the f16 d) -> the values
    8 * grid + delta as int8 in element order (rows, nb * 256), the sixteen scales 2s + 1 (rows, nb, 16) int8
    and d (rows, nb) float32."""
    rows, nb = b.shape[:2]
    nibbles = (b[:, :, 32:48, None] >> np.array([0, 4], np.uint8) & 15).reshape(rows, nb, 32).astype(np.int32)
    idx = b[:, :, 0:32].astype(np.int32) | (nibbles & 7) << 8
    sc = b[:, :, 48:56].copy().view(np.uint16)                                        # (rows, nb, 4)
    scales = (2 * (sc[..., None] >> np.array([0, 3, 6, 9], np.uint16) & 7) + 1).astype(np.int8)
    bits = sc >> np.array([12, 8, 4, 0], np.uint16) & np.array([0xF, 0xF0, 0xF00, 0xF000], np.uint16)
    d = np.bitwise_or.reduce(bits, axis=-1).astype(np.uint16).view(np.float16).astype(_F32)
    return _iq1_values(idx, nibbles & 8 != 0), scales.reshape(rows, nb, 16), d


def _per_16(scales: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Scales of sub-blocks of 16 or 32 (rows, nb, 16 or 8) and d (rows, nb) -> gguf's f32 d * scale per 16
    elements (rows, nb * 16)."""
    dl = d[:, :, None] * scales.astype(_F32)
    return np.repeat(dl, 16 // scales.shape[-1], axis=-1).reshape(d.shape[0], -1)


def repack_iq1_s(b):
    """The values 8 * grid + delta (int8, element order) and d * scale per 16 elements (float32, gguf's
    product)."""
    values, scales, d = iq1_s_fields(b)
    return values, _per_16(scales, d)


def repack_iq1_m(b):
    """As repack_iq1_s."""
    values, scales, d = iq1_m_fields(b)
    return values, _per_16(scales, d)


def tq1_0_values(b):
    """TQ1_0 blocks (48 bytes of five base-3 digits each, 4 of four, f16 d) -> the digits 0-2 (the value plus 1) as
    bytes in element order (rows, nb * 256) and d (rows, nb) float32. Digit k of byte q is the top of
    (q * 3^k mod 256) * 3 in 10 bits: elements 32k + l from byte l, 160 + 16k + l from byte 32 + l, and
    240 + 4k + l from byte 48 + l."""
    rows, nb = b.shape[:2]
    powers = lambda n: np.array([1, 3, 9, 27, 81][:n], np.uint8).reshape(n, 1)     # noqa: E731
    digits = [(b[:, :, lo:hi].reshape(rows, nb, 1, hi - lo) * powers(n)).reshape(rows, nb, -1)
              for lo, hi, n in ((0, 32, 5), (32, 48, 5), (48, 52, 4))]
    values = (np.concatenate(digits, axis=-1).astype(np.uint16) * 3 >> 8).astype(np.uint8)
    return values.reshape(rows, -1), block_f16(b, 52).reshape(rows, nb)
def _odd_nibbles(sc: np.ndarray) -> np.ndarray:
    """Scale bytes (rows, nb, 8), the low nibble for the first 16 weights of 32, the high one for the next 16
    -> 2s + 1 per 16 (rows, nb, 16) int8."""
    return (2 * np.stack([sc & 15, sc >> 4], axis=-1).reshape(*sc.shape[:2], 16).astype(np.int16) + 1).astype(np.int8)


def iq2_xxs_fields(b):
    """IQ2_XXS blocks (rows, nb, 66: f16 d, then per 32 weights 4 grid index bytes and a word of four 7-bit sign
    groups and the 4-bit scale on top) -> the values (rows, nb * 256) int8, the scales 2s + 1 per 16 (rows, nb,
    16) int8 (each of the 32's twice) and d (rows, nb) float32."""
    rows, nb = b.shape[:2]
    words = np.ascontiguousarray(b[:, :, 2:66]).view(np.uint32).reshape(rows, nb, 8, 2)
    signs = grid.parity_signs(words[..., 1:2] >> np.array([0, 7, 14, 21], np.uint32))
    values = grid.signed_values(GGMLQuantizationType.IQ2_XXS, b[:, :, 2:66].reshape(rows, nb, 8, 8)[..., :4], signs)
    scales = (2 * (words[..., 1] >> 28).astype(np.int16) + 1).astype(np.int8)
    return values.reshape(rows, -1), np.repeat(scales, 2, axis=-1), block_f16(b, 0).reshape(rows, nb)


def iq2_xs_fields(b):
    """IQ2_XS blocks (rows, nb, 74: f16 d, 32 words of a 9-bit index and 7 sign bits, 8 scale bytes) -> as
    iq2_xxs_fields."""
    rows, nb = b.shape[:2]
    q = np.ascontiguousarray(b[:, :, 2:66]).view(np.uint16)
    values = grid.signed_values(GGMLQuantizationType.IQ2_XS, q & 511, grid.parity_signs(q >> 9))
    return values.reshape(rows, -1), _odd_nibbles(b[:, :, 66:74]), block_f16(b, 0).reshape(rows, nb)


def iq2_s_fields(b):
    """IQ2_S blocks (rows, nb, 82: f16 d, 32 low index bytes, 32 sign bytes, 8 bytes of the indices' two high
    bits (bits 2l, 2l + 1 of byte j for group l of weights 32j ..), 8 scale bytes) -> as iq2_xxs_fields."""
    rows, nb = b.shape[:2]
    high = b[:, :, 66:74, None] >> np.array([0, 2, 4, 6], np.uint8) & 3          # (rows, nb, 8, 4)
    index = b[:, :, 2:34].astype(np.uint16) | high.reshape(rows, nb, 32).astype(np.uint16) << 8
    values = grid.signed_values(GGMLQuantizationType.IQ2_S, index, b[:, :, 34:66])
    return values.reshape(rows, -1), _odd_nibbles(b[:, :, 74:82]), block_f16(b, 0).reshape(rows, nb)


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
def row_iq1(q, dl, i, w, a, with_min):
    """IQ1_S and IQ1_M: gguf's (d * scale) * (grid + delta), grid + delta being the value byte over 8 (exact)."""
    for j in range(q.shape[1]):
        w[a, j] = dl[i, j >> 4] * (_F32(q[i, j]) * _F32(0.125))


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


@njit(**_inl)
def row_iq2(qv, sc, dd, i, w, a, with_min):
    """From quant.kquant's layout of the grid types (quant.grid: signed values as bytes in element order, the
    scales 2s + 1 per 16, d): gguf's (d * (0.5 + s) * 0.25) * value, as (d * (2s + 1)) * 0.125 * value (the same
    float: the factors of two are exact), in natural order."""
    for j in range(qv.shape[1]):
        b, v = j >> 8, np.int32(qv[i, j])
        w[a, j] = dd[i, b, 0] * _F32(sc[i, b, (j >> 4) & 15]) * _F32(0.125) * _F32(v - 256 if v > 127 else v)


@njit(**_inl)
def row_ternary(qv, sc, dd, i, w, a, with_min):
    """From quant.kquant's layout of TQ1_0 and TQ2_0 (the values plus 1 two bits each in TQ2_0's order, d): gguf's
    d * (value - 1), in natural order."""
    for j in range(qv.shape[1] << 2):
        q = np.int32(qv[i, (j >> 8 << 6) + ((j >> 7 & 1) << 5) + (j & 31)]) >> ((j >> 5 & 3) << 1) & 3
        w[a, j] = dd[i, j >> 8, 0] * _F32(q - 1)


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
