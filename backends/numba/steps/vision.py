"""A vision or audio tower's steps (llama.cpp's tools/mtmd clip graphs): im2col, the windows a convolution's kernel
meets as rows (a patch embedding is ggml_conv_2d, an audio tower's front end ggml_conv_1d: im2col, then mul_mat by
the kernel), pool_2d and interpolate (learned positions resized to a picture's patches). The first two in numpy,
which gives ggml's bits: im2col only moves values (rounding them to f16 as F16C does, for an f16 kernel), pool_2d takes
a window's values in ggml's order, each step one float32 operation over every window at once; interpolate (a loop
numba compiles, for its fused multiply-adds) weighs its four values as ggml's compiled code does."""

from __future__ import annotations

import threading

import numpy as np
from numba import njit

from graphir.backends.numba.primitives.bits import fma
from graphir.backends.numba.primitives.isa import IsaPath
from graphir.backends.numba.primitives.jit import SER
from graphir.backends.numba.steps.base import F32, Env, Function, Step, kernel
from graphir.graph.ir import Node

_FLT_MAX = np.finfo(F32).max
_ONE = F32(1)


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


def _bilinear_taps(n_out: int, n_in: int, align_corners: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml's source position of each output along an axis, in float32: (i + o) / scale - o, the offset o 0 and
    the scale (out - 1) / (in - 1) with the corners aligned (where both exceed 1), else 1/2 and out / in; the
    inputs either side of it clamped into the axis and its distance past the first, clamped into [0, 1]."""
    scale = F32(n_out) / F32(n_in)
    if align_corners and n_out > 1 and n_in > 1:
        scale = F32(n_out - 1) / F32(n_in - 1)
    o = F32(0) if align_corners else F32(0.5)
    at = (np.arange(n_out, dtype=F32) + o) / scale - o
    lo = np.clip(np.floor(at).astype(np.int64), 0, n_in - 1)
    return lo, np.clip(lo + 1, 0, n_in - 1), np.clip(at - lo.astype(F32), F32(0), F32(1))


@njit(**SER)
def _bilinear(p, x0, x1, dx, y0, y1, dy, out):
    """Each plane of p (planes, H, W) into out (planes, h, w): a (1 - dx)(1 - dy) + b dx (1 - dy) + c (1 - dx) dy
    + d dx dy as ggml's build contracts it: the first product's last multiplication fused with the second product
    added, then each further product's last multiplication fused in turn (one rounding each)."""
    for plane in range(p.shape[0]):
        for i in range(out.shape[1]):
            ey = _ONE - dy[i]
            for j in range(out.shape[2]):
                ex = _ONE - dx[j]
                a, b = p[plane, y0[i], x0[j]], p[plane, y0[i], x1[j]]
                c, d = p[plane, y1[i], x0[j]], p[plane, y1[i], x1[j]]
                v = fma(a * ex, ey, b * dx[j] * ey)
                v = fma(c * ex, dy[i], v)
                out[plane, i, j] = fma(d * dx[j], dy[i], v)


@kernel("interpolate")
def _interpolate(n: Node, memo: threading.local, path: IsaPath) -> Step:
    """ggml_compute_forward_upscale_f32, bilinear, every plane at once (_bilinear)."""
    a, (W, H), rank = n.attrs, (tuple(n.inputs[0].shape) + (1,))[:2], len(n.shape)
    x0, x1, dx = _bilinear_taps(a["w"], W, a["align_corners"])
    y0, y1, dy = _bilinear_taps(a["h"], H, a["align_corners"])

    def interpolate(env: Env, x: np.ndarray) -> np.ndarray:
        p = _planes(x).astype(F32, copy=False)
        planes = np.ascontiguousarray(p.reshape((-1,) + p.shape[2:]))
        out = np.empty((planes.shape[0], a["h"], a["w"]), F32)
        _bilinear(planes, x0, x1, dx, y0, y1, dy, out)
        out = out.reshape(p.shape[:2] + out.shape[1:])
        return out.reshape(out.shape[4 - rank:])

    return Function(interpolate)
