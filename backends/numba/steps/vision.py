"""A vision or audio tower's steps (llama.cpp's tools/mtmd clip graphs): im2col, the windows a convolution's kernel
meets as rows (a patch embedding is ggml_conv_2d, an audio tower's front end ggml_conv_1d: im2col, then mul_mat by
the kernel), and pool_2d. Both in numpy, which
gives ggml's bits: im2col only moves values (rounding them to f16 as F16C does, for an f16 kernel), pool_2d takes
a window's values in ggml's order, each step one float32 operation over every window at once."""

from __future__ import annotations

import threading

import numpy as np

from graphir.backends.numba.primitives.isa import IsaPath
from graphir.backends.numba.steps.base import F32, Env, Function, Step, kernel
from graphir.graph.ir import Node

_FLT_MAX = np.finfo(F32).max


def _taps(n_out: int, k: int, s: int, p: int, d: int, n_in: int) -> tuple[np.ndarray, np.ndarray]:
    """Along an axis of n_in values, where tap j of output position o falls (o s + j d - p), clipped into the axis,
    and whether it falls inside it rather than into the padding: both (n_out, k)."""
    at = np.arange(n_out)[:, None] * s + np.arange(k) * d - p
    return np.clip(at, 0, n_in - 1), (at >= 0) & (at < n_in)


def _planes(x: np.ndarray) -> np.ndarray:
    """x as (N, C, H, W): ggml's [W, H, C, N]."""
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


@kernel("im2col")
def _im2col(n: Node, memo: threading.local, path: IsaPath) -> Step:
    """ggml_compute_forward_im2col_f32 / _f16: each output position's window, channel by channel, each channel's
    kh x kw values row by row; 0 where the window reaches into the padding. The 1-D form (kh 0) is ggml's: its
    [L, C, N] read as one row of height 1 per channel, by a kernel of one row."""
    a, one_d = n.attrs, n.attrs["kh"] == 0
    W, H = (n.inputs[0].shape[0], 1) if one_d else (tuple(n.inputs[0].shape) + (1,))[:2]
    kh, s1, p1, d1 = (1, 1, 0, 1) if one_d else (a["kh"], a["s1"], a["p1"], a["d1"])
    OW, OH, rank = n.shape[1], 1 if one_d else n.shape[2], len(n.shape)
    rows, in_h = _taps(OH, kh, s1, p1, d1, H)
    cols, in_w = _taps(OW, a["kw"], a["s0"], a["p0"], a["d0"], W)
    at = rows[:, None, :, None], cols[None, :, None, :]               # (OH, OW, kh, kw) by broadcasting
    inside = in_h[:, None, :, None] & in_w[None, :, None, :]
    to = np.float16 if a["type"] == "f16" else F32

    def im2col(env: Env, x: np.ndarray) -> np.ndarray:
        planes = _planes(x[..., None, :] if one_d else x)
        windows = np.where(inside, planes[:, :, at[0], at[1]], 0)     # (N, C, OH, OW, kh, kw)
        out = np.ascontiguousarray(windows.transpose(0, 2, 3, 1, 4, 5), dtype=to)
        lead = out.shape[:1] + out.shape[2:3] if one_d else out.shape[:3]  # (N, OW) or (N, OH, OW)
        return out.reshape(lead[len(lead) + 1 - rank:] + (-1,))

    return Function(im2col)


@kernel("pool_2d")
def _pool_2d(n: Node, memo: threading.local, path: IsaPath) -> Step:
    """ggml_compute_forward_pool_2d: each window from 0 (avg) or -FLT_MAX (max) through its values inside a, kernel
    row by kernel row, column by column: avg adds each (then divides by k0 k1: the padding counts), max keeps the
    value unless it is below (std::max(x, res))."""
    a, (W, H) = n.attrs, (tuple(n.inputs[0].shape) + (1,))[:2]
    OW, OH = (tuple(n.shape) + (1,))[:2]
    k0, k1, rank = a["k0"], a["k1"], len(n.shape)
    rows, in_h = _taps(OH, k1, a["s1"], a["p1"], 1, H)
    cols, in_w = _taps(OW, k0, a["s0"], a["p0"], 1, W)
    avg = a["pool"] == "avg"

    def pool(env: Env, x: np.ndarray) -> np.ndarray:
        x4 = _planes(x).astype(F32, copy=False)
        res = np.full(x4.shape[:2] + (OH, OW), 0 if avg else -_FLT_MAX, F32)
        for ky in range(k1):
            for kx in range(k0):
                v, inside = x4[:, :, rows[:, ky, None], cols[None, :, kx]], in_h[:, ky, None] & in_w[None, :, kx]
                res = np.where(inside, res + v, res) if avg else np.where(inside & ~(v < res), v, res)
        if avg:
            res = np.divide(res, F32(k0 * k1), dtype=F32)
        return res.reshape(res.shape[4 - rank:])

    return Function(pool)
