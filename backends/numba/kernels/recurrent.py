"""Recurrent-state kernels (Mamba's ssm_conv / ssm_scan, RWKV6's wkv6, RWKV7's wkv7, gated linear attention,
gated DeltaNet's delta rule), in ggml's CPU order of operations.

Arrays are in numpy order (the reverse of the IR's ggml order). Each kernel says which ggml function it follows;
its products and sums are those of llama.cpp's x86 build (GCC with FMA contraction: `s += a*b` is one fused
multiply-add, and in `a*b + c*d` the first product is fused, the second rounded), checked bit for bit against
llama.cpp's own ggml-cpu. Every state and accumulator stays float32, as in ggml.

The loops over channels (Mamba) and heads (RWKV, DeltaNet) are independent, which is how ggml splits them over threads;
here they are `prange` loops (measured on 2 idle cores at Mamba-130m / RWKV6-1.6B sizes, from one token to 64:
1.5-2x the serial speed). Elements are read by full index, not through per-row views: with views inside the
prange body the wkv6 j loop stops vectorizing (3-4x slower).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
from numba import njit, prange

from graphir.backends.numba.primitives.expf import libm_expf, libm_logf
from graphir.backends.numba.primitives import simd
from graphir.backends.numba.primitives.jit import INL, PAR, PAR_MIN, parallel_and_serial
from graphir.backends.numba.primitives.simd import vfma, vload, vmul, vreduce4, vsplat, vstore, vzero, width
from graphir.backends.numba.primitives.bits import fma

F32 = np.float32
_ZERO, _ONE, _SOFTPLUS_MAX = F32(0.0), F32(1.0), F32(20.0)


def _f32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=F32)


# ---------------------------------------------------------------------------------------------------------
# Mamba
# ---------------------------------------------------------------------------------------------------------

def _ssm_conv(sx, w, y):
    """ggml_compute_forward_ssm_conv_f32: y[s, t, c] = sum_j sx[s, c, t + j] * w[c, j], one float32 FMA
    chain from 0 in j order (ggml avoids vec_dot there because it sums in double)."""
    n_seqs, n_tok, d_inner = y.shape
    d_conv = w.shape[1]
    for c in prange(d_inner):
        for s in range(n_seqs):
            for t in range(n_tok):
                acc = _ZERO
                for j in range(d_conv):
                    acc = fma(sx[s, c, t + j], w[c, j], acc)
                y[s, t, c] = acc


_conv_par, _conv_ser = parallel_and_serial(_ssm_conv)


def ssm_conv_kernel(size: int) -> Callable:
    """ssm_conv's kernel for y of ``size`` elements, (sx (n_seqs, d_inner, L) C-contiguous, w (d_inner, d_conv),
    y (n_seqs, n_tok, d_inner)): serial for a token or a few (one token of Mamba-130M: 19 -> 7 us in a decode)."""
    return _conv_par if size >= PAR_MIN else _conv_ser


def ssm_conv(sx: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Depthwise causal conv. sx (n_seqs, d_inner, d_conv - 1 + n_tok) (n_seqs may be left out when 1),
    w (d_inner, d_conv) -> (n_seqs, n_tok, d_inner)."""
    sx = _f32(sx).reshape((-1,) + sx.shape[-2:])
    y = np.empty((sx.shape[0], sx.shape[2] - w.shape[1] + 1, sx.shape[1]), F32)
    ssm_conv_kernel(y.size)(sx, _f32(w), y)
    return y


