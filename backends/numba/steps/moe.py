"""The mixture-of-experts steps: mul_mat_id through the experts a token chose, the routing's reductions, add_id."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from graphir.backends.numba.kernels.moe import add_id, argsort_top_k, moe_sum, mul_mat_id, sum_rows
from graphir.backends.numba.kernels.mul_mat import mul_mat
from graphir.backends.numba.primitives.isa import IsaPath
from graphir.backends.numba.quant.weight import QWeight, expert_matrices
from graphir.backends.numba.steps.base import Env, Function, Step, dense, kernel
from graphir.graph.ir import Node


@kernel("mul_mat_id")
def _mul_mat_id(n: Node, memo: threading.local, path: IsaPath) -> Step:
    n_expert = n.inputs[0].shape[2]

    def by_experts(env: Env, w: Any, x: np.ndarray, ids: np.ndarray) -> np.ndarray:
        experts = expert_matrices(w, n_expert)
        m = experts[0].rows if isinstance(experts[0], QWeight) else experts[0].shape[0]
        return mul_mat_id(lambda e, rows: _expert_product(experts[e], rows, path), n_expert, m, x, ids)

    return Function(by_experts)


def _expert_product(w: Any, x: np.ndarray, path: IsaPath) -> np.ndarray:
    """x (n, K) float32 through one expert: (n, M). F32 and F16 experts take ggml_vec_dot, never tinyBLAS, as
    ggml's mul_mat_id does."""
    if isinstance(w, QWeight):
        floats = w.float_rows()
        if floats is None:
            return w.matmul(x)
        return mul_mat(floats, x, path, pad=1, contiguous=False, vec_dot=True)
    return mul_mat(w, x, path, contiguous=False, vec_dot=True)


@kernel("argsort_top_k")
def _argsort_top_k(n: Node, memo: threading.local, path: IsaPath) -> Step:
    return Function(lambda env, x: argsort_top_k(x, n.attrs["k"]))


@kernel("sum_rows")
def _sum_rows(n: Node, memo: threading.local, path: IsaPath) -> Step:
    return Function(lambda env, x: sum_rows(x))


@kernel("moe_sum")
def _moe_sum(n: Node, memo: threading.local, path: IsaPath) -> Step:
    return Function(lambda env, x: moe_sum(x))


@kernel("add_id")
def _add_id(n: Node, memo: threading.local, path: IsaPath) -> Step:
    return Function(lambda env, x, b, ids: add_id(x, dense(b), ids))
