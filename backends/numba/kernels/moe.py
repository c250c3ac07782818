"""Mixture-of-experts kernels: ggml's mul_mat_id (each token through the experts its router chose) and the
routing's small reductions (top-k by a descending argsort, the sum of a row, the sum of a token's expert slots),
and add_id (each slot's product plus its expert's bias row).

mul_mat_id groups a ubatch's (token, slot) pairs by expert, as ggml does, and multiplies each chosen expert's rows
once through that expert's [n_ff, n_embd] matrix: an expert nobody chose costs nothing, so the time follows
n_expert_used, not n_expert. Float experts (F32, F16) take ggml_vec_dot in one call for all of them
(FloatExperts); for quantized ones how an expert multiplies is the caller's (quant.weight.expert_matrices splits
a stacked weight into its experts' matrices).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from numba import njit, prange

from graphir.backends.numba.kernels.mul_mat import (MM_PAR_MIN, VEC_F16, VEC_F32, kernel_view, task_addresses,
                                                    to_f32_row)
from graphir.backends.numba.primitives import isa, simd
from graphir.backends.numba.primitives.jit import SER, call_at, parallel_and_serial
from graphir.backends.numba.primitives.simd import width

F32 = np.float32
_EXPERT_ROWS = 64   # rows of an expert's matrix per parallel task


@njit(**SER)
def route(ids, n_expert, order, chosen, starts):
    """ggml's mul_mat_id grouping of a ubatch's (token, slot) pairs, numbered t * n_used + i: order gets them
    expert by expert (tokens in order within one), chosen the experts used in ascending order and starts where
    each one's pairs begin (one more entry: the end). Returns how many experts were chosen, or -1 if an id is
    not one of the n_expert (nothing else is then written)."""
    flat = ids.reshape(-1)
    begin = np.zeros(n_expert + 1, np.int64)
    for p in range(flat.size):
        if flat[p] < 0 or flat[p] >= n_expert:
            return -1
        begin[flat[p] + 1] += 1
    for e in range(n_expert):
        begin[e + 1] += begin[e]
    g = 0
    for e in range(n_expert):
        if begin[e + 1] > begin[e]:
            chosen[g], starts[g] = e, begin[e]
            g += 1
    starts[g] = flat.size
    for p in range(flat.size):
        order[begin[flat[p]]] = p
        begin[flat[p]] += 1
    return g


def routed_pairs(ids: np.ndarray, n_expert: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """route's grouping of ids (T, n_used): the pair numbers expert by expert, the chosen experts, their starts."""
    ids = np.ascontiguousarray(ids, np.int32)
    order, chosen, starts = np.empty(ids.size, np.int64), np.empty(ids.size, np.int64), np.empty(ids.size + 1, np.int64)
    groups = route(ids, n_expert, order, chosen, starts)
    if groups < 0:
        raise IndexError(f"expert ids must be in [0, {n_expert}), got {ids.min()}..{ids.max()}")
    return order, chosen[:groups], starts[:groups + 1]


