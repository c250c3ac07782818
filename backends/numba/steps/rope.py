"""The RoPE steps: rope and rope_multi, the cos/sin of a run's positions made once for every layer."""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np

from graphir.backends.numba import tape as T
from graphir.backends.numba.kernels.rope import multi_cos_sin, rope_apply, rope_cos_sin, rope_kernel, roping
from graphir.backends.numba.primitives.isa import IsaPath
from graphir.backends.numba.steps.base import Env, Step, dense, kernel, rows_of
from graphir.backends.numba.tape import Tape
from graphir.graph.ir import Node


@kernel("rope")
def _rope(n: Node, memo: threading.local, path: IsaPath) -> Step:
    a = n.attrs
    return _Rope(a, memo, lambda pos, ff: rope_cos_sin(pos, a["n_dims"], None if ff is None else dense(ff).reshape(-1),
                                                       a))


@kernel("rope_multi")
def _rope_multi(n: Node, memo: threading.local, path: IsaPath) -> Step:
    a = n.attrs
    return _Rope(a, memo, lambda pos, ff: multi_cos_sin(pos, a["n_dims"], a["sections"], a))


class _Rope(Step):
    """rope and rope_multi: x rotated by the cos/sin of the positions (and frequency factors), which the run's memo
    keeps from the first layer that makes them for the others; a plan binds the rotation to x's shape."""

    def __init__(self, a: dict[str, Any], memo: threading.local,
                 cos_sin: Callable[[np.ndarray, Any], tuple[np.ndarray, np.ndarray]]):
        self.a, self.memo, self.cos_sin, self.key = a, memo, cos_sin, tuple(a.values())

    def __call__(self, env: Env, x: np.ndarray, pos: np.ndarray, ff: Any = None) -> np.ndarray:
        return rope_apply(x, self._cached(pos, ff), self.a)

    def bind(self, env: Env, known: list[Any], shape: Callable[[int], tuple[int, ...]]) -> Callable[..., Any]:
        rotate, cached = roping(self.a, shape(0)), self._cached
        return lambda x, pos, ff=None: rotate(x, cached(pos, ff))

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        """The rotation on the tape; cos/sin of the positions made before each run, once for the layers."""
        x, pos, ff = (*args, None)[:3]
        if not rows_of(x):
            return None
        key = ("cos_sin", id(pos), id(ff), self.key)
        cs = tape.memo.get(key)
        if cs is None:
            c, s = self.cos_sin(pos, ff)
            if not rows_of(c, s) or c.ndim != 2:
                return None
            cs = tape.memo[key] = tape.arena(c.shape, fresh=True), tape.arena(s.shape, fresh=True)

            def fill(cs: tuple[np.ndarray, np.ndarray] = cs) -> None:
                cs[0][...], cs[1][...] = self.cos_sin(pos, ff)

            tape.before.append(fill)
        (cos, sin), (kernel, nh, n_dims, neox, n_fused) = cs, rope_kernel(self.a, x.shape)
        rows, out = x.reshape(-1, x.shape[-1]), tape.arena(x.shape)
        o2 = out.reshape(rows.shape)
        ok = tape.record(T.ROPE, kernel, (rows, cos, sin, cos.shape[0], nh, n_dims, neox, n_fused, o2))
        return out if ok else None

    def _cached(self, pos: np.ndarray, ff: Any) -> tuple[np.ndarray, np.ndarray]:
        k, d = (id(pos), id(ff), self.key), self.memo.d
        cs = d.get(k)
        if cs is None:
            cs = d[k] = self.cos_sin(pos, ff)
        return cs