@njit(**PAR)
def _ssm_scan(s0, x, dt, A, B, C, y, st):
    """ggml_compute_forward_ssm_scan_f32, Mamba-1 branch (per-state decay A[c, n]), per channel c:
    d = softplus(dt) = dt > 20 ? dt : logf(1 + expf(dt)); x_dt = x * d; for each state n in order:
    state = s * expf(d * A) + B * x_dt (the first product fused), y = fma(state, C, y) from 0. expf and logf are
    glibc's, written out (libm_expf, libm_logf) so that the softplus of every channel and the states' update
    vectorize: 72 -> 24 us a layer of Mamba-130M's sizes for one token here."""
    n_seqs, n_tok, d_inner = x.shape
    d_state = A.shape[1]
    soft = np.empty(x.shape, np.float32)
    for s in range(n_seqs):
        for t in range(n_tok):
            for c in range(d_inner):
                d = dt[s, t, c]
                p = libm_logf(_ONE + libm_expf(d))
                soft[s, t, c] = p if d <= _SOFTPLUS_MAX else d
    for c in prange(d_inner):
        for s in range(n_seqs):
            if n_tok == 0:                                 # no token: the states stay
                for n in range(d_state):
                    st[s, c, n] = s0[s, c, n]
            for t in range(n_tok):
                d = soft[s, t, c]
                x_dt = x[s, t, c] * d
                if t == 0:                               # the first token reads the states it starts from
                    for n in range(d_state):
                        st[s, c, n] = fma(s0[s, c, n], libm_expf(d * A[c, n]), B[s, t, n] * x_dt)
                else:
                    for n in range(d_state):
                        st[s, c, n] = fma(st[s, c, n], libm_expf(d * A[c, n]), B[s, t, n] * x_dt)
                acc = _ZERO
                for n in range(d_state):
                    acc = fma(st[s, c, n], C[s, t, n], acc)
                y[s, t, c] = acc


def ssm_scan_kernel() -> Callable:
    """ssm_scan's kernel, (s, x, dt, A, B, C, y, states), each C-contiguous float32 (ssm_scan's shapes)."""
    return _ssm_scan


def ssm_scan(s: np.ndarray, x: np.ndarray, dt: np.ndarray, A: np.ndarray, B: np.ndarray,
             C: np.ndarray) -> np.ndarray:
    """Mamba-1 selective scan from the gathered states s (n_seqs, d_inner, d_state); x, dt (n_seqs, n_tok,
    d_inner); A (d_inner, d_state); B, C (n_seqs, n_tok, d_state). Returns ggml's flat result: every y
    (n_seqs, n_tok, d_inner) followed by the final states (n_seqs, d_inner, d_state)."""
    s = _f32(s).reshape((x.shape[0],) + A.shape)        # a single sequence's states may come 2-D
    out = np.empty(x.size + s.size, F32)
    y, st = out[:x.size].reshape(x.shape), out[x.size:].reshape(s.shape)
    _ssm_scan(s, _f32(x), _f32(dt), _f32(A), _f32(B), _f32(C), y, st)
    return out


@njit(**PAR)
def _ssm_scan_heads(s0, x, dt, A, B, C, y, st, v, hadd):
    """ggml_compute_forward_ssm_scan_f32, Mamba-2 branch (a scalar decay per head), per head h in group
    g = h // (n_head / n_group): d = softplus(dt), dA = expf(d * A[h]); per channel i, x_dt = x * d and over
    the states n: state = s * dA + B * x_dt (the first product fused, in ggml's vector loop as in its scalar
    one), y = sum of state * C: fused lane by lane over the states ggml's SIMD loop covers (whole steps of 4
    registers of ``v``'s lanes, held in registers here: a 64-token prompt of Mamba-2-2.7B's sizes took 22 ms a
    layer with them in a scratch array) and reduced as GGML_F32_VEC_REDUCE, then one fused chain over the rest."""
    n_seqs, n_tok, n_head, dim = x.shape
    n_state, n_group = s0.shape[3], B.shape[2]
    n = width(v)
    step = 4 * n
    simd = n_state // step * step
    st1, b1, c1 = st.reshape(-1), B.reshape(-1), C.reshape(-1)
    for h in prange(n_head):
        g = h // (n_head // n_group)
        for s in range(n_seqs):
            for i in range(dim):
                for k in range(n_state):
                    st[s, h, i, k] = s0[s, h, i, k]
            for t in range(n_tok):
                d = dt[s, t, h]
                if d <= _SOFTPLUS_MAX:
                    d = math.log(_ONE + math.exp(d))
                dA = math.exp(d * A[h])
                da, bc = vsplat(v, F32(dA)), ((s * n_tok + t) * n_group + g) * n_state
                for i in range(dim):
                    x_dt = x[s, t, h, i] * d
                    xd, at = vsplat(v, F32(x_dt)), ((s * n_head + h) * dim + i) * n_state
                    sumf = _ZERO
                    if simd:
                        a0 = a1 = a2 = a3 = vzero(v)
                        for c in range(0, simd, step):
                            p0 = vfma(vload(v, st1, at + c), da, vmul(vload(v, b1, bc + c), xd))
                            p1 = vfma(vload(v, st1, at + c + n), da, vmul(vload(v, b1, bc + c + n), xd))
                            p2 = vfma(vload(v, st1, at + c + 2 * n), da, vmul(vload(v, b1, bc + c + 2 * n), xd))
                            p3 = vfma(vload(v, st1, at + c + 3 * n), da, vmul(vload(v, b1, bc + c + 3 * n), xd))
                            a0, a1 = vfma(p0, vload(v, c1, bc + c), a0), vfma(p1, vload(v, c1, bc + c + n), a1)
                            a2 = vfma(p2, vload(v, c1, bc + c + 2 * n), a2)
                            a3 = vfma(p3, vload(v, c1, bc + c + 3 * n), a3)
                            vstore(st1, at + c, p0)
                            vstore(st1, at + c + n, p1)
                            vstore(st1, at + c + 2 * n, p2)
                            vstore(st1, at + c + 3 * n, p3)
                        sumf = vreduce4(a0, a1, a2, a3, hadd)
                    for k in range(simd, n_state):
                        u = fma(st1[at + k], dA, b1[bc + k] * x_dt)
                        sumf = fma(u, c1[bc + k], sumf)
                        st1[at + k] = u
                    y[s, t, h, i] = sumf


