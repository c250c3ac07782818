"""Specification of graphir.backends.numba.quant: GGUF weights as matmul / get_rows operands.

Three references, from strict to loose:
- gguf.quants.dequantize: dequantize() and get_rows() must equal it bit for bit;
- a numpy emulation of llama.cpp's CPU matmul (activations quantized to the weight's vec_dot type, integer
  block dot products, float scaling; written here from llama.cpp's formulas, independently of the kernels):
  matmul must agree to float-summation noise;
- plain f32 math on the dequantized weight: matmul must agree to within the error the activation quantization
  adds (NMSE thresholds measured and pinned per type).
"""

from __future__ import annotations

import os
from dataclasses import replace

import gguf
import numpy as np
import pytest
from conftest import half, make_weight

from graphir.backends.numba.primitives import isa
from graphir.backends.numba.quant.exact import exact_gemv
from graphir.backends.numba.quant.weight import SUPPORTED, QWeight, expert_matrices

T = gguf.GGMLQuantizationType
F32 = np.float32
FLOATS = [T.F32, T.F16, T.BF16]
QUANTS = [T.Q8_0, T.Q4_0, T.Q5_0, T.Q4_1, T.Q5_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.MXFP4, T.IQ4_NL,
          T.IQ4_XS]
GRIDS = [T.IQ2_XXS, T.IQ2_XS, T.IQ2_S]    # signed values of a grid codebook, scales 2s + 1, a factor 1/8
QUANTS += GRIDS
QUANTS += [T.IQ1_S, T.IQ1_M]
QUANTS += [T.TQ1_0, T.TQ2_0]
QUANTS += [T.IQ3_S, T.IQ3_XXS]
ROWS, NE0 = 72, 512                  # 72 rows = 12 GEMM tiles of 6; odd shapes have their own test

# NMSE of matmul against f32 math on the dequantized weight (x ~ N(0,1)), worst of 5 seeds: 5e-8 (F16),
# 3.6e-6 (BF16), 3-6e-5 (Q8_0/Q4_0/Q4_1; MXFP4 2.9e-5), 5-12e-5 (K-quants, random blocks; IQ4_NL 3.9e-5, IQ4_XS
# 5.9e-5); pinned at 2-3x.
NMSE_MAX = {T.F32: 1e-12, T.F16: 2e-7, T.BF16: 1e-5, T.Q8_0: 2e-4, T.Q4_0: 2e-4, T.Q5_0: 2e-4, T.Q4_1: 2e-4, T.Q5_1: 2e-4,
            T.Q2_K: 2e-4, T.Q3_K: 2e-4, T.Q4_K: 3e-4, T.Q5_K: 4e-4, T.Q6_K: 2e-4, T.MXFP4: 2e-4, T.IQ4_NL: 2e-4,
            T.IQ4_XS: 2e-4}
NMSE_MAX |= {T.IQ2_XXS: 2e-4, T.IQ2_XS: 2e-4, T.IQ2_S: 2e-4}   # measured 4.9e-5, 5.4e-5, 5.6e-5
NMSE_MAX.update({T.IQ1_S: 2e-4, T.IQ1_M: 2e-4})     # measured the same way: 5.9e-5 and 7.9e-5
NMSE_MAX.update({T.TQ1_0: 2e-4, T.TQ2_0: 2e-4})        # measured 6.4e-5 (gguf's ternary blocks)
NMSE_MAX.update({T.IQ3_S: 2e-4, T.IQ3_XXS: 2e-4})   # measured 6.2e-5, 5.7e-5
# max |matmul - llama.cpp emulation| / max |emulation|: only the float summation order differs (measured
# <= 3.5e-7; skipping the activation quantization gives 3e-4 (F16) to 2e-2 (K-quants), dropping the f16
# rounding of Q8_1's s alone gives 3e-4)
EMU_RTOL = 2e-6


def gguf_dequant(raw: np.ndarray, qtype: T, rows: int, ne0: int) -> np.ndarray:
    return gguf.quants.dequantize(raw.view(np.uint8) if qtype == T.BF16 else raw, qtype).reshape(rows, ne0)


def assert_bits_equal(a: np.ndarray, b: np.ndarray) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype == F32
    nan = np.isnan(b)
    assert np.array_equal(np.isnan(a), nan)
    assert np.array_equal(a.view(np.uint32)[~nan], b.view(np.uint32)[~nan])


def nmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a.astype(np.float64) - b) ** 2).sum() / (b.astype(np.float64) ** 2).sum())


# --- numpy emulation of llama.cpp's CPU matmul --------------------------------------------------------------

def f16r(v: np.ndarray) -> np.ndarray:
    return np.asarray(v, F32).astype(np.float16).astype(F32)


def q8_blocks(x: np.ndarray):
    """quantize_row_q8_0 / q8_1 as the x86 build runs them: d = amax/127, q = rint(x * (127/amax))."""
    xb = x.reshape(x.shape[0], -1, 32)
    amax = np.abs(xb).max(-1)
    d32 = amax / F32(127)
    iscale = np.divide(F32(127), amax, out=np.zeros_like(amax), where=amax != 0)
    q = np.rint(xb * iscale[..., None]).astype(np.int64)
    return q, f16r(d32), f16r(d32 * q.sum(-1).astype(F32))           # qs, d, s (Q8_1)


def q8k_blocks(x: np.ndarray):
    """quantize_row_q8_K_ref: scale -127/max of the signed absmax, nearest-even, clamp at 127, d = 1/iscale."""
    xb = x.reshape(x.shape[0], -1, 256)
    vmax = np.take_along_axis(xb, np.abs(xb).argmax(-1)[..., None], -1)[..., 0]
    iscale = np.divide(F32(-127), vmax, out=np.zeros_like(vmax), where=vmax != 0)
    q = np.minimum(np.rint(iscale[..., None] * xb), 127).astype(np.int64)
    d = np.divide(F32(1), iscale, out=np.zeros_like(iscale), where=iscale != 0)
    return q, d, q.reshape(*q.shape[:2], 16, 16).sum(-1)               # qs, d, bsums


KVALUES = np.array(gguf.quants.IQ4_NL.kvalues, np.int64)      # kvalues_iq4nl
gguf.quants.IQ1_S.init_grid()
IQ1_GRID = gguf.quants.IQ1_S.grid.reshape(2048, 8).astype(np.int64)   # iq1s_grid: eight of -1, 0, 1 a row


def grid_of(qtype: T) -> np.ndarray:
    """gguf's grid of an i-quant: (entries, values an entry) int64."""
    cls = getattr(gguf.quants, qtype.name)
    cls.init_grid()
    return cls.grid.reshape(cls.grid_shape).astype(np.int64)


# the constant factor of a format's values: ggml's vec_dot applies it to its total, the tiled kernels to d
FACTOR = {T.IQ3_XXS: 0.25, **dict.fromkeys(GRIDS, 0.125)}   # on the vec_dot's total and the tiled d


def bits_of(b: np.ndarray) -> np.ndarray:
    """Bytes (..., n) -> their bits (..., 8n) as int64, each byte's least significant first."""
    return ((b[..., None].astype(np.int64) >> np.arange(8)) & 1).reshape(*b.shape[:-1], -1)


