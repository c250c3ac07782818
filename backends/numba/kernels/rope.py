"""RoPE: the cos/sin cache as ggml_rope_cache_init (and, for text positions, ggml_mrope_cache_init) builds it
(glibc's cosf/sinf, YaRN), and the rotation.

cos/sin come from glibc's cosf/sinf (numba's math.cos on float32; numpy's float32 cos differs in ~15% of
angles), the angles by repeated float32 multiplication; the rotation as GCC vectorized it (see _rope_row).
The cache is built once per position vector and run (the executor keeps it in the run's memo).
"""

from __future__ import annotations

import math
from typing import Callable

import numba
import numpy as np
from numba import njit, prange

from graphir.backends.numba.primitives.jit import INL, PAR_MIN, SER, parallel_and_serial
from graphir.backends.numba.primitives.bits import fma
from graphir.backends.numba.primitives.libm import libm

F32 = np.float32
_ONE, _ZERO = F32(1.0), F32(0.0)



@njit(**SER)
def _fma32(a, b, c):
    """float32 a * b + c rounded once, for scalars from Python."""
    return fma(F32(a), F32(b), F32(c))


def _yarn_corr_dims(n_dims: int, n_ctx_orig: int, base: float, beta_fast: float, beta_slow: float) -> tuple[float, float]:
    def corr(n_rot: float) -> float:
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    return max(0.0, math.floor(corr(beta_fast))), min(n_dims - 1.0, math.ceil(corr(beta_slow)))


@njit(**SER)
def _rope_cache(pos, half, theta_scale, ff, freq_scale, ext, lo, hi, mscale, cos, sin):
    """ggml_rope_cache_init + rope_yarn: theta = p, then theta *= theta_scale per pair; yarn mixing as compiled
    (theta = fma(theta_interp, 1 - mix, theta_extrap * mix)); cos/sin from libm's cosf/sinf."""
    for r in range(pos.shape[0]):
        theta = F32(pos[r])
        for i in range(half):
            te = theta / ff[i]
            ti = freq_scale * te
            th = ti
            if ext != _ZERO:
                y = (F32(i) - lo) / max(F32(0.001), hi - lo)
                mix = (_ONE - min(_ONE, max(_ZERO, y))) * ext
                th = fma(ti, _ONE - mix, te * mix)
            cos[r, i] = math.cos(th) * mscale
            sin[r, i] = math.sin(th) * mscale
            theta = theta * theta_scale


