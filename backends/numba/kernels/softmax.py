"""soft_max as ggml_soft_max_f32 computes it, with llama.cpp's padding of the KV length emulated.

llama.cpp pads n_kv to a multiple of N_KV_PAD with masked cells (its caches hold a multiple of 256 cells); graphir's
KV cache pads n_kv the same way, but holds the n_ctx cells asked for, so a whole cache of another size (and an
unpadded mask) attends over fewer cells than llama.cpp's. The padding changes the paths (SIMD blocks instead of
scalar tails) but not the values (masked probabilities are exactly 0), so soft_max with a mask runs the padded
length's paths and marks its result for the mul_mat that consumes it.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
from numba import njit, prange

from graphir.backends.numba.primitives import isa
from graphir.backends.numba.primitives.expf import v_expf_shifted
from graphir.backends.numba.primitives.libm import libm
from graphir.backends.numba.primitives.jit import INL, PAR, PAR_MIN, SER, f32_rows
from graphir.backends.numba.primitives.bits import fma, hsum, hsum16
from graphir.memory.kv import N_KV_PAD

F32 = np.float32
_INF = F32(np.inf)


class _Probs(np.ndarray):
    """soft_max's result, with the KV length it was computed over padded to ``kv_pad``: mul_mat(v, kq) then
    emulates the same padding. A marker type only (views keep it; np.array copies drop it)."""

    kv_pad: int = 1


@njit(**INL)
def _block_sums(v, head, lanes):
    """sum over the registers of v[:head] of each register's sum (hsum), in double, in order."""
    s = 0.0
    if lanes == 16:
        for b in range(0, head, 16):
            s += np.float64(hsum16(v[b:b + 16]))
    else:
        for b in range(0, head, 8):
            s += np.float64(hsum(v, b, 8))
    return s


@njit(**INL)
def soft_max_row(x, m, scale, slope, head, lanes, variant, w, out, sink, has_sink):
    """ggml_compute_forward_soft_max_f32 for one row: w = x*scale (+ slope * mask row m, if it has the row's
    length; the slope is ALiBi's, 1 without: ggml's loop compiles to a fused multiply-add),
    max, ggml_vec_soft_max_f32 (ggml_v_expf per register of `lanes`, each register's sum added to a double;
    cells past n up to `head` are the padding's -inf cells, exp 0; libm expf for a tail past `head`), then
    * (float)(1/sum). With a sink, the max counts it and the sum adds libm expf(sink - max) last, as ggml.
    w: scratch of at least max(n, head)."""
    n = x.shape[0]
    for i in range(n):
        w[i] = x[i] * scale
    if m.shape[0] == n:
        for i in range(n):
            w[i] = fma(slope, m[i], w[i])
    mx = -_INF
    for i in range(n):
        mx = w[i] if w[i] > mx else mx
    if has_sink:
        mx = mx if mx > sink else sink
    for i in range(n, head):
        w[i] = -_INF
    v_expf_shifted(w, head, mx, variant)
    s = _block_sums(w, head, lanes)
    for i in range(head, n):
        w[i] = math.exp(w[i] - mx)
        s += np.float64(w[i])
    if has_sink:
        s += np.float64(F32(math.exp(sink - mx)))
    inv = F32(1.0 / s)
    for i in range(n):
        out[i] = w[i] * inv


@njit(**PAR)
def _soft_max_par(x, mask, mrows, scale, slopes, head, lanes, variant, out, sinks):
    """Row r reads mask row r % mrows (mrows = 0: no mask), ALiBi slope slopes[r] (slopes empty: 1) and sink
    sinks[r] (sinks empty: none)."""
    for r in prange(x.shape[0]):
        w = np.empty(max(head, x.shape[1]), F32)
        has = sinks.shape[0] > 0
        soft_max_row(x[r], mask[r % mrows] if mrows else mask[0, :0], scale,
                     slopes[r] if slopes.shape[0] else F32(1.0), head, lanes, variant, w, out[r],
                     sinks[r] if has else F32(0.0), has)


@njit(**SER)
def _soft_max_ser(x, mask, mrows, scale, slopes, head, lanes, variant, out, sinks):
    w = np.empty(max(head, x.shape[1]), F32)
    has = sinks.shape[0] > 0
    for r in range(x.shape[0]):
        soft_max_row(x[r], mask[r % mrows] if mrows else mask[0, :0], scale,
                     slopes[r] if slopes.shape[0] else F32(1.0), head, lanes, variant, w, out[r],
                     sinks[r] if has else F32(0.0), has)


def soft_max_kernel(size: int) -> Callable:
    """soft_max's kernel for x of ``size`` elements, (rows, mask rows, mrows, scale, slopes, head, lanes,
    variant, out, sinks): parallel from PAR_MIN."""
    return _soft_max_par if size >= PAR_MIN else _soft_max_ser


