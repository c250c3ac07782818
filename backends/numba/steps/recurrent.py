"""The recurrent steps: Mamba's ssm_conv and scans, RWKV6's wkv6 and RWKV7's wkv7, gated linear attention, the gated
delta net; with their tape faces."""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

from graphir.backends.numba import tape as T
from graphir.backends.numba.kernels.recurrent import (gated_delta_net, gated_linear_attn, rwkv_wkv6, rwkv_wkv7, ssm_conv,
                                                      ssm_conv_kernel, ssm_scan, ssm_scan_heads, ssm_scan_heads_kernel,
                                                      ssm_scan_kernel, wkv6_kernel)
from graphir.backends.numba.primitives import simd
from graphir.backends.numba.primitives.isa import REDUCE_HADD, IsaPath
from graphir.backends.numba.steps.base import Env, Function, Step, dense_kept, kernel, rows_of
from graphir.backends.numba.tape import Tape
from graphir.graph.ir import Node


@kernel("ssm_conv")
def _ssm_conv(n: Node, memo: threading.local, path: IsaPath) -> Step:
    return _SsmConv()


class _SsmConv(Step):
    def __init__(self) -> None:
        self.dense = dense_kept()

    def __call__(self, env: Env, sx: np.ndarray, w: Any) -> np.ndarray:
        return ssm_conv(sx, self.dense(w))

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        sx, w = args[0], self.dense(args[1])
        if not rows_of(sx, w) or w.ndim != 2:
            return None
        sx3 = sx.reshape((-1,) + sx.shape[-2:])
        y = tape.arena((sx3.shape[0], sx3.shape[2] - w.shape[1] + 1, sx3.shape[1]))
        ok = tape.record(T.CONV, ssm_conv_kernel(y.size), (sx3, w, y))
        return y if ok else None


def _result_with_states(tape: Tape, shape: tuple[int, ...], y_shape: tuple[int, ...],
                        st_shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A recurrent op's value on the tape as ggml lays it out, every output then the final states in one array of
    ``shape``: that array, and its two parts as the kernel writes them."""
    out = tape.arena(shape)
    flat, n = out.reshape(-1), math.prod(y_shape)
    return out, flat[:n].reshape(y_shape), flat[n:].reshape(st_shape)


@kernel("ssm_scan")
def _ssm_scan(n: Node, memo: threading.local, path: IsaPath) -> Step:
    return _SsmScan()


class _SsmScan(Step):
    def __init__(self) -> None:
        self.dense = dense_kept()

    def __call__(self, env: Env, s: np.ndarray, x: np.ndarray, dt: np.ndarray, A: Any, B: np.ndarray,
                 C: np.ndarray) -> np.ndarray:
        return ssm_scan(s, x, dt, self.dense(A), B, C)

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        """The scan on the tape: its result, every y then the final states, one arena array (as ggml's)."""
        s, x, dt, A, B, C = args[0], args[1], args[2], self.dense(args[3]), args[4], args[5]
        if not rows_of(s, x, dt, A, B, C) or A.ndim != 2 or any(v.ndim != 3 for v in (x, dt, B, C)):
            return None
        s3 = s.reshape((x.shape[0],) + A.shape)
        out, y, st = _result_with_states(tape, (x.size + s3.size,), x.shape, s3.shape)
        return out if tape.record(T.SCAN, ssm_scan_kernel(), (s3, x, dt, A, B, C, y, st)) else None


@kernel("ssm_scan_heads")
def _ssm_scan_heads(n: Node, memo: threading.local, path: IsaPath) -> Step:
    return _SsmScanHeads(path)


class _SsmScanHeads(Step):
    def __init__(self, path: IsaPath) -> None:
        self.dense, self.lanes, self.hadd = dense_kept(), path.lanes, path.reduce == REDUCE_HADD

    def __call__(self, env: Env, s: np.ndarray, x: np.ndarray, dt: np.ndarray, A: Any, B: np.ndarray,
                 C: np.ndarray) -> np.ndarray:
        return ssm_scan_heads(s, x, dt, self.dense(A), B, C, self.lanes, self.hadd)

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        """Mamba-2's scan on the tape: every y then the final states, one arena array (as ggml's)."""
        s, x, dt, A, B, C = args[0], args[1], args[2], self.dense(args[3]).reshape(-1), args[4], args[5]
        if not rows_of(s, x, dt, A, B, C) or x.ndim != 4 or dt.ndim != 3 or B.ndim != 4 or C.shape != B.shape:
            return None
        s4 = s.reshape(x.shape[0], x.shape[2], x.shape[3], B.shape[3])
        out, y, st = _result_with_states(tape, (x.size + s4.size,), x.shape, s4.shape)
        kernel_args = (s4, x, dt, A, B, C, y, st, simd.lanes(self.lanes), self.hadd)
        return out if tape.record(T.SCAN_HEADS, ssm_scan_heads_kernel(), kernel_args) else None


@kernel("rwkv_wkv6")
def _rwkv_wkv6(n: Node, memo: threading.local, path: IsaPath) -> Step:
    return _Wkv6()


class _Wkv6(Step):
    def __init__(self) -> None:
        self.first = dense_kept()

    def __call__(self, env: Env, k: np.ndarray, v: np.ndarray, r: np.ndarray, tf: Any, td: np.ndarray,
                 state: np.ndarray) -> np.ndarray:
        return rwkv_wkv6(k, v, r, self.first(tf), td, state)

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        """wkv6 on the tape: its result, the outputs then the final states, one arena array (as ggml's)."""
        k, v, r, tf, td, state = args[0], args[1], args[2], self.first(args[3]), args[4], args[5]
        if not rows_of(k, v, r, tf, td, state) or tf.ndim != 2:
            return None
        n_head, hs = tf.shape
        k, v, r, td = (a.reshape(-1, n_head, hs) for a in (k, v, r, td))
        n_seqs = state.shape[0]
        out, y, st = _result_with_states(tape, (k.shape[0] + hs * n_seqs, n_head * hs), k.shape,
                                         (n_seqs * n_head, hs, hs))
        args = (k, v, r, tf, td, state.reshape(n_seqs, n_head, hs, hs), y, st.reshape(n_seqs, n_head, hs, hs))
        return out if tape.record(T.WKV6, wkv6_kernel(), args) else None


@kernel("gated_linear_attn")
def _gated_linear_attn(n: Node, memo: threading.local, path: IsaPath) -> Step:
    scale = n.attrs["scale"]
    return Function(lambda env, k, v, q, g, state: gated_linear_attn(k, v, q, g, state, scale))


@kernel("rwkv_wkv7")
def _rwkv_wkv7(n: Node, memo: threading.local, path: IsaPath) -> Step:
    hadd = path.reduce == REDUCE_HADD
    return Function(lambda env, r, w, k, v, a, b, s: rwkv_wkv7(r, w, k, v, a, b, s, path.lanes, hadd))


@kernel("gated_delta_net")
def _gated_delta_net(n: Node, memo: threading.local, path: IsaPath) -> Step:
    hadd = path.reduce == REDUCE_HADD
    return Function(lambda env, q, k, v, g, beta, s: gated_delta_net(q, k, v, g, beta, s, path.lanes, hadd))