def weight_ints(raw: np.ndarray, qtype: T, ne0: int):
    """Integer quants (rows, blocks, block) in natural order plus the scale fields, straight from the bytes."""
    block, tsize = gguf.GGML_QUANT_SIZES[qtype]
    b = raw.reshape(raw.shape[0], -1, tsize)
    f16 = lambda lo: b[..., lo:lo + 2].copy().view(np.float16)[..., 0].astype(F32)   # noqa: E731
    nib = lambda qs: np.concatenate([qs & 15, qs >> 4], -1).astype(np.int64)         # noqa: E731
    if qtype == T.Q8_0:
        return b[..., 2:].view(np.int8).astype(np.int64), f16(0)
    if qtype == T.Q4_0:
        return nib(b[..., 2:18]) - 8, f16(0)
    if qtype == T.Q5_0:
        hbits = b[..., 2:6].copy().view(np.uint32).astype(np.int64)               # bit j: element j's fifth bit
        return nib(b[..., 6:22]) + ((hbits >> np.arange(32)) & 1) * 16 - 16, f16(0)
    if qtype == T.Q4_1:
        return nib(b[..., 4:20]), f16(0), f16(2)
    if qtype == T.Q5_1:
        hbits = b[..., 4:8].copy().view(np.uint32).astype(np.int64)
        return nib(b[..., 8:24]) + ((hbits >> np.arange(32)) & 1) * 16, f16(0), f16(2)
    if qtype == T.Q2_K:                                   # 16 sub-blocks of 16: a 4-bit scale and min each
        q = (b[..., 16:80].reshape(*b.shape[:2], 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3
        sc, mn = (b[..., 0:16] & 15).astype(np.int64), (b[..., 0:16] >> 4).astype(np.int64)
        return q.reshape(*b.shape[:2], 256).astype(np.int64), f16(80), f16(82), sc, mn
    if qtype == T.Q3_K:                                   # values -4..3: 4 off where the high bit is clear
        low = (b[..., 32:96].reshape(*b.shape[:2], 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3
        high = (b[..., 0:32].reshape(*b.shape[:2], 1, 32) >> np.arange(8, dtype=np.uint8)[:, None]) & 1
        q = low.reshape(*b.shape[:2], 256).astype(np.int64) - 4 * (1 - high.reshape(*b.shape[:2], 256))
        lo = (b[..., 96:104, None] >> np.array([0, 4], np.uint8)) & 15          # byte j: scales j, j + 8
        hi = (b[..., 104:108, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3    # byte j: scales j + 4m's top bits
        sc = (lo.transpose(0, 1, 3, 2).reshape(*b.shape[:2], 16)
              | hi.transpose(0, 1, 3, 2).reshape(*b.shape[:2], 16) << 4)
        return q, f16(108), sc.astype(np.int64) - 32
    if qtype in (T.Q4_K, T.Q5_K):
        sc, mn = gguf.quants.Q4_K.get_scale_min(b[..., 4:16].reshape(-1, 12))
        sc, mn = sc.reshape(*b.shape[:2], 8).astype(np.int64), mn.reshape(*b.shape[:2], 8).astype(np.int64)
        qs = b[..., 16:144] if qtype == T.Q4_K else b[..., 48:176]
        q = np.stack([nib(qs[..., 32 * c:32 * c + 32]) for c in range(4)], 2).reshape(*b.shape[:2], 256)
        if qtype == T.Q5_K:
            bits = (b[..., 16:48, None] >> np.arange(8, dtype=np.uint8)) & 1          # (rows, nb, l, sub-block)
            q = q + 16 * bits.transpose(0, 1, 3, 2).reshape(*b.shape[:2], 256).astype(np.int64)
        return q, f16(0), f16(2), sc, mn
    if qtype == T.Q6_K:
        ql, qh = b[..., 0:128].astype(np.int64), b[..., 128:192].astype(np.int64)
        q = np.empty((*b.shape[:2], 256), np.int64)
        for h in range(2):
            l_, h_ = ql[..., 64 * h:64 * h + 64], qh[..., 32 * h:32 * h + 32]
            for k, (lo, shift) in enumerate([(l_[..., :32] & 15, 0), (l_[..., 32:] & 15, 2),
                                              (l_[..., :32] >> 4, 4), (l_[..., 32:] >> 4, 6)]):
                q[..., 128 * h + 32 * k:128 * h + 32 * k + 32] = (lo | (((h_ >> shift) & 3) << 4)) - 32
        return q, f16(208), b[..., 192:208].view(np.int8).astype(np.int64)
    if qtype == T.IQ4_NL:  # codes into the non-linear grid
        return KVALUES[nib(b[..., 2:18])], f16(0)
    if qtype == T.IQ4_XS:  # f16 d, 2 bytes of high scale bits, 4 of low ones, 8 sub-blocks of 16 code bytes
        sh, j = b[..., 2:4].copy().view(np.uint16)[..., 0].astype(np.int64), np.arange(8)
        ls = ((b[..., 4 + j // 2].astype(np.int64) >> 4 * (j % 2)) & 15) | (((sh[..., None] >> 2 * j) & 3) << 4)
        q = np.stack([nib(b[..., 8 + 16 * s:24 + 16 * s]) for s in range(8)], 2).reshape(*b.shape[:2], 256)
        return KVALUES[q], f16(0), ls - 32
    if qtype == T.IQ1_S:  # f16 d, 32 index bytes, per 32 a word: 4 x 3 high index bits, a 3-bit scale, the delta sign
        qh = b[..., 34:50].copy().view(np.uint16).astype(np.int64)                               # (rows, nb, 8)
        idx = b[..., 2:34].astype(np.int64).reshape(*qh.shape, 4) | ((qh[..., None] >> 3 * np.arange(4)) & 7) << 8
        delta = np.repeat(np.where(qh & 0x8000, -1, 1), 32, axis=-1)
        return IQ1_GRID[idx].reshape(*b.shape[:2], 256), f16(0), 2 * (qh >> 12 & 7) + 1, delta
    if qtype == T.IQ1_M:  # 32 index bytes, a nibble per 8 (3 high index bits, the delta sign), 4 scale words
        nib = ((b[..., 32:48, None] >> np.array([0, 4], np.uint8)) & 15).reshape(*b.shape[:2], 32).astype(np.int64)
        idx = b[..., 0:32].astype(np.int64) | (nib & 7) << 8
        sc = b[..., 48:56].copy().view(np.uint16).astype(np.int64)                               # (rows, nb, 4)
        scales = (2 * ((sc[..., None] >> 3 * np.arange(4)) & 7) + 1).reshape(*b.shape[:2], 16)   # per 16
        bits = (sc[..., 0] >> 12) | (sc[..., 1] >> 8 & 0xF0) | (sc[..., 2] >> 4 & 0xF00) | (sc[..., 3] & 0xF000)
        d = bits.astype(np.uint16).view(np.float16).astype(F32)
        return IQ1_GRID[idx].reshape(*b.shape[:2], 256), d, scales, np.repeat(np.where(nib & 8, -1, 1), 8, axis=-1)
    if qtype == T.IQ3_S:  # f16 d, 64 grid index bytes, their ninth bits, 32 sign bytes, 4 bytes of scale nibbles
        idx = b[..., 2:66].astype(np.int64) | bits_of(b[..., 66:74]) << 8
        q = grid_of(qtype)[idx].reshape(*b.shape[:2], 256) * (1 - 2 * bits_of(b[..., 74:106]))
        ls = (b[..., 106:110, None].astype(np.int64) >> np.array([0, 4])) & 15      # byte k: sub-blocks 2k, 2k + 1
        return q, f16(0), 2 * ls.reshape(*b.shape[:2], 8) + 1
    if qtype == T.IQ3_XXS:  # f16 d, 64 grid index bytes, per 32 a word: four groups' 7 sign bits, a scale nibble
        words = b[..., 66:98].copy().view(np.uint32).astype(np.int64)                      # (rows, nb, 8)
        seven = ((words[..., None] >> 7 * np.arange(4)) & 127)[..., None] >> np.arange(7) & 1   # (.., 8, 4, 7)
        sign = np.concatenate([seven, seven.sum(-1, keepdims=True) & 1], -1)                # the eighth: parity
        q = grid_of(qtype)[b[..., 2:66]].reshape(*b.shape[:2], 256) * (1 - 2 * sign.reshape(*b.shape[:2], 256))
        return q, f16(0), 2 * (words >> 28) + 1
    if qtype == T.MXFP4:  # doubled e2m1 values; the E8M0 scale halved (subnormal below e = 2)
        e = b[..., 0].astype(np.uint32)
        d = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23)).astype(np.uint32)
        return np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12])[nib(b[..., 1:17])], d.view(F32)
    if qtype in (T.TQ1_0, T.TQ2_0):  # ternary values -1..1 (TQ2_0's 2-bit 3, no quantizer's, reads as 2), one d
        return ternary_digits(b, qtype) - 1, f16(tsize - 2), np.ones((*b.shape[:2], 1), np.int64)
    if qtype in GRIDS:
        return grid_ints(b, qtype)
    raise AssertionError(qtype)


KSIGNS = np.frombuffer(gguf.quants.IQ2_XXS.ksigns, np.uint8)  # ksigns_iq2xs: 7 sign bits and their parity


def grid_ints(b: np.ndarray, qtype: T):
    """The grid types' signed values (rows, nb, 256), d and the odd scales 2s + 1 (per 32 for IQ2_XXS, per 16)."""
    cls = getattr(gguf.quants, qtype.name)
    cls.init_grid()
    table = cls.grid.reshape(cls.grid_shape).astype(np.int64)
    f16 = b[..., 0:2].copy().view(np.float16)[..., 0].astype(F32)
    nibbles = lambda sc: np.stack([sc & 15, sc >> 4], -1).reshape(*b.shape[:2], 16).astype(np.int64)  # noqa: E731
    if qtype == T.IQ2_XXS:      # per 32: 4 index bytes, then 4 x 7 sign bits and the scale in one word
        aux = b[..., 2:66].copy().view(np.uint32).reshape(*b.shape[:2], 8, 2).astype(np.int64)
        index = b[..., 2:66].reshape(*b.shape[:2], 8, 8)[..., :4]
        signs = KSIGNS[(aux[..., 1:2] >> np.array([0, 7, 14, 21])) & 127]
        scales = 2 * (aux[..., 1] >> 28) + 1
    elif qtype == T.IQ2_XS:     # words of a 9-bit index and 7 sign bits; a scale nibble per 16
        words = b[..., 2:66].copy().view(np.uint16).reshape(*b.shape[:2], 8, 4).astype(np.int64)
        index, signs, scales = words & 511, KSIGNS[words >> 9], 2 * nibbles(b[..., 66:74]) + 1
    else:                       # IQ2_S: 8-bit index bytes, 2 high bits each in qh, 8 sign bits stored
        high = (b[..., 66:74, None].astype(np.int64) >> np.array([0, 2, 4, 6])) & 3
        index = b[..., 2:34].reshape(*b.shape[:2], 8, 4).astype(np.int64) | high << 8
        signs, scales = b[..., 34:66].reshape(*b.shape[:2], 8, 4), 2 * nibbles(b[..., 74:82]) + 1
    negative = (signs[..., None].astype(np.int64) >> np.arange(8)) & 1
    return (table[index] * (1 - 2 * negative)).reshape(*b.shape[:2], 256), f16, scales


def ternary_digits(b: np.ndarray, qtype: T) -> np.ndarray:
    """The values plus 1 of TQ1_0 / TQ2_0 blocks (rows, nb, size) in element order, as ggml_vec_dot_tq1_0_q8_K and
    _tq2_0_q8_K read them: TQ1_0's byte q (the first 48 five digits each, the next 4 four) times 3^k in 8 bits, less
    1 without going below 0, averaged (rounding up) with its own average with 0, bits 6-7 of that; TQ2_0's
    element 128h + 32s + l the bits 2s of byte 32h + l."""
    b = b.astype(np.int64)
    if qtype == T.TQ2_0:
        return np.concatenate([(b[..., 32 * h:32 * h + 32] >> 2 * s) & 3 for h in range(2) for s in range(4)], -1)
    parts = [b[..., 0:32] * 3 ** k for k in range(5)] + [b[..., 32:48] * 3 ** k for k in range(5)]
    q = np.concatenate(parts + [np.tile(b[..., 48:52], 4) * 3 ** (np.arange(16) // 4)], -1) & 255
    q = np.maximum(q - 1, 0)                                        # _mm256_subs_epu8(q, 1)
    avg = lambda a, c: (a + c + 1) >> 1                             # noqa: E731  (_mm256_avg_epu8)
    return (avg(q, avg(q, 0)) >> 6) & 3


def llama_matmul(raw: np.ndarray, qtype: T, ne0: int, x: np.ndarray) -> np.ndarray:
    """x @ W.T the way ggml's CPU backend computes it, in float64 after the exact integer parts."""
    f64 = np.float64
    if qtype in FLOATS:
        w = gguf_dequant(raw, qtype, raw.shape[0], ne0).astype(f64)
        if qtype == T.F32:
            return x.astype(f64) @ w.T
        if qtype == T.F16:
            return f16r(x).astype(f64) @ w.T
        u = x.view(np.uint32).astype(np.uint64)                       # fp32 -> bf16, nearest-even
        xr = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(F32)
        return xr.astype(f64) @ w.T
    wi = weight_ints(raw, qtype, ne0)
    if qtype in (T.Q8_0, T.Q4_0, T.Q5_0, T.Q4_1, T.Q5_1, T.MXFP4, T.IQ4_NL):
        qw, dw = wi[0].reshape(raw.shape[0], -1, 32), wi[1]
        qx, dx, sx = q8_blocks(x)
        isum = np.einsum("rbk,nbk->nrb", qw, qx)
        y = ((dw[None] * dx[:, None]).astype(f64) * isum).sum(-1)    # f32(d_w*d_x) * isum, summed
        if qtype in (T.Q4_1, T.Q5_1):
            y += (wi[2][None] * sx[:, None]).astype(f64).sum(-1)     # + f32(m*s)
        return y
    qx, dx, bsums = q8k_blocks(x)
    if qtype in (T.IQ1_S, T.IQ1_M):                                    # grid + delta / 8, sub-blocks of 32 / 16
        qw, dw, sc, delta = wi
        g, values = sc.shape[-1], 8 * qw + delta
        isum = np.einsum("rbgk,nbgk->nrbg", values.reshape(*qw.shape[:2], g, -1), qx.reshape(*qx.shape[:2], g, -1))
        return ((dw[None] * dx[:, None]).astype(f64) * (isum * sc[None]).sum(-1) / 8).sum(-1)
    if qtype in (T.Q6_K, T.Q3_K, T.IQ4_XS, *GRIDS, T.IQ3_S, T.IQ3_XXS, T.TQ1_0, T.TQ2_0):  # no min
        qw, dw, sc = wi
        g = sc.shape[-1]
        isum = np.einsum("rbgk,nbgk->nrbg", qw.reshape(*qw.shape[:2], g, -1), qx.reshape(*qx.shape[:2], g, -1))
        return FACTOR.get(qtype, 1) * ((dw[None] * dx[:, None]).astype(f64) * (isum * sc[None]).sum(-1)).sum(-1)
    qw, dw, dmin, sc, mn = wi
    g = sc.shape[-1]                                                    # sub-blocks a super-block (Q2_K: 16)
    isum = np.einsum("rbgk,nbgk->nrbg", qw.reshape(*qw.shape[:2], g, -1), qx.reshape(*qx.shape[:2], g, -1))
    msum = (mn[None] * bsums.reshape(*bsums.shape[:2], g, -1).sum(-1)[:, None]).sum(-1)
    return ((dw[None] * dx[:, None]).astype(f64) * (isum * sc[None]).sum(-1)
            - (dmin[None] * dx[:, None]).astype(f64) * msum).sum(-1)


# --- synthetic weights -------------------------------------------------------------------------------------

@pytest.fixture(scope="module", params=FLOATS + QUANTS, ids=lambda t: t.name)
def case(request):
    qtype = request.param
    rng = np.random.default_rng(1000 + int(qtype))
    raw = make_weight(qtype, ROWS, NE0, rng)
    return qtype, raw, QWeight.prepare(raw, qtype, NE0), gguf_dequant(raw, qtype, ROWS, NE0)


def activations(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, NE0)).astype(F32)
    x[0, 256:512] = 0.0                  # an all-zero block / super-block (the amax == 0 branch)
    return x


def test_every_listed_type_is_supported():
    assert SUPPORTED == frozenset(FLOATS + QUANTS)


def test_dequantize_is_bit_exact(case):
    qtype, raw, w, ref = case
    assert (w.rows, w.ne0, w.qtype) == (ROWS, NE0, qtype)
    assert_bits_equal(w.dequantize(), ref)


def test_get_rows_is_bit_exact_before_and_after_repack(case):
    qtype, raw, w, ref = case
    ids = np.array([5, 0, ROWS - 1, 5, 17])
    fresh = QWeight.prepare(raw, qtype, NE0)
    assert_bits_equal(fresh.get_rows(ids), ref[ids])               # repacks only these rows
    assert fresh.packed_nbytes == 0
    fresh.matmul(activations(1, 0))
    assert_bits_equal(fresh.get_rows(ids), ref[ids])               # from the cached repack
    out = np.empty((len(ids), NE0), F32)
    assert fresh.get_rows(ids, out=out) is out


@pytest.mark.parametrize("n", [1, 3, 64])
def test_matmul_close_to_f32_math_on_dequantized_weight(case, n):
    qtype, raw, w, ref = case
    x = activations(n, n)
    y = w.matmul(x)
    assert y.shape == (n, ROWS) and y.dtype == F32
    assert nmse(y, x @ ref.T) < NMSE_MAX[qtype]


@pytest.mark.parametrize("n", [1, 3, 4, 7, 64])
def test_matmul_matches_llama_cpp_emulation(case, n):
    qtype, raw, w, ref = case
    x = activations(n, 100 + n)
    y, emu = w.matmul(x), llama_matmul(raw, qtype, NE0, x)
    assert np.abs(y - emu).max() <= EMU_RTOL * np.abs(emu).max()


@pytest.mark.parametrize("qtype, ne0", [(T.Q4_1, NE0), (T.Q6_K, NE0), (T.F32, 100), (T.F16, 100), (T.BF16, 100)])
@pytest.mark.parametrize("n", [1, 5])
def test_matmul_with_odd_shapes(qtype, ne0, n):
    rows = 13                                                          # not a multiple of the 6-row tile
    raw = make_weight(qtype, rows, ne0, np.random.default_rng(7))
    x = np.random.default_rng(n).standard_normal((n, ne0)).astype(F32)
    out = np.full((n, rows), np.nan, F32)
    assert QWeight.prepare(raw, qtype, ne0).matmul(x, out=out) is out
    emu = llama_matmul(raw, qtype, ne0, x)
    assert np.abs(out - emu).max() <= EMU_RTOL * np.abs(emu).max()


def test_f16_and_bf16_dequantize_every_bit_pattern_exactly():
    patterns = np.arange(65536, dtype=np.uint32).astype(np.uint16).reshape(256, 256)
    for qtype in (T.F16, T.BF16):
        raw = patterns.view(np.float16) if qtype == T.F16 else patterns
        w = QWeight.prepare(raw, qtype, 256)
        assert_bits_equal(w.dequantize(), gguf_dequant(patterns.view(np.uint8), qtype, 256, 256)
                          if qtype == T.BF16 else patterns.view(np.float16).astype(F32))


def test_repack_is_lazy_and_cached():
    raw = make_weight(T.Q4_1, ROWS, NE0, np.random.default_rng(3))
    w = QWeight.prepare(raw, T.Q4_1, NE0)
    assert w.packed_nbytes == 0 and w.nbytes == raw.nbytes
    w.matmul(activations(1, 3))
    packed = w.packed
    assert w.packed_nbytes == -(-ROWS // 16) * 16 * NE0 * 5 // 8  # GGUF's bytes regrouped (20 per 32 weights), rows
    #                                                                 padded to groups of 16
    w.matmul(activations(2, 3))
    assert w.packed is packed


def _resident_kb(path) -> int:
    """This process's resident kB of its mappings of ``path`` (Linux's /proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and len(fields[0]) > 8 and ":" not in fields[0]:
                inside = len(fields) > 5 and fields[5] == str(path)
            elif inside and fields[0] == "Rss:":
                total += int(fields[1])
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads resident pages from Linux's /proc")
@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q8_0, T.Q4_K], ids=lambda t: t.name)
def test_a_mapped_weight_leaves_memory_once_repacked_and_reads_the_same(tmp_path, qtype):
    rows, ne0 = 4096, 512                                  # 1-2 MB: many pages
    raw = make_weight(qtype, rows, ne0, np.random.default_rng(5))
    path = tmp_path / "w.bin"
    raw.tofile(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r").reshape(raw.shape[0], -1)
    w = QWeight.prepare(mapped, qtype, ne0)
    expect = QWeight.prepare(raw.copy(), qtype, ne0)
    assert int(np.asarray(mapped).sum(dtype=np.int64)) == int(raw.sum(dtype=np.int64))  # every page read in
    assert _resident_kb(path) >= raw.nbytes // 1024 - 8
    x = activations(2, 5)
    y = w.matmul(x)
    assert _resident_kb(path) <= 8                        # the repacked copy serves; the file's pages are let go
    assert_bits_equal(y, expect.matmul(x))
    ids = np.array([0, 17, rows - 1])
    assert_bits_equal(w.get_rows(ids), expect.get_rows(ids))  # rows read back from the file as they were


def test_prepare_rejects_bad_input():
    raw = make_weight(T.Q4_0, 4, 64, np.random.default_rng(0))
    with pytest.raises(ValueError):
        QWeight.prepare(raw, T.Q4_0, 96)                              # row bytes do not match ne0
    with pytest.raises(ValueError):
        QWeight.prepare(raw[:, :-2], T.Q4_0, 64)
    with pytest.raises(NotImplementedError):
        QWeight.prepare(raw, T.Q8_1, 64)
    w = QWeight.prepare(raw, T.Q4_0, 64)
    with pytest.raises(ValueError):
        w.matmul(np.zeros((2, 64), np.float64))
    with pytest.raises(ValueError):
        w.matmul(np.zeros((64, 2), F32).T)                            # not C-contiguous
    with pytest.raises(IndexError):
        w.get_rows(np.array([4]))


# --- the real SmolLM2 tensors --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2_tensors(smollm2_gguf):
    wanted = {"blk.0.ffn_up.weight", "token_embd.weight"}
    return {t.name: t for t in gguf.GGUFReader(smollm2_gguf).tensors if t.name in wanted}


def test_smollm2_q4_1_ffn_up(smollm2_tensors):
    t = smollm2_tensors["blk.0.ffn_up.weight"]
    assert t.tensor_type == T.Q4_1
    ne0, rows = (int(v) for v in t.shape)
    w = QWeight.prepare(t.data, t.tensor_type, ne0)
    ref = gguf_dequant(np.asarray(t.data), T.Q4_1, rows, ne0)
    assert_bits_equal(w.dequantize(), ref)
    for n in (1, 8):
        x = np.random.default_rng(n).standard_normal((n, ne0)).astype(F32)
        y, emu = w.matmul(x), llama_matmul(np.asarray(t.data), T.Q4_1, ne0, x)
        assert np.abs(y - emu).max() <= EMU_RTOL * np.abs(emu).max()
        assert nmse(y, x @ ref.T) < NMSE_MAX[T.Q4_1]


def test_smollm2_q8_0_token_embd(smollm2_tensors):
    t = smollm2_tensors["token_embd.weight"]
    assert t.tensor_type == T.Q8_0
    ne0, rows = (int(v) for v in t.shape)
    raw = np.asarray(t.data)
    w = QWeight.prepare(t.data, t.tensor_type, ne0)
    ids = np.array([504, 3575, 282, 4649, 314, 0, rows - 1])
    assert_bits_equal(w.get_rows(ids), gguf_dequant(raw[ids], T.Q8_0, len(ids), ne0))
    sub = slice(0, 2048)                                                # emulate the LM head on a row slice
    for n in (1, 8):
        x = np.random.default_rng(n).standard_normal((n, ne0)).astype(F32)
        y, emu = w.matmul(x)[:, sub], llama_matmul(raw[sub], T.Q8_0, ne0, x)
        assert np.abs(y - emu).max() <= EMU_RTOL * np.abs(emu).max()
        assert nmse(y, x @ gguf_dequant(raw[sub], T.Q8_0, 2048, ne0).T) < NMSE_MAX[T.Q8_0]
    assert_bits_equal(w.get_rows(ids), gguf_dequant(raw[ids], T.Q8_0, len(ids), ne0))


@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q5_1, T.Q8_0, T.Q4_0])
def test_the_exact_gemv_gives_the_same_bits_with_one_row_or_two_to_a_register(qtype):
    rng = np.random.default_rng(11)
    rows, ne0 = 40, 96                                  # a last group of 8 rows: padding the 16 of a group
    w = QWeight.prepare(make_weight(qtype, rows, ne0, rng), qtype, ne0)
    x = rng.standard_normal((2, ne0)).astype(np.float32)
    outs = []
    for n_lanes in (8, 16):
        out = np.full((2, rows), np.nan, np.float32)
        exact_gemv({T.Q4_1: "q4_1", T.Q5_1: "q5_1", T.Q8_0: "q8_0", T.Q4_0: "q4_0x8"}[qtype], n_lanes)(*w.packed, x, out)
        outs.append(out)
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], w.matmul(x))


@pytest.mark.parametrize("qtype", [T.MXFP4, T.Q4_0, T.IQ4_NL], ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 3, 9])
def test_rows_in_eights_are_llama_cpps_repacked_block_by_block_fma_chain(qtype, n):
    """x is quantized to Q8_0 first; then per output and 32-block the exact integer sum of the weight's values
    times x's quants, accumulated as acc = fma(sum, d_w * d_x, acc) in block order (llama.cpp's repacked 8x8
    kernels). The fma is emulated in float64 (the product of two float32 is exact there)."""
    rng = np.random.default_rng(n)
    raw = make_weight(qtype, 40, 256, rng)
    x = rng.standard_normal((n, 256)).astype(F32)
    qw, dw = weight_ints(raw, qtype, 256)[:2]                                             # (40, 8, 32), (40, 8)
    qx, dx, _ = q8_blocks(x)                                                              # (n, 8, 32), (n, 8)
    want = np.zeros((n, 40), F32)
    for b in range(8):
        sums = (qx[:, None, b, :] * qw[None, :, b, :]).sum(-1).astype(np.float64)         # exact integers
        scale = (dw[None, :, b] * dx[:, None, b]).astype(F32).astype(np.float64)          # one f32 product
        want = (sums * scale + want.astype(np.float64)).astype(F32)
    assert_bits_equal(QWeight.prepare(raw, qtype, 256).matmul(x), want)


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q5_0], ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 3, 9])
def test_unrepacked_q4_0_and_q5_0_are_q8_0s_vec_dot_on_their_values(qtype, n):
    """ggml_vec_dot_q4_0_q8_0 and _q5_0_q8_0 (Q4_0 rows not in eights, which llama.cpp does not repack; Q5_0
    always) unpack a block's values to bytes and form Q8_0's lane sums from them: Q8_0 blocks of the same values
    and d give the same bits."""
    rng = np.random.default_rng(n)
    rows = 44 if qtype == T.Q4_0 else 40
    raw = make_weight(qtype, rows, 256, rng)
    qw = weight_ints(raw, qtype, 256)[0].reshape(rows, 8, 32)
    d = raw.reshape(rows, 8, -1)[:, :, 0:2]
    as_q8_0 = np.concatenate([d, qw.astype(np.int8).view(np.uint8)], axis=-1).reshape(rows, -1)
    x = rng.standard_normal((n, 256)).astype(F32)
    assert_bits_equal(QWeight.prepare(raw, qtype, 256).matmul(x), QWeight.prepare(as_q8_0, T.Q8_0, 256).matmul(x))


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("n", [1, 2, 3, 9])
def test_unrepacked_iq4_nl_is_its_vec_dot_for_one_row_and_tiny_blas_from_two(n, split):
    """IQ4_NL rows llama.cpp does not repack (not in eights, or a 3-D weight's matrices): one activation row through
    ggml_vec_dot_iq4_nl_q8_0, per block Q8_0's eight lane sums (lane l: elements 4l .. 4l + 3 of the values times
    x's quants), the even blocks chained in one register and the odd ones in another, acc = fma(d_x * d_w, lane,
    acc), hsum_float_8 of the two added, and an odd last block's exact sum added as fma(d_x * d_w, sum, total), or
    as a product then a sum in a build that splits FMA chains (isa.IsaPath.split_chains: GCC's -march=native on
    AMD's Zen cores); from two rows tinyBLAS_Q0_AVX: one chain over the blocks, then hsum_float_8. An expert's
    rows (mul_mat_id) stay on the vec_dot for every n. Seven blocks a row: an odd last one."""
    rng = np.random.default_rng(n)
    rows, ne0, nb = 44, 224, 7
    path = replace(isa.numerics().path, split_chains=split)
    raw = make_weight(T.IQ4_NL, rows, ne0, rng)
    x = rng.standard_normal((n, ne0)).astype(F32)
    qw, dw = weight_ints(raw, T.IQ4_NL, ne0)                                             # (rows, nb, 32), (rows, nb)
    qx, dx, _ = q8_blocks(x)                                                             # (n, nb, 32), (n, nb)
    lanes = (qw[None] * qx[:, None]).reshape(n, rows, nb, 8, 4).sum(-1).astype(F32)     # (n, rows, nb, 8)
    scale = (dx[:, None] * dw[None]).astype(F32)[..., None]                              # (n, rows, nb, 1)
    vec_dot, one_chain = np.empty((n, rows), F32), np.empty((n, rows), F32)
    for r in range(n):
        chains = [np.zeros((rows, 8), F32), np.zeros((rows, 8), F32)]
        for b in range(nb - 1):
            chains[b % 2] = _fma(scale[r, :, b], lanes[r, :, b], chains[b % 2])
        total, last = _hsum8(chains[0] + chains[1]), lanes[r, :, -1].sum(-1)
        vec_dot[r] = total + scale[r, :, -1, 0] * last if split else _fma(scale[r, :, -1, 0], last, total)
        one = np.zeros((rows, 8), F32)
        for b in range(nb):
            one = _fma(scale[r, :, b], lanes[r, :, b], one)
        one_chain[r] = _hsum8(one)
    assert not np.array_equal(vec_dot, one_chain)                           # the orders differ in the last bits
    mul_mat = vec_dot if n == 1 else one_chain
    assert_bits_equal(QWeight.prepare(raw, T.IQ4_NL, ne0, path).matmul(x), mul_mat)
    assert_bits_equal(QWeight(raw[:40], T.IQ4_NL, ne0, use="stack", path=path).matmul(x), mul_mat[:, :40])
    assert_bits_equal(QWeight(raw, T.IQ4_NL, ne0, use="expert", path=path).matmul(x), vec_dot)


def _fma_chain(terms, scales, acc):
    """acc = fma(term, scale, acc) over the last axis, as float32 FMAs (emulated in float64: one rounding)."""
    for t in range(terms.shape[-1]):
        acc = (terms[..., t].astype(np.float64) * scales[..., t].astype(np.float64) + acc.astype(np.float64)).astype(F32)
    return acc


@pytest.mark.parametrize("n", [1, 3, 4, 9])
def test_q4_k_rows_in_eights_are_llama_cpps_repacked_order(n):
    """ggml_gemv/gemm_q4_K_8x8_q8_K: exact integers sum_j sc_j * (q . q8) and sum_j m_j * bsum_j, per super-block in
    the GEMV and per pair of sub-blocks in the GEMM (rows in fours; the last n % 4 rows through the GEMV), then
    acc = fma(isum, d * d_x, acc), acc_min = fma(imin, dmin * d_x, acc_min), result acc - acc_min. One row holds the
    largest sums a block can have (every nibble 15, every scale 63, x all equal), past 2^24."""
    rng = np.random.default_rng(n)
    rows, ne0 = 16, 512
    raw = make_weight(T.Q4_K, rows, ne0, rng)
    blocks = raw.reshape(rows, -1, 144)
    blocks[3, :, 4:16], blocks[3, :, 16:] = 255, 255                      # scales and mins 63, nibbles 15
    x = rng.standard_normal((n, ne0)).astype(F32)
    x[-1] = 1.0
    q, d, dmin, sc, mn = weight_ints(raw, T.Q4_K, ne0)                    # (rows, nb, 256), (rows, nb), .., (rows, nb, 8)
    qx, dx, bsums = q8k_blocks(x)                                         # (n, nb, 256), (n, nb), (n, nb, 16)
    dots = np.einsum("rbjk,nbjk->nrbj", q.reshape(rows, -1, 8, 32), qx.reshape(n, -1, 8, 32))      # (n, rows, nb, 8)
    isum, imin = dots * sc[None], mn[None] * bsums.reshape(n, 1, -1, 8, 2).sum(-1)
    in_fours = n - n % 4
    per = [isum.reshape(n, rows, -1, 4, 2).sum(-1) if r < in_fours else isum.sum(-1, keepdims=True) for r in range(n)]
    per_min = [imin.reshape(n, rows, -1, 4, 2).sum(-1) if r < in_fours else imin.sum(-1, keepdims=True) for r in range(n)]
    want = np.empty((n, rows), F32)
    for r in range(n):
        links = per[r].shape[-1]
        terms = per[r][r].astype(F32).reshape(rows, -1)                   # float(isum): one rounding, as cvtepi32_ps
        mins = per_min[r][r].astype(F32).reshape(rows, -1)
        sw = np.repeat((d * dx[r][None]).astype(F32), links, axis=-1)
        sm = np.repeat((dmin * dx[r][None]).astype(F32), links, axis=-1)
        want[r] = _fma_chain(terms, sw, np.zeros(rows, F32)) - _fma_chain(mins, sm, np.zeros(rows, F32))
    assert np.abs(isum[-1, 3].sum(-1)).max() >= 2 ** 24
    assert_bits_equal(QWeight.prepare(raw, T.Q4_K, ne0).matmul(x), want)


def _fma(a, b, c) -> np.ndarray:
    """float32 fma(a, b, c), emulated in float64 (the product exact there, one rounding to float32)."""
    return (np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64)).astype(F32)


def _hsum8(a: np.ndarray) -> np.ndarray:
    """hsum_float_8 over the last axis (8 lanes): ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)), in float32."""
    a = a.astype(F32)
    return ((a[..., 0] + a[..., 4]) + (a[..., 2] + a[..., 6])) + ((a[..., 1] + a[..., 5]) + (a[..., 3] + a[..., 7]))


def _extremes(blocks: np.ndarray, qtype: T) -> None:
    """Every super-block of ``blocks`` (one row) given the largest values and scales of its type."""
    if qtype == T.Q6_K:
        blocks[:, 0:192], blocks[:, 192:208] = 255, 127                   # values 63, scales 127
    elif qtype == T.Q3_K:
        blocks[:, 0:108] = 0                                               # values -4, scales -32
    elif qtype == T.Q2_K:
        blocks[:, 0:80] = 255                                              # values 3, scales and mins 15
    elif qtype == T.IQ4_XS:
        blocks[:, 2:] = 0                                                  # scales -32, values -127
    elif qtype == T.IQ2_XXS:                                               # scales 31, grid row 57 (sum 203)
        words = np.zeros((len(blocks), 8, 2), np.uint32)
        words[..., 0], words[..., 1] = 0x39393939, 15 << 28               # all signs +
        blocks[:, 2:66] = words.view(np.uint8).reshape(len(blocks), 64)
    elif qtype == T.IQ2_XS:                                                # grid row 511 (all 43), signs +, scales 31
        blocks[:, 2:66] = np.full((len(blocks), 32), 511, np.uint16).view(np.uint8)
        blocks[:, 66:74] = 255
    elif qtype == T.IQ2_S:                                                 # grid row 1023 (all 43), signs +, scales 31
        blocks[:, 2:34], blocks[:, 34:66], blocks[:, 66:82] = 255, 0, 255
    elif qtype == T.IQ3_S:                                                 # the entry of the largest values, all
        e = int(grid_of(qtype).sum(-1).argmax())                           # negative, scales 31
        blocks[:, 2:66], blocks[:, 66:74], blocks[:, 74:] = e & 255, 255 * (e >> 8), 255
    elif qtype == T.IQ3_XXS:                                               # the same: every sign group 127
        blocks[:, 2:66], blocks[:, 66:] = int(grid_of(qtype).sum(-1).argmax()), 255   # (and its parity), scales 31
    else:
        blocks[:, 4:] = 255                                                # scales and mins 63, values 31 / 15


def _every_sign(blocks: np.ndarray, qtype: T) -> None:
    """The sign fields of ``blocks`` (rows, nb, size) of a grid type given every pattern in turn (IQ2_XXS and
    IQ2_XS: 7 bits, the 8th their parity; IQ2_S: 8 bits)."""
    rows, nb = blocks.shape[:2]
    p = np.arange(rows * nb * 32, dtype=np.uint32) % (256 if qtype == T.IQ2_S else 128)
    if qtype == T.IQ2_XXS:
        words = blocks[..., 2:66].copy().view(np.uint32).reshape(rows, nb, 8, 2)
        groups = p.reshape(rows, nb, 8, 4) << np.array([0, 7, 14, 21], np.uint32)
        words[..., 1] = words[..., 1] & np.uint32(0xF0000000) | groups.sum(-1, dtype=np.uint32)
        blocks[..., 2:66] = words.view(np.uint8).reshape(rows, nb, 64)
    elif qtype == T.IQ2_XS:
        words = blocks[..., 2:66].copy().view(np.uint16)
        blocks[..., 2:66] = (words & 511 | p.reshape(rows, nb, 32).astype(np.uint16) << 9).view(np.uint8)
    else:
        blocks[..., 34:66] = p.reshape(rows, nb, 32)


def _vec_dot_and_tiled(raw: np.ndarray, qtype: T, ne0: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The llama.cpp order of an unrepacked K-quant matrix (see the test below), and its lanes."""
    rows, n = raw.shape[0], x.shape[0]
    qx, dx, bsums = q8k_blocks(x)                                          # (n, nb, 256), (n, nb), (n, nb, 16)
    if qtype in (T.Q6_K, T.Q3_K):
        q, d, sc = weight_ints(raw, qtype, ne0)
        dmin, imin = np.zeros_like(d), np.zeros((n, rows, d.shape[1]), np.int64)
        q, sub, bias = (q + 32, 16, 32) if qtype == T.Q6_K else (q, 16, 0)   # Q3_K's lanes: its signed values
    elif qtype in (T.IQ4_XS, *GRIDS, T.IQ3_S, T.IQ3_XXS):
        q, d, sc = weight_ints(raw, qtype, ne0)
        dmin, sub, bias, imin = np.zeros_like(d), 256 // sc.shape[-1], 0, np.zeros((n, rows, d.shape[1]), np.int64)
    else:
        q, d, dmin, sc, mn = weight_ints(raw, qtype, ne0)
        g = sc.shape[-1]                                                   # sub-blocks a super-block
        sub, bias = 256 // g, 0
        terms = mn[None] * bsums.reshape(n, 1, -1, g, 16 // g).sum(-1)    # (n, rows, nb, g)
        min_pairs = terms.reshape(*terms.shape[:3], -1, 2).sum(-1)                            # sub-blocks 2p, 2p + 1
        imin = terms.sum(-1)                                                                   # (n, rows, nb)
    nb = d.shape[1]
    dots = np.einsum("rbgle,nbgle->nrbgl", q.reshape(rows, nb, 8, 8, 4), qx.reshape(n, nb, 8, 8, 4))
    lanes = (dots * sc[:, :, (32 * np.arange(8)[:, None] + 4 * np.arange(8)) // sub][None]).sum(3)  # (n, rows, nb, 8)
    if bias:
        pairs = sc[None, :, :, 0::2] * bsums[:, None, :, 0::2] + sc[None, :, :, 1::2] * bsums[:, None, :, 1::2]
        lanes -= bias * pairs
    want = np.empty((n, rows), F32)
    for r in range(n):
        acc, summs = np.zeros((rows, 8) if n < 8 else rows, F32), np.zeros((rows, 4) if qtype == T.Q4_K else rows, F32)
        for b in range(nb):
            if n < 8:
                if qtype == T.Q2_K:                                        # its mins first, in the lanes' chain
                    acc = _fma(min_pairs[r, :, b].astype(F32), (-dx[r, b] * dmin[:, b, None]).astype(F32), acc)
                acc = _fma(lanes[r, :, b].astype(F32), (dx[r, b] * d[:, b, None]).astype(F32), acc)
                if qtype in (T.Q5_K, T.Q4_K):
                    mins = min_pairs[r, :, b] if qtype == T.Q4_K else imin[r, :, b]
                    summs = _fma(mins.astype(F32), (-dx[r, b] * dmin[:, b, None] if qtype == T.Q4_K else
                                                    -dx[r, b] * dmin[:, b]).astype(F32), summs)
            else:
                res = ((d[:, b] * F32(FACTOR.get(qtype, 1))) * lanes[r, :, b].sum(-1).astype(F32)).astype(F32)
                acc = _fma(_fma(-dmin[:, b], imin[r, :, b].astype(F32), res), dx[r, b], acc)
        if qtype == T.Q4_K:
            summs = (summs[:, 0] + summs[:, 2]) + (summs[:, 1] + summs[:, 3])
        want[r] = acc if n >= 8 else F32(FACTOR.get(qtype, 1)) * _hsum8(acc) \
            if qtype in (T.Q6_K, T.Q3_K, T.Q2_K, T.IQ4_XS, *GRIDS, T.IQ3_S, T.IQ3_XXS) \
            else _hsum8(acc) + summs
    return want, lanes


@pytest.mark.parametrize("qtype", [T.Q6_K, T.Q5_K, T.Q4_K, T.Q3_K, T.Q2_K, T.IQ4_XS, *GRIDS, T.IQ3_S,
                                   T.IQ3_XXS],
                         ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 17, 33])   # 33: the tiled chains formed with rows side by side
def test_k_quants_unrepacked_are_llama_cpps_vec_dot_below_eight_rows_and_its_tiled_kernels_from_eight(qtype, n):
    """ggml_vec_dot_q6_K_q8_K / _q5_K_q8_K / _q4_K_q8_K / _q3_K_q8_K / _q2_K_q8_K (their AVX2 code, which AVX-512
    builds take too) for Q6_K, Q5_K, Q3_K and the Q4_K and Q2_K matrices llama.cpp does not repack (rows not in
    eights, a 3-D weight's matrices; Q2_K on AVX2 always), fewer than 8 activation rows: per super-block eight
    int32 lanes, lane l over the runs of 32 elements the scale of its sub-block times (elements 4l .. 4l + 3 . q8)
    (Q3_K's values signed), less for Q6_K 32 * (sc[2l] * bsum[2l] + sc[2l + 1] * bsum[2l + 1]) (its values'
    offset); acc = fma(d_x * d_w, lane, acc) lane by lane, hsum_float_8, plus Q5_K's min chain
    summs = fma(-d_x * dmin, imin, summs), or Q4_K's in four lanes (sub-blocks 2p and 2p + 1 in lane p) added
    (0 + 2) + (1 + 3) at the end; Q2_K's mins go into the lanes' own chain, each super-block
    acc = fma(-d_x * dmin, m_2p * bsum_2p + m_2p+1 * bsum_2p+1, acc) before its lanes' FMA. From 8 rows
    ggml-cpu/tiled: res = d_w * float(sum of the lanes), res = fnmadd(dmin, imin, res), acc = fma(res, d_x, acc).
    imin = sum_j m_j * (the activation's sum over sub-block j). One row holds the largest values and scales, and
    x's last row +-1 (1 on lane 0's elements): for the 6-bit scales, sums past 2^24, for Q6_K in a lane (its
    products and offset of one sign). IQ4_XS (ggml_vec_dot_iq4_xs_q8_K, tiled's sign-trick MAC) is Q6_K's arithmetic
    on its signed values, sub-blocks of 32 and no offset. The grid types (IQ2_XXS, IQ2_XS and IQ2_S:
    ggml_vec_dot_iq2_xxs_q8_K, _xs_q8_K, _s_q8_K, and tiled's act-bias MAC) take the same lanes on their signed
    grid values, sub-blocks of 32 (IQ2_XXS) or 16 and scales 2s + 1, with a factor 1/8 on the vec_dot's hsum and
    on the tiled kernels' d; three super-blocks a row, rows 4 to 7 with every sign pattern. IQ3_S's
    (ggml_vec_dot_iq3_s_q8_K, tiled's act-bias MAC) too, on its signed grid values, scales 1 + 2 * field (its sums
    stay below 2^24), and IQ3_XXS's, whose factor of 1/4 multiplies the vec_dot's total (0.25f * hsum_float_8) and the tiled kernels' d."""
    rng = np.random.default_rng(n)
    # from 32 rows: 1280 elements (two passes of the side-by-side chains) and 40 rows (whole groups of 16 or 8 rows
    # side by side, and on AVX-512 a last group of 8)
    rows, ne0 = (40, 1280) if n >= 32 else (16, 768 if qtype in GRIDS else 512)
    raw = make_weight(qtype, rows, ne0, rng)
    _extremes(raw.reshape(rows, -1, gguf.GGML_QUANT_SIZES[qtype][1])[3], qtype)
    if qtype in GRIDS:
        _every_sign(raw.reshape(rows, -1, gguf.GGML_QUANT_SIZES[qtype][1])[4:8], qtype)
    x = rng.standard_normal((n, ne0)).astype(F32)
    x[-1] = np.where(np.arange(ne0) % 32 < 4, 1.0, -1.0)                  # lane 0's elements against the others
    want, lanes = _vec_dot_and_tiled(raw, qtype, ne0, x)
    if qtype == T.Q6_K:
        assert np.abs(lanes[-1, 3]).max() >= 2 ** 24
    elif qtype in (T.Q5_K, T.Q4_K, T.IQ4_XS, *GRIDS, T.IQ3_XXS):
        assert np.abs(lanes[-1, 3].sum(-1)).max() >= 2 ** 24
    if qtype in (T.Q4_K, T.Q2_K):                                         # the kinds llama.cpp does not repack
        assert_bits_equal(QWeight(raw, qtype, ne0, use="stack").matmul(x), want)
        raw, want = raw[:12], want[:, :12]
    assert_bits_equal(QWeight.prepare(raw, qtype, ne0).matmul(x), want)


def _every_entry_and_sign(raw: np.ndarray, qtype: T) -> None:
    """Grid-coded rows given every grid entry and every sign pattern in turn, group after group."""
    b = raw.reshape(-1, gguf.GGML_QUANT_SIZES[qtype][1])
    entries = np.arange(64 * b.shape[0]) % len(grid_of(qtype))
    if qtype == T.IQ3_S:                                                  # ninth index bits, then the sign bytes
        b[:, 2:66] = (entries & 255).reshape(-1, 64)
        b[:, 66:74] = np.packbits((entries >> 8).reshape(-1, 8, 8).astype(np.uint8), axis=-1, bitorder="little")[..., 0]
        b[:, 74:106] = (np.arange(32 * b.shape[0]) % 256).reshape(-1, 32)
    else:                                                                 # seven sign bits a group, four a word
        b[:, 2:66] = entries.reshape(-1, 64)
        seven = (np.arange(32 * b.shape[0], dtype=np.uint32) % 128).reshape(-1, 8, 4) << np.uint32(7) * np.arange(
            4, dtype=np.uint32)
        words = b[:, 66:98].copy().view(np.uint32) & np.uint32(0xF0000000) | seven.sum(-1, dtype=np.uint32)
        b[:, 66:98] = words.view(np.uint8)


@pytest.mark.parametrize("qtype", [T.IQ3_S, T.IQ3_XXS], ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 5, 8, 11])
def test_grid_types_take_every_entry_and_sign_pattern_over_an_odd_number_of_super_blocks(qtype, n):
    """Rows of three super-blocks (an odd count) holding every grid entry and every sign pattern: the products are
    llama.cpp's vec_dot below 8 activation rows and its tiled kernels from 8 (the emulation above), and the rows
    read back are gguf's."""
    rng = np.random.default_rng(40 + n)
    rows, ne0 = 24, 768
    raw = make_weight(qtype, rows, ne0, rng)
    _every_entry_and_sign(raw, qtype)
    x = rng.standard_normal((n, ne0)).astype(F32)
    w = QWeight.prepare(raw, qtype, ne0)
    assert_bits_equal(w.matmul(x), _vec_dot_and_tiled(raw, qtype, ne0, x)[0])
    assert_bits_equal(w.dequantize(), gguf_dequant(raw, qtype, rows, ne0))


@pytest.mark.parametrize("n", [1, 9])
def test_iq3_xxs_quarter_is_taken_where_llama_cpp_takes_it(monkeypatch, n):
    """ggml_vec_dot_iq3_xxs_q8_K multiplies its total by 0.25f after its FMA chains (a lane past float's largest
    value stays infinite), the tiled kernels multiply d by it before theirs (a sum that would pass it before the
    quarter stays finite): with d = 4 and activations near 1e34 the other place gives other numbers, and the
    products are llama.cpp's."""
    rng = np.random.default_rng(n)
    rows, ne0 = 8, 512
    raw = make_weight(T.IQ3_XXS, rows, ne0, rng)
    raw.reshape(rows, -1, 98)[:, :, 0:2] = half(np.full((rows, 2), 4.0))
    x = (rng.standard_normal((n, ne0)) * 1e34).astype(F32)
    with np.errstate(over="ignore", invalid="ignore"):
        want = _vec_dot_and_tiled(raw, T.IQ3_XXS, ne0, x)[0]
        monkeypatch.setitem(FACTOR, T.IQ3_XXS, 1.0)
        if n < 8:                                                         # the quarter in d: d = 1, no factor
            folded = raw.copy()
            folded.reshape(rows, -1, 98)[:, :, 0:2] = half(np.full((rows, 2), 1.0))
            other = _vec_dot_and_tiled(folded, T.IQ3_XXS, ne0, x)[0]
        else:                                                             # the quarter on the result
            other = _vec_dot_and_tiled(raw, T.IQ3_XXS, ne0, x)[0] * F32(0.25)
    assert not np.array_equal(want.view(np.uint32), other.view(np.uint32))
    assert_bits_equal(QWeight.prepare(raw, T.IQ3_XXS, ne0).matmul(x), want)


@pytest.mark.parametrize("path", ["avx512", "avx2"])
@pytest.mark.parametrize("n", [1, 3, 4, 9])
def test_q2_k_rows_in_eights_are_llama_cpps_repacked_order_on_avx512_and_its_vec_dot_on_avx2(path, n):
    """AVX-512 builds repack a Q2_K matrix whose rows come in eights (block_q2_Kx8) and multiply it with
    ggml_gemv/gemm_q2_K_8x8_q8_K: exact integers isum = sum_j sc_j * (q . q8 over sub-block j of 16) and
    imin = sum_j m_j * bsum_j, per super-block in the GEMV and per half (128 elements) in the GEMM (rows in fours;
    the last n % 4 rows through the GEMV), then acc = fma(isum, d * d_x, acc), acc_min = fma(imin, dmin * d_x,
    acc_min), result acc - acc_min. An expert's rows (mul_mat_id) all go through the GEMV. AVX2 builds do not
    repack Q2_K: its vec_dot (and tiled kernels from 8 rows), as above. The path is the weight's own (a model
    loaded with isa=...), whatever the host's or GRAPHIR_ISA's."""
    rng = np.random.default_rng(n)
    rows, ne0 = 16, 512
    raw = make_weight(T.Q2_K, rows, ne0, rng)
    _extremes(raw.reshape(rows, -1, 84)[3], T.Q2_K)
    x = rng.standard_normal((n, ne0)).astype(F32)
    x[-1] = 1.0
    q, d, dmin, sc, mn = weight_ints(raw, T.Q2_K, ne0)                    # (rows, nb, 256), (rows, nb), .., (.., 16)
    qx, dx, bsums = q8k_blocks(x)                                         # (n, nb, 256), (n, nb), (n, nb, 16)
    dots = np.einsum("rbjk,nbjk->nrbj", q.reshape(rows, -1, 16, 16), qx.reshape(n, -1, 16, 16))    # (n, rows, nb, 16)
    isum, imin = dots * sc[None], mn[None] * bsums[:, None]

    def chains(in_fours: int) -> np.ndarray:
        want = np.empty((n, rows), F32)
        for r in range(n):
            links = 2 if r < in_fours else 1
            terms = isum[r].reshape(rows, -1, links, 16 // links).sum(-1).astype(F32).reshape(rows, -1)
            mins = imin[r].reshape(rows, -1, links, 16 // links).sum(-1).astype(F32).reshape(rows, -1)
            sw = np.repeat((d * dx[r][None]).astype(F32), links, axis=-1)
            sm = np.repeat((dmin * dx[r][None]).astype(F32), links, axis=-1)
            want[r] = _fma_chain(terms, sw, np.zeros(rows, F32)) - _fma_chain(mins, sm, np.zeros(rows, F32))
        return want

    matrix = QWeight.prepare(raw, T.Q2_K, ne0, isa.PATHS[path])
    (expert,) = expert_matrices(QWeight.prepare(raw, T.Q2_K, ne0, isa.PATHS[path]), 1)
    if path == "avx512":
        assert_bits_equal(matrix.matmul(x), chains(n - n % 4))
        assert_bits_equal(expert.matmul(x), chains(0))
    else:
        want = _vec_dot_and_tiled(raw, T.Q2_K, ne0, x)[0]
        assert_bits_equal(matrix.matmul(x), want)
        assert_bits_equal(expert.matmul(x), want)


def _iq1_extremes(blocks: np.ndarray, qtype: T) -> None:
    """Every super-block of ``blocks`` (one row) given the largest scales (15) and, group by group, grid rows of
    eight +-1 (no zero), the delta's signs alternating."""
    full = np.flatnonzero((IQ1_GRID != 0).all(axis=1))                 # the rows of eight +-1
    idx = full[np.arange(32) % len(full)]
    if qtype == T.IQ1_S:
        blocks[:, 2:34] = idx & 255
        high = (idx >> 8).reshape(8, 4) << 3 * np.arange(4)
        words = high.sum(axis=1) | 7 << 12 | (np.arange(8) % 2) << 15
        blocks[:, 34:50] = words.astype(np.uint16).view(np.uint8)
    else:
        blocks[:, 0:32] = idx & 255
        nib = (idx >> 8) | (np.arange(32) % 2) << 3
        blocks[:, 32:48] = (nib[0::2] | nib[1::2] << 4).astype(np.uint8)
        blocks[:, 48:56] |= np.array([0xFF, 0x0F], np.uint8)[np.arange(8) % 2]      # the twelve scale bits of a word


def _iq1_orders(raw: np.ndarray, qtype: T, ne0: int, x: np.ndarray) -> np.ndarray:
    """llama.cpp's order of an IQ1 matrix (see the test below)."""
    rows, n = raw.shape[0], x.shape[0]
    grid, d, sc, delta = weight_ints(raw, qtype, ne0)                     # (rows, nb, 256), (rows, nb), .., (.., 256)
    qx, dx, _ = q8k_blocks(x)                                             # (n, nb, 256), (n, nb)
    nb, sub = d.shape[1], 256 // sc.shape[-1]
    per_lane = sc[:, :, (32 * np.arange(8)[:, None] + 4 * np.arange(8)) // sub][None]    # (1, rows, nb, run, lane)

    def lanes(values):                               # (n, rows, nb, 8): scale times 4 products, over the runs
        dots = np.einsum("rbgle,nbgle->nrbgl", values.reshape(rows, nb, 8, 8, 4), qx.reshape(n, nb, 8, 8, 4))
        return (dots * per_lane).sum(3)

    grid_lanes, delta_lanes, whole = lanes(grid), lanes(delta), lanes(8 * grid + delta).sum(-1)
    want = np.empty((n, rows), F32)
    for r in range(n):
        acc = np.zeros((rows, 8) if n < 8 else rows, F32)
        acc1 = np.zeros((rows, 8) if qtype == T.IQ1_M else rows, F32)
        for b in range(nb):
            if n < 8:                                                     # ggml_vec_dot_iq1_s_q8_K / _iq1_m_q8_K
                dd = (dx[r, b] * d[:, b]).astype(F32)
                acc = _fma(dd[:, None], grid_lanes[r, :, b].astype(F32), acc)
                if qtype == T.IQ1_S:                                      # one integer, a scalar chain
                    acc1 = _fma(dd, delta_lanes[r, :, b].sum(-1).astype(F32), acc1)
                else:
                    acc1 = _fma(dd[:, None], delta_lanes[r, :, b].astype(F32), acc1)
            else:                                                         # ggml-cpu/tiled: d / 8, values whole
                res = ((d[:, b] * F32(0.125)).astype(F32) * whole[r, :, b].astype(F32)).astype(F32)
                acc = _fma(res, dx[r, b], acc)
        if n >= 8:
            want[r] = acc
        else:
            want[r] = _hsum8(acc) + F32(0.125) * (acc1 if qtype == T.IQ1_S else _hsum8(acc1))
    return want


@pytest.mark.parametrize("qtype", [T.IQ1_S, T.IQ1_M], ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 17])
def test_iq1_is_llama_cpps_vec_dot_below_eight_rows_and_its_tiled_kernels_from_eight(qtype, n):
    """IQ1_S and IQ1_M (values grid + delta / 8, grid rows of eight from iq1s_grid, delta +-1/8 per 32 or per 8,
    scales 2s + 1 per 32 or per 16), never repacked: below 8 activation rows ggml_vec_dot_iq1_s_q8_K /
    _iq1_m_q8_K (their AVX2 code, which AVX-512 builds take too): per super-block the grid's eight int32 lanes,
    lane l over the runs of 32 elements the scale of its sub-block times (elements 4l .. 4l + 3 . q8),
    acc = fma(d_x * d_w, lane, acc) lane by lane, and the delta's apart: IQ1_S's one integer
    sum_j sign_j * scale_j * (the activation's sum over sub-block j) in a scalar chain acc1 = fma(d_x * d_w, int,
    acc1), IQ1_M's eight lanes as the grid's in a second register; the result hsum_float_8(acc) + 1/8 * acc1
    (IQ1_M: hsum_float_8(acc1)). From 8 rows ggml-cpu/tiled: the values 8 * grid + delta whole, s1 the exact sum
    of scale times their products, res = (d_w * 1/8) * float(s1), acc = fma(res, d_x, acc). Three super-blocks a
    row (an odd count); row 3 holds rows of the grid without zeros, the largest scales and both delta signs, x's
    last row +-127 in quants (1 on lane 0's elements, -1 on the others): the largest lanes (|s1| stays below
    2^24: 15 * 9 * 127 * 256). An expert's rows (mul_mat_id) are multiplied the same way."""
    rng = np.random.default_rng(n)
    rows, ne0 = 16, 768
    raw = make_weight(qtype, rows, ne0, rng)
    _iq1_extremes(raw.reshape(rows, 3, -1)[3], qtype)
    x = rng.standard_normal((n, ne0)).astype(F32)
    x[-1] = np.where(np.arange(ne0) % 32 < 4, 1.0, -1.0)
    want = _iq1_orders(raw, qtype, ne0, x)
    grid, _, sc, _ = weight_ints(raw[3:4], qtype, ne0)
    assert (np.abs(grid) == 1).all() and (sc == 15).all() and (np.abs(q8k_blocks(x[-1:])[0]) == 127).all()
    assert_bits_equal(QWeight.prepare(raw, qtype, ne0).matmul(x), want)
    assert_bits_equal(QWeight(raw, qtype, ne0, use="expert").matmul(x), want)


@pytest.mark.parametrize("qtype", [T.TQ1_0, T.TQ2_0], ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 17])
def test_ternary_types_are_llama_cpps_vec_dot_for_every_number_of_rows(qtype, n):
    """ggml_vec_dot_tq1_0_q8_K / _tq2_0_q8_K (AVX2 code, which AVX-512 builds take too), which llama.cpp's mul_mat
    and mul_mat_id take for any number of activation rows (ggml-cpu/tiled, tinyBLAS and the repacked kernels leave
    these types alone): per super-block sixteen int16 lanes, lane k the products of the values plus 1 (0-2; TQ2_0's
    3 counts as 3) of bytes 2k, 2k + 1 of each run of 32 elements with the activation's quants, less the
    activation's sum over its sub-block k of 16; pairs of them added into eight int32 lanes, converted, and
    acc = fma(float(lane), d_x * d_w, acc) lane by lane (the build contracts its mul and add), hsum_float_8 at the
    end. Three super-blocks a row; one row all +1 (TQ2_0: its largest bytes, the 2-bit 3s), one all -1, and x's
    last row +-1 over its first super-block (1 on lane 0's elements), so the int16 lanes reach their largest
    sums, which stay in range; the other super-blocks random, where the order of the float operations shows."""
    rng = np.random.default_rng(n)
    rows, ne0, tsize = 16, 768, gguf.GGML_QUANT_SIZES[qtype][1]
    raw = make_weight(qtype, rows, ne0, rng)
    blocks = raw.reshape(rows, -1, tsize)
    blocks[3, :, :tsize - 2], blocks[4, :, :tsize - 2] = 255, 0
    x = rng.standard_normal((n, ne0)).astype(F32)
    x[-1, :256] = np.where(np.arange(256) % 32 < 4, 1.0, -1.0)
    values = ternary_digits(blocks, qtype)                                # (rows, nb, 256)
    d = blocks[..., tsize - 2:].copy().view(np.float16)[..., 0].astype(F32)
    assert values[3].min() == (2 if qtype == T.TQ1_0 else 3) and values[4].max() == 0
    qx, dx, bsums = q8k_blocks(x)                                         # (n, nb, 256), (n, nb), (n, nb, 16)
    nb = d.shape[1]
    products = np.einsum("rbtkp,nbtkp->nrbk", values.reshape(rows, nb, 8, 16, 2), qx.reshape(n, nb, 8, 16, 2))
    int16_lanes = products - bsums[:, None]                               # (n, rows, nb, 16)
    assert np.abs(int16_lanes).max() < 2 ** 15 and np.abs(int16_lanes[-1, 3]).max() >= 16 * 2 * 127
    lanes = int16_lanes.reshape(n, rows, nb, 8, 2).sum(-1).astype(F32)
    want, tiled = np.empty((n, rows), F32), np.empty((n, rows), F32)
    for r in range(n):
        acc, tiled_acc = np.zeros((rows, 8), F32), np.zeros(rows, F32)
        for b in range(nb):
            acc = _fma(lanes[r, :, b], (dx[r, b] * d[:, b, None]).astype(F32), acc)
            tiled_acc = _fma(d[:, b] * lanes[r, :, b].sum(-1), dx[r, b], tiled_acc)
        want[r], tiled[r] = _hsum8(acc), tiled_acc
    assert not np.array_equal(want, tiled)                                # the other order shows in the bits
    assert_bits_equal(QWeight.prepare(raw, qtype, ne0).matmul(x), want)
    assert_bits_equal(QWeight(raw, qtype, ne0, use="expert").matmul(x), want)
    assert_bits_equal(QWeight(raw, qtype, ne0, use="stack").matmul(x), want)