def ssm_scan_heads_kernel() -> Callable:
    """ssm_scan_heads' kernel, (s, x, dt, A, B, C, y, states, register type, hadd), each array C-contiguous
    float32 (ssm_scan_heads' shapes, A flat)."""
    return _ssm_scan_heads


def ssm_scan_heads(s: np.ndarray, x: np.ndarray, dt: np.ndarray, A: np.ndarray, B: np.ndarray, C: np.ndarray,
                   lanes: int, hadd: bool) -> np.ndarray:
    """Mamba-2 selective scan from the gathered states s (n_seqs, n_head, dim, n_state); x (n_seqs, n_tok, n_head,
    dim); dt (n_seqs, n_tok, n_head); A (n_head,) (any shape of n_head values); B, C (n_seqs, n_tok, n_group,
    n_state). Returns every y (x's shape) followed by the final states (s's shape), flat, as ggml does."""
    s = _f32(s).reshape((x.shape[0], x.shape[2], x.shape[3], B.shape[3]))
    out = np.empty(x.size + s.size, F32)
    y, st = out[:x.size].reshape(x.shape), out[x.size:].reshape(s.shape)
    _ssm_scan_heads(s, _f32(x), _f32(dt).reshape(x.shape[:3]), _f32(A).reshape(-1), _f32(B), _f32(C), y, st,
                    simd.lanes(lanes), hadd)
    return out


# ---------------------------------------------------------------------------------------------------------
# Gated DeltaNet
# ---------------------------------------------------------------------------------------------------------

@njit(**INL)
def _vec_dot(v, a, b, hadd):
    """ggml_vec_dot_f32 on x86: fused lane by lane over whole steps of 4 registers (of ``v``'s lanes, kept in
    registers), reduced as GGML_F32_VEC_REDUCE, then the rest added product by product, each product rounded
    (vec.cpp's leftover loop is not contracted, unlike the scalar loops of ops.cpp)."""
    n, w = a.shape[0], width(v)
    step = 4 * w
    simd = n // step * step
    sumf = _ZERO
    if simd:
        a0 = a1 = a2 = a3 = vzero(v)
        for c in range(0, simd, step):
            a0, a1 = vfma(vload(v, a, c), vload(v, b, c), a0), vfma(vload(v, a, c + w), vload(v, b, c + w), a1)
            a2 = vfma(vload(v, a, c + 2 * w), vload(v, b, c + 2 * w), a2)
            a3 = vfma(vload(v, a, c + 3 * w), vload(v, b, c + 3 * w), a3)
        sumf = vreduce4(a0, a1, a2, a3, hadd)
    for i in range(simd, n):
        sumf = sumf + a[i] * b[i]
    return sumf


