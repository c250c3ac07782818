"""Unary and gated elementwise kernels: silu (and swiglu's gate), relu / reglu, gelu / geglu, gelu_quick, the libm
ops (exp, tanh, sigmoid, softplus, gelu_erf), sqr, neg, gpt-oss's clamped SwiGLU (swiglu_oai) and Apertus's xIELU.

Each follows its ggml-cpu function: SiLU with ggml_v_expf on full registers and libm's expf for the tail,
exp / tanh / sigmoid / softplus with glibc calls per element, GELU and GELU-quick through ggml's fp16 tables.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import numpy as np
from numba import njit, prange

from graphir.backends.numba.primitives import isa
from graphir.backends.numba.primitives.isa import EXPF_SPLIT
from graphir.backends.numba.primitives.expf import v_expf_scalef, v_expf_split
from graphir.backends.numba.primitives.jit import INL, PAR_MIN, SER, f32_rows, parallel_and_serial
from graphir.backends.numba.primitives.bits import fma, half_bits

F32 = np.float32
_ONE, _ZERO = F32(1.0), F32(0.0)


@njit(**INL)
def _silu_row(x, lanes, variant, gate, out):
    """ggml_v_silu (x / (1 + exp(0 - x))) on full blocks of `lanes`, ggml_silu_f32 (libm expf) for the tail; then,
    if ``gate`` has the row's length, times it (swiglu: the SiLU rounded, then the product, as ggml's two steps)."""
    n = x.shape[0]
    head = n // lanes * lanes
    if variant == EXPF_SPLIT:
        for i in range(head):
            v = x[i]
            out[i] = v / (_ONE + v_expf_split(_ZERO - v))
    else:
        for i in range(head):
            v = x[i]
            out[i] = v / (_ONE + v_expf_scalef(_ZERO - v))
    for i in range(head, n):
        v = x[i]
        out[i] = v / (_ONE + math.exp(-v))
    if gate.shape[0] == n:
        for i in range(n):
            out[i] = out[i] * gate[i]


def _silu_rows(x, lanes, variant, gate, out):
    """Rows of x; gate: (rows, n) rows to multiply by, or (rows, 0) for none."""
    for r in prange(x.shape[0]):
        _silu_row(x[r], lanes, variant, gate[r], out[r])


_silu_par, _silu_ser = parallel_and_serial(_silu_rows)


def silu(x: np.ndarray, path: isa.IsaPath) -> np.ndarray:
    if x.dtype != F32:          # ggml_vec_silu_f16: per element in f32 with libm expf
        xf = x.astype(F32)
        return xf / (F32(1) + np.exp(-xf.astype(np.float64)).astype(F32))
    r = f32_rows(x)
    out = np.empty_like(r)
    silu_kernel(r.size)(r, path.lanes, path.expf, np.empty((len(r), 0), F32), out)
    return out.reshape(x.shape)


def swiglu(g: np.ndarray, u: np.ndarray, path: isa.IsaPath) -> np.ndarray:
    """silu(g) * u in one pass: ggml's swiglu, bit for bit the two steps."""
    if g.dtype != F32 or u.shape != g.shape:
        return silu(g, path) * u
    r, ur = f32_rows(g), f32_rows(u)
    out = np.empty_like(r)
    silu_kernel(r.size)(r, path.lanes, path.expf, ur, out)
    return out.reshape(g.shape)


def silu_kernel(size: int) -> Callable:
    """silu's kernel for x of ``size`` elements, (rows, lanes, variant, gate rows, out): parallel from PAR_MIN."""
    return _silu_par if size >= PAR_MIN else _silu_ser


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, F32(0))


