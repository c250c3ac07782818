"""Mixture-of-experts kernels: ggml's mul_mat_id (each token through the experts its router chose) and the
routing's small reductions (top-k by a descending argsort, the sum of a row, the sum of a token's expert slots),
and add_id (each slot's product plus its expert's bias row).

mul_mat_id groups a ubatch's (token, slot) pairs by expert, as ggml does, and multiplies each chosen expert's rows
once through that expert's [n_ff, n_embd] matrix: an expert nobody chose costs nothing, so the time follows
n_expert_used, not n_expert. An expert's matrix is a QWeight over its rows of the stacked GGUF tensor (the same
quantized matmuls as dense layers, repacked per expert on its first use) or, for stacked weights held as a float
array, its slice. F32 and F16 experts take ggml_vec_dot, never tinyBLAS, as ggml's mul_mat_id does.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Sequence

import numpy as np

from graphir.backends.isa import IsaPath
from graphir.backends.kernels.mul_mat import mul_mat
from graphir.backends.quant.weight import QWeight

F32 = np.float32


_EXPERTS: weakref.WeakKeyDictionary[QWeight, list[QWeight]] = weakref.WeakKeyDictionary()
_EXPERTS_LOCK = threading.Lock()


def expert_matrices(w: Any, n_expert: int) -> Sequence[Any]:
    """The n_expert matrices of a stacked weight: QWeights over consecutive row ranges of a QWeight (expert e's
    rows are e * n_ff .. (e + 1) * n_ff, as GGUF stores [n_embd, n_ff, n_expert]), made once per weight and
    shared by every graph and thread that multiplies it (each repacks on its first use); or a float array
    (n_expert, n_ff, n_embd), expert e being its view [e]."""
    if isinstance(w, QWeight):
        if w.rows % n_expert:
            raise ValueError(f"{w!r} does not split into {n_expert} experts")
        with _EXPERTS_LOCK:
            if w not in _EXPERTS:
                rows = w.rows // n_expert
                _EXPERTS[w] = [QWeight(w.raw[e * rows:(e + 1) * rows], w.qtype, w.ne0) for e in range(n_expert)]
            return _EXPERTS[w]
    w = np.ascontiguousarray(w, dtype=F32)  # no copy of a float32 array: expert e is the view w[e]
    if w.ndim != 3 or w.shape[0] != n_expert:
        raise ValueError(f"stacked expert weights must be (n_expert={n_expert}, n_ff, n_embd), got {w.shape}")
    return w


def _expert_matmul(w: Any, x: np.ndarray, path: IsaPath) -> np.ndarray:
    """x (n, K) float32 through one expert: (n, M)."""
    if isinstance(w, QWeight):
        floats = w.float_rows()
        if floats is None:
            return w.matmul(x)
        return mul_mat(floats, x, path, pad=1, contiguous=False, vec_dot=True)
    return mul_mat(w, x, path, contiguous=False, vec_dot=True)


def mul_mat_id(experts: Sequence[Any], x: np.ndarray, ids: np.ndarray, path: IsaPath) -> np.ndarray:
    """out[t, i] = experts[ids[t, i]] @ x[t, i % ne1] for x (T, ne1, K) (ne1 1: one row per token, read by every
    slot; or n_expert_used: a row per slot) and ids (T, n_expert_used): (T, n_expert_used, M) float32."""
    n_tok, n_used = ids.shape
    flat = np.asarray(ids, np.int64).reshape(-1)
    if flat.size and (flat.min() < 0 or flat.max() >= len(experts)):
        raise IndexError(f"expert ids must be in [0, {len(experts)}), got {flat.min()}..{flat.max()}")
    m = experts[0].rows if isinstance(experts[0], QWeight) else experts[0].shape[0]
    out = np.empty((n_tok, n_used, m), F32)
    order = np.argsort(flat, kind="stable")               # pairs grouped by expert, tokens in order within each
    chosen, starts = np.unique(flat[order], return_index=True)
    ends = np.append(starts[1:], flat.size)
    for e, lo, hi in zip(chosen, starts, ends):
        pairs = order[lo:hi]
        tok, slot = pairs // n_used, pairs % n_used
        rows = np.ascontiguousarray(x[tok, slot % x.shape[1]], dtype=F32)
        out[tok, slot] = _expert_matmul(experts[e], rows, path)
    return out


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
