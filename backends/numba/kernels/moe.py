"""Mixture-of-experts kernels: ggml's mul_mat_id (each token through the experts its router chose) and the
routing's small reductions (top-k by a descending argsort, the sum of a row, the sum of a token's expert slots),
and add_id (each slot's product plus its expert's bias row).

mul_mat_id groups a ubatch's (token, slot) pairs by expert, as ggml does, and multiplies each chosen expert's rows
once through that expert's [n_ff, n_embd] matrix: an expert nobody chose costs nothing, so the time follows
n_expert_used, not n_expert. How an expert multiplies is the caller's (quant.weight.expert_matrices splits a
stacked weight into its experts' matrices).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

F32 = np.float32


def routed_pairs(ids: np.ndarray, n_expert: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A ubatch's (token, slot) pairs grouped by expert as ggml's mul_mat_id groups them: the flat pair numbers
    t * n_expert_used + i in that order (tokens in order within an expert), the chosen experts in ascending order,
    and where each one's pairs start (one more entry: the end)."""
    flat = np.asarray(ids, np.int64).reshape(-1)
    if flat.size and (flat.min() < 0 or flat.max() >= n_expert):
        raise IndexError(f"expert ids must be in [0, {n_expert}), got {flat.min()}..{flat.max()}")
    order = np.argsort(flat, kind="stable")
    chosen, starts = np.unique(flat[order], return_index=True)
    return order, chosen, np.append(starts, flat.size)


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


def argsort_top_k(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values along the last axis, largest first (ggml_argsort_top_k), int32."""
    return np.argsort(-np.asarray(x, F32), axis=-1, kind="stable")[..., :k].astype(np.int32)


def sum_rows(x: np.ndarray) -> np.ndarray:
    """Sum along the last axis, keeping it as 1: ggml_vec_sum_f32 adds in order in double, then rounds once."""
    return np.cumsum(np.asarray(x, np.float64), axis=-1)[..., -1:].astype(F32)


def add_id(x: np.ndarray, b: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """x (T, n_expert_used, n) plus, in each slot, the bias row b[e] (b: (n_expert, n)) of the expert e the slot
    chose (ids (T, n_expert_used)): ggml_add_id, one float32 addition per element."""
    flat = np.asarray(ids, np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= b.shape[0]):
        raise IndexError(f"expert ids must be in [0, {b.shape[0]}), got {flat.min()}..{flat.max()}")
    return np.add(x, np.asarray(b, F32)[flat], dtype=F32)


def moe_sum(x: np.ndarray) -> np.ndarray:
    """x (T, n_expert_used, n) -> (T, n): slot 0, plus slot 1, ... in float32, the order llama.cpp adds its views."""
    out = np.array(x[:, 0], F32)
    for i in range(1, x.shape[1]):
        out += x[:, i]
    return out
