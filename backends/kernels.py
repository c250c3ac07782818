"""Activation kernels of the IR's ops, written to reproduce ggml's CPU arithmetic (llama.cpp's oracle) bit for bit.

Arrays are in numpy order (the reverse of the IR's ggml order): a ggml ``[576, n_tokens]`` value is a
numpy ``(n_tokens, 576)`` array. The reference is llama.cpp's ggml-cpu as built on x86 (GCC, FMA contraction
on, llamafile's tinyBLAS enabled) for one of the paths of :mod:`graphir.backends.isa`: the kernels that
depend on it take an ``IsaPath`` (its register width ``lanes``, its final vector reduction, its ggml_v_expf).
Each kernel says which ggml function it follows and in what order it sums; where ggml sums in double, so do
these. "A register" below is ``lanes`` floats: 16 on the AVX-512 path, 8 on the AVX2 path.

What makes the attention exact (numba kernels below):
    mul_mat of f16/f32 activations: ggml converts the other operand to the cache type (f32 -> f16, nearest
    even), then per output element either tinyBLAS (llamafile sgemm, taken for n >= 2 columns when the inner
    length is a multiple of a register: one FMA chain per lane, then the register's sum) or
    ggml_vec_dot_f16/f32 (n = 1: four registers of FMA chains over steps of 4 registers, reduced (0+2, 1+3,
    then 0+1) and summed by the path's final reduction, the tail added in double for f16 / fused in float
    for f32).
    llama.cpp's KV length n_kv is padded to a multiple of 256 with masked cells; graphir attends over the used
    cells only. Padding changes the paths (SIMD blocks instead of scalar tails) but not the values (masked
    probabilities are exactly 0), so soft_max with a mask and the mul_mat that consumes its output emulate the
    padded length (``pad``; by default taken from the mask / from soft_max's result).
    soft_max: ggml_soft_max_f32 (scale, + mask, max, ggml_vec_soft_max_f32: ggml_v_expf per register and a
    double sum of each register's sum, then * (float)(1/sum)).
RoPE: cos/sin from glibc's cosf/sinf (numba's math.cos on float32; numpy's float32 cos differs in ~15% of
    angles), angles by repeated float32 multiplication; the rotation as GCC vectorized it: x0*cos - x1*sin with
    the second product rounded and the first fused, x0*sin + x1*cos with x1*cos rounded and x0*sin fused.
rms_norm: squares in float, summed sequentially in double.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math

import numba
import numpy as np
from numba import njit, prange

from graphir.backends import isa
from graphir.backends.kernels_util import bits_f32, bits_u32, f16_bits, fma, hsum8, hsum16

F32 = np.float32
# error_model="numpy": a float division by zero gives inf/nan as in C; numba's default (raise) keeps a branch in
# every division that stops loops from vectorizing (silu: 8x slower)
_SER = dict(cache=True, error_model="numpy")
_PAR = dict(parallel=True, cache=True, error_model="numpy")
_INL = dict(cache=True, error_model="numpy", inline="always")

_libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
for _f, _n in (("powf", 2), ("logf", 1), ("cosf", 1), ("sinf", 1)):
    getattr(_libm, _f).restype, getattr(_libm, _f).argtypes = ctypes.c_float, [ctypes.c_float] * _n

KV_PAD = 256        # llama.cpp pads n_kv to a multiple of 256 (llama_kv_cache::get_n_kv)


class _Probs(np.ndarray):
    """soft_max's result when it was computed over a padded KV length: mul_mat(v, kq) then emulates the
    same padding. A marker type only (views keep it; np.array copies drop it)."""

    kv_pad: int = 1


@njit(**_SER)
def _fma32(a, b, c):
    """float32 a * b + c rounded once, for scalars from Python."""
    return fma(F32(a), F32(b), F32(c))


@njit(**_INL)
def _hsum(v, o, lanes):
    """The sum of one register, v[o:o + lanes], halved down to one lane: _mm512_reduce_add_ps for 16 lanes,
    hsum_float_8 (and soft_max's / the variance's extract-movehl-movehdup sequence) for 8."""
    if lanes == 16:
        return hsum16(v[o:o + 16])
    return hsum8(v[o], v[o + 1], v[o + 2], v[o + 3], v[o + 4], v[o + 5], v[o + 6], v[o + 7])


# ---------------------------------------------------------------------------------------------------------
# exp: ggml_v_expf, one lane, in the variant of the path (isa.EXPF_*)
# ---------------------------------------------------------------------------------------------------------

_E = [F32(float.fromhex(h)) for h in ("0x1.8p23", "0x1.715476p+0", "0x1.7f7d1cp-20", "0x1.62e4p-1", "0x1.0e4020p-7",
                                       "0x1.573e2ep-5", "0x1.555e66p-3", "0x1.fffdb6p-2", "0x1.ffffecp-1")]
_R, _LOG2E, _LN2_LO, _LN2_HI, _C5, _C4, _C3, _C2, _C1 = _E
_ONE, _ZERO, _INF, _N126, _N192, _N200 = F32(1.0), F32(0.0), F32(np.inf), F32(126.0), F32(192.0), F32(200.0)
_P127, _M125 = F32(2.0 ** 127), F32(2.0 ** -125)
_EXPF_SPLIT = isa.EXPF_SPLIT


@njit(**_INL)
def _v_expf_scalef(x):
    """ggml_v_expf (vec.h, AVX-512) for one lane: 2^n range reduction, degree-5 polynomial, scalef.

    NOTE: not libm's expf (up to ~1.5 ulp apart); llama.cpp's SiLU and softmax use it. scalef(j, n) = j * 2^n
    rounded once: as (j * 2^(n>>1)) * 2^(n - (n>>1)), the first product exact (|n| <= 192, j in [0.7, 1.5]).
    """
    z = fma(x, _LOG2E, _R)
    n = z - _R
    b = fma(-n, _LN2_LO, fma(-n, _LN2_HI, x))
    u = b * b
    j = fma(fma(fma(_C5, b, _C4), u, fma(_C3, b, _C2)), u, fma(_C1, b, _ONE))
    big = abs(n) > _N192
    k = np.int32(min(max(n, -_N192), _N192))
    k1 = k >> np.int32(1)
    res = (j * bits_f32((k1 + np.int32(127)) << np.int32(23))) * bits_f32((k - k1 + np.int32(127)) << np.int32(23))
    if big:
        res = _ZERO if n <= _ZERO else _INF
    return res


@njit(**_INL)
def _v_expf_split(x):
    """ggml_v_expf (vec.h, AVX2) for one lane: the same reduction, a polynomial j without its constant 1 and
    k = 2^n, result k + k*j; for |n| > 126 the power is split in two factors, s2 * (1 + j) then * s1, so it
    cannot overflow early, and past |n| > 192 the result is s1 * s1 (inf, or 0).

    The vector code builds k, s1 and s2 from z's bits with 32-bit integer steps; here they are the same powers
    of two from n. As in its blend, every case is computed and then selected (a branch stops loops from
    vectorizing), and lanes that will not use s2 get a harmless one: the vector code skips that path when no
    lane needs it, and computing it with the real s2 makes subnormals, which cost microcode assists (SiLU
    measured 4x slower). Checked equal to the bitwise formulation on every 5th float32."""
    z = fma(x, _LOG2E, _R)
    n = z - _R
    b = fma(-n, _LN2_LO, fma(-n, _LN2_HI, x))
    u = b * b
    j = fma(fma(fma(_C5, b, _C4), u, fma(_C3, b, _C2)), u, _C1 * b)
    pos = n > _ZERO
    an = abs(n)
    split = an > _N126                                      # _CMP_GT_OQ: false for NaN, which takes k + k*j
    kn = np.int32(min(max(n, -_N200), _N200))
    k = bits_f32((kn + np.int32(127)) << np.int32(23))      # 2^n
    ks = kn if split else (np.int32(127) if pos else np.int32(-120))
    s1 = _P127 if pos else _M125                            # 2^127 or 2^-125
    s2 = bits_f32((ks + (np.int32(0) if pos else np.int32(252))) << np.int32(23))   # 2^(n-127) or 2^(n+125)
    res = (_INF if pos else _ZERO) if an > _N192 else fma(s2, j, s2) * s1   # s1 * s1 rounds to inf or 0
    return res if split else fma(j, k, k)


@njit(**_INL)
def _v_expf_shifted(w, head, mx, variant):
    """w[:head] = ggml_v_expf(w - mx), with the path's variant chosen once outside the loop (a branch inside
    keeps it from vectorizing: soft_max measured 30% slower)."""
    if variant == _EXPF_SPLIT:
        for i in range(head):
            w[i] = _v_expf_split(w[i] - mx)
    else:
        for i in range(head):
            w[i] = _v_expf_scalef(w[i] - mx)


@njit(**_INL)
def _block_sums(v, head, lanes):
    """sum over the registers of v[:head] of each register's sum (_hsum), in double, in order."""
    s = 0.0
    if lanes == 16:
        for b in range(0, head, 16):
            s += np.float64(hsum16(v[b:b + 16]))
    else:
        for b in range(0, head, 8):
            s += np.float64(_hsum(v, b, 8))
    return s