def pair_rows(x: np.ndarray, pairs: np.ndarray, n_used: int) -> np.ndarray:
    """The rows of x (T, ne1, K) the pairs read, contiguous float32: ne1 1 gives every slot its token's row."""
    return np.ascontiguousarray(x[pairs // n_used, pairs % n_used % x.shape[1]], dtype=F32)


def mul_mat_id(product: Callable[[int, np.ndarray], np.ndarray], n_expert: int, m: int, x: np.ndarray,
               ids: np.ndarray) -> np.ndarray:
    """out[t, i] = product(ids[t, i], x[t, i % ne1]) for x (T, ne1, K) (ne1 1: one row per token, read by every
    slot; or n_expert_used: a row per slot) and ids (T, n_expert_used): (T, n_expert_used, m) float32.
    ``product(e, rows)``: rows (n, K) float32 through expert e's matrix, (n, m)."""
    n_tok, n_used = ids.shape
    order, chosen, starts = routed_pairs(ids, n_expert)
    out = np.empty((n_tok * n_used, m), F32)
    for e, lo, hi in zip(chosen, starts[:-1], starts[1:]):
        pairs = order[lo:hi]
        out[pairs] = product(int(e), pair_rows(x, pairs, n_used))
    return out.reshape(n_tok, n_used, m)


def _experts_by_ids(task_at, tail_at, v, w1, k, m_rows, x, ids, n_expert, f16, hadd, mode, out):
    """mul_mat_id of float experts in one call: out[t, i] = ggml_vec_dot of every row of expert ids[t, i] (rows
    ids[t, i] * m_rows ... of w1) with x[t, i % ne1] (rounded to f16 first for f16 experts, as ggml converts
    src1). The pairs are grouped by expert (route), their x rows gathered and padded, then one parallel loop of
    tasks (expert, block of its rows), numbered so that consecutive ones share an expert: each thread streams
    its own part of the chosen experts' weights, where one launch per expert took 24 a token for a layer of 8
    used experts. False (nothing written) if an id is not an expert's."""
    n_tok, n_used = ids.shape
    n_pair, mm, n = n_tok * n_used, out.shape[2], width(v)
    order, chosen, starts = np.empty(n_pair, np.int64), np.empty(n_pair, np.int64), np.empty(n_pair + 1, np.int64)
    groups = route(ids, n_expert, order, chosen, starts)
    if groups < 0:
        return False
    ldx = (k + 63) // 64 * 64
    x1 = np.empty(n_pair * ldx, F32)
    for q in range(n_pair):
        to_f32_row(x[order[q] // n_used, order[q] % n_used % x.shape[1]], 2 if f16 else 0, x1[q * ldx:(q + 1) * ldx])
    rows = np.empty((1, n_pair, mm), F32)
    whole = k // (4 * n) * (4 * n)        # the length ggml_vec_dot's register steps cover
    m_blocks = (mm + _EXPERT_ROWS - 1) // _EXPERT_ROWS
    bm = ((mm + m_blocks - 1) // m_blocks + 3) // 4 * 4
    m_blocks = (mm + bm - 1) // bm
    zero, one = np.int64(0), np.int64(1)
    for task in prange(groups * m_blocks):
        g, r = task // m_blocks, task % m_blocks
        m0 = np.int64(r * bm)
        m1, wr, n0, n1 = min(m0 + bm, mm), chosen[g] * m_rows, starts[g], starts[g + 1]
        if mode == VEC_F32 and whole == 0:
            call_at(tail_at, (v, w1, k, x1, ldx, k, k, wr, one, zero, one, zero, n0, n1, m0, m1, rows))
        else:
            call_at(task_at, (v, w1, k, x1, ldx, k, k, wr, one, zero, one, hadd, mode, whole, zero, n0, n1, m0, m1,
                              rows))
    for q in range(n_pair):
        out[order[q] // n_used, order[q] % n_used] = rows[0, q]
    return True


_experts_by_ids_par, _experts_by_ids_ser = parallel_and_serial(_experts_by_ids)


class FloatExperts:
    """ggml's mul_mat_id for float experts stacked in ``rows`` (n_expert * M, K; float32 or float16), prepared once
    (the kernel's view of the rows, its addresses) for every call: x (T, ne1, K) float32 (ne1 1: every slot reads
    its token's row), ids (T, n_used) -> (T, n_used, M) float32, each element ggml_vec_dot_f32/f16 as
    mul_mat(..., vec_dot=True) gives it expert by expert."""

    def __init__(self, rows: np.ndarray, n_expert: int, path: isa.IsaPath) -> None:
        self.n_expert, self.m, self.k = n_expert, rows.shape[0] // n_expert, rows.shape[1]
        self.f16 = rows.dtype == np.float16
        self.mode = np.int64(VEC_F16 if self.f16 else VEC_F32)
        self.w1, self.hadd, self.v = kernel_view(rows.reshape(-1)), path.reduce == isa.REDUCE_HADD, simd.lanes(path.lanes)
        self.task_at, self.tail_at = task_addresses(path.lanes, self.w1.dtype, self.hadd,
                                                    self.mode == VEC_F32 and self.k < 4 * path.lanes)

    def __call__(self, x: np.ndarray, ids: np.ndarray) -> np.ndarray:
        ids = np.ascontiguousarray(ids, np.int32)
        out = np.empty(ids.shape + (self.m,), F32)
        fn = _experts_by_ids_par if ids.size * self.m * self.k >= MM_PAR_MIN else _experts_by_ids_ser
        if not fn(self.task_at, self.tail_at, self.v, self.w1, np.int64(self.k), np.int64(self.m),
                  np.ascontiguousarray(x, F32), ids, np.int64(self.n_expert), self.f16, self.hadd, self.mode, out):
            raise IndexError(f"expert ids must be in [0, {self.n_expert}), got {ids.min()}..{ids.max()}")
        return out


def argsort_top_k(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values along the last axis, largest first (ggml_argsort_top_k), int32: equal values
    in the order of their indices, a NaN after every number (as np.argsort(-x, kind="stable")[..., :k])."""
    x = np.ascontiguousarray(x, F32)
    out = np.empty(x.shape[:-1] + (k,), np.int32)
    _top_k(x.reshape(-1, x.shape[-1]), out.reshape(-1, k))
    return out


@njit(**SER)
def _top_k(x, out):
    """Each row's k best indices by insertion into the sorted list of the best so far (k is a router's few)."""
    k = out.shape[1]
    for r in range(x.shape[0]):
        held = 0
        for j in range(x.shape[1]):
            v, i = x[r, j], min(held, k)
            while i > 0 and (v > x[r, out[r, i - 1]] or (v == v and x[r, out[r, i - 1]] != x[r, out[r, i - 1]])):
                i -= 1
            if i < k:
                for t in range(min(held, k - 1), i, -1):
                    out[r, t] = out[r, t - 1]
                out[r, i] = j
                held += 1


def sum_rows(x: np.ndarray) -> np.ndarray:
    """Sum along the last axis, keeping it as 1: ggml_vec_sum_f32 adds in order in double, then rounds once."""
    x = np.ascontiguousarray(x, F32)
    out = np.empty(x.shape[:-1] + (1,), F32)
    _sum_rows(x.reshape(-1, x.shape[-1]), out.reshape(-1))
    return out


def mean_rows(x: np.ndarray) -> np.ndarray:
    """ggml_mean: each row's sum as sum_rows gives it (in double, rounded once), divided by its length in float32."""
    return np.divide(sum_rows(x), F32(x.shape[-1]), dtype=F32)


@njit(**SER)
def _sum_rows(x, out):
    for r in range(x.shape[0]):
        total = 0.0
        for j in range(x.shape[1]):
            total += np.float64(x[r, j])
        out[r] = F32(total)


def add_id(x: np.ndarray, b: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """x (T, n_expert_used, n) plus, in each slot, the bias row b[e] (b: (n_expert, n)) of the expert e the slot
    chose (ids (T, n_expert_used)): ggml_add_id, one float32 addition per element."""
    flat = np.asarray(ids, np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= b.shape[0]):
        raise IndexError(f"expert ids must be in [0, {b.shape[0]}), got {flat.min()}..{flat.max()}")
    return np.add(x, np.asarray(b, F32)[flat], dtype=F32)


def moe_sum(x: np.ndarray) -> np.ndarray:
    """x (T, n_expert_used, n) -> (T, n): slot 0, plus slot 1, ... in float32, the order llama.cpp adds its views."""
    x = np.ascontiguousarray(x, F32)
    out = np.empty((x.shape[0], x.shape[2]), F32)
    _moe_sum(x, out)
    return out


@njit(**SER)
def _moe_sum(x, out):
    for t in range(x.shape[0]):
        out[t] = x[t, 0]
        for i in range(1, x.shape[1]):
            out[t] += x[t, i]