@njit(**PAR)
def _gated_delta_net(q, k, v, g, beta, s0, y, st, r, hadd):
    """ggml_compute_forward_gated_delta_net_f32 (one state slot) per sequence s and value head h, which reads
    key head h % n_khead. The state is kept transposed, row j = column j of S. Per token: every element times
    expf(g), or with a decay per key channel (g [..., d]) element i of every row times expf(g[i]); delta[j] = (v[j] - dot(row j, k)) * beta; row j += k * delta[j] (fused, ggml_vec_mad_f32);
    y[j] = dot(row j, q) * (1 / sqrtf(d)). Rows go through registers of ``r``'s lanes (the dots' chains held
    there: a 64-token prompt of Qwen3.5-0.8B's sizes took 10 ms a layer with them in a scratch array)."""
    n_seqs, n_tok, n_head, d = v.shape
    n_khead = q.shape[2]
    per_channel = g.shape[3] == d > 1
    scale = _ONE / math.sqrt(F32(d))
    w = width(r)
    whole = d // w * w
    for sh in prange(n_seqs * n_head):
        s, h = sh // n_head, sh % n_head
        hk = h % n_khead
        delta = np.empty(d, F32)
        decays = np.empty(d, F32)
        m = st[s, h]
        m[:, :] = s0[s, h]
        for t in range(n_tok):
            kt, qt, b = k[s, t, hk], q[s, t, hk], beta[s, t, h]
            if per_channel:
                for i in range(d):
                    decays[i] = F32(math.exp(g[s, t, h, i]))
                for j in range(d):
                    row = m[j]
                    for i in range(d):
                        row[i] = row[i] * decays[i]
            for j in range(d):
                row = m[j]
                if not per_channel:
                    decay = F32(math.exp(g[s, t, h, 0]))
                    dv = vsplat(r, decay)
                    for i in range(0, whole, w):
                        vstore(row, i, vmul(vload(r, row, i), dv))
                    for i in range(whole, d):
                        row[i] = row[i] * decay
                delta[j] = (v[s, t, h, j] - _vec_dot(r, row, kt, hadd)) * b
            for j in range(d):
                row, dj = m[j], vsplat(r, delta[j])
                for i in range(0, whole, w):
                    vstore(row, i, vfma(vload(r, kt, i), dj, vload(r, row, i)))
                for i in range(whole, d):
                    row[i] = fma(kt[i], delta[j], row[i])
                y[s, t, h, j] = _vec_dot(r, row, qt, hadd) * scale


def gated_delta_net(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, s: np.ndarray,
                    lanes: int, hadd: bool) -> np.ndarray:
    """The gated delta rule from the gathered states s (n_seqs, n_head, d, d); q, k (n_seqs, n_tok, n_khead, d);
    v (n_seqs, n_tok, n_head, d); g (n_seqs, n_tok, n_head, 1 or d); beta (n_seqs, n_tok, n_head, 1). Returns every output (v's shape) followed
    by the final states (s's shape), flat, as ggml does."""
    v = _f32(v)
    n_seqs, n_tok, n_head, d = v.shape
    s = _f32(s).reshape(n_seqs, n_head, d, d)
    out = np.empty(v.size + s.size, F32)
    y, st = out[:v.size].reshape(v.shape), out[v.size:].reshape(s.shape)
    _gated_delta_net(_f32(q), _f32(k), v, _f32(g).reshape(*v.shape[:3], -1), _f32(beta).reshape(v.shape[:3]), s, y, st,
                     simd.lanes(lanes), hadd)
    return out


# ---------------------------------------------------------------------------------------------------------
# RWKV
# ---------------------------------------------------------------------------------------------------------

@njit(**PAR)
def _wkv6(k, v, r, tf, td, s0, out, st):
    """ggml_compute_forward_rwkv_wkv6_f32 (AVX-512 path, whose FMAs the scalar tail repeats) per head h and
    token t of sequence s, key channel i in order, value channel j: kv = v[j] * k[i]; out[j] =
    fma(fma(kv, tf[i], S[i, j]), r[i], out[j]) from 0; S[i, j] = fma(S[i, j], decay[i], kv)."""
    n_tok, n_head, hs = k.shape
    n_seqs = s0.shape[0]
    per_seq = n_tok // n_seqs
    for h in prange(n_head):
        for s in range(n_seqs):
            for i in range(hs):
                for j in range(hs):
                    st[s, h, i, j] = s0[s, h, i, j]
            for t in range(s * per_seq, (s + 1) * per_seq):
                for j in range(hs):
                    out[t, h, j] = _ZERO
                for i in range(hs):
                    ki, ri, fi, di = k[t, h, i], r[t, h, i], tf[h, i], td[t, h, i]
                    for j in range(hs):
                        kv = v[t, h, j] * ki
                        prev = st[s, h, i, j]
                        out[t, h, j] = fma(fma(kv, fi, prev), ri, out[t, h, j])
                        st[s, h, i, j] = fma(prev, di, kv)