@njit(**_INL)
def _silu_row(x, lanes, variant, out):
    """ggml_v_silu (x / (1 + exp(0 - x))) on full blocks of `lanes`, ggml_silu_f32 (libm expf) for the tail."""
    n = x.shape[0]
    head = n // lanes * lanes
    if variant == _EXPF_SPLIT:
        for i in range(head):
            v = x[i]
            out[i] = v / (_ONE + _v_expf_split(_ZERO - v))
    else:
        for i in range(head):
            v = x[i]
            out[i] = v / (_ONE + _v_expf_scalef(_ZERO - v))
    for i in range(head, n):
        v = x[i]
        out[i] = v / (_ONE + math.exp(-v))


@njit(**_PAR)
def _silu_par(x, lanes, variant, out):
    for r in prange(x.shape[0]):
        _silu_row(x[r], lanes, variant, out[r])


@njit(**_SER)
def _silu_ser(x, lanes, variant, out):
    for r in range(x.shape[0]):
        _silu_row(x[r], lanes, variant, out[r])


_PAR_MIN = 1 << 15      # elements from which a kernel's parallel variant pays for waking the worker threads


def _rows(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=F32).reshape(-1, x.shape[-1] if x.ndim else 1)


def silu(x: np.ndarray, path: isa.IsaPath) -> np.ndarray:
    if x.dtype != F32:          # ggml_vec_silu_f16: per element in f32 with libm expf
        xf = x.astype(F32)
        return xf / (F32(1) + np.exp(-xf.astype(np.float64)).astype(F32))
    r = _rows(x)
    out = np.empty_like(r)
    (_silu_par if r.size >= _PAR_MIN else _silu_ser)(r, path.lanes, path.expf, out)
    return out.reshape(x.shape)


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, F32(0))