def rope_cos_sin(pos: np.ndarray, n_dims: int, freq_factors: np.ndarray | None, a: dict,
                 pairs: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [n_tokens, n_dims/2] as ggml's rope cache builds them (angle *= theta_scale per pair); ``pairs``
    columns instead where the cache runs past n_dims/2 (vision RoPE's, over the whole head)."""
    half = pairs or n_dims // 2
    theta_scale = F32(libm.powf(F32(a["freq_base"]), F32(-2.0) / F32(n_dims)))
    ff = np.ones(half, F32) if freq_factors is None else np.ascontiguousarray(freq_factors, dtype=F32)[:half]
    freq_scale, ext = F32(a["freq_scale"]), F32(a["ext_factor"])
    mscale = F32(a["attn_factor"])
    lo = hi = 0.0
    if ext != 0:
        lo, hi = _yarn_corr_dims(n_dims, a["n_ctx_orig"], a["freq_base"], a["beta_fast"], a["beta_slow"])
        mscale = mscale * _fma32(F32(0.1), F32(libm.logf(F32(1) / freq_scale)), F32(1))
    cos, sin = np.empty((len(pos), half), F32), np.empty((len(pos), half), F32)
    _rope_cache(np.asarray(pos, np.int64), half, theta_scale, ff, freq_scale, ext, F32(lo), F32(hi), mscale, cos, sin)
    if numba.config.USING_SVML:     # numba may vectorize math.cos with SVML, which is not glibc's cosf
        cos, sin = _rope_cos_sin_libm(np.asarray(pos, np.int64), half, theta_scale, ff, freq_scale, ext, F32(lo),
                                      F32(hi), mscale)
    return cos, sin


def multi_cos_sin(pos: np.ndarray, n_dims: int, sections: tuple[int, ...], a: dict) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin of ggml_mrope_cache_init: ``pos`` holds each token's time, height, width and extra positions,
    section-major; every section's angles run through the same multiplications as plain RoPE's, and pair i takes
    those of the section its sector falls in (mode imrope: time, height and width by turns while each lasts, then
    the extra one; mrope: the sections one after the other; vision: one after the other over n_dims pairs, the
    whole head, each section's angles multiplied from its own start, as ggml resets them there)."""
    per_section = np.asarray(pos).reshape(4, -1)
    vision = a["mode"] == "vision"
    pairs = n_dims if vision else n_dims // 2
    rows = [rope_cos_sin(p, n_dims, None, a, pairs) for p in per_section]
    cos, sin = rows[3][0].copy(), rows[3][1].copy()
    starts = np.cumsum((0, *sections[:3]))
    for i in range(pairs):
        section = multi_section(i, sections, a["mode"] == "imrope")
        col = i % sum(sections) - starts[section] if vision else i
        cos[:, i], sin[:, i] = rows[section][0][:, col], rows[section][1][:, col]
    return cos, sin


def multi_section(i: int, sections: tuple[int, ...], interleaved: bool) -> int:
    """The section (0 time, 1 height, 2 width, 3 extra) whose positions turn pair i, as ggml_mrope_cache_init."""
    t, h, w = sections[:3]
    sector = i % sum(sections)
    if interleaved:
        r = sector % 3
        return 1 if r == 1 and sector < 3 * h else 2 if r == 2 and sector < 3 * w else 0 if r == 0 and sector < 3 * t \
            else 3
    return 0 if sector < t else 1 if sector < t + h else 2 if sector < t + h + w else 3


def _rope_cos_sin_libm(pos, half, theta_scale, ff, freq_scale, ext, lo, hi, mscale):
    """_rope_cache in Python with ctypes' cosf/sinf (only when numba uses SVML for math.cos)."""
    cos, sin = np.empty((len(pos), half), F32), np.empty((len(pos), half), F32)
    for r, p in enumerate(pos):
        theta = F32(p)
        for i in range(half):
            te = F32(theta / ff[i])
            th = ti = F32(freq_scale * te)
            if ext != 0:
                y = F32(F32(F32(i) - lo) / max(F32(0.001), F32(hi - lo)))
                mix = F32((F32(1) - min(F32(1), max(F32(0), y))) * ext)
                th = _fma32(ti, F32(1) - mix, F32(te * mix))
            cos[r, i] = F32(libm.cosf(th)) * mscale
            sin[r, i] = F32(libm.sinf(th)) * mscale
            theta = F32(theta * theta_scale)
    return cos, sin


@njit(**INL)
def _rope_row(x, cos, sin, n_dims, neox, n_fused, out):
    """rotate_pairs as GCC compiled it: dst0 = fma(x0, cos, -(x1*sin)), dst1 = fma(x0, sin, x1*cos), the named
    products rounded first. 'neox' (scalar loop): every pair. 'norm' (vectorized): the pairs of the zmm/ymm
    loops, 4 pairs a vector (n_fused); the last pairs%4 go through an addsubps tail without FMA."""
    half = n_dims // 2
    for i in range(x.shape[0]):
        out[i] = x[i]
    for i in range(half):
        if neox:
            i0, i1 = i, i + half
        else:
            i0, i1 = 2 * i, 2 * i + 1
        x0, x1, c, s = x[i0], x[i1], cos[i], sin[i]
        if i < n_fused:
            out[i0] = fma(x0, c, -(x1 * s))
            out[i1] = fma(x0, s, x1 * c)
        else:
            out[i0] = x0 * c - x1 * s
            out[i1] = x0 * s + x1 * c


def _rope_rows(x, cos, sin, n_tok, n_head, n_dims, neox, n_fused, out):
    """Rows of x (lead * n_tok * n_head, head_dim) in that order: row r is token (r // n_head) % n_tok."""
    for r in prange(x.shape[0]):
        t = r // n_head % n_tok
        _rope_row(x[r], cos[t], sin[t], n_dims, neox, n_fused, out[r])


_rope_par, _rope_ser = parallel_and_serial(_rope_rows)


def rope_apply(x: np.ndarray, cos_sin: tuple[np.ndarray, np.ndarray], a: dict) -> np.ndarray:
    return roping(a, x.shape)(x, cos_sin)


def roping(a: dict, shape: tuple[int, ...]) -> Callable[[np.ndarray, tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """rope_apply for x of this shape (..., n_tokens, n_heads, head_dim) as a function of x and cos_sin: the mode's
    loop and the variant chosen once, for a caller that rotates values of one shape run after run."""
    kernel, nh, n_dims, neox, n_fused = rope_kernel(a, shape)

    def run(x: np.ndarray, cos_sin: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        cos, sin = cos_sin
        rows = np.ascontiguousarray(x, dtype=F32).reshape(-1, x.shape[-1])
        out = np.empty_like(rows)
        kernel(rows, cos, sin, cos.shape[0], nh, n_dims, neox, n_fused, out)
        return out.reshape(x.shape)

    return run


def rope_kernel(a: dict, shape: tuple[int, ...]) -> tuple[Callable, int, int, bool, int]:
    """The rotation's kernel for x of this shape, (rows, cos, sin, n_tokens, n_heads, n_dims, neox, n_fused, out),
    and its constant arguments n_heads, n_dims, neox and n_fused."""
    n_dims, mode = a["n_dims"], a["mode"]
    if mode not in ("norm", "neox", "imrope", "mrope", "vision"):
        raise NotImplementedError(f"rope mode {mode!r}")
    if mode == "vision":                     # the whole head in pairs n_dims apart: NeoX's loop over 2 n_dims
        n_dims = 2 * n_dims
    half = n_dims // 2
    if mode != "norm":                       # neox and the M-RoPEs rotate the same pairs, through the same loop
        n_fused = half                       # scalar loop, contracted
    else:
        n_fused = half - half % 4            # zmm/ymm loop: 4 pairs a vector; the tail pairs: addsubps, no FMA
    nh = shape[-2] if len(shape) >= 3 else 1
    kernel = _rope_par if math.prod(shape) >= PAR_MIN else _rope_ser
    return kernel, nh, n_dims, mode != "norm", n_fused