def reglu(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """ggml_vec_reglu_f32: g * u where g > 0, else 0 (whatever u is)."""
    return np.where(g > 0, g * u, F32(0)).astype(F32)


_EXP, _TANH, _SIGMOID, _SOFTPLUS, _GELU_ERF = 0, 1, 2, 3, 4
_SOFTPLUS_MAX = F32(20.0)
_SQRT_2_INV, _HALF = F32(0.70710678118654752440084436210484), F32(0.5)


@njit(**INL)
def _libm_row(x, op, out):
    """op_exp: expf; op_tanh: tanhf; op_sigmoid: 1 / (1 + expf(-x)); op_softplus: x above 20, else
    logf(1 + expf(x)); op_gelu_erf: 0.5 x (1 + erff(x / sqrt 2)); all glibc's (numpy's own float32 exp and tanh
    are other approximations, and ggml_v_expf is not used by these ops)."""
    for i in range(x.shape[0]):
        v = x[i]
        if op == _EXP:
            out[i] = math.exp(v)
        elif op == _TANH:
            out[i] = math.tanh(v)
        elif op == _SIGMOID:
            out[i] = _ONE / (_ONE + math.exp(-v))
        elif op == _GELU_ERF:
            out[i] = _HALF * v * (_ONE + math.erf(v * _SQRT_2_INV))
        else:
            out[i] = v if v > _SOFTPLUS_MAX else math.log(_ONE + math.exp(v))


def _libm_rows(x, op, out):
    for r in prange(x.shape[0]):
        _libm_row(x[r], op, out[r])


_libm_par, _libm_ser = parallel_and_serial(_libm_rows)


def _libm_unary(x: np.ndarray, op: int) -> np.ndarray:
    r = f32_rows(x)
    out = np.empty_like(r)
    libm_kernel(r.size)(r, op, out)
    return out.reshape(x.shape)


LIBM = {"exp": _EXP, "tanh": _TANH, "sigmoid": _SIGMOID, "softplus": _SOFTPLUS,   # the glibc ops, by op name
        "gelu_erf": _GELU_ERF}


def libm_kernel(size: int) -> Callable:
    """The glibc ops' kernel for x of ``size`` elements, (rows, LIBM[op], out): parallel from PAR_MIN."""
    return _libm_par if size >= PAR_MIN else _libm_ser


def exp(x: np.ndarray) -> np.ndarray:
    return _libm_unary(x, _EXP)


def tanh(x: np.ndarray) -> np.ndarray:
    return _libm_unary(x, _TANH)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return _libm_unary(x, _SIGMOID)


def softplus(x: np.ndarray) -> np.ndarray:
    return _libm_unary(x, _SOFTPLUS)


def gelu_erf(x: np.ndarray) -> np.ndarray:
    return _libm_unary(x, _GELU_ERF)


def sqr(x: np.ndarray) -> np.ndarray:
    return np.multiply(x, x, dtype=F32)


def neg(x: np.ndarray) -> np.ndarray:
    return np.negative(x, dtype=F32)


def sqrt(x: np.ndarray) -> np.ndarray:
    """ggml_vec_sqrt_f32: sqrtf per element, correctly rounded as numpy's float32 sqrt is."""
    return np.sqrt(x, dtype=F32)


@njit(**SER)
def _scale_bias_rows(x, s, b, step, out):
    """ggml_vec_mad1_f32 on each row: x * s + b fused (vfmadd) over whole steps of four registers, then x * s
    rounded and b added in the row's tail (ops.cpp is built without FP contraction)."""
    for r in range(x.shape[0]):
        n = x.shape[1]
        head = n // step * step
        for i in range(head):
            out[r, i] = fma(x[r, i], s, b)
        for i in range(head, n):
            out[r, i] = x[r, i] * s + b


def scale_bias(x: np.ndarray, s: float, b: float, path: isa.IsaPath) -> np.ndarray:
    """ggml_scale_bias (a SCALE whose bias is not 0): rows of x, in blocks of GGML_F32_STEP = 4 registers."""
    r = f32_rows(x)
    out = np.empty_like(r)
    _scale_bias_rows(r, F32(s), F32(b), 4 * path.lanes, out)
    return out.reshape(x.shape)


_GELU_LIMIT = F32(10.0)


@njit(**SER)
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


@njit(**INL)
def _gelu_row(x, u, gated, table, out):
    """ggml_vec_gelu_f32 / ggml_vec_geglu_f32 with GGML_GELU_FP16: +0 for x <= -10 (whatever u is), x from 10
    on, else the table at fp16(x) (F16C's rounding, as ggml converts); geglu (``gated``) then multiplies by u.
    Selects, not branches (every lane reads the table; a nan's or a large x's entry is not used), so the row
    vectorizes: 8x1536 25 -> 14 us here."""
    for i in range(x.shape[0]):
        v = x[i]
        g = table[half_bits(v)]
        g = v if v >= _GELU_LIMIT or v != v else g
        g = g * u[i] if gated else g
        out[i] = _ZERO if v <= -_GELU_LIMIT else g


def _gelu_rows(x, u, gated, table, out):
    for r in prange(x.shape[0]):
        _gelu_row(x[r], u[r], gated, table, out[r])


_gelu_par, _gelu_ser = parallel_and_serial(_gelu_rows)


def _gelu(g: np.ndarray, u: np.ndarray | None) -> np.ndarray:
    gr = f32_rows(g)
    ur = gr if u is None else f32_rows(u)
    out = np.empty_like(gr)
    gelu_kernel(gr.size)(gr, ur, u is not None, gelu_table(), out)
    return out.reshape(g.shape)


def gelu_kernel(size: int) -> Callable:
    """gelu's (and geglu's) kernel for x of ``size`` elements, (rows, gate rows, gated, gelu_table(), out)."""
    return _gelu_par if size >= PAR_MIN else _gelu_ser


def gelu(x: np.ndarray) -> np.ndarray:
    """ggml_vec_gelu_f32 with GGML_GELU_FP16: 0 for x <= -10, x for x >= 10, else the fp16 table."""
    return _gelu(np.asarray(x, F32), None)


def geglu(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """ggml_vec_geglu_f32: 0 for g <= -10 (whatever u is), else gelu(g) * u as gelu computes it."""
    g, u = np.asarray(g, F32), np.asarray(u, F32)
    if u.shape != g.shape:
        u = np.broadcast_to(u, g.shape)
    return _gelu(g, u)


_GELU_QUICK_COEF = F32(-1.702)


@njit(**SER)
def _gelu_quick_f32(x, out):
    """ggml_gelu_quick_f32: x * (1 / (1 + expf(-1.702 * x))), each step a float32 operation, expf glibc's."""
    for i in range(x.shape[0]):
        v = x[i]
        out[i] = v * (_ONE / (_ONE + math.exp(_GELU_QUICK_COEF * v)))


@functools.cache
def gelu_quick_table() -> np.ndarray:
    """ggml_table_gelu_quick_f16 (ggml_cpu_init) widened to float32, indexed by a half's bits: entry i =
    fp16(ggml_gelu_quick_f32(half i)). llama.cpp's CPU GELU-quick reads it (GGML_GELU_QUICK_FP16, vec.h)."""
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(F32)
    g = np.empty_like(x)
    _gelu_quick_f32(x, g)
    with np.errstate(invalid="ignore"):     # the nan halves' entries, and -inf's (-inf * 0)
        return g.astype(np.float16).astype(F32)


@njit(**INL)
def _table_row(x, table, out):
    """out = the table at fp16(x) (F16C's rounding, as ggml converts), for every x."""
    for i in range(x.shape[0]):
        out[i] = table[half_bits(x[i])]


def _table_rows(x, table, out):
    for r in prange(x.shape[0]):
        _table_row(x[r], table, out[r])


_table_par, _table_ser = parallel_and_serial(_table_rows)


def gelu_quick(x: np.ndarray) -> np.ndarray:
    """ggml_vec_gelu_quick_f32 with GGML_GELU_QUICK_FP16: the fp16 table over the whole range (unlike gelu's, no
    cut-offs: an x past the halves reads inf's entry)."""
    r = f32_rows(x)
    out = np.empty_like(r)
    (_table_par if r.size >= PAR_MIN else _table_ser)(r, gelu_quick_table(), out)
    return out.reshape(x.shape)


@njit(**INL)
def _swiglu_oai_row(g, u, alpha, limit, shifted, out):
    """ggml_compute_forward_swiglu_oai_f32: x = min(g, limit), y = clamp(u, -limit, limit), then
    (x / (1 + expf(alpha * -x))) * (y + 1), each step a float32 operation and expf glibc's; not ``shifted``,
    ggml_compute_forward_swiglu_clamp_f32's (x / (1 + expf(-x))) * y (alpha 1: alpha * -x is -x)."""
    for i in range(g.shape[0]):
        x = limit if limit < g[i] else g[i]
        y = -limit if u[i] < -limit else (limit if limit < u[i] else u[i])
        out[i] = (x / (_ONE + math.exp(alpha * (-x)))) * ((y + _ONE) if shifted else y)


def _swiglu_oai_rows(g, u, alpha, limit, shifted, out):
    for r in prange(g.shape[0]):
        _swiglu_oai_row(g[r], u[r], alpha, limit, shifted, out[r])


_swiglu_oai_par, _swiglu_oai_ser = parallel_and_serial(_swiglu_oai_rows)


def swiglu_oai(g: np.ndarray, u: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    """gpt-oss's clamped SwiGLU of gate g and up u (same shapes): the gate capped above at limit, up clamped to
    [-limit, limit] and shifted by 1, the gate's sigmoid sharpened by alpha."""
    return _clamped_swiglu(g, u, alpha, limit, True)


def swiglu_clamp(g: np.ndarray, u: np.ndarray, limit: float) -> np.ndarray:
    """ggml's swiglu_clamp of gate g and up u (same shapes): the gate capped above at limit, up clamped to
    [-limit, limit], silu(gate) * up."""
    return _clamped_swiglu(g, u, 1.0, limit, False)


def _clamped_swiglu(g: np.ndarray, u: np.ndarray, alpha: float, limit: float, shifted: bool) -> np.ndarray:
    gr, ur = f32_rows(g), f32_rows(u)
    out = np.empty_like(gr)
    (_swiglu_oai_par if gr.size >= PAR_MIN else _swiglu_oai_ser)(gr, ur, F32(alpha), F32(limit), shifted, out)
    return out.reshape(g.shape)


@njit(**INL)
def _xielu_row(x, alpha_n, alpha_p, beta, eps, out):
    """ggml's op_xielu as GCC compiles it, each sum contracted into an FMA: x > 0: fma(alpha_p * x, x, beta * x);
    else fma(expm1f(fminf(x, eps)) - x, alpha_n, beta * x), expm1f glibc's (fminf of a nan x is eps)."""
    for i in range(x.shape[0]):
        v = x[i]
        if v > _ZERO:
            out[i] = fma(alpha_p * v, v, beta * v)
        else:
            m = v if v < eps else eps
            out[i] = fma(math.expm1(m) - v, alpha_n, beta * v)


def _xielu_rows(x, alpha_n, alpha_p, beta, eps, out):
    for r in prange(x.shape[0]):
        _xielu_row(x[r], alpha_n, alpha_p, beta, eps, out[r])


_xielu_par, _xielu_ser = parallel_and_serial(_xielu_rows)


def xielu(x: np.ndarray, alpha_n: float, alpha_p: float, beta: float, eps: float) -> np.ndarray:
    """xIELU of x with ggml's op parameters (alpha_n already beta + softplus of the layer's, alpha_p softplus of
    it)."""
    r = f32_rows(x)
    out = np.empty_like(r)
    (_xielu_par if r.size >= PAR_MIN else _xielu_ser)(r, F32(alpha_n), F32(alpha_p), F32(beta), F32(eps), out)
    return out.reshape(x.shape)