# ---------------------------------------------------------------------------------------------------------
# libm unary ops (unary-ops.cpp: one scalar call per element) and GELU's fp16 table
# ---------------------------------------------------------------------------------------------------------

_EXP, _TANH, _SIGMOID = 0, 1, 2


@njit(**_INL)
def _libm_row(x, op, out):
    """op_exp: expf; op_tanh: tanhf; op_sigmoid: 1 / (1 + expf(-x)), all glibc's (numpy's own float32 exp and
    tanh are other approximations, and ggml_v_expf is not used by these ops)."""
    for i in range(x.shape[0]):
        v = x[i]
        if op == _EXP:
            out[i] = math.exp(v)
        elif op == _TANH:
            out[i] = math.tanh(v)
        else:
            out[i] = _ONE / (_ONE + math.exp(-v))


@njit(**_PAR)
def _libm_par(x, op, out):
    for r in prange(x.shape[0]):
        _libm_row(x[r], op, out[r])


@njit(**_SER)
def _libm_ser(x, op, out):
    for r in range(x.shape[0]):
        _libm_row(x[r], op, out[r])


def _libm_unary(x: np.ndarray, op: int) -> np.ndarray:
    r = _rows(x)
    out = np.empty_like(r)
    (_libm_par if r.size >= _PAR_MIN else _libm_ser)(r, op, out)
    return out.reshape(x.shape)


def exp(x: np.ndarray) -> np.ndarray:
    return _libm_unary(x, _EXP)


def tanh(x: np.ndarray) -> np.ndarray:
    return _libm_unary(x, _TANH)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return _libm_unary(x, _SIGMOID)


def sqr(x: np.ndarray) -> np.ndarray:
    return np.multiply(x, x, dtype=F32)


def neg(x: np.ndarray) -> np.ndarray:
    return np.negative(x, dtype=F32)


_GELU_LIMIT = F32(10.0)


@njit(**_SER)
def _gelu_f32(x, out):
    """ggml_gelu_f32 as GCC compiles it: (0.5*x) * (1 + tanhf((sqrt(2/pi)*x) * fma(0.044715*x, x, 1)))."""
    for i in range(x.shape[0]):
        v = x[i]
        inner = fma(F32(0.044715) * v, v, _ONE)
        out[i] = (F32(0.5) * v) * (_ONE + math.tanh((F32(0.7978845608028654) * v) * inner))


@functools.cache
def gelu_table() -> np.ndarray:
    """ggml_table_gelu_f16 (ggml_cpu_init) widened to float32, indexed by a half's bits: entry i =
    fp16(ggml_gelu_f32(half i)). llama.cpp's CPU GELU reads it (GGML_GELU_FP16 is defined in vec.h)."""
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(F32)
    g = np.empty_like(x)
    _gelu_f32(x, g)
    with np.errstate(invalid="ignore"):     # the nan halves' entries (never read for finite x)
        return g.astype(np.float16).astype(F32)


