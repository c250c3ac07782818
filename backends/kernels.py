"""Activation kernels of the IR's ops, written to reproduce ggml's CPU arithmetic (llama.cpp's oracle).

Arrays are in numpy order (the reverse of the IR's ggml order): a ggml ``[576, n_tokens]`` value is a
numpy ``(n_tokens, 576)`` array. Where ggml sums in double or builds RoPE angles by repeated float32
multiplication, so do these kernels: the reference is llama.cpp's ggml-cpu ops.
"""

from __future__ import annotations

import math

import numpy as np

F32 = np.float32


def mul_mat(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Activation x activation (attention): out[b, n, m] = sum_k w[b', m, k] x[b, n, k], with ggml's broadcast
    b' = b // (B/A) per batch dim (query head h reads kv head h // (n_head / n_head_kv))."""
    if w.dtype == np.float16:  # NOTE: ggml rounds the other operand to f16 before an f16 dot product
        x = x.astype(np.float16)
    x = x.astype(F32, copy=False)
    r = max(w.ndim, x.ndim, 2)
    w4 = w.reshape((1,) * (4 - w.ndim) + w.shape).astype(F32, copy=False)
    x4 = x.reshape((1,) * (4 - x.ndim) + x.shape)
    for axis in (0, 1):
        if w4.shape[axis] != x4.shape[axis]:
            w4 = np.repeat(w4, x4.shape[axis] // w4.shape[axis], axis=axis)
    out = np.matmul(x4, np.swapaxes(w4, -1, -2))
    return out.reshape(out.shape[4 - r:])


def rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    # NOTE: ggml squares in float32 and sums the squares in double; squaring in double differs by an ulp
    x = x.astype(F32, copy=False)
    mean = ((x * x).sum(axis=-1, dtype=np.float64) / x.shape[-1]).astype(F32)
    return x * (F32(1) / np.sqrt(mean + F32(eps)))[..., None]


def norm(x: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(F32, copy=False)
    mean = x.mean(axis=-1, dtype=np.float64, keepdims=True).astype(F32)
    d = x - mean
    var = (np.einsum("...i,...i->...", d, d, dtype=np.float64) / x.shape[-1]).astype(F32)
    return d * (F32(1) / np.sqrt(var + F32(eps)))[..., None]


def _fma(a: np.ndarray, b: np.ndarray | float, c: np.ndarray | float) -> np.ndarray:
    """float32 fused multiply-add: the product is exact in float64, then one rounding (to f32, via f64)."""
    return (np.asarray(a, np.float64) * b + c).astype(F32)


_E = [F32(float.fromhex(h)) for h in ("0x1.8p23", "0x1.715476p+0", "0x1.7f7d1cp-20", "0x1.62e4p-1", "0x1.0e4020p-7",
                                       "0x1.573e2ep-5", "0x1.555e66p-3", "0x1.fffdb6p-2", "0x1.ffffecp-1")]


def _expf_vec(x: np.ndarray) -> np.ndarray:
    """ggml's vectorised expf (AVX-512 ggml_v_expf): a degree-5 polynomial on a 2^n range reduction.

    NOTE: it is not libm's expf (up to ~1.5 ulp apart); llama.cpp's SiLU and softmax use it, and a one-ulp
    difference there can flip an 8-bit activation quantum downstream, so it is reproduced op for op.
    """
    r, log2e, ln2_lo, ln2_hi, c5, c4, c3, c2, c1 = _E
    with np.errstate(over="ignore", invalid="ignore"):  # -inf (masked) and huge inputs are fixed up below
        z = _fma(x, log2e, r)
        n = z - r
        b = _fma(-n, ln2_lo, _fma(-n, ln2_hi, x))
        u = b * b
        j = _fma(_fma(_fma(c5, b, c4), u, _fma(c3, b, c2)), u, _fma(c1, b, F32(1)))
        big = ~(np.abs(n) <= 192)
        out = np.ldexp(j, np.where(big, 0, n).astype(np.int32)).astype(F32)
    if big.any():
        out[big] = np.where(x[big] > 0, F32(np.inf), F32(0))
    return out


def expf(x: np.ndarray) -> np.ndarray:
    """exp along the last axis as ggml's row loops compute it: SIMD blocks of 16, libm for the tail."""
    head = x.shape[-1] // 16 * 16
    out = np.empty_like(x)
    out[..., :head] = _expf_vec(x[..., :head])
    out[..., head:] = np.exp(x[..., head:].astype(np.float64)).astype(F32)
    return out


def silu(x: np.ndarray) -> np.ndarray:
    return x / (F32(1) + expf(-x))


def gelu(x: np.ndarray) -> np.ndarray:
    c = F32(math.sqrt(2 / math.pi))
    return F32(0.5) * x * (F32(1) + np.tanh(c * x * (F32(1) + F32(0.044715) * x * x)))


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, F32(0))


def soft_max(x: np.ndarray, mask: np.ndarray | None, scale: float, max_bias: float) -> np.ndarray:
    """softmax over the last numpy axis of x*scale + mask (mask broadcast over heads)."""
    if max_bias:
        raise NotImplementedError("ALiBi (max_bias != 0) is not implemented")
    w = x * F32(scale)
    if mask is not None:
        w = w + mask
    w = expf(w - w.max(axis=-1, keepdims=True))
    return w * (1.0 / w.sum(axis=-1, dtype=np.float64, keepdims=True)).astype(F32)


def _yarn_corr_dims(n_dims: int, n_ctx_orig: int, base: float, beta_fast: float, beta_slow: float) -> tuple[float, float]:
    def corr(n_rot: float) -> float:
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    return max(0.0, math.floor(corr(beta_fast))), min(n_dims - 1.0, math.ceil(corr(beta_slow)))


def rope_cos_sin(pos: np.ndarray, n_dims: int, freq_factors: np.ndarray | None, a: dict) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [n_tokens, n_dims/2] as ggml's rope cache builds them (angle *= theta_scale per pair)."""
    half = n_dims // 2
    theta_scale = F32(a["freq_base"]) ** F32(-2.0 / n_dims)
    steps = np.empty((len(pos), half), dtype=F32)
    steps[:, 0] = pos.astype(F32)
    steps[:, 1:] = theta_scale
    theta_extrap = np.cumprod(steps, axis=1, dtype=F32)
    if freq_factors is not None:
        theta_extrap = theta_extrap / freq_factors.astype(F32)
    freq_scale, ext = F32(a["freq_scale"]), F32(a["ext_factor"])
    theta = freq_scale * theta_extrap
    mscale = F32(a["attn_factor"])
    if ext != 0:
        lo, hi = _yarn_corr_dims(n_dims, a["n_ctx_orig"], a["freq_base"], a["beta_fast"], a["beta_slow"])
        y = (np.arange(half, dtype=F32) - F32(lo)) / F32(max(0.001, hi - lo))
        mix = (F32(1) - np.clip(y, 0, 1)) * ext
        theta = theta * (F32(1) - mix) + theta_extrap * mix
        mscale = mscale * F32(1 + 0.1 * math.log(1 / float(freq_scale)))
    return np.cos(theta) * mscale, np.sin(theta) * mscale


def rope(x: np.ndarray, pos: np.ndarray, freq_factors: np.ndarray | None, a: dict) -> np.ndarray:
    """x (n_tokens, n_heads, head_dim): rotate the first n_dims channels; 'norm' pairs adjacent, 'neox' halves."""
    return rope_apply(x, rope_cos_sin(pos, a["n_dims"], freq_factors, a), a)


def rope_apply(x: np.ndarray, cos_sin: tuple[np.ndarray, np.ndarray], a: dict) -> np.ndarray:
    n_dims = a["n_dims"]
    cos, sin = cos_sin[0][:, None, :], cos_sin[1][:, None, :]
    out = x.copy()
    if a["mode"] == "neox":
        x0, x1 = x[..., : n_dims // 2], x[..., n_dims // 2: n_dims]
        out[..., : n_dims // 2] = x0 * cos - x1 * sin
        out[..., n_dims // 2: n_dims] = x0 * sin + x1 * cos
    elif a["mode"] == "norm":
        x0, x1 = x[..., 0:n_dims:2], x[..., 1:n_dims:2]
        out[..., 0:n_dims:2] = x0 * cos - x1 * sin
        out[..., 1:n_dims:2] = x0 * sin + x1 * cos
    else:
        raise NotImplementedError(f"rope mode {a['mode']!r}")
    return out