def mask_rows(mask: np.ndarray | None, shape: tuple[int, ...]) -> tuple[np.ndarray, int]:
    """The mask as float32 rows of the last axis of x's ``shape`` and how many there are: row r of x takes row
    r % mrows (mrows = 0: no mask)."""
    n = shape[-1]
    if mask is None:
        return np.zeros((1, n), F32), 0
    mask = np.asarray(mask)
    lead = mask.reshape((1,) * (max(len(shape), 2) - mask.ndim) + mask.shape)
    if lead.shape[-1] == n and all(d == 1 for d in lead.shape[:-2]) and \
            (lead.shape[-2] == (shape[-2] if len(shape) > 1 else 1)):
        m = np.ascontiguousarray(lead.reshape(-1, n), dtype=F32)   # one mask row per query row
    else:
        m = np.ascontiguousarray(np.broadcast_to(lead, shape), dtype=F32).reshape(-1, n)
    return m, m.shape[0]


def exp_head(n: int, lanes: int, pad: int) -> int:
    """How many of a row's n cells ggml_vec_soft_max_f32 takes in registers: with llama.cpp's KV padding
    (pad > 1) every cell, the padding's masked ones filling the last register; else whole registers only."""
    return -(-n // lanes) * lanes if pad > 1 else n // lanes * lanes


def soft_max(x: np.ndarray, mask: np.ndarray | None, scale: float, max_bias: float, path: isa.IsaPath,
             pad: int | None = None, sinks: np.ndarray | None = None) -> np.ndarray:
    """softmax over the last numpy axis of x*scale + mask (mask broadcast over x's leading axes; with ALiBi,
    ``max_bias`` > 0, times the slope of the row's head); sinks: one extra logit per head (numpy axis -3 of x,
    ggml's ne2) in each row's denominator.

    pad: emulate llama.cpp's KV padding (default: N_KV_PAD when there is a mask, i.e. attention; 1 otherwise).
    The result is marked (``kv_pad``) so that the mul_mat consuming it pads the same way and knows it
    contiguous."""
    if pad is None:
        pad = N_KV_PAD if mask is not None else 1
    shape = x.shape
    r = f32_rows(x)
    n = r.shape[1]
    m, mrows = mask_rows(mask, shape)
    out = np.empty_like(r)
    lanes = path.lanes
    head = exp_head(n, lanes, pad)
    sk = np.zeros(0, F32) if sinks is None else per_row(np.asarray(sinks, F32).reshape(-1), shape)
    slopes = per_row(alibi_slopes(max_bias, heads(shape)), shape) if max_bias > 0 else np.zeros(0, F32)
    soft_max_kernel(r.size)(r, m, mrows, F32(scale), slopes, head, lanes, path.expf, out, sk)
    return probabilities(out.reshape(shape), pad)  # contiguous probabilities: mul_mat may take tinyBLAS with them


def heads(shape: tuple[int, ...]) -> int:
    """ggml's ne2 of x: the heads of an attention's scores (numpy axis -3)."""
    return shape[-3] if len(shape) >= 3 else 1


def per_row(per_head: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """One value per head as one per row of x's ``shape``: rows run over ne1 within a head, heads (ne2) next,
    then ne3."""
    lead = (1,) * max(3 - len(shape), 0) + tuple(shape[:-1])
    rows = np.ascontiguousarray(np.broadcast_to(per_head[:, None], (lead[-2], lead[-1])), dtype=F32).reshape(-1)
    return np.tile(rows, int(np.prod(shape[:-1], dtype=np.int64)) // rows.size)


def alibi_slopes(max_bias: float, n_head: int) -> np.ndarray:
    """ALiBi's slope of each of ``n_head`` heads as ggml's soft_max computes them, in float32 with libm's powf:
    with n the largest power of two not above n_head, m0 = 2^(-max_bias/n) and m1 = 2^(-max_bias/2/n); head h
    below n takes m0^(h+1), the others m1^(2(h-n)+1)."""
    n = 1 << int(math.floor(math.log2(n_head)))
    m0 = libm.powf(F32(2.0), F32(-max_bias) / F32(n))
    m1 = libm.powf(F32(2.0), F32(-max_bias / 2.0) / F32(n))
    return np.array([libm.powf(m0, h + 1) if h < n else libm.powf(m1, 2 * (h - n) + 1) for h in range(n_head)], F32)


def probabilities(out: np.ndarray, pad: int) -> np.ndarray:
    """soft_max's result ``out`` marked with the KV padding it was computed with (a view)."""
    marked = out.view(_Probs)
    marked.kv_pad = int(pad)
    return marked
