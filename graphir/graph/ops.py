"""The op catalogue: one row per op with its operand slots, attributes, kind and shape/dtype rule.

Semantics follow ggml (shapes in ne order, ne0 first); see llama.cpp's ggml.c for the reference rules.
This table is the only list of op names in the project: builder, verifier, printers and backends all read it.
Operand slots ending in ``?`` are optional and may only be omitted at the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from graphir.graph.dims import Dim, Sym, divides, numel
from graphir.graph.ir import FLOAT_TYPES, INDEX_TYPES, Node

Type = tuple[str, tuple[Dim, ...]]


class ShapeError(ValueError):
    """An op's operands or attributes do not fit its rule (message says which)."""


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ShapeError(msg)


def _pad4(shape: Sequence[Dim]) -> list[Dim]:
    return list(shape) + [1] * (4 - len(shape))


def _trim(shape: Sequence[Dim], rank: int) -> tuple[Dim, ...]:
    """Drop trailing 1s beyond ``rank`` so results keep the rank of their operands."""
    out = list(shape)
    while len(out) > rank and out[-1] == 1:
        out.pop()
    return tuple(out)


# ---- rules: (inputs, attrs) -> (dtype, shape) ------------------------------------------------------------

def _leaf(xs: list[Node], a: dict[str, Any]) -> Type:
    raise ShapeError("leaves declare their own type")  # never called: inputs and weights are not re-inferred


def _same(xs: list[Node], a: dict[str, Any]) -> Type:
    x = xs[0]
    _need(x.dtype in FLOAT_TYPES, f"expects a float operand, got {x.dtype}")
    return "f32", x.shape


def _filled(xs: list[Node], a: dict[str, Any]) -> Type:
    return "f32", xs[0].shape


def _binary(xs: list[Node], a: dict[str, Any]) -> Type:
    x, y = xs
    _need(all(d == 1 for d in y.shape[len(x.shape):]),
          f"operand 1 {y.type_str} has more non-1 dimensions than operand 0 {x.type_str}")
    ok = all(divides(d1, d0) for d0, d1 in zip(x.shape, y.shape))
    _need(ok, f"cannot broadcast {y.type_str} into {x.type_str}")
    return "f32", x.shape


def _glu(xs: list[Node], a: dict[str, Any]) -> Type:
    g, u = xs
    _need(g.shape == u.shape, f"gate {g.type_str} and up {u.type_str} differ")
    return "f32", g.shape


def _get_rows(xs: list[Node], a: dict[str, Any]) -> Type:
    src, idx = xs
    _need(idx.dtype in INDEX_TYPES, f"row ids must be integer, got {idx.dtype}")
    s = _pad4(src.shape)
    if len(idx.shape) in (2, 3):  # batched (ggml's ids [n, B...] over a source [ne0, rows, B...]): MoE's routing
        batches = tuple(idx.shape[1:])
        _need(len(src.shape) == 1 + len(idx.shape) and tuple(src.shape[2:]) == batches,
              f"{len(idx.shape)}-D row ids {idx.type_str} need a {1 + len(idx.shape)}-D source with "
              f"{' x '.join(map(str, batches))} batches, got {src.type_str}")
        return "f32", (s[0], idx.shape[0]) + batches
    _need(len(idx.shape) == 1, f"row ids must be 1-D (or 2-D or 3-D, batched), got {idx.type_str}")
    _need(s[2] == 1 and s[3] == 1, f"source must be 2-D, got {src.type_str}")
    return "f32", (s[0], idx.shape[0])


def _mul_mat(xs: list[Node], a: dict[str, Any]) -> Type:
    w, x = xs
    sw, sx = _pad4(w.shape), _pad4(x.shape)
    _need(sw[0] == sx[0], f"inner dimensions differ: {w.type_str} x {x.type_str}")
    _need(divides(sw[2], sx[2]) and divides(sw[3], sx[3]),
          f"cannot broadcast {w.type_str} over {x.type_str} in dims 2-3")
    return "f32", _trim((sw[1], sx[1], sx[2], sx[3]), max(len(w.shape), len(x.shape)))


def _mul_mat_id(xs: list[Node], a: dict[str, Any]) -> Type:
    w, x, ids = xs
    _need(len(w.shape) == 3, f"expert weights must be 3-D [K, M, n_expert], got {w.type_str}")
    _need(ids.dtype == "i32" and len(ids.shape) == 2,
          f"expert ids must be i32[n_expert_used, n_tokens], got {ids.type_str}")
    n_used, n_tok = ids.shape
    sx = _pad4(x.shape)
    _need(len(x.shape) == 3, f"x must be 3-D [K, 1 or n_expert_used, n_tokens], got {x.type_str}")
    _need(sx[0] == w.shape[0], f"inner dimensions differ: {w.type_str} x {x.type_str}")
    _need(sx[1] == 1 or sx[1] == n_used, f"x {x.type_str} needs 1 or {n_used} rows per token")
    _need(sx[2] == n_tok, f"x {x.type_str} and ids {ids.type_str} differ in tokens")
    return "f32", (w.shape[1], n_used, n_tok)


