"""The norm steps: rms_norm, norm and l2_norm, and rms_norm fused with the product by its weight."""

from __future__ import annotations

import math
import threading
from functools import partial
from typing import Any, Callable

import numpy as np

from graphir.backends.numba import tape as T
from graphir.backends.numba.kernels.norm import l2_norm, norm, norm_kernel, rms_norm, rms_norm_kernel, rms_norming
from graphir.backends.numba.primitives.isa import IsaPath
from graphir.backends.numba.steps.base import F32, Env, Function, Step, kernel, rows_of
from graphir.backends.numba.tape import Tape
from graphir.graph.ir import Node


@kernel("rms_norm")
def _rms_norm(n: Node, memo: threading.local, path: IsaPath) -> Step:
    return _Norm(n.attrs["eps"], path, rms=True)


@kernel("norm")
def _norm(n: Node, memo: threading.local, path: IsaPath) -> Step:
    return _Norm(n.attrs["eps"], path, rms=False)


@kernel("l2_norm")
def _l2_norm(n: Node, memo: threading.local, path: IsaPath) -> Step:
    eps = n.attrs["eps"]
    return Function(lambda env, x: l2_norm(x, eps))


_NO_WEIGHT = np.zeros(0, F32)   # rms_norm's kernel without a product by a weight
_NO_WEIGHT.flags.writeable = False


class _Norm(Step):
    """norm, or rms_norm without a weight after it (Mamba-2's grouped norm, whose weight comes after a reshape;
    one followed by its weight is RmsNormWeighted)."""

    def __init__(self, eps: float, path: IsaPath, rms: bool):
        self.eps, self.path, self.rms = eps, path, rms

    def __call__(self, env: Env, x: np.ndarray) -> np.ndarray:
        return rms_norm(x, self.eps) if self.rms else norm(x, self.eps, self.path)

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        x = args[0]
        if not rows_of(x):
            return None
        out = tape.arena(x.shape)
        x2, o2, eps, lanes = x.reshape(-1, x.shape[-1]), out.reshape(-1, x.shape[-1]), F32(self.eps), self.path.lanes
        if self.rms:
            ok = tape.record(T.NORM, rms_norm_kernel(x.size), (x2, eps, _NO_WEIGHT, o2))
        else:
            ok = tape.record(T.LAYER_NORM, norm_kernel(x.size), (x2, eps, lanes, o2))
        return out if ok else None


class RmsNormWeighted(Step):
    """One step for rms_norm then mul by the norm's weight: kernels.norm's rms_norm with the weight where it is a
    float32 row of x's length, else the two steps' kernels in turn."""

    def __init__(self, eps: float, norm_step: Callable[..., Any], mul_step: Callable[..., Any]):
        self.eps, self.norm_step, self.mul_step = eps, norm_step, mul_step

    def __call__(self, env: Env, x: np.ndarray, w: Any) -> np.ndarray:
        if self._takes(w, x.shape):
            return rms_norm(x, self.eps, w)
        return self.mul_step(env, self.norm_step(env, x), w)

    def bind(self, env: Env, known: list[Any], shape: Callable[[int], tuple[int, ...]]) -> Callable[..., Any]:
        if not self._takes(known[1], shape(0)):
            return partial(self, env)
        norm_x = rms_norming(self.eps, known[1], math.prod(shape(0)))
        return lambda x, w: norm_x(x)

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        x, w = args
        if not rows_of(x) or not self._takes(w, x.shape):
            return None
        rows, out = x.reshape(-1, x.shape[-1]), tape.arena(x.shape)
        o2, eps = out.reshape(rows.shape), F32(self.eps)
        ok = tape.record(T.NORM, rms_norm_kernel(x.size), (rows, eps, w, o2))
        return out if ok else None

    @staticmethod
    def _takes(w: Any, shape: tuple[int, ...]) -> bool:
        return isinstance(w, np.ndarray) and w.ndim == 1 and w.dtype == np.float32 and w.shape[0] == shape[-1]