def wkv6_kernel() -> Callable:
    """rwkv_wkv6's kernel, (k, v, r, time_first, decay, states, y, new states), rwkv_wkv6's shapes (states
    (n_seqs, n_head, hs, hs)), each C-contiguous float32."""
    return _wkv6


def rwkv_wkv6(k: np.ndarray, v: np.ndarray, r: np.ndarray, time_first: np.ndarray, decay: np.ndarray,
              state: np.ndarray) -> np.ndarray:
    """RWKV6 linear attention. k, v, r, decay (n_tok, n_head, hs), sequence-major (n_tok / n_seqs tokens a
    sequence); time_first (n_head, hs); state (n_seqs, n_head * hs * hs), each [h][i][j] with i the key
    channel. Returns (n_tok + hs * n_seqs, n_head * hs): the outputs, then the final states. A single token's
    operands may come 2-D."""
    n_head, hs = time_first.shape
    k, v, r, decay = (_f32(a).reshape(-1, n_head, hs) for a in (k, v, r, decay))
    n_tok, n_seqs = k.shape[0], state.shape[0]
    out = np.empty((n_tok + hs * n_seqs, n_head * hs), F32)
    flat = out.reshape(-1)
    y = flat[:k.size].reshape(k.shape)
    st = flat[k.size:].reshape(n_seqs, n_head, hs, hs)
    _wkv6(k, v, r, _f32(time_first), decay, _f32(state).reshape(n_seqs, n_head, hs, hs), y, st)
    return out


@njit(**PAR)
def _gla(k, v, q, g, scale, s0, out, st):
    """ggml_compute_forward_gla_f32 (its vector path, whose FMAs the scalar tail repeats) per head h and token t
    of sequence s, key channel i in order, value channel j: q' = q[i] * scale; S[i, j] = fma(S[i, j], g[i],
    v[j] * k[i]); out[j] = fma(S[i, j], q', out[j]) from 0. A sequence's first token reads its saved state."""
    st[:] = s0
    out[:] = _ZERO
    per_seq = k.shape[0] // s0.shape[0]
    for h in prange(k.shape[1]):
        for t in range(k.shape[0]):
            s = t // per_seq
            for i in range(k.shape[2]):
                ki, qi, gi = k[t, h, i], q[t, h, i] * scale, g[t, h, i]
                for j in range(k.shape[2]):
                    new = fma(st[s, h, i, j], gi, v[t, h, j] * ki)
                    out[t, h, j] = fma(new, qi, out[t, h, j])
                    st[s, h, i, j] = new


def gated_linear_attn(k: np.ndarray, v: np.ndarray, q: np.ndarray, g: np.ndarray, state: np.ndarray,
                      scale: float) -> np.ndarray:
    """Gated linear attention. k, v, q, g (n_tok, n_head, hs), sequence-major (n_tok / n_seqs tokens a
    sequence); state (n_seqs, n_head * hs * hs), each [h][i][j] with i the key channel. Returns (n_tok + hs *
    n_seqs, n_head * hs): the outputs, then the final states, as rwkv_wkv6's."""
    n_seqs, hs = state.shape[0], k.shape[-1]
    k, v, q, g = (_f32(a).reshape(-1, a.shape[-2], hs) for a in (k, v, q, g))
    n_tok, n_head = k.shape[:2]
    out = np.empty((n_tok + hs * n_seqs, n_head * hs), F32)
    flat = out.reshape(-1)
    y = flat[:k.size].reshape(k.shape)
    st = flat[k.size:].reshape(n_seqs, n_head, hs, hs)
    _gla(k, v, q, g, F32(scale), _f32(state).reshape(n_seqs, n_head, hs, hs), y, st)
    return out


@njit(**INL)
def _wkv7_update(lanes, row, j, dv, dsa, kt, wt, bt, rt, acc):
    """One register of a state row: row[j..] = (row * w + v[i] k) + sa b, each step fused; acc + row * r."""
    x = vfma(vload(lanes, row, j), vload(lanes, wt, j), vmul(dv, vload(lanes, kt, j)))
    x = vfma(dsa, vload(lanes, bt, j), x)
    vstore(row, j, x)
    return vfma(x, vload(lanes, rt, j), acc)