def _argsort_top_k(xs: list[Node], a: dict[str, Any]) -> Type:
    x, k = xs[0], a["k"]
    # a size of the memory's (the keys an indexer keeps, at most the cells it scores) stands for its value
    _need(isinstance(k, Sym) or isinstance(k, int) and isinstance(x.shape[0], int) and 0 < k <= x.shape[0],
          f"k={k} must be in [1, {x.shape[0]}] (the rows of {x.type_str})")
    return "i32", (k,) + tuple(x.shape[1:])


def _cast(xs: list[Node], a: dict[str, Any]) -> Type:
    t = a["type"]
    _need(t in ("f32", "i32") and xs[0].dtype in ("f32", "i32"), f"casts between f32 and i32, not {xs[0].dtype} to {t}")
    return t, xs[0].shape


def _sum_rows(xs: list[Node], a: dict[str, Any]) -> Type:
    x = xs[0]
    _need(x.dtype in FLOAT_TYPES, f"expects a float operand, got {x.dtype}")
    return "f32", (1,) + tuple(x.shape[1:])


def _moe_sum(xs: list[Node], a: dict[str, Any]) -> Type:
    x = xs[0]
    _need(len(x.shape) == 3, f"expects [n_embd, n_expert_used, n_tokens], got {x.type_str}")
    return "f32", (x.shape[0], x.shape[2])


def _ssm_conv(xs: list[Node], a: dict[str, Any]) -> Type:
    sx, w = xs
    s, sw = _pad4(sx.shape), _pad4(w.shape)
    _need(len(w.shape) == 2 and sw[1] == s[1], f"conv weight {w.type_str} does not fit channels of {sx.type_str}")
    return "f32", (s[1], s[0] - sw[0] + 1, s[2])


def _ssm_scan(xs: list[Node], a: dict[str, Any]) -> Type:
    s, x, dt, A, B, C = xs
    d_state, d_inner, n_seqs = _pad4(s.shape)[:3]
    _need(x.shape[:1] == (d_inner,) and len(x.shape) == 3 and x.shape[2] == n_seqs,
          f"x {x.type_str} does not fit state {s.type_str}")
    _need(dt.shape == x.shape, f"dt {dt.type_str} differs from x {x.type_str}")
    _need(A.shape == (d_state, d_inner), f"A {A.type_str} is not [{d_state}, {d_inner}]")
    for name, t in (("B", B), ("C", C)):
        _need(t.shape == (d_state,) + tuple(x.shape[1:]), f"{name} {t.type_str} is not [{d_state}, ...x's tokens]")
    return "f32", (numel(x.shape) + numel(s.shape),)


def _ssm_scan_heads(xs: list[Node], a: dict[str, Any]) -> Type:
    s, x, dt, A, B, C = xs
    n_state, dim, n_head, n_seqs = _pad4(s.shape)
    _need(len(x.shape) == 4 and tuple(x.shape[:2]) == (dim, n_head) and x.shape[3] == n_seqs,
          f"x {x.type_str} does not fit state {s.type_str}")
    _need(tuple(dt.shape) == (n_head,) + tuple(x.shape[2:]), f"dt {dt.type_str} is not [{n_head}, ...x's tokens]")
    _need(tuple(A.shape) == (1, n_head), f"A {A.type_str} is not [1, {n_head}]")
    for name, t in (("B", B), ("C", C)):
        _need(len(t.shape) == 4 and t.shape[0] == n_state and tuple(t.shape[2:]) == tuple(x.shape[2:]),
              f"{name} {t.type_str} is not [{n_state}, n_group, ...x's tokens]")
    _need(B.shape == C.shape, f"B {B.type_str} and C {C.type_str} differ")
    _need(isinstance(B.shape[1], int) and isinstance(n_head, int) and n_head % B.shape[1] == 0,
          f"{n_head} heads do not split into {B.shape[1]} groups")
    return "f32", (numel(x.shape) + numel(s.shape),)


def _rwkv_wkv6(xs: list[Node], a: dict[str, Any]) -> Type:
    k, v, r, tf, td, state = xs
    hs, H, T = _pad4(k.shape)[:3]
    for name, t in (("v", v), ("r", r), ("decay", td)):
        _need(t.shape == k.shape, f"{name} {t.type_str} differs from k {k.type_str}")
    _need(tf.shape == (hs, H), f"time_first {tf.type_str} is not [{hs}, {H}]")
    _need(len(state.shape) == 2 and state.shape[0] == hs * hs * H,
          f"state {state.type_str} is not [{hs * hs * H}, n_seqs]")
    return "f32", (hs * H, T + hs * state.shape[1])


