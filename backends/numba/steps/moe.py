"""The mixture-of-experts steps: mul_mat_id through the experts a token chose, the routing's reductions, add_id."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from graphir.backends.numba.kernels.moe import FloatExperts, add_id, argsort_top_k, mean_rows, moe_sum, mul_mat_id, sum_rows
from graphir.backends.numba.primitives.isa import IsaPath
from graphir.backends.numba.quant.weight import QWeight, expert_matrices
from graphir.backends.numba.steps.base import Env, Function, Step, dense, kernel
from graphir.graph.dims import Sym
from graphir.graph.ir import Node


@kernel("mul_mat_id")
def _mul_mat_id(n: Node, memo: threading.local, path: IsaPath) -> Step:
    n_expert = n.inputs[0].shape[2]
    floats: dict[int, tuple[Any, FloatExperts | None]] = {}   # by the weight's id: the weight, and its kernel

    def by_experts(env: Env, w: Any, x: np.ndarray, ids: np.ndarray) -> np.ndarray:
        if id(w) not in floats:
            rows = _float_rows(w, n_expert)
            floats[id(w)] = w, None if rows is None else FloatExperts(rows, n_expert, path)
        float_experts = floats[id(w)][1]
        if float_experts is not None:   # every chosen expert in one call
            return float_experts(x, ids)
        experts = expert_matrices(w, n_expert)
        return mul_mat_id(lambda e, r: experts[e].matmul(r), n_expert, experts[0].rows, x, ids)

    return Function(by_experts)


def _float_rows(w: Any, n_expert: int) -> np.ndarray | None:
    """Stacked F32 or F16 experts as their rows (n_expert * n_ff, n_embd), as stored: ggml's mul_mat_id takes
    ggml_vec_dot_f32/f16 for them, never tinyBLAS. None for quantized experts, which multiply expert by expert."""
    if isinstance(w, QWeight):
        return w.float_rows()
    w = np.asarray(w)
    if w.ndim != 3 or w.shape[0] != n_expert:
        raise ValueError(f"stacked expert weights must be (n_expert={n_expert}, n_ff, n_embd), got {w.shape}")
    return (w if w.dtype in (np.float16, np.float32) else w.astype(np.float32)).reshape(-1, w.shape[2])


@kernel("argsort_top_k")
def _argsort_top_k(n: Node, memo: threading.local, path: IsaPath) -> Step:
    k = n.attrs["k"]  # a size of the memory's (an indexer's kept keys) is bound at run time
    return Function(lambda env, x: argsort_top_k(x, k.eval(env) if isinstance(k, Sym) else k))


@kernel("sum_rows")
def _sum_rows(n: Node, memo: threading.local, path: IsaPath) -> Step:
    return Function(lambda env, x: sum_rows(x))


@kernel("mean")
def _mean(n: Node, memo: threading.local, path: IsaPath) -> Step:
    return Function(lambda env, x: mean_rows(x))


@kernel("moe_sum")
def _moe_sum(n: Node, memo: threading.local, path: IsaPath) -> Step:
    return Function(lambda env, x: moe_sum(x))


@kernel("add_id")
def _add_id(n: Node, memo: threading.local, path: IsaPath) -> Step:
    return Function(lambda env, x, b, ids: add_id(x, dense(b), ids))
