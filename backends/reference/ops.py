"""What every op of the catalogue computes, in numpy, written to be read: the reference backend runs these, and
tests/test_backend_ops.py holds the numba kernels to them op by op.

Each function takes the operands (numpy order, the reverse of ggml's; float operands as float64 but where an op
reads its operand 0 as it is stored: a weight's rows, a buffer written in place), the node's attributes, the
value's numpy shape and the dims' values, and returns the value. Most work in ggml's 4-D order through ``gg``
and ``back``, as ggml's definitions are written (index [i0, i1, i2, i3], ne0 first).
"""

from __future__ import annotations

import math
from typing import Callable, Mapping

import numpy as np

from graphir.graph.dims import Sym

Env = Mapping[str, int]


def gg(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.T.reshape(a.T.shape + (1,) * (4 - a.ndim))


def back(A: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return A.T.reshape(shape)


def get_rows(v: list[np.ndarray], a: dict, shape: tuple[int, ...], env: Env) -> np.ndarray:
    A, ids = gg(v[0]), v[1]
    out = np.empty((A.shape[0], len(ids), 1, 1))
    for i, r in enumerate(ids):
        out[:, i, 0, 0] = A[:, r, 0, 0]
    return back(out, shape)


def mul_mat(v: list[np.ndarray], a: dict, shape: tuple[int, ...], env: Env) -> np.ndarray:
    Wg, Xg = gg(v[0]), gg(v[1])
    K, M, A2, A3 = Wg.shape
    _, N, B2, B3 = Xg.shape
    out = np.zeros((M, N, B2, B3))
    for i3 in range(B3):
        for i2 in range(B2):  # x slice i2 reads w slice i2 // (B2 / A2): consecutive q heads share a kv head
            w = Wg[:, :, i2 // (B2 // A2), i3 // (B3 // A3)]
            out[:, :, i2, i3] = w.T @ Xg[:, :, i2, i3]
    return back(out, shape)


def _repeat_b(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    return B[np.ix_(*[np.arange(n) % m for n, m in zip(A.shape, B.shape)])]


def add(v, a, shape, env):
    A, B = gg(v[0]), gg(v[1])
    return back(A + _repeat_b(A, B), shape)


def mul(v, a, shape, env):
    A, B = gg(v[0]), gg(v[1])
    return back(A * _repeat_b(A, B), shape)


def get_rows_batched(v, a, shape, env):
    A, ids = gg(v[0]), gg(v[1])                       # [ne0, rows, B, C], [n, B, C]
    out = np.empty((A.shape[0], ids.shape[0], ids.shape[1], ids.shape[2]))
    for c in range(ids.shape[2]):
        for b in range(ids.shape[1]):
            for i in range(ids.shape[0]):
                out[:, i, b, c] = A[:, ids[i, b, c, 0], b, c]
    return back(out, shape)


def repeat(v, a, shape, env):
    A = gg(v[0])
    ne = gg(np.empty(shape)).shape
    return back(np.tile(A, tuple(n // m for n, m in zip(ne, A.shape))), shape)


def mul_mat_id(v, a, shape, env):
    Wg, Xg, ids = gg(v[0]), gg(v[1]), gg(v[2])     # [K, M, E], [K, ne1, T], [n_used, T]
    out = np.empty((Wg.shape[1], ids.shape[0], ids.shape[1], 1))
    for t in range(ids.shape[1]):
        for i in range(ids.shape[0]):
            out[:, i, t, 0] = Wg[:, :, ids[i, t, 0, 0], 0].T @ Xg[:, i % Xg.shape[1], t, 0]
    return back(out, shape)


def argsort_top_k(v, a, shape, env):
    rows = v[0].reshape(-1, v[0].shape[-1])
    top = [sorted(range(len(r)), key=lambda j: -r[j])[: shape[-1]] for r in rows]
    return np.array(top).reshape(shape)


def sub(v, a, shape, env):
    A, B = gg(v[0]), gg(v[1])
    return back(A - _repeat_b(A, B), shape)


def rms_norm(v, a, shape, env):
    x = v[0]
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + a["eps"])


def norm(v, a, shape, env):
    x = v[0]
    d = x - x.mean(axis=-1, keepdims=True)
    return d / np.sqrt((d * d).mean(axis=-1, keepdims=True) + a["eps"])


def l2_norm(v, a, shape, env):
    x = v[0]
    return x / np.maximum(np.sqrt((x * x).sum(axis=-1, keepdims=True)), a["eps"])


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _gelu(x):
    """GELU as llama.cpp's CPU computes it (GGML_GELU_FP16): the tanh formula read from a table of halves, so x is
    rounded to f16 and its GELU to f16; 0 from x <= -10 on down, x itself from 10 on."""
    h = np.asarray(x, np.float32).astype(np.float16).astype(np.float64)
    g = (0.5 * h * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h ** 3)))).astype(np.float16)
    return np.where(x <= -10, 0.0, np.where(x >= 10, x, g.astype(np.float64)))


_GELU_QUICK_COEF = float(np.float32(1.702))   # ggml's, a float: 1.702 itself moves one half's entry (x = -6.227)


def _gelu_quick(x):
    """GELU-quick as llama.cpp's CPU computes it (GGML_GELU_QUICK_FP16): x sigmoid(1.702 x) read from a table of
    halves over the whole range (no cut-offs), so x is rounded to f16 and its value to f16."""
    # an x past the halves rounds to inf, e^(1.702 |h|) of the largest halves overflows, -inf's entry is -inf * 0: nan
    with np.errstate(over="ignore", invalid="ignore"):
        h = np.asarray(x, np.float32).astype(np.float16).astype(np.float64)
        return (h * (1.0 / (1.0 + np.exp(-_GELU_QUICK_COEF * h)))).astype(np.float16).astype(np.float64)


def ssm_conv(v, a, shape, env):
    X, Wc = gg(v[0]), gg(v[1])       # [d_conv-1+T, Di, S], [d_conv, Di]
    d_conv, n_tok = Wc.shape[0], X.shape[0] - Wc.shape[0] + 1
    out = np.zeros((X.shape[1], n_tok, X.shape[2], 1))
    for t in range(n_tok):
        for j in range(d_conv):
            out[:, t, :, 0] += X[t + j, :, :, 0] * Wc[j, :, 0, 0][:, None]
    return back(out, shape)


def ssm_scan(v, a, shape, env):
    """Mamba-1: per sequence and channel, state = state * exp(d * A) + B * (x * d), y = state . C, d = softplus(dt)."""
    s, x, dt, A, B, Cm = (gg(t)[..., 0] for t in v)        # [Ds, Di, S], [Di, T, S] x2, [Ds, Di, 1], [Ds, T, S] x2
    state = s.copy()
    d = np.where(dt > 20, dt, np.log1p(np.exp(np.minimum(dt, 20))))
    y = np.empty(x.shape)
    for t in range(x.shape[1]):
        state = state * np.exp(d[None, :, t, :] * A) + B[:, None, t, :] * (x[:, t, :] * d[:, t, :])[None]
        y[:, t, :] = (state * Cm[:, None, t, :]).sum(axis=0)
    return np.concatenate([y.T.ravel(), state.T.ravel()]).reshape(shape)   # numpy order: y (S, T, Di), states


def ssm_scan_heads(v, a, shape, env):
    """Mamba-2: per sequence, head h (of group h // (H/G)) and channel: state = state * exp(d * A[h]) + B * (x * d),
    y = state . C, d = softplus(dt)."""
    s, x, B, Cm = (gg(v[i]) for i in (0, 1, 4, 5))          # [Ds, P, H, S], [P, H, T, S], [Ds, G, T, S] x2
    dt, A = gg(v[2])[..., 0], gg(v[3])[0, :, 0, 0]          # [H, T, S], [H]
    n_head, n_group = s.shape[2], B.shape[1]
    grp = np.arange(n_head) // (n_head // n_group)
    d = np.where(dt > 20, dt, np.log1p(np.exp(np.minimum(dt, 20))))
    state, y = s.copy(), np.empty(x.shape)
    for t in range(x.shape[2]):
        xd = x[:, :, t, :] * d[None, :, t, :]                  # [P, H, S]
        state = state * np.exp(d[:, t, :] * A[:, None])[None, None] + B[:, grp, t, :][:, None] * xd[None]
        y[:, :, t, :] = (state * Cm[:, grp, t, :][:, None]).sum(axis=0)
    return np.concatenate([y.T.ravel(), state.T.ravel()]).reshape(shape)   # numpy order: y (S, T, H, P), states


def rope_multi(v, a, shape, env):
    """Pair i lies in sector i % sum(sections); imrope: sectors cycle time, height, width (each while its section
    lasts), the rest are the extra section; mrope: the sections follow one another; each section turns by its own
    positions (p: times, heights, widths, extras); vision: n_dims pairs (i, i + n_dims) over the whole head, the
    sections one after the other, each section's frequencies counted from its own first pair."""
    X = gg(v[0])
    p = np.asarray(v[1], np.float64).reshape(4, -1)
    t, h, w, _ = a["sections"]
    out = X.copy()
    n_dims, base, vision = a["n_dims"], a["freq_base"], a["mode"] == "vision"
    half = n_dims if vision else n_dims // 2
    starts = (0, t, t + h, t + h + w)
    for i in range(half):
        sector = i % sum(a["sections"])
        if a["mode"] == "imrope":
            section = 1 if sector % 3 == 1 and sector < 3 * h else 2 if sector % 3 == 2 and sector < 3 * w else \
                0 if sector % 3 == 0 and sector < 3 * t else 3
        else:
            section = 0 if sector < t else 1 if sector < t + h else 2 if sector < t + h + w else 3
        k = sector - starts[section] if vision else i
        for j in range(X.shape[2]):
            theta = p[section, j] * base ** (-2.0 * k / n_dims)
            c, s = math.cos(theta) * a["attn_factor"], math.sin(theta) * a["attn_factor"]
            xa, xb = X[i, :, j, :], X[i + half, :, j, :]
            out[i, :, j, :] = xa * c - xb * s
            out[i + half, :, j, :] = xa * s + xb * c
    return back(out, shape)


def gated_delta_net(v, a, shape, env):
    """Per sequence and value head h (key head h % Hk), with S[i, j] (key i, value j) = s[i, j]: S[i, :] *= exp(g)
    (g one decay per head, or one per key channel i: Kimi's delta rule); S += k (beta (v - S^T k))^T;
    y = S^T q / sqrt(d)."""
    q, k, vv, g, beta, s = (gg(t) for t in v)    # [d, Hk, T, S] x2, [d, H, T, S], [1 or d, H, T, S], [1, H, T, S],
    #                                              [d, d, H, S]
    d, n_head, n_tok, n_seqs = vv.shape
    n_khead = q.shape[1]
    y, st = np.empty(vv.shape), s.copy()
    for sq in range(n_seqs):
        for hh in range(n_head):
            S, hk = st[:, :, hh, sq], hh % n_khead
            for t in range(n_tok):
                S *= np.array([math.exp(x) for x in g[:, hh, t, sq]])[:, None]
                kt, qt = k[:, hk, t, sq], q[:, hk, t, sq]
                S += np.outer(kt, beta[0, hh, t, sq] * (vv[:, hh, t, sq] - S.T @ kt))
                y[:, hh, t, sq] = S.T @ qt / math.sqrt(d)
    return np.concatenate([y.T.ravel(), st.T.ravel()]).reshape(shape)   # numpy order: y (S, T, H, d), states


def lightning_indexer(v, a, shape, env):
    """score[j, t] = sum_h relu(q[:, h, t] . k[:, 0, j]) w[h, t] + mask[j, t], per sequence."""
    q, k, w, m = (gg(t) for t in v)                  # [d, H, T, S], [d, 1, n_kv, S], [H, T, 1, S], [n_kv, T, 1, S']
    qk = np.einsum("dhts,djs->jhts", q, k[:, 0])     # [n_kv, H, T, S]
    score = (np.maximum(qk, 0.0) * w[None, :, :, 0, :]).sum(axis=1)        # [n_kv, T, S]
    out = score + m[:, :, 0, np.arange(q.shape[3]) % m.shape[3]]
    return back(out[:, :, None, :], shape)


def rwkv_wkv6(v, a, shape, env):
    """Per head: out[j] = sum_i r[i] (tf[i] k[i] v[j] + S[i, j]); S[i, j] = S[i, j] decay[i] + k[i] v[j]."""
    k, val, r, tf, td, state = v       # numpy order: (T, H, hs) x3, (H, hs), (T, H, hs), (S, H*hs*hs)
    n_tok, n_head, hs = k.shape
    per_seq = n_tok // state.shape[0]
    S = state.reshape(-1, n_head, hs, hs).copy()           # [seq][h][i = key][j = value]
    out = np.empty(k.shape)
    for t in range(n_tok):
        st = S[t // per_seq]
        kv = k[t][:, :, None] * val[t][:, None, :]
        out[t] = np.einsum("hi,hij->hj", r[t], tf[:, :, None] * kv + st)
        st[:] = st * td[t][:, :, None] + kv
    return np.concatenate([out.ravel(), S.ravel()]).reshape(shape)


def gated_linear_attn(v, a, shape, env):
    """Per head: S[i, j] = S[i, j] g[i] + k[i] v[j]; out[j] = sum_i scale q[i] S[i, j] (the state after the token)."""
    k, val, q, g, state = v            # numpy order: (T, H, hs) x4, (S, H*hs*hs)
    S = state.reshape(len(state), k.shape[1], k.shape[2], k.shape[2]).copy()  # [seq][h][i = key][j = value]
    seq_of = np.arange(len(k)) // (len(k) // len(S))        # sequence-major tokens
    out = np.stack([np.zeros(k.shape[1:])] * len(k))
    for t, s in enumerate(seq_of):
        S[s] = S[s] * g[t][:, :, None] + np.einsum("hi,hj->hij", k[t], val[t])
        out[t] = a["scale"] * np.einsum("hi,hij->hj", q[t], S[s])
    return np.concatenate([out.ravel(), S.ravel()]).reshape(shape)


def rwkv_wkv7(v, a, shape, env):
    """Per head, S[i = value, j = key]: sa = S a; S = S diag(w) + v k^T + sa b^T; out = S r (after the update)."""
    r, w, k, val, ia, ib, state = v    # numpy order: (T, H, hs) x6, (S, H*hs*hs)
    n_tok, n_head, hs = k.shape
    per_seq = n_tok // state.shape[0]
    S = state.reshape(-1, n_head, hs, hs).copy()
    out = np.empty(k.shape)
    for t in range(n_tok):
        st = S[t // per_seq]
        sa = np.einsum("hij,hj->hi", st, ia[t])
        st[:] = st * w[t][:, None, :] + val[t][:, :, None] * k[t][:, None, :] + sa[:, :, None] * ib[t][:, None, :]
        out[t] = np.einsum("hij,hj->hi", st, r[t])
    return np.concatenate([out.ravel(), S.ravel()]).reshape(shape)


def rope(v, a, shape, env):
    X, p = gg(v[0]), v[1]
    ff = v[2] if len(v) > 2 else None
    n_dims, base, fs, ext = a["n_dims"], a["freq_base"], a["freq_scale"], a["ext_factor"]
    out = X.copy()  # channels [n_dims, d) stay as they are

    def corr(n_rot: float) -> float:
        return n_dims * math.log(a["n_ctx_orig"] / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    if ext != 0.0:  # YaRN's ramp (a layer without YaRN may give betas of 0, whose log is undefined)
        lo = max(0.0, math.floor(corr(a["beta_fast"])))
        hi = min(n_dims - 1.0, math.ceil(corr(a["beta_slow"])))
    for i in range(n_dims // 2):
        ia, ib = (2 * i, 2 * i + 1) if a["mode"] == "norm" else (i, i + n_dims // 2)
        for t in range(X.shape[2]):
            theta_extrap = float(p[t]) * base ** (-2.0 * i / n_dims)
            if ff is not None:
                theta_extrap /= float(ff[i])
            theta = fs * theta_extrap
            mscale = a["attn_factor"]
            if ext != 0.0:
                ramp = 1.0 - min(1.0, max(0.0, (i - lo) / max(0.001, hi - lo)))
                mix = ramp * ext
                theta = theta * (1 - mix) + theta_extrap * mix
                mscale *= 1.0 + 0.1 * math.log(1.0 / fs)
            c, s = math.cos(theta) * mscale, math.sin(theta) * mscale
            xa, xb = X[ia, :, t, :], X[ib, :, t, :]
            out[ia, :, t, :] = xa * c - xb * s
            out[ib, :, t, :] = xa * s + xb * c
    return back(out, shape)


def alibi_slope(max_bias, n_head, h):
    """ALiBi's slope of head h of n_head (ggml_soft_max): with n the largest power of two not above n_head,
    2^(-max_bias (h+1) / n) for the first n heads, 2^(-max_bias (2(h-n)+1) / 2n) for the rest; 1 without ALiBi."""
    if max_bias <= 0:
        return 1.0
    n = 2 ** int(np.floor(np.log2(n_head)))
    return 2.0 ** (-max_bias * (h + 1) / n) if h < n else 2.0 ** (-max_bias * (2 * (h - n) + 1) / (2 * n))


def soft_max(v, a, shape, env):
    Wt = gg(v[0]) * a["scale"]
    if len(v) > 1:
        Mk = gg(v[1])
        for i3 in range(Wt.shape[3]):
            for i2 in range(Wt.shape[2]):
                slope = alibi_slope(a["max_bias"], Wt.shape[2], i2)
                Wt[:, :, i2, i3] += slope * Mk[:, : Wt.shape[1], i2 % Mk.shape[2], i3 % Mk.shape[3]]
    if len(v) > 2:  # head i2's sink: one more logit in the denominator
        sink = np.asarray(v[2], np.float64).reshape(1, 1, -1, 1)
        m = np.maximum(Wt.max(axis=0, keepdims=True), sink)
        e = np.exp(Wt - m)
        return back(e / (e.sum(axis=0, keepdims=True) + np.exp(sink - m)), shape)
    e = np.exp(Wt - Wt.max(axis=0, keepdims=True))
    return back(e / e.sum(axis=0, keepdims=True), shape)


def swiglu_oai(v, a, shape, env):
    g, u = np.minimum(v[0], a["limit"]), np.clip(v[1], -a["limit"], a["limit"])
    return g / (1.0 + np.exp(-a["alpha"] * g)) * (u + 1.0)


def xielu(v, a, shape, env):
    x = v[0]
    neg = (np.expm1(np.minimum(x, a["eps"])) - x) * a["alpha_n"] + a["beta"] * x
    return np.where(x > 0, a["alpha_p"] * x * x + a["beta"] * x, neg)


def swiglu_clamp(v, a, shape, env):
    g, u = np.minimum(v[0], a["limit"]), np.clip(v[1], -a["limit"], a["limit"])
    return g / (1.0 + np.exp(-g)) * u


def reshape(v, a, shape, env):
    return np.ascontiguousarray(v[0]).reshape(-1).reshape(shape)  # ggml element order == numpy C order


def view(v, a, shape, env):
    flat = np.ascontiguousarray(v[0]).reshape(-1)
    ne = tuple(reversed(shape))
    offset, *strides = (d.eval(env) if isinstance(d, Sym) else d for d in (a["offset"], *a["strides"]))
    idx = np.full(ne, offset, dtype=np.int64)
    for k, (n, st) in enumerate(zip(ne, strides)):
        idx += (np.arange(n) * st).reshape((1,) * k + (n,) + (1,) * (len(ne) - k - 1))
    return flat[idx].T


def _permute_ref(x: np.ndarray, axes: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
    A = gg(x).reshape(gg(x).shape[: len(axes)])
    out = np.empty(tuple(A.shape[axes.index(k)] for k in range(len(axes))))
    for src in np.ndindex(*A.shape):  # source axis i moves to position axes[i]
        dst = [0] * len(axes)
        for i, p in enumerate(axes):
            dst[p] = src[i]
        out[tuple(dst)] = A[src]
    return back(out, shape)


def permute(v, a, shape, env):
    return _permute_ref(v[0], tuple(a["axes"]), shape)


def transpose(v, a, shape, env):
    return _permute_ref(v[0], (1, 0, 2, 3), shape)


def cont(v, a, shape, env):
    return v[0]


def pad(v, a, shape, env):
    A = gg(v[0])
    out = np.zeros(tuple(n + p for n, p in zip(A.shape, a["pad"])))
    out[tuple(slice(0, n) for n in A.shape)] = A
    return back(out, shape)


def concat(v, a, shape, env):
    A, B, d = gg(v[0]), gg(v[1]), a["dim"]
    ne = list(A.shape)
    ne[d] += B.shape[d]
    out = np.full(ne, np.nan)
    lead = (slice(None),) * d
    out[lead + (slice(0, A.shape[d]),)] = A
    out[lead + (slice(A.shape[d], ne[d]),)] = B
    return back(out, shape)


def im2col(v, a, shape, env):
    """Row (iow, ioh, n) of the result holds the kernel's window at that output position, channel by channel,
    each channel's kh x kw values row by row; 0 where the window reaches past a (into the padding). The 1-D form
    (kh 0): a [L, C, N] as [L, 1, C, N], a kernel of one row."""
    if a["kh"] == 0:
        L, C, N = gg(v[0]).shape[:3]
        one_row = {**a, "kh": 1, "s1": 1, "p1": 0, "d1": 1}
        return im2col([np.reshape(v[0], (N, C, 1, L))], one_row, (N, 1, shape[-2], shape[-1]), env).reshape(shape)
    A = gg(v[0])                                       # [W, H, C, N]
    W, H = A.shape[:2]
    kw, kh = a["kw"], a["kh"]
    _, OW, OH, _ = gg(np.empty(shape)).shape
    out = np.zeros((A.shape[2] * kh * kw, OW, OH, A.shape[3]))
    for ioh in range(OH):
        for iow in range(OW):
            for ikh in range(kh):
                for ikw in range(kw):
                    iiw = iow * a["s0"] + ikw * a["d0"] - a["p0"]
                    iih = ioh * a["s1"] + ikh * a["d1"] - a["p1"]
                    if 0 <= iiw < W and 0 <= iih < H:   # value ikh kw + ikw of every channel's kh kw
                        out[ikh * kw + ikw:: kh * kw, iow, ioh, :] = A[iiw, iih, :, :]
    return back(out, shape)


def pool_2d(v, a, shape, env):
    """Each window's values inside a: avg, their sum over k0 k1 (the padding counts as zeros); max, the largest
    (-FLT_MAX for a window wholly in the padding)."""
    A = gg(v[0])                                       # [W, H, C, N]
    k0, k1 = a["k0"], a["k1"]
    OW, OH = gg(np.empty(shape)).shape[:2]
    out = np.empty((OW, OH) + A.shape[2:])
    for oy in range(OH):
        for ox in range(OW):
            x0, y0 = ox * a["s0"] - a["p0"], oy * a["s1"] - a["p1"]
            win = A[max(x0, 0): max(x0 + k0, 0), max(y0, 0): max(y0 + k1, 0)]
            if a["pool"] == "avg":
                out[ox, oy] = win.sum(axis=(0, 1)) / (k0 * k1)
            else:
                out[ox, oy] = win.max(axis=(0, 1), initial=-float(np.finfo(np.float32).max))
    return back(out, shape)


def interpolate(v, a, shape, env):
    """Each output value at source position (i + o) / scale - o along each axis (o: 0 with the corners aligned, the
    scale then (out - 1) / (in - 1); else 1/2 and out / in), from the two inputs either side (clamped into the
    plane) weighted by the distance to each."""
    A = gg(v[0])                                        # [W, H, C, N]
    out = np.empty((a["w"], a["h"]) + A.shape[2:])

    def taps(n_out: int, n_in: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        aligned = a["align_corners"] and n_out > 1 and n_in > 1
        scale, o = ((n_out - 1) / (n_in - 1), 0.0) if aligned else (n_out / n_in, 0.0 if a["align_corners"] else 0.5)
        at = (np.arange(n_out) + o) / scale - o
        lo = np.clip(np.floor(at).astype(int), 0, n_in - 1)
        return lo, np.clip(lo + 1, 0, n_in - 1), np.clip(at - lo, 0.0, 1.0)

    x0, x1, dx = taps(a["w"], A.shape[0])
    y0, y1, dy = taps(a["h"], A.shape[1])
    for i in range(a["w"]):
        for j in range(a["h"]):
            out[i, j] = (A[x0[i], y0[j]] * (1 - dx[i]) * (1 - dy[j]) + A[x1[i], y0[j]] * dx[i] * (1 - dy[j])
                         + A[x0[i], y1[j]] * (1 - dx[i]) * dy[j] + A[x1[i], y1[j]] * dx[i] * dy[j])
    return back(out, shape)


def set_rows(v, a, shape, env):
    """dst's rows at ids replaced by src's, rounded to dst's type, in place: dst is a memory's buffer (or, batched,
    dst[b] rows ids[b] of src[b]); the value is dst."""
    dst, src, ids = v
    if ids.ndim == 2:
        for b in range(ids.shape[0]):
            dst[b, ids[b]] = src[b]
        return dst
    dst[ids] = src
    return dst


REFERENCES: dict[str, Callable[..., np.ndarray]] = {
    "get_rows": lambda v, a, shape, env: (get_rows_batched if v[1].ndim >= 2 else get_rows)(v, a, shape, env),
    "fill": lambda v, a, shape, env: np.full(shape, a["c"]), "repeat": repeat, "pad": pad,
    # float32 values, so that a scale of them rounds as ggml's does (GroveMoE's expert ids divided by a group size)
    "cast": lambda v, a, shape, env: np.asarray(v[0]).astype(np.float32 if a["type"] == "f32" else np.int32),
    "mul_mat": mul_mat, "mul_mat_id": mul_mat_id, "argsort_top_k": argsort_top_k,
    "sum_rows": lambda v, a, shape, env: v[0].sum(-1, keepdims=True),
    "mean": lambda v, a, shape, env: v[0].mean(-1, keepdims=True),
    "moe_sum": lambda v, a, shape, env: v[0].sum(-2),
    "add_id": lambda v, a, shape, env: v[0] + np.asarray(v[1], np.float64)[np.asarray(v[2])],
    "swiglu_oai": swiglu_oai, "swiglu_clamp": swiglu_clamp, "xielu": xielu,
    "clamp": lambda v, a, shape, env: np.clip(v[0], a["min"], a["max"]),
    "div": lambda v, a, shape, env: back(gg(v[0]) / _repeat_b(gg(v[0]), gg(v[1])), shape),
    "add": add, "sub": sub, "mul": mul,
    "scale": lambda v, a, shape, env: v[0] * (a["s"].eval(env) if isinstance(a["s"], Sym) else a["s"]),
    "scale_bias": lambda v, a, shape, env: v[0] * a["s"] + a["b"],
    "rms_norm": rms_norm, "norm": norm, "l2_norm": l2_norm,
    "silu": lambda v, a, shape, env: _silu(v[0]),
    "gelu": lambda v, a, shape, env: _gelu(v[0]),
    "gelu_quick": lambda v, a, shape, env: _gelu_quick(v[0]),
    "gelu_erf": lambda v, a, shape, env: 0.5 * v[0] * (1.0 + np.vectorize(math.erf)(v[0] / math.sqrt(2.0))),
    "relu": lambda v, a, shape, env: np.maximum(v[0], 0.0),
    "sqr": lambda v, a, shape, env: v[0] * v[0],
    "sqrt": lambda v, a, shape, env: np.sqrt(v[0]),
    "neg": lambda v, a, shape, env: -v[0],
    "exp": lambda v, a, shape, env: np.exp(v[0]),
    "tanh": lambda v, a, shape, env: np.tanh(v[0]),
    "sigmoid": lambda v, a, shape, env: 1.0 / (1.0 + np.exp(-v[0])),
    "softplus": lambda v, a, shape, env: np.where(v[0] > 20, v[0], np.log1p(np.exp(np.minimum(v[0], 20)))),
    "swiglu": lambda v, a, shape, env: _silu(v[0]) * v[1],
    "geglu": lambda v, a, shape, env: _gelu(v[0]) * v[1],
    "reglu": lambda v, a, shape, env: np.where(v[0] > 0, v[0] * v[1], 0.0),
    "rope": rope, "rope_multi": rope_multi, "soft_max": soft_max, "reshape": reshape, "view": view,
    "permute": permute, "transpose": transpose, "cont": cont, "concat": concat,
    "im2col": im2col, "pool_2d": pool_2d, "interpolate": interpolate,
    "set_rows": set_rows, "ssm_conv": ssm_conv, "ssm_scan": ssm_scan, "ssm_scan_heads": ssm_scan_heads,
    "rwkv_wkv6": rwkv_wkv6, "rwkv_wkv7": rwkv_wkv7, "gated_linear_attn": gated_linear_attn,
    "gated_delta_net": gated_delta_net, "lightning_indexer": lightning_indexer,
}