def _gelu_open(x: np.ndarray) -> np.ndarray:
    """ggml_vec_gelu_f32 / geglu for x > -10: x itself from 10 on, else the table at fp16(x) (nearest even, as
    F16C rounds; x is clipped first only to keep the cast from overflowing)."""
    idx = np.clip(x, -_GELU_LIMIT, _GELU_LIMIT).astype(np.float16).view(np.uint16)
    return np.where(x >= _GELU_LIMIT, x, gelu_table()[idx])


def gelu(x: np.ndarray) -> np.ndarray:
    """ggml_vec_gelu_f32 with GGML_GELU_FP16: 0 for x <= -10, x for x >= 10, else the fp16 table."""
    x = np.asarray(x, F32)
    return np.where(x <= -_GELU_LIMIT, _ZERO, _gelu_open(x))


def geglu(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """ggml_vec_geglu_f32: 0 for g <= -10 (whatever u is), else gelu(g) * u as gelu computes it."""
    g = np.asarray(g, F32)
    return np.where(g <= -_GELU_LIMIT, _ZERO, np.multiply(_gelu_open(g), u, dtype=F32))


# ---------------------------------------------------------------------------------------------------------
# norms
# ---------------------------------------------------------------------------------------------------------

@njit(**_INL)
def _rms_norm_row(x, eps, out):
    """ggml_compute_forward_rms_norm_f32: sum += (double)(x*x) in order, mean = (float)(sum/n),
    scale = 1.0f/sqrtf(mean + eps), y = x * scale."""
    n = x.shape[0]
    s = 0.0
    for i in range(n):
        v = x[i]
        s += np.float64(v * v)
    scale = _ONE / np.sqrt(F32(s / n) + eps)
    for i in range(n):
        out[i] = x[i] * scale


@njit(**_PAR)
def _rms_norm_par(x, eps, out):
    for r in prange(x.shape[0]):
        _rms_norm_row(x[r], eps, out[r])


@njit(**_SER)
def _rms_norm_ser(x, eps, out):
    for r in range(x.shape[0]):
        _rms_norm_row(x[r], eps, out[r])


@njit(**_INL)
def _cvar_blocks(x, mean, head, lanes, sq, out):
    """ggml_vec_cvar_f32's vector part: out = x - mean per register, each register's squares summed (_hsum)
    and added to a double."""
    v2 = 0.0
    for b in range(0, head, lanes):
        for t in range(lanes):
            d = x[b + t] - mean
            out[b + t] = d
            sq[t] = d * d
        v2 += np.float64(_hsum(sq, 0, lanes))
    return v2


@njit(**_SER)
def _norm_rows(x, eps, lanes, out):
    """ggml_compute_forward_norm_f32: mean = (float)(double sum)/n; ggml_vec_cvar_f32 (x - mean, squares summed
    per register of `lanes` into a double, the tail one by one); scale = 1/sqrtf(var + eps)."""
    rows, n = x.shape
    head = n // lanes * lanes
    sq = np.empty(16, F32)
    for r in range(rows):
        s = 0.0
        for i in range(n):
            s += np.float64(x[r, i])
        mean = F32(s) / F32(n)
        if lanes == 16:                      # literal widths: the block loops unroll (a runtime width: 20% slower)
            v2 = _cvar_blocks(x[r], mean, head, 16, sq, out[r])
        else:
            v2 = _cvar_blocks(x[r], mean, head, 8, sq, out[r])
        for i in range(head, n):
            d = x[r, i] - mean
            out[r, i] = d
            v2 += np.float64(d * d)
        scale = _ONE / np.sqrt(F32(v2 / n) + eps)
        for i in range(n):
            out[r, i] = out[r, i] * scale


def rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    r = _rows(x)
    out = np.empty_like(r)
    (_rms_norm_par if r.size >= _PAR_MIN else _rms_norm_ser)(r, F32(eps), out)
    return out.reshape(x.shape)


def norm(x: np.ndarray, eps: float, path: isa.IsaPath) -> np.ndarray:
    r = _rows(x)
    out = np.empty_like(r)
    _norm_rows(r, F32(eps), path.lanes, out)
    return out.reshape(x.shape)


# ---------------------------------------------------------------------------------------------------------
# soft_max
# ---------------------------------------------------------------------------------------------------------

@njit(**_INL)
def _soft_max_row(x, m, scale, head, lanes, variant, w, out):
    """ggml_compute_forward_soft_max_f32 for one row: w = x*scale (+ mask row m, if it has the row's length),
    max, ggml_vec_soft_max_f32 (ggml_v_expf per register of `lanes`, each register's sum added to a double;
    cells past n up to `head` are the padding's -inf cells, exp 0; libm expf for a tail past `head`), then
    * (float)(1/sum). w: scratch of at least max(n, head)."""
    n = x.shape[0]
    for i in range(n):
        w[i] = x[i] * scale
    if m.shape[0] == n:
        for i in range(n):
            w[i] = w[i] + m[i]
    mx = -_INF
    for i in range(n):
        mx = w[i] if w[i] > mx else mx
    for i in range(n, head):
        w[i] = -_INF
    _v_expf_shifted(w, head, mx, variant)
    s = _block_sums(w, head, lanes)
    for i in range(head, n):
        w[i] = math.exp(w[i] - mx)
        s += np.float64(w[i])
    inv = F32(1.0 / s)
    for i in range(n):
        out[i] = w[i] * inv


@njit(**_PAR)
def _soft_max_par(x, mask, mrows, scale, head, lanes, variant, out):
    """Row r reads mask row r % mrows (mrows = 0: no mask)."""
    for r in prange(x.shape[0]):
        w = np.empty(max(head, x.shape[1]), F32)
        _soft_max_row(x[r], mask[r % mrows] if mrows else mask[0, :0], scale, head, lanes, variant, w, out[r])


@njit(**_SER)
def _soft_max_ser(x, mask, mrows, scale, head, lanes, variant, out):
    w = np.empty(max(head, x.shape[1]), F32)
    for r in range(x.shape[0]):
        _soft_max_row(x[r], mask[r % mrows] if mrows else mask[0, :0], scale, head, lanes, variant, w, out[r])


def soft_max(x: np.ndarray, mask: np.ndarray | None, scale: float, max_bias: float, path: isa.IsaPath,
             pad: int | None = None) -> np.ndarray:
    """softmax over the last numpy axis of x*scale + mask (mask broadcast over x's leading axes).

    pad: emulate llama.cpp's KV padding (default: KV_PAD when there is a mask, i.e. attention; 1 otherwise).
    With pad > 1 the result is marked so that the mul_mat consuming it pads the same way."""
    if max_bias:
        raise NotImplementedError("ALiBi (max_bias != 0) is not implemented")
    if pad is None:
        pad = KV_PAD if mask is not None else 1
    shape = x.shape
    r = _rows(x)
    n = r.shape[1]
    if mask is None:
        m, mrows = np.zeros((1, n), F32), 0
    else:
        mask = np.asarray(mask)
        lead = mask.reshape((1,) * (max(len(shape), 2) - mask.ndim) + mask.shape)
        if lead.shape[-1] == n and all(d == 1 for d in lead.shape[:-2]) and \
                (lead.shape[-2] == (shape[-2] if len(shape) > 1 else 1)):
            m = np.ascontiguousarray(lead.reshape(-1, n), dtype=F32)   # one mask row per query row
        else:
            m = np.ascontiguousarray(np.broadcast_to(lead, shape), dtype=F32).reshape(-1, n)
        mrows = m.shape[0]
    out = np.empty_like(r)
    lanes = path.lanes
    head = -(-n // lanes) * lanes if pad > 1 else n // lanes * lanes   # padded: every element in a register
    (_soft_max_par if r.size >= _PAR_MIN else _soft_max_ser)(r, m, mrows, F32(scale), head, lanes, path.expf, out)
    out = out.reshape(shape)
    if pad > 1:
        out = out.view(_Probs)
        out.kv_pad = int(pad)
    return out


# ---------------------------------------------------------------------------------------------------------
# mul_mat of two activations (attention): f16 or f32 cache
# ---------------------------------------------------------------------------------------------------------

_TINYBLAS, _VEC_F16, _VEC_F32 = 0, 1, 2
_REDUCE_HADD = isa.REDUCE_HADD
_MM_PAR_MIN = 1 << 14    # multiply-adds from which the parallel variant is faster (measured)


@njit(**_INL)
def _half_to_f32(h):
    """IEEE half (bits in an integer) -> float32, exactly and branch-free (vectorizes)."""
    h = np.uint32(h)
    em = h & np.uint32(0x7FFF)
    sign = h & np.uint32(0x8000)
    normal = bits_f32(f16_bits(h))
    sub = F32(em) * F32(5.9604644775390625e-08)              # zero / subnormal: m * 2**-24
    sub = -sub if sign else sub
    return normal if em >= np.uint32(0x400) else sub


@njit(**_INL)
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


@njit(**_INL)
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


@njit(**_INL)
def _mm_task(w1, wb0, wsm, x1, xo, kq, k, mm, reg, reduce, simd, mode, acc, s16, out_row):
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
            v = _hsum(acc, 0, reg)                            # tinyBLAS's hsum of its one register
        else:
            for t in range(reg):                              # GGML_F32_VEC_REDUCE: registers (0 + 2) + (1 + 3) ...
                s16[t] = (acc[t] + acc[2 * reg + t]) + (acc[reg + t] + acc[3 * reg + t])
            if reduce == _REDUCE_HADD:                        # ... then 256 -> 128 bits and _mm_hadd_ps twice
                v = ((s16[0] + s16[4]) + (s16[1] + s16[5])) + ((s16[2] + s16[6]) + (s16[3] + s16[7]))
            else:                                             # ... or _mm512_reduce_add_ps
                v = _hsum(s16, 0, reg)
        if mode == _VEC_F16:
            s = np.float64(v)
            for c in range(simd, k):
                s += np.float64(w1[wb + u(c)] * x1[xb + u(c)])
            v = F32(s)
        elif mode == _VEC_F32:
            for c in range(simd, k):
                v = fma(w1[wb + u(c)], x1[xb + u(c)], v)
        out_row[m] = v


@njit(**_PAR)
def _mm_par(wsrc, wkind, wsb, wsm, xsrc, xkind, xsb, xsn, bx, nn, mm, ratio, kq, kp, reg, reduce, mode, out):
    """out[b, n, m] = dot(w row (b // ratio) * wsb + m * wsm, x row b * xsb + n * xsn), the rows of wsrc/xsrc
    (R, k) converted to float32 (_to_f32_row kinds) and zero-padded to kq (a multiple of 64) first.

    The lanes of one dot product run along the contraction axis, as in ggml, with `reg` lanes a register:
    element c goes to lane c % reg (tinyBLAS: one FMA chain per lane) or c % (4 reg) (vec_dot: lane t of
    sum[j], j = c % (4 reg) // reg); elements past the SIMD part of vec_dot (c >= kp - kp % (4 reg)) form its
    scalar tail. kp: the padded length ggml sees; its extra elements are zeros, which leave every FMA chain
    unchanged. (Loop bounds are runtime values on purpose: constant-trip loops get unrolled instead of
    vectorized.) _mm_ser: the same, one thread."""
    k = wsrc.shape[1]
    w = np.empty((wsrc.shape[0], kq), F32)
    x = np.empty((xsrc.shape[0], kq), F32)
    for r in prange(wsrc.shape[0]):
        _to_f32_row(wsrc[r], wkind, w[r])
    for r in prange(xsrc.shape[0]):
        _to_f32_row(xsrc[r], xkind, x[r])
    simd = kq if mode == _TINYBLAS else min(kq, kp // (4 * reg) * (4 * reg))
    w1, x1 = w.reshape(-1), x.reshape(-1)
    for task in prange(bx * nn):
        b, i = task // nn, task % nn
        acc, s16 = np.empty(64, F32), np.empty(16, F32)
        _mm_task(w1, (b // ratio) * wsb, wsm, x1, (b * xsb + i * xsn) * kq, kq, k, mm, reg, reduce, simd, mode, acc,
                 s16, out[b, i])


@njit(**_SER)
def _mm_ser(wsrc, wkind, wsb, wsm, xsrc, xkind, xsb, xsn, bx, nn, mm, ratio, kq, kp, reg, reduce, mode, out):
    k = wsrc.shape[1]
    w = np.empty((wsrc.shape[0], kq), F32)
    x = np.empty((xsrc.shape[0], kq), F32)
    for r in range(wsrc.shape[0]):
        _to_f32_row(wsrc[r], wkind, w[r])
    for r in range(xsrc.shape[0]):
        _to_f32_row(xsrc[r], xkind, x[r])
    simd = kq if mode == _TINYBLAS else min(kq, kp // (4 * reg) * (4 * reg))
    w1, x1 = w.reshape(-1), x.reshape(-1)
    acc, s16 = np.empty(64, F32), np.empty(16, F32)
    for task in range(bx * nn):
        b, i = task // nn, task % nn
        _mm_task(w1, (b // ratio) * wsb, wsm, x1, (b * xsb + i * xsn) * kq, kq, k, mm, reg, reduce, simd, mode, acc,
                 s16, out[b, i])


def _as_rows(a: np.ndarray) -> tuple[np.ndarray, int, int]:
    """a (B, M, K) -> (rows (R, K) C-contiguous, row stride of b, row stride of m), without copying when a
    is C-contiguous or a (M, B, K) block seen transposed (the KV-cache views, permuted q)."""
    if a.flags.c_contiguous:
        return a.reshape(-1, a.shape[2]), a.shape[1], 1
    t = a.transpose(1, 0, 2)
    if t.flags.c_contiguous:
        return t.reshape(-1, a.shape[2]), 1, a.shape[0]
    return np.ascontiguousarray(a).reshape(-1, a.shape[2]), a.shape[1], 1


def mul_mat(w: np.ndarray, x: np.ndarray, path: isa.IsaPath, pad: int | None = None) -> np.ndarray:
    """Activation x activation (attention): out[b, n, m] = sum_k w[b', m, k] x[b, n, k], with ggml's broadcast
    b' = b // (B/A) per batch dim (query head h reads kv head h // (n_head / n_head_kv)).

    w f16 (the f16 KV cache): x is rounded to f16 first, as ggml converts src1 to the vec_dot type.
    Path per ggml_compute_forward_mul_mat: tinyBLAS for n >= 2 columns when the (padded) inner length is a
    multiple of the register's lanes (f16 always, after the conversion; f32 only when src1 is contiguous,
    i.e. soft_max's output), else ggml_vec_dot_f16/f32. (tinyBLAS also wants m % 4 == 0, which attention
    always meets: m is the padded KV length or the head size.) pad: the contraction length llama.cpp sees is
    a multiple of this (default: the kv_pad of a soft_max result, else 1). Only the path choice depends on
    it."""
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
    if n >= 2 and kp % path.lanes == 0 and (mode16 or pad > 1):
        mode = _TINYBLAS
    else:
        mode = _VEC_F16 if mode16 else _VEC_F32
    kq = -(-k // 64) * 64
    out = np.empty(x4.shape[:-1] + (m,), F32)
    for a in range(x4.shape[0]):                              # dim 3: few (usually 1)
        wa, xa = w4[a // (x4.shape[0] // w4.shape[0])], x4[a]
        wrows, wsb, wsm = _as_rows(wa)
        xrows, xsb, xsn = _as_rows(xa)
        xkind = (1 if xa.dtype == np.float16 else 2) if mode16 else (1 if xa.dtype == np.float16 else 0)
        fn = _mm_par if xa.shape[0] * n * m * kq >= _MM_PAR_MIN else _mm_ser
        fn(_bits(wrows), 1 if wa.dtype == np.float16 else 0, wsb, wsm, _bits(xrows), xkind, xsb, xsn,
           xa.shape[0], n, m, xa.shape[0] // wa.shape[0], kq, kp, path.lanes, path.reduce, mode, out[a])
    return out.reshape(out.shape[4 - r:])


def _bits(a: np.ndarray) -> np.ndarray:
    """f16 arrays as their uint16 bits (numba has no float16); other dtypes as float32."""
    return a.view(np.uint16) if a.dtype == np.float16 else a.astype(F32, copy=False)


# ---------------------------------------------------------------------------------------------------------
# RoPE
# ---------------------------------------------------------------------------------------------------------

def _yarn_corr_dims(n_dims: int, n_ctx_orig: int, base: float, beta_fast: float, beta_slow: float) -> tuple[float, float]:
    def corr(n_rot: float) -> float:
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    return max(0.0, math.floor(corr(beta_fast))), min(n_dims - 1.0, math.ceil(corr(beta_slow)))


@njit(**_SER)
def _rope_cache(pos, half, theta_scale, ff, freq_scale, ext, lo, hi, mscale, cos, sin):
    """ggml_rope_cache_init + rope_yarn: theta = p, then theta *= theta_scale per pair; yarn mixing as compiled
    (theta = fma(theta_interp, 1 - mix, theta_extrap * mix)); cos/sin from libm's cosf/sinf."""
    for r in range(pos.shape[0]):
        theta = F32(pos[r])
        for i in range(half):
            te = theta / ff[i]
            ti = freq_scale * te
            th = ti
            if ext != _ZERO:
                y = (F32(i) - lo) / max(F32(0.001), hi - lo)
                mix = (_ONE - min(_ONE, max(_ZERO, y))) * ext
                th = fma(ti, _ONE - mix, te * mix)
            cos[r, i] = math.cos(th) * mscale
            sin[r, i] = math.sin(th) * mscale
            theta = theta * theta_scale


def rope_cos_sin(pos: np.ndarray, n_dims: int, freq_factors: np.ndarray | None, a: dict) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [n_tokens, n_dims/2] as ggml's rope cache builds them (angle *= theta_scale per pair)."""
    half = n_dims // 2
    theta_scale = F32(_libm.powf(F32(a["freq_base"]), F32(-2.0) / F32(n_dims)))
    ff = np.ones(half, F32) if freq_factors is None else np.ascontiguousarray(freq_factors, dtype=F32)[:half]
    freq_scale, ext = F32(a["freq_scale"]), F32(a["ext_factor"])
    mscale = F32(a["attn_factor"])
    lo = hi = 0.0
    if ext != 0:
        lo, hi = _yarn_corr_dims(n_dims, a["n_ctx_orig"], a["freq_base"], a["beta_fast"], a["beta_slow"])
        mscale = mscale * _fma32(F32(0.1), F32(_libm.logf(F32(1) / freq_scale)), F32(1))
    cos, sin = np.empty((len(pos), half), F32), np.empty((len(pos), half), F32)
    _rope_cache(np.asarray(pos, np.int64), half, theta_scale, ff, freq_scale, ext, F32(lo), F32(hi), mscale, cos, sin)
    if numba.config.USING_SVML:     # numba may vectorize math.cos with SVML, which is not glibc's cosf
        cos, sin = _rope_cos_sin_libm(np.asarray(pos, np.int64), half, theta_scale, ff, freq_scale, ext, F32(lo),
                                      F32(hi), mscale)
    return cos, sin


def _rope_cos_sin_libm(pos, half, theta_scale, ff, freq_scale, ext, lo, hi, mscale):
    """_rope_cache in Python with ctypes' cosf/sinf (only when numba uses SVML for math.cos)."""
    cos, sin = np.empty((len(pos), half), F32), np.empty((len(pos), half), F32)
    for r, p in enumerate(pos):
        theta = F32(p)
        for i in range(half):
            te = F32(theta / ff[i])
            th = ti = F32(freq_scale * te)
            if ext != 0:
                y = F32(F32(F32(i) - lo) / max(F32(0.001), F32(hi - lo)))
                mix = F32((F32(1) - min(F32(1), max(F32(0), y))) * ext)
                th = _fma32(ti, F32(1) - mix, F32(te * mix))
            cos[r, i] = F32(_libm.cosf(th)) * mscale
            sin[r, i] = F32(_libm.sinf(th)) * mscale
            theta = F32(theta * theta_scale)
    return cos, sin


@njit(**_INL)
def _rope_row(x, cos, sin, n_dims, neox, n_fused, out):
    """rotate_pairs as GCC compiled it: dst0 = fma(x0, cos, -(x1*sin)), dst1 = fma(x0, sin, x1*cos), the named
    products rounded first. 'neox' (scalar loop): every pair. 'norm' (vectorized): the pairs of the zmm/ymm
    loops, 4 pairs a vector (n_fused); the last pairs%4 go through an addsubps tail without FMA."""
    half = n_dims // 2
    for i in range(x.shape[0]):
        out[i] = x[i]
    for i in range(half):
        if neox:
            i0, i1 = i, i + half
        else:
            i0, i1 = 2 * i, 2 * i + 1
        x0, x1, c, s = x[i0], x[i1], cos[i], sin[i]
        if i < n_fused:
            out[i0] = fma(x0, c, -(x1 * s))
            out[i1] = fma(x0, s, x1 * c)
        else:
            out[i0] = x0 * c - x1 * s
            out[i1] = x0 * s + x1 * c


@njit(**_PAR)
def _rope_par(x, cos, sin, n_tok, n_head, n_dims, neox, n_fused, out):
    """Rows of x (lead * n_tok * n_head, head_dim) in that order: row r is token (r // n_head) % n_tok."""
    for r in prange(x.shape[0]):
        t = r // n_head % n_tok
        _rope_row(x[r], cos[t], sin[t], n_dims, neox, n_fused, out[r])


@njit(**_SER)
def _rope_ser(x, cos, sin, n_tok, n_head, n_dims, neox, n_fused, out):
    for r in range(x.shape[0]):
        t = r // n_head % n_tok
        _rope_row(x[r], cos[t], sin[t], n_dims, neox, n_fused, out[r])


def rope(x: np.ndarray, pos: np.ndarray, freq_factors: np.ndarray | None, a: dict) -> np.ndarray:
    """x (n_tokens, n_heads, head_dim): rotate the first n_dims channels; 'norm' pairs adjacent, 'neox' halves."""
    return rope_apply(x, rope_cos_sin(pos, a["n_dims"], freq_factors, a), a)


def rope_apply(x: np.ndarray, cos_sin: tuple[np.ndarray, np.ndarray], a: dict) -> np.ndarray:
    n_dims, mode = a["n_dims"], a["mode"]
    if mode not in ("norm", "neox"):
        raise NotImplementedError(f"rope mode {mode!r}")
    half = n_dims // 2
    if mode == "neox":
        n_fused = half                       # scalar loop, contracted
    else:
        n_fused = half - half % 4            # zmm/ymm loop: 4 pairs a vector; the tail pairs: addsubps, no FMA
    cos, sin = cos_sin
    n_tok = cos.shape[0]
    # x (..., n_tokens, n_heads, head_dim): the token axis is the third from the end
    xs = np.ascontiguousarray(x, dtype=F32)
    nh = xs.shape[-2] if xs.ndim >= 3 else 1                # x (..., n_tokens, n_heads, head_dim)
    rows = xs.reshape(-1, xs.shape[-1])
    out = np.empty_like(rows)
    (_rope_par if rows.size >= _PAR_MIN else _rope_ser)(rows, cos, sin, n_tok, nh, n_dims, mode == "neox",
                                                        n_fused, out)
    return out.reshape(x.shape)
