"""DeepSeek's sparse-attention indexer (the ``lightning_indexer`` op), in ggml's CPU order of operations.

ggml_compute_forward_lightning_indexer: per sequence, token t and cached key j, the key row is read as float32
(an f16 cache converted exactly), each head's q . k is ggml_vec_dot_f32, and the heads are summed in order as
``score += max(qk, 0) * w[h]`` (one fused multiply-add under llama.cpp's x86 build's contraction); the f16 mask
is added last. The keys are independent (ggml splits them over threads): here a ``prange`` over them.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from graphir.backends.numba.kernels.recurrent import _vec_dot
from graphir.backends.numba.primitives import simd
from graphir.backends.numba.primitives.bits import fma
from graphir.backends.numba.primitives.jit import PAR

F32 = np.float32
_ZERO = F32(0.0)


@njit(**PAR)
def _lightning_indexer(q, k, w, m, out, r, hadd):
    """q (S, T, H, d), k (S, n_kv, d), w (S, T, H), m (S', T, n_kv) as float32, out (S, T, n_kv)."""
    n_seqs, n_tok, n_head, _ = q.shape
    n_kv, n_mask = k.shape[1], m.shape[0]
    for sj in prange(n_seqs * n_kv):
        s, j = sj // n_kv, sj % n_kv
        kj = k[s, j]
        for t in range(n_tok):
            score = _ZERO
            for h in range(n_head):
                qk = _vec_dot(r, q[s, t, h], kj, hadd)
                score = fma(max(qk, _ZERO), w[s, t, h], score)
            out[s, t, j] = score + m[s % n_mask, t, j]


def lightning_indexer(q: np.ndarray, k: np.ndarray, w: np.ndarray, mask: np.ndarray, lanes: int,
                      hadd: bool) -> np.ndarray:
    """Scores [.., n_tokens, n_kv] (numpy order) of q [.., T, H, d], k [.., n_kv, 1, d], weights [.., T, H] and
    the f16 mask [.., T, n_kv]; leading sizes are the sequences (1 when absent)."""
    n_tok, n_head, d = q.shape[-3:]
    n_kv = k.shape[-3]
    q4 = np.ascontiguousarray(q, F32).reshape(-1, n_tok, n_head, d)
    k3 = np.ascontiguousarray(k, F32).reshape(-1, n_kv, d)
    w3 = np.ascontiguousarray(w, F32).reshape(-1, n_tok, n_head)
    m3 = np.ascontiguousarray(mask, F32).reshape(-1, n_tok, n_kv)
    out = np.empty((q4.shape[0], n_tok, n_kv), F32)
    _lightning_indexer(q4, k3, w3, m3, out, simd.lanes(lanes), hadd)
    return out
