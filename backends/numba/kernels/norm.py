"""Normalizations: rms_norm, norm and l2_norm, in ggml's order of sums (in double, and per register for norm's
variance)."""

from __future__ import annotations

from typing import Callable

import numpy as np
from numba import njit, prange

from graphir.backends.numba.primitives import isa
from graphir.backends.numba.primitives.jit import INL, PAR_MIN, SER, f32_rows, parallel_and_serial
from graphir.backends.numba.primitives.bits import hsum

F32 = np.float32
_ONE = F32(1.0)


@njit(**INL)
def _rms_norm_row(x, eps, w, out):
    """ggml_compute_forward_rms_norm_f32: sum += (double)(x*x) in order, mean = (float)(sum/n),
    scale = 1.0f/sqrtf(mean + eps), y = x * scale; then, if w has the row's length, y * w (ggml's mul by the
    norm's weight, rounded apart)."""
    n = x.shape[0]
    s = 0.0
    for i in range(n):
        v = x[i]
        s += np.float64(v * v)
    scale = _ONE / np.sqrt(F32(s / n) + eps)
    if w.shape[0] == n:
        for i in range(n):
            out[i] = (x[i] * scale) * w[i]
    else:
        for i in range(n):
            out[i] = x[i] * scale


def _rms_norm_rows(x, eps, w, out):
    for r in prange(x.shape[0]):
        _rms_norm_row(x[r], eps, w, out[r])


_rms_norm_par, _rms_norm_ser = parallel_and_serial(_rms_norm_rows)


@njit(**INL)
def _cvar_blocks(x, mean, head, lanes, sq, out):
    """ggml_vec_cvar_f32's vector part: out = x - mean per register, each register's squares summed (hsum)
    and added to a double."""
    v2 = 0.0
    for b in range(0, head, lanes):
        for t in range(lanes):
            d = x[b + t] - mean
            out[b + t] = d
            sq[t] = d * d
        v2 += np.float64(hsum(sq, 0, lanes))
    return v2


def _norm_rows(x, eps, lanes, out):
    """ggml_compute_forward_norm_f32: mean = (float)(double sum)/n; ggml_vec_cvar_f32 (x - mean, squares summed
    per register of `lanes` into a double, the tail one by one); scale = 1/sqrtf(var + eps)."""
    rows, n = x.shape
    head = n // lanes * lanes
    sq = np.empty((rows, 16), F32)           # a register's squares, a row's own
    for r in prange(rows):
        s = 0.0
        for i in range(n):
            s += np.float64(x[r, i])
        mean = F32(s) / F32(n)
        if lanes == 16:                      # literal widths: the block loops unroll (a runtime width: 20% slower)
            v2 = _cvar_blocks(x[r], mean, head, 16, sq[r], out[r])
        else:
            v2 = _cvar_blocks(x[r], mean, head, 8, sq[r], out[r])
        for i in range(head, n):
            d = x[r, i] - mean
            out[r, i] = d
            v2 += np.float64(d * d)
        scale = _ONE / np.sqrt(F32(v2 / n) + eps)
        for i in range(n):
            out[r, i] = out[r, i] * scale


_norm_par, _norm_ser = parallel_and_serial(_norm_rows)


_NO_WEIGHT = np.empty(0, F32)


def rms_norm(x: np.ndarray, eps: float, weight: np.ndarray | None = None) -> np.ndarray:
    """rms_norm over the last axis; with ``weight`` (float32, the row's length), times it (a norm's scale)."""
    return rms_norming(eps, weight, x.size)(x)


def rms_norming(eps: float, weight: np.ndarray | None, size: int) -> Callable[[np.ndarray], np.ndarray]:
    """rms_norm as a function of x alone, for x of ``size`` elements: the variant and the constants chosen once,
    for a caller that normalizes values of one shape run after run (a planned graph)."""
    kernel = rms_norm_kernel(size)
    eps32, w = F32(eps), _NO_WEIGHT if weight is None else weight

    def run(x: np.ndarray) -> np.ndarray:
        r = f32_rows(x)
        out = np.empty_like(r)
        kernel(r, eps32, w, out)
        return out.reshape(x.shape)

    return run


def rms_norm_kernel(size: int) -> Callable:
    """rms_norm's kernel for x of ``size`` elements, (rows, eps, weight, out): parallel from PAR_MIN."""
    return _rms_norm_par if size >= PAR_MIN else _rms_norm_ser


def norm(x: np.ndarray, eps: float, path: isa.IsaPath) -> np.ndarray:
    r = f32_rows(x)
    out = np.empty_like(r)
    norm_kernel(r.size)(r, F32(eps), path.lanes, out)
    return out.reshape(x.shape)


def norm_kernel(size: int) -> Callable:
    """norm's kernel for x of ``size`` elements, (rows, eps, lanes, out): parallel from PAR_MIN."""
    return _norm_par if size >= PAR_MIN else _norm_ser


def _l2_norm_rows(x, eps, out):
    """ggml_compute_forward_l2_norm_f32: sum += (double)(x*x) in order, scale = 1.0f/fmaxf(sqrtf((float)sum), eps),
    y = x * scale."""
    rows, n = x.shape
    for r in prange(rows):
        s = 0.0
        for i in range(n):
            v = x[r, i]
            s += np.float64(v * v)
        root = np.sqrt(F32(s))
        scale = _ONE / (root if root > eps else eps)  # fmaxf: eps where the root is NaN
        for i in range(n):
            out[r, i] = x[r, i] * scale


_l2_norm_par, _l2_norm_ser = parallel_and_serial(_l2_norm_rows)


def l2_norm(x: np.ndarray, eps: float) -> np.ndarray:
    r = f32_rows(x)
    out = np.empty_like(r)
    (_l2_norm_par if r.size >= PAR_MIN else _l2_norm_ser)(r, F32(eps), out)
    return out.reshape(x.shape)