def _wkv7(r, w, k, v, a, b, s0, out, st, lanes, hadd):
    """ggml_compute_forward_rwkv_wkv7_f32's vector path per head h and token t of sequence s, with the state's row
    i (a value channel) in registers of ``lanes``: sa = dot(row i, a) over steps of four registers (fused lane by
    lane, reduced as GGML_F32_VEC_REDUCE); then per lane row[j] = fma(sa, b[j], fma(row[j], w[j], v[i] * k[j]))
    and out[i] = dot(new row i, r), summed the same way. ggml's loops step four registers at a time bounded only
    by the head size, so a head that is not a multiple of that step reads past it there (llama.cpp's result is
    then undefined); here the rest of such a head is summed element by element after the steps."""
    n_tok, n_head, hs = k.shape
    n_seqs = s0.shape[0]
    per_seq = n_tok // n_seqs
    lw = width(lanes)
    step = 4 * lw
    whole = hs // step * step
    for h in prange(n_head):
        for s in range(n_seqs):
            st[s, h] = s0[s, h]
            for t in range(s * per_seq, (s + 1) * per_seq):
                rt, wt, kt, at, bt = r[t, h], w[t, h], k[t, h], a[t, h], b[t, h]
                for i in range(hs):
                    row = st[s, h, i]
                    sa = _ZERO
                    if whole:
                        a0 = a1 = a2 = a3 = vzero(lanes)
                        for c in range(0, whole, step):
                            a0 = vfma(vload(lanes, at, c), vload(lanes, row, c), a0)
                            a1 = vfma(vload(lanes, at, c + lw), vload(lanes, row, c + lw), a1)
                            a2 = vfma(vload(lanes, at, c + 2 * lw), vload(lanes, row, c + 2 * lw), a2)
                            a3 = vfma(vload(lanes, at, c + 3 * lw), vload(lanes, row, c + 3 * lw), a3)
                        sa = vreduce4(a0, a1, a2, a3, hadd)
                    for j in range(whole, hs):
                        sa = fma(at[j], row[j], sa)
                    vi = v[t, h, i]
                    dv, dsa = vsplat(lanes, vi), vsplat(lanes, sa)
                    y = _ZERO
                    if whole:
                        y0 = y1 = y2 = y3 = vzero(lanes)
                        for c in range(0, whole, step):
                            y0 = _wkv7_update(lanes, row, c, dv, dsa, kt, wt, bt, rt, y0)
                            y1 = _wkv7_update(lanes, row, c + lw, dv, dsa, kt, wt, bt, rt, y1)
                            y2 = _wkv7_update(lanes, row, c + 2 * lw, dv, dsa, kt, wt, bt, rt, y2)
                            y3 = _wkv7_update(lanes, row, c + 3 * lw, dv, dsa, kt, wt, bt, rt, y3)
                        y = vreduce4(y0, y1, y2, y3, hadd)
                    for j in range(whole, hs):
                        x = fma(sa, bt[j], fma(row[j], wt[j], vi * kt[j]))
                        row[j] = x
                        y = fma(x, rt[j], y)
                    out[t, h, i] = y


_wkv7_par, _wkv7_ser = parallel_and_serial(_wkv7)


def rwkv_wkv7(r: np.ndarray, w: np.ndarray, k: np.ndarray, v: np.ndarray, a: np.ndarray, b: np.ndarray,
              state: np.ndarray, lanes: int, hadd: bool) -> np.ndarray:
    """RWKV7 linear attention. r, w, k, v, a, b (n_tok, n_head, hs), sequence-major (n_tok / n_seqs tokens a
    sequence); state (n_seqs, n_head * hs * hs), each [h][i][j] with i the value channel. Returns (n_tok + hs *
    n_seqs, n_head * hs): the outputs, then the final states. A token of each sequence runs on the calling thread
    (waking the workers cost more than its 128 KB of state at RWKV7-1.5B's sizes)."""
    n_seqs, n_head, hs = state.shape[0], k.shape[-2], k.shape[-1]
    r, w, k, v, a, b = (_f32(x).reshape(-1, n_head, hs) for x in (r, w, k, v, a, b))
    out = np.empty((k.shape[0] + hs * n_seqs, n_head * hs), F32)
    flat = out.reshape(-1)
    y = flat[:k.size].reshape(k.shape)
    st = flat[k.size:].reshape(n_seqs, n_head, hs, hs)
    kernel = _wkv7_ser if k.shape[0] == n_seqs else _wkv7_par
    kernel(r, w, k, v, a, b, _f32(state).reshape(n_seqs, n_head, hs, hs), y, st, simd.lanes(lanes), hadd)
    return out