def _gated_linear_attn(xs: list[Node], a: dict[str, Any]) -> Type:
    k, v, q, g, state = xs
    hs, H, T = _pad4(k.shape)[:3]
    for name, t in (("v", v), ("q", q), ("g", g)):
        _need(t.shape == k.shape, f"{name} {t.type_str} differs from k {k.type_str}")
    _need(len(state.shape) == 2 and state.shape[0] == hs * hs * H,
          f"state {state.type_str} is not [{hs * hs * H}, n_seqs]")
    return "f32", (hs * H, T + hs * state.shape[1])


def _rwkv_wkv7(xs: list[Node], a: dict[str, Any]) -> Type:
    r, w, k, v, ia, ib, state = xs
    hs, H, T = _pad4(k.shape)[:3]
    for name, t in (("r", r), ("w", w), ("v", v), ("a", ia), ("b", ib)):
        _need(t.shape == k.shape, f"{name} {t.type_str} differs from k {k.type_str}")
    _need(len(state.shape) == 2 and state.shape[0] == hs * hs * H,
          f"state {state.type_str} is not [{hs * hs * H}, n_seqs]")
    return "f32", (hs * H, T + hs * state.shape[1])


def _rope(xs: list[Node], a: dict[str, Any], per_token: int = 1) -> Type:
    x, pos = xs[0], xs[1]
    s = _pad4(x.shape)
    _need(pos.dtype == "i32" and len(pos.shape) == 1, f"positions must be i32[n], got {pos.type_str}")
    _need(pos.shape[0] == per_token * s[2], f"positions {pos.type_str} do not match the token axis (ne2) of "
                                             f"{x.type_str}" + (f", {per_token} a token" if per_token > 1 else ""))
    _need(isinstance(s[0], int) and a["n_dims"] <= s[0] and a["n_dims"] % 2 == 0,
          f"n_dims={a['n_dims']} does not fit head size {s[0]}")
    if len(xs) == 3:
        ff = xs[2]
        _need(ff.shape == (a["n_dims"] // 2,), f"freq factors must be f32[{a['n_dims'] // 2}], got {ff.type_str}")
    return "f32", x.shape


def _rope_multi(xs: list[Node], a: dict[str, Any]) -> Type:
    sections = tuple(a["sections"])
    _need(a["mode"] in ("imrope", "mrope", "vision"), f"mode={a['mode']!r}: multi-section RoPE is 'imrope' "
          f"(interleaved sections), 'mrope' (one after the other) or 'vision' (a vision tower's)")
    _need(a["mode"] != "vision" or 2 * a["n_dims"] == _pad4(xs[0].shape)[0],
          f"n_dims={a['n_dims']}: vision RoPE turns pairs n_dims apart across the whole head {xs[0].shape[0]}")
    _need(len(sections) == 4 and all(isinstance(n, int) and n >= 0 for n in sections) and any(sections[:3]),
          f"sections={list(sections)} must be 4 counts of rotated pairs, one of the first three positive")
    _need(sum(sections) <= _pad4(xs[0].shape)[0], f"sections={list(sections)} hold more pairs than head size "
                                                  f"{xs[0].shape[0]}")
    return _rope(xs, a, per_token=4)  # time, height, width and extra positions, section-major


def _gated_delta_net(xs: list[Node], a: dict[str, Any]) -> Type:
    q, k, v, g, beta, s = xs
    d, n_head, n_tok, n_seqs = _pad4(v.shape)
    _need(len(q.shape) == 4 and q.shape == k.shape, f"q {q.type_str} and k {k.type_str} must be the same 4-D shape")
    n_khead = q.shape[1]
    _need(q.shape[0] == d and tuple(q.shape[2:]) == (n_tok, n_seqs),
          f"q {q.type_str} does not fit v {v.type_str}: key and value heads are both {d} wide")
    _need(isinstance(n_head, int) and isinstance(n_khead, int) and n_khead > 0 and n_head % n_khead == 0,
          f"{n_head} value heads do not share {n_khead} key heads evenly")
    _need(tuple(beta.shape) == (1, n_head, n_tok, n_seqs), f"beta {beta.type_str} is not [1, {n_head}, ...v's tokens]")
    _need(tuple(g.shape) in ((1, n_head, n_tok, n_seqs), (d, n_head, n_tok, n_seqs)),
          f"g {g.type_str} is not [1 (a decay per head) or {d} (per key channel), {n_head}, ...v's tokens]")
    _need(tuple(s.shape) == (d, d, n_head, n_seqs), f"state {s.type_str} is not [{d}, {d}, {n_head}, n_seqs]")
    return "f32", (numel(v.shape) + numel(s.shape),)


def _lightning_indexer(xs: list[Node], a: dict[str, Any]) -> Type:
    q, k, w, m = xs
    d, n_head, n_tok, n_seqs = _pad4(q.shape)
    kd, k1, n_kv, k_seqs = _pad4(k.shape)
    _need(q.dtype == "f32" and w.dtype == "f32" and m.dtype == "f16",
          f"q {q.type_str} and weights {w.type_str} must be f32, the mask {m.type_str} f16")
    _need(kd == d and k1 == 1 and k_seqs == n_seqs, f"k {k.type_str} is not one key head of q's {d} values")
    _need(tuple(_pad4(w.shape)) == (n_head, n_tok, 1, n_seqs), f"weights {w.type_str} are not one per head and token")
    mm = _pad4(m.shape)
    _need(mm[0] == n_kv and mm[1] == n_tok and mm[2] == 1, f"mask {m.type_str} is not [{n_kv}, {n_tok}]")
    return "f32", _trim((n_kv, n_tok, 1, n_seqs), 2)


def _soft_max(xs: list[Node], a: dict[str, Any]) -> Type:
    x = xs[0]
    if len(xs) >= 2:
        m, s = _pad4(xs[1].shape), _pad4(x.shape)
        _need(m[0] == s[0] and m[1] == s[1], f"mask {xs[1].type_str} does not match scores {x.type_str}")
    if len(xs) == 3:
        sk = xs[2]
        _need(sk.dtype == "f32" and tuple(sk.shape) == (_pad4(x.shape)[2],),
              f"sinks must be f32[{_pad4(x.shape)[2]}] (one per head, ne2 of the scores), got {sk.type_str}")
    return "f32", x.shape


def _add_id(xs: list[Node], a: dict[str, Any]) -> Type:
    x, b, ids = xs
    _need(len(x.shape) == 3, f"expects [n, n_expert_used, n_tokens], got {x.type_str}")
    _need(ids.dtype == "i32" and tuple(ids.shape) == tuple(x.shape[1:]),
          f"ids must be i32[{', '.join(map(str, x.shape[1:]))}], got {ids.type_str}")
    _need(len(b.shape) == 2 and b.shape[0] == x.shape[0], f"biases {b.type_str} are not [{x.shape[0]}, n_expert]")
    return "f32", x.shape


def _reshape(xs: list[Node], a: dict[str, Any]) -> Type:
    x, shape = xs[0], tuple(a["shape"])
    _need(numel(shape) == numel(x.shape), f"cannot reshape {x.type_str} to {list(shape)}")
    return x.dtype, shape


def _view(xs: list[Node], a: dict[str, Any]) -> Type:
    shape, strides = tuple(a["shape"]), tuple(a["strides"])
    _need(len(shape) == len(strides), f"view shape {list(shape)} and strides {list(strides)} differ in rank")
    return xs[0].dtype, shape


def _permute(xs: list[Node], a: dict[str, Any]) -> Type:
    x, axes = xs[0], tuple(a["axes"])
    _need(sorted(axes) == list(range(len(axes))) and len(axes) >= len(x.shape),
          f"axes {list(axes)} are not a permutation for {x.type_str}")
    src = _pad4(x.shape)[: len(axes)]
    out: list[Dim] = [1] * len(axes)
    for i, p in enumerate(axes):
        out[p] = src[i]
    return x.dtype, _trim(out, len(x.shape))


def _cont(xs: list[Node], a: dict[str, Any]) -> Type:
    return xs[0].dtype, xs[0].shape


def _repeat(xs: list[Node], a: dict[str, Any]) -> Type:
    x, shape = xs[0], tuple(a["shape"])
    _need(len(shape) >= len(x.shape) and all(divides(d, n) for d, n in zip(_pad4(x.shape), _pad4(shape))),
          f"cannot repeat {x.type_str} into {list(shape)}")
    return "f32", shape


def _pad(xs: list[Node], a: dict[str, Any]) -> Type:
    x, pad = xs[0], tuple(a["pad"])
    _need(len(pad) == 4 and all(isinstance(p, int) and p >= 0 for p in pad), f"pad={list(pad)} must be 4 counts")
    s = _pad4(x.shape)
    return "f32", _trim([d + p if p else d for d, p in zip(s, pad)], len(x.shape))


def _concat(xs: list[Node], a: dict[str, Any]) -> Type:
    x, y, d = xs[0], xs[1], a["dim"]
    sx, sy = _pad4(x.shape), _pad4(y.shape)
    _need(all(sx[i] == sy[i] for i in range(4) if i != d), f"cannot concat {x.type_str} and {y.type_str} on {d}")
    sx[d] = sx[d] + sy[d]
    return "f32", _trim(sx, max(len(x.shape), len(y.shape)))


def _set_rows(xs: list[Node], a: dict[str, Any]) -> Type:
    dst, src, idx = xs
    if len(idx.shape) == 2:  # batched (ggml's ids [n, B] into a destination [ne0, rows, B]): MoE's group mask
        _need(idx.dtype in INDEX_TYPES, f"row ids must be integer, got {idx.type_str}")
        _need(len(dst.shape) == 3 and len(src.shape) == 3 and src.shape[0] == dst.shape[0]
              and src.shape[1] == idx.shape[0] and src.shape[2] == dst.shape[2] == idx.shape[1],
              f"rows {src.type_str} do not fit {dst.type_str} at batched ids {idx.type_str}")
        return dst.dtype, dst.shape
    _need(idx.dtype in INDEX_TYPES and len(idx.shape) == 1, f"row ids must be integer 1-D, got {idx.type_str}")
    _need(len(src.shape) == 2 and src.shape[0] == dst.shape[0] and src.shape[1] == idx.shape[0],
          f"rows {src.type_str} do not fit {dst.type_str} at ids {idx.type_str}")
    return dst.dtype, dst.shape


def _im2col(xs: list[Node], a: dict[str, Any]) -> Type:
    """[W, H, C, N] -> [C * kh * kw, OW, OH, N]: ggml_im2col's 2-D rows, as f32 or f16 values; kh 0 (s1, p1, d1 0
    too, as ggml_conv_1d passes them), its 1-D rows: [L, C, N] -> [C * kw, OL, N]."""
    x, t = xs[0], a["type"]
    _need(t in ("f32", "f16"), f"im2col writes f32 or f16, not {t}")
    if a["kh"] == 0:
        _need(a["s1"] == a["p1"] == a["d1"] == 0, "a 1-D im2col (kh 0) has no second axis: s1, p1, d1 must be 0")
        _need(all(isinstance(a[k], int) and a[k] > 0 for k in ("kw", "s0", "d0")),
              "kernel size, stride and dilation must be positive ints")
        L, C, N, _ = _pad4(x.shape)
        ol = _conv_out(L, a["kw"], a["s0"], a["p0"], a["d0"])
        return t, _trim((C * a["kw"], ol, N), max(len(x.shape), 2))
    _need(all(isinstance(a[k], int) and a[k] > 0 for k in ("kw", "kh", "s0", "s1", "d0", "d1")),
          "kernel sizes, strides and dilations must be positive ints")
    W, H, C, N = _pad4(x.shape)
    ow, oh = (_conv_out(n, k, s, p, d) for n, k, s, p, d in ((W, a["kw"], a["s0"], a["p0"], a["d0"]),
                                                            (H, a["kh"], a["s1"], a["p1"], a["d1"])))
    return t, _trim((C * a["kh"] * a["kw"], ow, oh, N), max(len(x.shape), 3))


def _conv_out(n: Dim, k: int, s: int, p: int, d: int) -> Dim:
    _need(isinstance(n, int), f"a convolution's input sizes must be concrete, got {n}")
    out = (n + 2 * p - d * (k - 1) - 1) // s + 1
    _need(out > 0, f"a window of {k} (dilation {d}) does not fit {n} values padded by {p}")
    return out


def _pool_2d(xs: list[Node], a: dict[str, Any]) -> Type:
    """[W, H, C, N] -> [OW, OH, C, N] (ggml_pool_2d)."""
    x = xs[0]
    _need(a["pool"] in ("avg", "max"), f"pool_2d pools by avg or max, not {a['pool']}")
    W, H, C, N = _pad4(x.shape)
    ow, oh = (_conv_out(n, k, s, p, 1)
              for n, k, s, p in ((W, a["k0"], a["s0"], a["p0"]), (H, a["k1"], a["s1"], a["p1"])))
    return "f32", _trim((ow, oh, C, N), len(x.shape))


def _interpolate(xs: list[Node], a: dict[str, Any]) -> Type:
    """[W, H, C, N] -> [w, h, C, N] (ggml_interpolate, bilinear)."""
    x = xs[0]
    _need(all(isinstance(n, int) and n > 0 for n in (a["w"], a["h"])),
          f"interpolate's sizes must be positive, got {a['w']} x {a['h']}")
    _need(x.dtype == "f32", f"interpolate resizes f32 planes (as ggml does), not {x.type_str}")
    _, _, C, N = _pad4(x.shape)
    return "f32", _trim((a["w"], a["h"], C, N), max(len(x.shape), 2))


# ---- the catalogue ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OpDef:
    name: str
    kind: str  # leaf | movement | elementwise | unary | norm | reduce | matmul | attention | recurrent | memory
    operands: tuple[str, ...]
    attrs: tuple[str, ...]
    infer: Callable[[list[Node], dict[str, Any]], Type]
    doc: str
    open_attrs: bool = False  # leaves may carry further facts after the listed ones (e.g. a mask's causal flag)
    layout_only: bool = False  # the result holds the operand's values, only laid out differently (a view)
    product: bool = False      # a matrix product: each output value sums rows of ne0 of operand 0 (FLOPs, kernels)
    rows_of_weight: bool = False  # reads operand 0 by rows, so a backend may keep a quantized weight there as it is
    in_place: bool = False     # the result is operand 0 written in place (a memory's buffer), not a fresh value

    @property
    def min_arity(self) -> int:
        return sum(1 for s in self.operands if not s.endswith("?"))


_ROPE_ATTRS = ("n_dims", "mode", "n_ctx_orig", "freq_base", "freq_scale", "ext_factor", "attn_factor",
               "beta_fast", "beta_slow")

OPS: dict[str, OpDef] = {o.name: o for o in (
    OpDef("input", "leaf", (), ("role",), _leaf, "runtime-fed tensor: tokens, positions, masks, ids, cache",
          open_attrs=True),
    OpDef("weight", "leaf", (), ("tensor",), _leaf, "a GGUF tensor, by name; never carries data"),
    OpDef("get_rows", "movement", ("src", "ids"), (), _get_rows, "rows ids of src, dequantized to f32",
          rows_of_weight=True),
    OpDef("mul_mat", "matmul", ("w", "x"), (), _mul_mat, "out[m,n] = sum_k w[k,m] x[k,n], batched over ne2/ne3",
          product=True, rows_of_weight=True),
    OpDef("mul_mat_id", "matmul", ("w", "x", "ids"), (), _mul_mat_id,
          "out[m,i,t] = sum_k w[k,m,ids[i,t]] x[k,i % ne1(x),t]: token t through its i-th selected expert (MoE)",
          product=True, rows_of_weight=True),
    OpDef("im2col", "movement", ("a",), ("kw", "kh", "s0", "s1", "p0", "p1", "d0", "d1", "type"), _im2col,
          "each window of a [W, H, C, N] that a kw x kh kernel (stride s, padding p zeros, dilation d) meets, as one "
          "row of C * kh * kw values (channel-major, then kernel row, then column), as type f32 or f16 (values "
          "rounded); out [C kh kw, OW, OH, N] (ggml_im2col, 2-D); kh = s1 = p1 = d1 = 0: each window of a [L, C, N] "
          "that a kernel of kw meets, as a row of C kw values (channel-major); out [C kw, OL, N] (1-D)"),
    OpDef("pool_2d", "reduce", ("a",), ("pool", "k0", "k1", "s0", "s1", "p0", "p1"), _pool_2d,
          "each k0 x k1 window (stride s, padding p) of every channel of a [W, H, C, N], by its mean (pool avg: the "
          "float32 sum over the window divided by k0 k1) or max; out [OW, OH, C, N] (ggml_pool_2d)"),
    OpDef("interpolate", "movement", ("a",), ("w", "h", "align_corners"), _interpolate,
          "every plane of a [W, H, C, N] resized to w x h bilinearly: each output value from its four nearest inputs "
          "weighted by distance, the corners' centres aligned (align_corners) or the pixels' (ggml_interpolate, "
          "GGML_SCALE_MODE_BILINEAR); out [w, h, C, N]"),
    OpDef("argsort_top_k", "reduce", ("a",), ("k",), _argsort_top_k,
          "indices of the k largest values of each row (ne0), largest first"),
    OpDef("sum_rows", "reduce", ("a",), (), _sum_rows, "sum over ne0, accumulated in double"),
    OpDef("mean", "reduce", ("a",), (), _sum_rows,
          "mean over ne0: the sum accumulated in double, rounded to float32, then divided by ne0 in float32"),
    OpDef("moe_sum", "reduce", ("a",), (), _moe_sum,
          "sum over ne1 (a token's expert slots), slot 0 first, in float32"),
    OpDef("clamp", "unary", ("a",), ("min", "max"), _same, "min(max(a, min), max)"),
    OpDef("fill", "unary", ("a",), ("c",), _filled,
          "f32 of a's shape, every value c; a's values (of any type) are not read (MoE's group mask starts at -inf)"),
    OpDef("cast", "unary", ("a",), ("type",), _cast,
          "a's values as another type: i32 to f32 exactly, f32 to i32 truncated toward zero (ggml_cast)"),
    OpDef("add", "elementwise", ("a", "b"), (), _binary, "a + b, b broadcast by repetition"),
    OpDef("sub", "elementwise", ("a", "b"), (), _binary, "a - b, b broadcast by repetition"),
    OpDef("mul", "elementwise", ("a", "b"), (), _binary, "a * b, b broadcast by repetition"),
    OpDef("div", "elementwise", ("a", "b"), (), _binary, "a / b, b broadcast by repetition"),
    OpDef("scale", "unary", ("a",), ("s",), _same, "a * s"),
    OpDef("scale_bias", "unary", ("a",), ("s", "b"), _same,
          "a * s + b, rounded once (fused) over each row's blocks of four registers, twice in its tail (ggml's mad1)"),
    OpDef("rms_norm", "norm", ("a",), ("eps",), _same, "a / sqrt(mean(a^2) + eps) over ne0"),
    OpDef("norm", "norm", ("a",), ("eps",), _same, "(a - mean) / sqrt(var + eps) over ne0"),
    OpDef("l2_norm", "norm", ("a",), ("eps",), _same, "a / max(sqrt(sum(a^2)), eps) over ne0"),
    OpDef("silu", "unary", ("a",), (), _same, "a * sigmoid(a)"),
    OpDef("gelu", "unary", ("a",), (), _same, "tanh-approximated GELU"),
    OpDef("gelu_erf", "unary", ("a",), (), _same, "GELU by the error function: x (1 + erf(x / sqrt 2)) / 2"),
    OpDef("gelu_quick", "unary", ("a",), (), _same, "a * sigmoid(1.702 a)"),
    OpDef("relu", "unary", ("a",), (), _same, "max(a, 0)"),
    OpDef("sqr", "unary", ("a",), (), _same, "a * a"),
    OpDef("sqrt", "unary", ("a",), (), _same, "sqrt(a), correctly rounded"),
    OpDef("neg", "unary", ("a",), (), _same, "-a"),
    OpDef("exp", "unary", ("a",), (), _same, "e^a"),
    OpDef("tanh", "unary", ("a",), (), _same, "tanh(a)"),
    OpDef("sigmoid", "unary", ("a",), (), _same, "1 / (1 + e^-a)"),
    OpDef("softplus", "unary", ("a",), (), _same, "log(1 + e^a), a itself above 20"),
    OpDef("xielu", "unary", ("a",), ("alpha_n", "alpha_p", "beta", "eps"), _same,
          "xIELU (Apertus): alpha_p a^2 + beta a for a > 0, else (e^min(a, eps) - 1 - a) alpha_n + beta a; the "
          "attributes are ggml's op parameters (alpha_n: beta + softplus of the layer's, alpha_p: softplus of it)"),
    OpDef("swiglu", "elementwise", ("gate", "up"), (), _glu, "silu(gate) * up"),
    OpDef("geglu", "elementwise", ("gate", "up"), (), _glu, "gelu(gate) * up"),
    OpDef("reglu", "elementwise", ("gate", "up"), (), _glu, "relu(gate) * up (0 where gate <= 0)"),
    OpDef("swiglu_oai", "elementwise", ("gate", "up"), ("alpha", "limit"), _glu,
          "g * sigmoid(alpha * g) * (u + 1) with g = min(gate, limit), u = clamp(up, -limit, limit) (gpt-oss)"),
    OpDef("swiglu_clamp", "elementwise", ("gate", "up"), ("limit",), _glu,
          "silu(g) * u with g = min(gate, limit), u = clamp(up, -limit, limit)"),
    OpDef("add_id", "elementwise", ("a", "b", "ids"), (), _add_id,
          "a[:, i, t] + b[:, ids[i, t]]: each token's slot i plus the bias row of the expert it chose"),
    OpDef("rope", "attention", ("a", "pos", "freq_factors?"), _ROPE_ATTRS, _rope,
          "rotary position embedding over the first n_dims of ne0; positions index ne2"),
    OpDef("rope_multi", "attention", ("a", "pos"), _ROPE_ATTRS + ("sections",), _rope_multi,
          "RoPE whose rotated pairs fall into sections (time, height, width, extra; 'imrope': interleaved; 'mrope': "
          "one after the other; 'vision': each section's angles from its own start, pairs n_dims apart over the whole "
          "head), each "
          "section turned by its own position: four a token, section-major (every token's time, then heights, "
          "widths, extras); a text token's are (p, p, p, 0)"),
    OpDef("lightning_indexer", "attention", ("q", "k", "weights", "mask"), (), _lightning_indexer,
          "DeepSeek's sparse-attention indexer: score[j, t] = sum over heads h of max(q[:, h, t] . k[:, 0, j], 0) "
          "w[h, t], plus the (f16) mask; heads summed in order, float32"),
    OpDef("soft_max", "attention", ("a", "mask?", "sinks?"), ("scale", "max_bias"), _soft_max,
          "softmax over ne0 of a*scale + mask; sinks[h]: one more logit of head h (ne2) in the denominator"),
    OpDef("reshape", "movement", ("a",), ("shape",), _reshape, "same elements, new shape (a contiguous)",
          layout_only=True),
    OpDef("view", "movement", ("a",), ("shape", "strides", "offset"), _view,
          "strided window of a; strides and offset in elements", layout_only=True),
    OpDef("permute", "movement", ("a",), ("axes",), _permute, "axis i of a becomes axis axes[i]",
          layout_only=True),
    OpDef("transpose", "movement", ("a",), (), lambda xs, a: _permute(xs, {"axes": (1, 0, 2, 3)}), "swap ne0 and ne1",
          layout_only=True),
    OpDef("cont", "movement", ("a",), (), _cont, "materialise a (strided) view contiguously", layout_only=True),
    OpDef("concat", "movement", ("a", "b"), ("dim",), _concat, "join a and b along dim"),
    OpDef("pad", "movement", ("a",), ("pad",), _pad, "a followed by pad[d] zeros along each dim d (ggml_pad)"),
    OpDef("repeat", "movement", ("a",), ("shape",), _repeat, "a tiled to shape (each of a's sizes divides it)"),
    OpDef("ssm_conv", "recurrent", ("sx", "w"), (), _ssm_conv,
          "depthwise causal conv: y[c,t,s] = sum_j sx[t+j,c,s] w[j,c]; sx holds d_conv-1 state columns first"),
    OpDef("ssm_scan", "recurrent", ("s", "x", "dt", "A", "B", "C"), (), _ssm_scan,
          "Mamba selective scan from states s; returns all y (x's layout) followed by the final states"),
    OpDef("ssm_scan_heads", "recurrent", ("s", "x", "dt", "A", "B", "C"), (), _ssm_scan_heads,
          "Mamba-2 selective scan per head (a scalar decay A[h]; B, C shared by each group of heads) from states s; "
          "returns all y (x's layout) followed by the final states"),
    OpDef("rwkv_wkv6", "recurrent", ("k", "v", "r", "time_first", "decay", "state"), (), _rwkv_wkv6,
          "RWKV6 linear attention per head from states; returns all outputs followed by the final states"),
    OpDef("gated_linear_attn", "recurrent", ("k", "v", "q", "g", "state"), ("scale",), _gated_linear_attn,
          "gated linear attention per head from states: S[i, j] = S[i, j] g[i] + k[i] v[j], out[j] = sum_i "
          "scale q[i] S[i, j]; returns all outputs followed by the final states"),
    OpDef("rwkv_wkv7", "recurrent", ("r", "w", "k", "v", "a", "b", "state"), (), _rwkv_wkv7,
          "RWKV7 linear attention per head from states: S = S diag(w) + (S a) b^T + v k^T, out = S r; returns all "
          "outputs followed by the final states"),
    OpDef("gated_delta_net", "recurrent", ("q", "k", "v", "g", "beta", "s"), (), _gated_delta_net,
          "gated delta rule per value head from states s: decay by e^g, correct toward v by beta along k, read "
          "with q / sqrt(head size); value head h reads key head h % n_key_heads; returns all outputs (v's layout) "
          "followed by the final states"),
    OpDef("set_rows", "memory", ("dst", "src", "ids"), (), _set_rows,
          "write src's rows into dst at ids (with type conversion); the result is dst after the write", in_place=True),
)}


# Named groups, derived from the table: what forms, hashing, builder, memories and backends ask of an op.
LEAVES = frozenset(n for n, d in OPS.items() if d.kind == "leaf")            # input, weight: no operands
UNARY = frozenset(n for n, d in OPS.items() if d.kind == "unary")
BINARY = frozenset(n for n, d in OPS.items() if d.kind == "elementwise" and d.operands == ("a", "b"))
VIEWS = frozenset(n for n, d in OPS.items() if d.layout_only)               # same values, another layout
COMPUTING = frozenset(OPS) - LEAVES                                          # what a backend must run
PRODUCTS = frozenset(n for n, d in OPS.items() if d.product)                # matrix products
ROWS_OF_WEIGHT = frozenset(n for n, d in OPS.items() if d.rows_of_weight)   # operand 0 may stay a packed weight
IN_PLACE = frozenset(n for n, d in OPS.items() if d.in_place)               # write operand 0, a held buffer


def infer(op: str, inputs: list[Node], attrs: dict[str, Any]) -> Type:
    """Check arity and attributes against the catalogue, then apply the op's shape/dtype rule."""
    d = OPS.get(op)
    if d is None:
        raise ShapeError(f"unknown op {op!r}")
    if not d.min_arity <= len(inputs) <= len(d.operands):
        raise ShapeError(f"{op} takes {d.min_arity}..{len(d.operands)} operands, got {len(inputs)}")
    names = tuple(attrs)[: len(d.attrs)] if d.open_attrs else tuple(attrs)
    if names != d.attrs:
        raise ShapeError(f"{op} attributes must be {list(d.attrs)}, got {list(attrs)}")
    return d.infer(inputs, attrs)
