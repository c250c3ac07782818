"""Backend op tests in the style of llama.cpp's test-backend-ops: every op of the catalogue, one tiny graph per case.

Each case names an op, its operands (leaf kind, IR dtype, shape in ggml order, how to fill it) and attributes.
The test builds a graph of leaves plus one op node typed by ``graphir.graph.ops.infer``, runs it through the numba
backend's ``Program`` and compares the result with the reference backend's float64 numpy definition of the op
(graphir.backends.reference.ops, from llama.cpp reference doc section 6, never from the numba kernels).
The metric is llama.cpp's NMSE = sum((out - ref)^2) / sum(ref^2) with a per-case threshold; the result's
shape and dtype must also be exactly what the IR infers.

Thresholds, pinned from the worst NMSE measured over 40 seeds per case, with a margin of 10x or more (run this
file as a script to print every case's NMSE):
  EXACT  1e-10  movement and copy ops, get_rows, set_rows, im2col, pool_2d max: values come through unchanged
                (measured 0); gelu_quick, whose fp16 table the reference reproduces entry for entry (measured 0)
  F32    1e-12  float32 elementwise math, norms, softmax, f32 matmul, pool_2d avg, interpolate (measured <= 3e-14:
                float32 rounding)
  ROPE   1e-10  rope: the backend builds angles by repeated float32 multiplication as ggml does, so they
                drift from the float64 reference by a few ulps (measured <= 2e-12 with positions < 200)
  F16    3e-6   f16 operands: matmul against f16 weights/cache rounds activations to f16 as ggml does,
                f16 data keeps f16 precision (measured <= 3e-7, the worst being the 10-output gemv); gelu and
                geglu read llama.cpp's fp16 GELU table (measured <= 2e-7; its exact semantics: test_gelu_*); im2col
                for an f16 kernel rounds its windows to f16 (measured <= 4e-8)
  QUANT  5e-4   Q8_0 / Q4_1 matmul: activations are quantized to Q8_0 / Q8_1 blocks as on llama.cpp's CPU
                backend (measured <= 5e-5; test-backend-ops itself allows 5e-4 for quantized mul_mat)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gguf
import numpy as np
import pytest

from graphir.backends.numba import tape
from graphir.backends.numba.program import Program
from graphir.backends.numba.steps import KERNELS, kernel
from graphir.backends.numba.primitives.isa import PATHS, IsaPath, numerics
from graphir.backends.numba.quant.weight import QWeight
from graphir.backends.reference.ops import REFERENCES
from graphir.graph.dims import DimDecl, Sym
from graphir.graph.ir import Graph, Node
from graphir.graph.ops import COMPUTING, OPS, infer

GT = gguf.GGMLQuantizationType

T = Sym.named("n_tokens")
KV = Sym.named("n_kv")
CTX = Sym.named("n_ctx")

EXACT, F32, ROPE, F16, QUANT = 1e-10, 1e-12, 1e-10, 3e-6, 5e-4

NP_DTYPE = {"f32": np.float32, "f16": np.float16, "i32": np.int32, "i64": np.int64}


# ---------------------------------------------------------------------------------------------------- the table

@dataclass(frozen=True)
class Src:
    leaf: str                 # "input" (fed at run time) or "weight" (given by the weights function)
    dtype: str                # IR dtype of the leaf
    shape: tuple[Any, ...]    # ggml order (ne0 first), ints or Syms
    init: str = "uniform"     # uniform | ids (with repeats) | uids (distinct) | ruids (distinct per row) | pos | mask
    lo: float = -1.0
    hi: float = 1.0
    n: int = 0                # ids/uids: rows to pick from; pos: positions are in [0, n)
    store: str = "qw"         # weights: "qw" = QWeight.prepare(raw, qtype), "np" = plain float32 array
    strided: bool = False     # feed a non-contiguous array holding the same values


@dataclass(frozen=True)
class Case:
    op: str
    srcs: tuple[Src, ...]
    attrs: dict[str, Any]
    tol: float
    env: dict[str, int] = field(default_factory=dict)
    note: str = ""

    @property
    def id(self) -> str:
        def one(s: Src) -> str:
            w = "w:" if s.leaf == "weight" else ""
            st = "~" if s.strided else ""
            return f"{w}{s.dtype}[{','.join(map(str, s.shape))}]{st}"

        attrs = self.attrs
        if self.op == "rope":  # name n_dims, mode and what differs from the defaults only
            base = rope_attrs(attrs["n_dims"], attrs["mode"])
            attrs = {k: v for k, v in attrs.items() if k in ("n_dims", "mode") or v != base[k]}
        extra = ",".join(f"{k}={v}" for k, v in attrs.items() if k not in ("shape", "strides"))
        return f"{self.op}({' '.join(one(s) for s in self.srcs)}{' ' + extra if extra else ''})" \
               + (f"#{self.note}" if self.note else "")


def I(dtype: str, *shape: Any, **kw: Any) -> Src:
    return Src("input", dtype, shape, **kw)


def W(dtype: str, *shape: Any, **kw: Any) -> Src:
    return Src("weight", dtype, shape, **kw)


def C(op: str, *srcs: Src, tol: float, env: dict[str, int] | None = None, note: str = "", **attrs: Any) -> Case:
    return Case(op, srcs, attrs, tol, env or {}, note)


def rope_attrs(n_dims: int, mode: str, **over: Any) -> dict[str, Any]:
    a = {"n_dims": n_dims, "mode": mode, "n_ctx_orig": 4096, "freq_base": 10000.0, "freq_scale": 1.0,
         "ext_factor": 0.0, "attn_factor": 1.0, "beta_fast": 32.0, "beta_slow": 1.0}
    a.update(over)
    return a


def pos(n: int = 200) -> Src:
    return I("i32", T, init="pos", n=n)


CASES: list[Case] = [
    # get_rows: embeddings / out_ids gathering, from every weight storage and from runtime inputs
    C("get_rows", W("f32", 7, 10, store="np"), I("i32", 5, init="ids", n=10), tol=EXACT, note="odd ne0"),
    C("get_rows", W("f32", 64, 9), I("i32", T, init="ids", n=9), tol=EXACT, env={"n_tokens": 6}),
    C("get_rows", W("f16", 48, 11), I("i32", 4, init="ids", n=11), tol=EXACT),
    C("get_rows", W("bf16", 32, 5), I("i32", 3, init="ids", n=5), tol=EXACT),
    C("get_rows", W("q8_0", 64, 13), I("i32", T, init="ids", n=13), tol=EXACT, env={"n_tokens": 7}),
    C("get_rows", W("q4_1", 96, 10), I("i32", 3, init="ids", n=10), tol=EXACT),
    C("get_rows", I("f32", 5, 8), I("i64", 6, init="ids", n=8), tol=EXACT, note="input src, i64 ids"),
    C("get_rows", I("f16", 6, 9), I("i32", 4, init="ids", n=9), tol=EXACT, note="f16 src -> f32 rows"),
    # mul_mat(w, x): out[m, n] = sum_k w[k, m] x[k, n], w broadcast over x's dims 2/3
    C("mul_mat", W("f32", 16, 12, store="np"), I("f32", 16, 5), tol=F32),
    C("mul_mat", W("f32", 16, 12, store="np"), I("f32", 16, 5, strided=True), tol=F32, note="strided x"),
    C("mul_mat", W("f32", 33, 7), I("f32", 33, T), tol=F32, env={"n_tokens": 3}, note="odd K"),
    C("mul_mat", W("f32", 16, 8, store="np"), I("f32", 16, 3, 4), tol=F32, note="2-D w over 3-D x"),
    C("mul_mat", W("f16", 64, 10), I("f32", 64, 1), tol=F16, note="gemv"),
    C("mul_mat", W("f16", 64, 10), I("f32", 64, 6), tol=F16, note="gemm"),
    C("mul_mat", W("q8_0", 64, 16), I("f32", 64, 1), tol=QUANT, note="gemv"),
    C("mul_mat", W("q8_0", 64, 16), I("f32", 64, 6), tol=QUANT, note="gemm"),
    C("mul_mat", W("q4_1", 96, 12), I("f32", 96, 5), tol=QUANT, note="gemm"),
    C("mul_mat", W("q4_1", 64, 8), I("f32", 64, 2), tol=QUANT, note="gemv"),
    C("mul_mat", W("q8_0", 64, 8), I("f32", 64, 3, 2), tol=QUANT, note="3-D x"),
    C("mul_mat", W("f16", 32, 8), I("f32", 32, T, 2), tol=F16, env={"n_tokens": 3}, note="3-D x"),
    C("mul_mat", I("f32", 16, KV, 2), I("f32", 16, 5, 8), tol=F32, env={"n_kv": 9}, note="kq GQA 8/2"),
    C("mul_mat", I("f16", 8, 11, 2), I("f32", 8, 3, 6), tol=F16, note="kq GQA 6/2, f16 cache"),
    C("mul_mat", I("f16", KV, 8, 2), I("f32", KV, 5, 4), tol=F16, env={"n_kv": 7}, note="kqv GQA 4/2, f16 cache"),
    C("mul_mat", I("f32", 10, 6, 4), I("f16", 10, 3, 4), tol=F32, note="f16 x"),
    C("mul_mat", I("f32", 16, 6, 2, 3), I("f32", 16, 4, 2, 3), tol=F32, note="4-D batch"),
    C("mul_mat", I("f32", 16, 6, 2, 1), I("f32", 16, 4, 4, 3), tol=F32, note="4-D broadcast nr=[2,3]"),
    C("mul_mat", I("f32", 16, 6, 2), I("f32", 16, 4, 4, 3), tol=F32, note="3-D w over 4-D x"),
    # add / mul: b repeated over a (every b size divides a's)
    C("add", I("f32", 7, 5), I("f32", 7, 5), tol=F32),
    C("add", I("f32", 16, T), W("f32", 16), tol=F32, env={"n_tokens": 5}, note="bias"),
    C("add", I("f32", 8, 4, T), I("f32", 8, 1, T), tol=F32, env={"n_tokens": 3}),
    C("add", I("f32", 12, 6, 4), I("f32", 4, 3, 2), tol=F32, note="repeat"),
    C("add", I("f32", 16, 5), I("f16", 16, 5), tol=F32, note="f16 b"),
    C("add", I("f16", 16, 5), I("f16", 16), tol=F16, note="f16 a and b"),
    C("add", I("f32", 6, 4, 3, 2), I("f32", 6, 1, 3, 1), tol=F32),
    C("sub", I("f32", 16, T), W("f32", 16), tol=F32, env={"n_tokens": 4}, note="bias"),
    C("sub", I("f32", 12, 6, 4), I("f32", 4, 3, 2), tol=F32, note="repeat"),
    C("sub", I("f32", 6, 4, 3, 2), I("f32", 6, 1, 3, 1), tol=F32),
    C("mul", I("f32", 8, 4, T), W("f32", 8), tol=F32, env={"n_tokens": 3}, note="per-head norm weight"),
    C("mul", I("f32", 10, 7), I("f32", 10, 7), tol=F32),
    C("mul", I("f32", 9, 6, 4), I("f32", 3, 2, 4), tol=F32, note="repeat"),
    C("mul", I("f32", 16, 3), I("f16", 16), tol=F32, note="f16 b"),
    C("mul", I("f16", 8, 3), I("f16", 8, 3), tol=F16, note="f16 a and b"),
    # unary / norms
    C("scale", I("f32", 7, 5), s=0.125, tol=F32),
    C("scale", I("f32", 16, 4, 3), s=-3.5, tol=F32),
    C("scale", I("f16", 8, 5), s=2.0, tol=F32, note="f16 a"),
    C("rms_norm", I("f32", 64, 5), eps=1e-5, tol=F32),
    C("rms_norm", I("f32", 33, 4, 3), eps=1e-6, tol=F32, note="odd rows"),
    C("rms_norm", I("f32", 16, T, lo=-100, hi=100), eps=1e-5, tol=F32, env={"n_tokens": 4}),
    C("rms_norm", I("f16", 32, 4), eps=1e-5, tol=F32, note="f16 a"),
    C("norm", I("f32", 64, 5), eps=1e-5, tol=F32),
    C("norm", I("f32", 31, 3, 2, lo=2, hi=4), eps=1e-5, tol=F32, note="offset mean"),
    C("norm", I("f32", 16, 1), eps=1e-6, tol=F32),
    C("l2_norm", I("f32", 64, 2, 5), eps=1e-12, tol=F32, note="RWKV7's kk"),
    C("l2_norm", I("f32", 33, T, lo=-1e-7, hi=1e-7), eps=1e-6, tol=F32, env={"n_tokens": 3}, note="eps bites"),
    C("silu", I("f32", 7, 5), tol=F32),
    C("silu", I("f32", 16, 4, 3, lo=-8, hi=8), tol=F32),
    C("silu", I("f16", 10, 3), tol=F16, note="f16 a"),
    C("gelu", I("f32", 7, 5), tol=F16),
    C("gelu", I("f32", 16, 4, 3, lo=-12, hi=12), tol=F16),
    C("gelu_erf", I("f32", 7, 5, lo=-6, hi=6), tol=F32),
    C("gelu_erf", I("f32", 40, 12, lo=-4, hi=4), tol=F32, note="an audio tower's conv rows"),
    C("relu", I("f32", 7, 5), tol=F32),
    C("relu", I("f32", 6, 4, 3, 2), tol=F32),
    C("sqr", I("f32", 7, 5), tol=F32),
    C("sqr", I("f16", 8, 3), tol=F32, note="f16 a"),
    C("neg", I("f32", 7, 5), tol=F32),
    C("neg", I("f32", 6, 4, 3, 2), tol=F32),
    C("exp", I("f32", 7, 5, lo=-80, hi=80), tol=F32),
    C("exp", I("f32", 16, 4, T, lo=-5, hi=5), tol=F32, env={"n_tokens": 3}),
    C("tanh", I("f32", 7, 5, lo=-4, hi=4), tol=F32),
    C("tanh", I("f32", 16, 4, 3, lo=-0.01, hi=0.01), tol=F32, note="near 0"),
    C("sigmoid", I("f32", 7, 5, lo=-20, hi=20), tol=F32),
    C("sigmoid", I("f16", 16, 3), tol=F32, note="f16 a"),
    C("softplus", I("f32", 7, 5, lo=-30, hi=30), tol=F32, note="both sides of 20"),
    C("softplus", I("f32", 16, 4, T, lo=-5, hi=5), tol=F32, env={"n_tokens": 3}),
    C("swiglu", I("f32", 11, 5), I("f32", 11, 5), tol=F32),
    C("swiglu", I("f32", 16, 3, 2, lo=-4, hi=4), I("f32", 16, 3, 2), tol=F32),
    C("swiglu_oai", I("f32", 37, 4, lo=-12, hi=12), I("f32", 37, 4, lo=-12, hi=12), alpha=1.7020000219345093,
      limit=7.0, tol=F32, note="both clamps hit"),
    C("swiglu_oai", I("f32", 16, 3, 2, lo=-3, hi=3), I("f32", 16, 3, 2), alpha=1.0, limit=2.5, tol=F32),
    C("xielu", I("f32", 37, 4, lo=-12, hi=12), tol=F32, alpha_n=1.6711006, alpha_p=1.1711006, beta=0.5, eps=-1e-6,
      note="both branches"),
    C("xielu", I("f32", 16, 3, T, lo=-1e-5, hi=1e-5), tol=F32, env={"n_tokens": 2}, alpha_n=1.3132616,
      alpha_p=1.3132616, beta=1.0, eps=1e-7, note="around 0 and eps"),
    C("swiglu_clamp", I("f32", 37, 4, lo=-12, hi=12), I("f32", 37, 4, lo=-12, hi=12), limit=7.0, tol=F32,
      note="both clamps hit"),
    C("swiglu_clamp", I("f32", 16, 3, 2, lo=-3, hi=3), I("f32", 16, 3, 2), limit=2.5, tol=F32),
    C("geglu", I("f32", 11, 5), I("f32", 11, 5), tol=F16),
    C("geglu", I("f32", 16, 3, 2, lo=-12, hi=12), I("f32", 16, 3, 2), tol=F16),
    C("reglu", I("f32", 11, 5), I("f32", 11, 5), tol=F32),
    C("reglu", I("f32", 16, 3, 2, lo=-4, hi=4), I("f32", 16, 3, 2), tol=F32),
    # rope: x [d, heads, tokens(, seqs)], positions index ne2
    C("rope", I("f32", 16, 4, T), pos(), tol=ROPE, env={"n_tokens": 5}, **rope_attrs(16, "norm")),
    C("rope", I("f32", 16, 3, T), pos(), tol=ROPE, env={"n_tokens": 7}, **rope_attrs(16, "neox")),
    C("rope", I("f32", 16, 2, T), pos(), tol=ROPE, env={"n_tokens": 4}, note="partial",
      **rope_attrs(8, "neox", freq_base=500000.0)),
    C("rope", I("f32", 12, 3, T), pos(), tol=ROPE, env={"n_tokens": 3}, note="partial", **rope_attrs(6, "norm")),
    C("rope", I("f32", 16, 2, T), pos(), W("f32", 8, lo=1, hi=8), tol=ROPE, env={"n_tokens": 6},
      note="freq factors", **rope_attrs(16, "neox")),
    C("rope", I("f32", 16, 2, T), pos(), tol=ROPE, env={"n_tokens": 5}, note="yarn",
      **rope_attrs(16, "neox", freq_scale=0.25, ext_factor=1.0)),
    C("rope", I("f32", 16, 2, T), pos(), W("f32", 8, lo=1, hi=4), tol=ROPE, env={"n_tokens": 4},
      note="yarn + freq factors", **rope_attrs(16, "norm", freq_scale=0.5, ext_factor=0.5, attn_factor=0.9)),
    C("rope", I("f32", 8, 2, T, 2), pos(), tol=ROPE, env={"n_tokens": 3}, note="4-D",
      **rope_attrs(8, "norm", freq_scale=0.5, attn_factor=0.5)),
    C("rope", I("f16", 8, 2, T), pos(), tol=F16, env={"n_tokens": 4}, note="f16 a", **rope_attrs(8, "neox")),
    # rope_multi: sections of rotated pairs, interleaved (imrope), each turned by its own positions (four a token)
    C("rope_multi", I("f32", 24, 2, T), I("i32", 4 * T, init="pos", n=200), tol=ROPE, env={"n_tokens": 5},
      note="partial, extra section",
      sections=(3, 3, 1, 1), **rope_attrs(16, "imrope")),
    C("rope_multi", I("f32", 64, 2, T), I("i32", 4 * T, init="pos", n=200), tol=ROPE, env={"n_tokens": 3},
      note="Qwen3.5's sections",
      sections=(11, 11, 10, 0), **rope_attrs(64, "imrope", freq_base=10000000.0)),
    C("rope_multi", I("f32", 16, 3, T), I("i32", 4 * T, init="pos", n=200), tol=ROPE, env={"n_tokens": 6},
      note="vision, Qwen2-VL's sections", sections=(4, 4, 4, 4), **rope_attrs(8, "vision")),
    # soft_max over ne0 of a*scale + mask (mask rows follow ne1, broadcast over dims 2/3)
    C("soft_max", I("f32", 10, 4), scale=1.0, max_bias=0.0, tol=F32),
    C("soft_max", I("f32", KV, T, 4), I("f32", KV, T, init="mask"), scale=0.125, max_bias=0.0, tol=F32,
      env={"n_kv": 9, "n_tokens": 5}, note="kq"),
    C("soft_max", I("f32", 37, 3, 2), I("f16", 37, 3, init="mask"), scale=0.5, max_bias=0.0, tol=F32,
      note="f16 mask"),
    C("soft_max", I("f32", 16, 6, lo=-50, hi=50), scale=1.0, max_bias=0.0, tol=F32, note="large logits"),
    C("soft_max", I("f32", 8, 3, 2, 2), I("f32", 8, 3, init="mask"), scale=0.3, max_bias=0.0, tol=F32),
    C("soft_max", I("f32", 8, 3, 4), I("f32", 8, 3, 2, init="mask"), scale=1.0, max_bias=0.0, tol=F32,
      note="mask ne2 broadcast by modulo"),
    C("soft_max", I("f32", KV, T, 4), I("f32", KV, T, init="mask"), I("f32", 4, lo=-3, hi=6), scale=0.125,
      max_bias=0.0, tol=F32, env={"n_kv": 9, "n_tokens": 5}, note="sinks, one per head"),
    C("soft_max", I("f32", 20, 3, 2, lo=-50, hi=50), I("f32", 20, 3, init="mask"), I("f32", 2, lo=40, hi=60),
      scale=1.0, max_bias=0.0, tol=F32, note="sinks above every score"),
    # ALiBi: the mask's distances times a slope per head (12 heads: 8 of ggml's m0 powers, 4 of m1's)
    C("soft_max", I("f32", KV, T, 12), I("f32", KV, T, lo=-30, hi=0), scale=0.125, max_bias=8.0, tol=F32,
      env={"n_kv": 9, "n_tokens": 5}, note="ALiBi, 12 heads"),
    C("soft_max", I("f32", KV, T, 4), I("f16", KV, T, lo=-30, hi=0), scale=1.0, max_bias=4.0, tol=F32,
      env={"n_kv": 20, "n_tokens": 3}, note="ALiBi, f16 mask"),
    # movement
    C("reshape", I("f32", 64, T), shape=(8, 8, T), tol=EXACT, env={"n_tokens": 3}),
    C("reshape", I("f32", 8, 4, T), shape=(32, T), tol=EXACT, env={"n_tokens": 5}),
    C("reshape", I("f32", 6, 5, 4, 3), shape=(360,), tol=EXACT),
    C("reshape", I("f16", 12, 5), shape=(4, 3, 5), tol=EXACT),
    C("view", I("f32", 24, 5), shape=(8, 5), strides=(1, 24), offset=8, tol=EXACT, note="fused qkv: k"),
    C("view", I("f32", 24, 5), shape=(4, 2, 5), strides=(1, 4, 24), offset=16, tol=EXACT, note="fused qkv: v"),
    C("view", I("f16", 12, CTX), shape=(4, 3, KV), strides=(1, 4, 12), offset=0, tol=EXACT,
      env={"n_ctx": 10, "n_kv": 6}, note="cache window"),
    C("view", I("f32", 5, 6, 4), shape=(3, 2, 4), strides=(1, 5, 30), offset=7, tol=EXACT, note="sub-block"),
    C("view", I("f32", 48, 2), shape=(4, 3, 2, 2), strides=(1, 4, 12, 48), offset=0, tol=EXACT, note="4-D"),
    C("view", I("f32", CTX, 4), shape=(3, 4), strides=(1, CTX), offset=CTX - 3, tol=EXACT, env={"n_ctx": 7},
      note="symbolic strides and offset: each row's last 3"),
    C("view", I("f32", 6, T, 2), shape=(6, 2), strides=(1, T * 6), offset=(T - 1) * 6, tol=EXACT,
      env={"n_tokens": 4}, note="symbolic: last token of each sequence"),
    C("permute", I("f32", 8, 4, 5), axes=(0, 2, 1, 3), tol=EXACT),
    C("permute", I("f32", 8, 2, 6), axes=(1, 2, 0, 3), tol=EXACT),
    C("permute", I("f32", 3, 4, 5, 2), axes=(2, 0, 3, 1), tol=EXACT),
    C("permute", I("f16", 4, 3, KV), axes=(0, 2, 1, 3), tol=EXACT, env={"n_kv": 5}),
    C("permute", I("f32", 6, 5), axes=(0, 2, 1, 3), tol=EXACT, note="2-D to 3-D"),
    C("permute", I("f32", 4, 3, 5), axes=(0, 1, 3, 2), tol=EXACT, note="3-D to 4-D"),
    C("transpose", I("f32", 7, 5), tol=EXACT),
    C("transpose", I("f32", 4, 3, 2), tol=EXACT),
    C("transpose", I("f16", 6, 4), tol=EXACT),
    C("transpose", I("f32", 5), tol=EXACT, note="vector to column"),
    C("cont", I("f32", 7, 5, strided=True), tol=EXACT),
    C("cont", I("f16", 4, 6, 3, strided=True), tol=EXACT),
    C("cont", I("f32", 5, 3), tol=EXACT),
    C("pad", I("f32", 5, 3), pad=(7, 0, 0, 0), tol=EXACT, note="deepstack's token rows"),
    C("pad", I("f32", 4, 3, 2), pad=(1, 2, 0, 1), tol=EXACT),
    C("concat", I("f32", 5, 3), I("f32", 4, 3), dim=0, tol=EXACT),
    C("concat", I("f32", 6, 2, 4), I("f32", 6, 3, 4), dim=1, tol=EXACT),
    C("concat", I("f32", 4, 3, 2), I("f32", 4, 3, 5), dim=2, tol=EXACT),
    C("concat", I("f32", 3, 2, 2, 3), I("f32", 3, 2, 2, 1), dim=3, tol=EXACT),
    C("concat", I("f32", 4, 3), I("f32", 4, 3), dim=2, tol=EXACT, note="new axis"),
    C("concat", I("f16", 4, 5), I("f16", 4, 2), dim=1, tol=EXACT, note="f16"),
    # ssm_conv(sx [d_conv-1+T, Di, S], w [d_conv, Di]) -> [Di, T, S]
    C("ssm_conv", I("f32", 3 + T, 16, 2), W("f32", 4, 16), tol=F32, env={"n_tokens": 5}),
    C("ssm_conv", I("f32", 4, 24, 1), W("f32", 4, 24), tol=F32, note="decode"),
    C("ssm_conv", I("f32", 2 + T, 9, 3, strided=True), W("f32", 3, 9, store="np"), tol=F32, env={"n_tokens": 4},
      note="d_conv 3, strided sx"),
    # ssm_scan(s [Ds, Di, S], x, dt [Di, T, S], A [Ds, Di], B, C [Ds, T, S]) -> y then final states, flat
    *[C("ssm_scan", I("f32", 16, Di, S), I("f32", Di, T, S, lo=-2, hi=2), I("f32", Di, T, S, lo=lo, hi=hi),
        W("f32", 16, Di, lo=-2, hi=-0.1), I("f32", 16, T, S), I("f32", 16, T, S), tol=F32, env={"n_tokens": n},
        note=note)
      for Di, S, n, lo, hi, note in ((24, 1, 1, -4, 4, "decode"), (24, 2, 1, -4, 4, "2 seqs, T=1"),
                                     (16, 1, 6, -4, 4, "prompt"), (16, 3, 4, -4, 4, "3 seqs"),
                                     (16, 2, 3, 10, 30, "dt > 20 branch"))],
    C("ssm_scan", I("f32", 5, 8, 2), I("f32", 8, 3, 2), I("f32", 8, 3, 2), W("f32", 5, 8, lo=-1, hi=-0.5, store="np"),
      I("f32", 5, 3, 2, strided=True), I("f32", 5, 3, 2), tol=F32, note="d_state 5, strided B"),
    # ssm_scan_heads(s [Ds, P, H, S], x [P, H, T, S], dt [H, T, S], A [1, H], B, C [Ds, G, T, S]) -> y, states
    *[C("ssm_scan_heads", I("f32", Ds, P, H, S), I("f32", P, H, n, S, lo=-2, hi=2), I("f32", H, n, S, lo=lo, hi=hi),
        W("f32", 1, H, lo=-2, hi=-0.1), I("f32", Ds, G, n, S), I("f32", Ds, G, n, S), tol=F32, note=note)
      for Ds, P, H, G, n, S, lo, hi, note in ((16, 8, 4, 2, 1, 1, -4, 4, "decode, 2 groups"),
                                                (16, 4, 4, 1, 3, 2, -4, 4, "2 seqs x 3 tokens"),
                                                (80, 4, 2, 2, 5, 1, -4, 4, "80 states: SIMD steps and a tail"),
                                                (16, 4, 2, 1, 2, 2, 10, 30, "dt > 20 branch"))],
    # rwkv_wkv6(k, v, r [hs, H, T], time_first [hs, H], decay [hs, H, T], state [hs*hs*H, S]) -> [hs*H, T + hs*S]
    C("rwkv_wkv6", I("f32", 8, 2, 6), I("f32", 8, 2, 6), I("f32", 8, 2, 6), W("f32", 8, 2),
      I("f32", 8, 2, 6, lo=0.2, hi=1), I("f32", 128, 2), tol=F32, note="2 seqs x 3 tokens"),
    C("rwkv_wkv6", I("f32", 16, 3, T), I("f32", 16, 3, T), I("f32", 16, 3, T), W("f32", 16, 3),
      I("f32", 16, 3, T, lo=0.2, hi=1), I("f32", 768, 1), tol=F32, env={"n_tokens": 1}, note="decode"),
    C("rwkv_wkv6", I("f32", 4, 2, 4, strided=True), I("f32", 4, 2, 4), I("f32", 4, 2, 4), W("f32", 4, 2, store="np"),
      I("f32", 4, 2, 4, lo=0.2, hi=1), I("f32", 32, 1), tol=F32, note="1 seq x 4 tokens, strided k"),
    # gated_linear_attn(k, v, q, g [hs, H, T], state [hs*hs*H, S]) -> [hs*H, T + hs*S]
    C("gated_linear_attn", I("f32", 8, 2, 6), I("f32", 8, 2, 6), I("f32", 8, 2, 6), I("f32", 8, 2, 6, lo=0.2, hi=1),
      I("f32", 128, 2), tol=F32, scale=8 ** -0.5, note="2 seqs x 3 tokens"),
    C("gated_linear_attn", I("f32", 16, 3, T), I("f32", 16, 3, T), I("f32", 16, 3, T), I("f32", 16, 3, T, lo=0.2, hi=1),
      I("f32", 768, 1), tol=F32, env={"n_tokens": 1}, scale=0.25, note="decode"),
    C("gated_linear_attn", I("f32", 4, 2, 4, strided=True), I("f32", 4, 2, 4), I("f32", 4, 2, 4),
      I("f32", 4, 2, 4, lo=0.2, hi=1), I("f32", 32, 1), tol=F32, scale=0.5, note="1 seq x 4 tokens, strided k"),
    # rwkv_wkv7(r, w, k, v, a, b [hs, H, T], state [hs*hs*H, S]) -> [hs*H, T + hs*S]
    *[C("rwkv_wkv7", I("f32", hs, H, n), I("f32", hs, H, n, lo=0.5, hi=1), I("f32", hs, H, n), I("f32", hs, H, n),
        I("f32", hs, H, n, lo=-0.2, hi=0.2), I("f32", hs, H, n, lo=-0.2, hi=0.2), I("f32", hs * hs * H, S), tol=F32,
        note=note)
      for hs, H, n, S, note in ((64, 2, 6, 2, "2 seqs x 3 tokens"), (64, 1, 1, 1, "decode"),
                                (128, 1, 2, 1, "head 128"), (20, 2, 2, 1, "head 20: steps and a tail"))],
    # gated_delta_net(q, k [d, Hk, T, S], v [d, H, T, S], g [1 or d, H, T, S], beta [1, H, T, S], s [d, d, H, S])
    # -> y, states; g of d: a decay per key channel (Kimi's delta rule)
    *[C("gated_delta_net", I("f32", d, Hk, n, S, lo=-0.4, hi=0.4), I("f32", d, Hk, n, S, lo=-kr, hi=kr),
        I("f32", d, H, n, S, strided=strided), I("f32", gw, H, n, S, lo=-1, hi=0), I("f32", 1, H, n, S, lo=0, hi=1),
        I("f32", d, d, H, S), tol=F32, note=note)
      for d, Hk, H, n, S, kr, strided, gw, note in (
          (16, 2, 4, 3, 2, 0.4, False, 1, "2 seqs x 3 tokens, shared k heads"),
          (80, 1, 2, 1, 1, 0.2, False, 1, "decode, 80 wide: SIMD steps and a tail"),
          (16, 2, 2, 4, 1, 0.4, True, 1, "strided v"),
          (16, 2, 2, 3, 2, 0.4, False, 16, "a decay per key channel, 2 seqs x 3 tokens"),
          (80, 1, 1, 1, 1, 0.2, False, 80, "a decay per key channel, decode, 80 wide"))],
    # lightning_indexer(q [d, H, T], k [d, 1, n_kv] (the f16 indexer cache), weights [H, T], mask f16 [n_kv, T])
    C("lightning_indexer", I("f32", 128, 8, T), I("f16", 128, 1, KV), I("f32", 8, T), I("f16", KV, T, lo=-8, hi=0),
      tol=F32, env={"n_tokens": 5, "n_kv": 9}, note="prompt, DeepSeek-V3.2's head size"),
    C("lightning_indexer", I("f32", 40, 3, 1), I("f32", 40, 1, 7, strided=True), I("f32", 3, 1),
      I("f16", 7, 1, lo=-8, hi=0), tol=F32, note="decode, 40 wide: SIMD steps and a tail, strided f32 keys"),
    C("lightning_indexer", I("f32", 16, 4, 3, 2), I("f16", 16, 1, 6, 2), I("f32", 4, 3, 1, 2),
      I("f16", 6, 3, 1, 1, lo=-8, hi=0), tol=F32, note="2 streams, one mask for both"),
    # set_rows: dst[:, ids[i]] = src[:, i], converted to dst's type
    C("set_rows", I("f16", 12, CTX), I("f32", 12, T), I("i64", T, init="uids", n=16), tol=EXACT,
      env={"n_ctx": 16, "n_tokens": 5}, note="kv write"),
    C("set_rows", I("f32", 7, 9), I("f32", 7, 3), I("i32", 3, init="uids", n=9), tol=EXACT),
    C("set_rows", I("f16", 16, 8), I("f32", 16, 1), I("i64", 1, init="uids", n=8), tol=EXACT, note="decode"),
    # mixture of experts: mul_mat_id(w [K, M, n_expert], x [K, 1 or n_used, T], ids [n_used, T]) -> [M, n_used, T]
    C("mul_mat_id", W("f32", 32, 12, 6, store="np"), I("f32", 32, 1, T), I("i32", 2, T, init="ids", n=6), tol=F32,
      env={"n_tokens": 5}, note="float array, a row per token"),
    C("mul_mat_id", W("f32", 33, 8, 4), I("f32", 33, 3, T), I("i32", 3, T, init="ids", n=4), tol=F32,
      env={"n_tokens": 4}, note="odd K, a row per slot"),
    C("mul_mat_id", W("f16", 64, 10, 4), I("f32", 64, 1, 1), I("i32", 2, 1, init="ids", n=4), tol=F16, note="decode"),
    C("mul_mat_id", W("f16", 64, 16, 3), I("f32", 64, 1, 9), I("i32", 3, 9, init="ids", n=3), tol=F16),
    C("mul_mat_id", W("q8_0", 64, 16, 8), I("f32", 64, 1, T), I("i32", 4, T, init="ids", n=8), tol=QUANT,
      env={"n_tokens": 7}),
    C("mul_mat_id", W("q8_0", 64, 8, 5), I("f32", 64, 2, 1), I("i32", 2, 1, init="ids", n=5), tol=QUANT, note="decode"),
    C("mul_mat_id", W("q4_k", 256, 8, 4), I("f32", 256, 1, T), I("i32", 2, T, init="ids", n=4), tol=QUANT,
      env={"n_tokens": 6}),
    C("mul_mat_id", W("q4_k", 256, 4, 6), I("f32", 256, 1, 1), I("i32", 4, 1, init="ids", n=6), tol=QUANT,
      note="decode"),
    # routing: the selected experts (top k, largest first), their probabilities (batched get_rows), normalisation
    C("argsort_top_k", I("f32", 8, T), k=2, tol=EXACT, env={"n_tokens": 5}),
    C("argsort_top_k", I("f32", 128, 3), k=8, tol=EXACT),
    C("argsort_top_k", I("f32", 4, 1), k=4, tol=EXACT, note="all"),
    C("get_rows", I("f32", 1, 8, T), I("i32", 2, T, init="ids", n=8), tol=EXACT, env={"n_tokens": 4}, note="batched"),
    C("get_rows", I("f32", 3, 5, 2), I("i32", 4, 2, init="ids", n=5), tol=EXACT, note="batched, 3 wide"),
    C("get_rows", I("f32", 1, 4, 3, T), I("i32", 2, 3, T, init="ids", n=4), tol=EXACT, env={"n_tokens": 2},
      note="batched twice: each group's top 2"),
    # GroveMoE's expert ids divided by the group size: ids to f32 and back, truncated toward zero
    C("cast", I("i32", 4, T, init="ids", n=9), type="f32", tol=EXACT, env={"n_tokens": 3}),
    C("cast", I("f32", 5, 3, lo=-4.0, hi=4.0), type="i32", tol=EXACT, note="negative and fractional values truncated"),
    # group-limited routing's mask: every score -inf, then the kept groups' rows written back per token
    C("fill", I("f32", 4, 3, T), c=-2.5, tol=EXACT, env={"n_tokens": 2}),
    C("fill", I("f16", 7, 2), c=0.75, tol=EXACT, note="f16 shape, f32 values"),
    C("set_rows", I("f32", 4, 5, T), I("f32", 4, 2, T), I("i32", 2, T, init="ruids", n=5), tol=EXACT,
      env={"n_tokens": 3}, note="batched"),
    # repeat: a tiled to shape (the legacy MLA's key part, one head repeated to every head)
    C("repeat", I("f32", 4, 1, T), shape=(4, 3, T), tol=EXACT, env={"n_tokens": 2}),
    C("repeat", I("f32", 2, 3), shape=(4, 3, 2), tol=EXACT, note="tiled in two dims, a new one"),
    C("sum_rows", I("f32", 8, T), tol=F32, env={"n_tokens": 3}),
    C("sum_rows", I("f32", 7, 4, 2, lo=0, hi=1), tol=F32),
    # Gemma 3n: a row's mean and the square root of its variance (the FFN's sparsity cutoff, AltUp's magnitudes),
    # the coefficients of AltUp's correction plus one (scale_bias: fused over 4-register steps, the tail not)
    C("mean", I("f32", 96, T), tol=F32, env={"n_tokens": 3}),
    C("mean", I("f32", 7, 4, 2, lo=0, hi=1), tol=F32),
    C("sqrt", I("f32", 64, T, lo=0, hi=4), tol=F32, env={"n_tokens": 2}),
    C("sqrt", I("f32", 1, 5, 3, lo=0, hi=1e-3), tol=F32, note="small"),
    C("scale_bias", I("f32", 4, T), s=1.0, b=1.0, tol=F32, env={"n_tokens": 3}, note="AltUp's + 1"),
    C("scale_bias", I("f32", 150, 3, lo=-3, hi=3), s=0.37, b=-1.25, tol=F32, note="fused steps and a tail"),
    C("moe_sum", I("f32", 16, 4, T), tol=F32, env={"n_tokens": 3}),
    C("moe_sum", I("f32", 8, 1, 2), tol=F32, note="one slot"),
    C("add_id", I("f32", 16, 2, T), I("f32", 16, 5), I("i32", 2, T, init="ids", n=5), tol=F32,
      env={"n_tokens": 3}),
    C("add_id", I("f32", 7, 4, 2), W("f32", 7, 6, store="np"), I("i32", 4, 2, init="ids", n=6), tol=F32,
      note="bias table a weight"),
    C("clamp", I("f32", 7, 5, lo=-1e-4, hi=1e-4), min=6.103515625e-5, max=float("inf"), tol=F32, note="f16 floor"),
    C("clamp", I("f32", 16, 3, lo=-3, hi=3), min=-1.0, max=2.0, tol=F32),
    C("div", I("f32", 8, T), I("f32", 1, T, lo=0.5, hi=2), tol=F32, env={"n_tokens": 3}, note="by row sums"),
    C("div", I("f32", 7, 5), I("f32", 7, 5, lo=1, hi=3), tol=F32),
    # vision towers (llama.cpp's tools/mtmd clip graphs): a patch embedding is ggml_conv_2d, im2col's windows by the
    # kernel (a weight, operand 1); Gemma 3 pools its patches 4 x 4; the FFN's gelu_quick
    *[C("im2col", I("f32", 42, 28, 3), kw=14, kh=14, s0=14, s1=14, p0=0, p1=0, d0=1, d1=1, type=t, tol=tol,
        note="14x14 patches") for t, tol in (("f16", F16), ("f32", EXACT))],
    C("im2col", I("f32", 9, 7, 2, 2), kw=3, kh=2, s0=2, s1=1, p0=1, p1=2, d0=2, d1=1, type="f32", tol=EXACT,
      note="padded, dilated, 2 images"),
    # audio towers: Whisper's front end is ggml_conv_1d twice (kernel 3, padding 1; the second of stride 2), im2col's
    # 1-D form (kh, s1, p1, d1 all 0, as ggml_conv_1d passes them)
    *[C("im2col", I("f32", 40, 5), kw=3, kh=0, s0=s0, s1=0, p0=1, p1=0, d0=1, d1=0, type=t, tol=tol,
        note=f"1-D, stride {s0}") for t, tol in (("f16", F16), ("f32", EXACT)) for s0 in (1, 2)],
    C("im2col", I("f32", 11, 3, 2), kw=4, kh=0, s0=3, s1=0, p0=2, p1=0, d0=2, d1=0, type="f32", tol=EXACT,
      note="1-D, padded, dilated, 2 signals"),
    C("mul_mat", I("f16", 588, 6), W("f16", 588, 8), tol=F16, note="patch embedding, f16"),
    C("mul_mat", I("f32", 64, 3), W("f32", 64, 5), tol=F32, note="patch embedding, f32, 3 rows"),
    C("pool_2d", I("f32", 8, 8, 5), pool="avg", k0=4, k1=4, s0=4, s1=4, p0=0, p1=0, tol=F32, note="Gemma 3's"),
    C("pool_2d", I("f32", 7, 6, 3), pool="avg", k0=3, k1=2, s0=2, s1=2, p0=1, p1=1, tol=F32,
      note="padded: the padding counts"),
    C("pool_2d", I("f32", 7, 6, 3, 2), pool="max", k0=3, k1=3, s0=2, s1=1, p0=1, p1=1, tol=EXACT, note="padded"),
    # Qwen3-VL's learned positions, a 4 x 4 grid resized to a picture's patches (corners aligned), up and down
    *[C("interpolate", I("f32", 4, 4, 6), w=w, h=h, align_corners=True, tol=F32, note=f"positions to {w} x {h}")
      for w, h in ((6, 10), (2, 3), (1, 5))],
    C("interpolate", I("f32", 5, 3, 2, 2), w=8, h=4, align_corners=False, tol=F32, note="pixels' centres aligned"),
    C("gelu_quick", I("f32", 7, 5), tol=EXACT),
    C("gelu_quick", I("f32", 16, 4, 3, lo=-30, hi=30), tol=EXACT),
]


# ---------------------------------------------------------------------------------------------------- data

def np_shape(shape: tuple[Any, ...], env: dict[str, int]) -> tuple[int, ...]:
    return tuple(d.eval(env) if isinstance(d, Sym) else d for d in reversed(shape))


def _strided(a: np.ndarray) -> np.ndarray:
    """The same values, every second element of a twice-as-wide buffer: not C-contiguous."""
    big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
    big[..., ::2] = a
    out = big[..., ::2]
    assert not out.flags.c_contiguous and np.array_equal(out, a)
    return out


def deq_q8_0(raw: np.ndarray, ne0: int) -> np.ndarray:
    """Q8_0 block (34 bytes): d f16, qs int8[32]; x = d * q."""
    b = raw.reshape(raw.shape[0], -1, 34)
    d = np.ascontiguousarray(b[..., :2]).view(np.float16).astype(np.float64)
    q = np.ascontiguousarray(b[..., 2:]).view(np.int8).astype(np.float64)
    return (d * q).reshape(raw.shape[0], ne0)


def deq_q4_1(raw: np.ndarray, ne0: int) -> np.ndarray:
    """Q4_1 block (20 bytes): d f16, m f16, qs u8[16]; x[j] = d*(qs[j]&15) + m, x[j+16] = d*(qs[j]>>4) + m."""
    b = raw.reshape(raw.shape[0], -1, 20)
    d = np.ascontiguousarray(b[..., 0:2]).view(np.float16).astype(np.float64)
    m = np.ascontiguousarray(b[..., 2:4]).view(np.float16).astype(np.float64)
    qs = b[..., 4:]
    q = np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.float64)
    return (d * q + m).reshape(raw.shape[0], ne0)


def deq_bf16(raw: np.ndarray, ne0: int) -> np.ndarray:
    bits = np.ascontiguousarray(raw).view(np.uint16).astype(np.uint32) << np.uint32(16)
    return bits.view(np.float32).astype(np.float64).reshape(raw.shape[0], ne0)


def make_weight(rng: np.random.Generator, s: Src, shape: tuple[int, ...]) -> tuple[Any, np.ndarray]:
    """(what the weights function returns, its exact values in float64)."""
    data = rng.uniform(s.lo, s.hi, shape).astype(np.float32)
    if len(shape) == 1 or s.store == "np":
        assert s.dtype == "f32"
        return data, data.astype(np.float64)
    if len(shape) == 3:  # stacked experts: the GGUF data's rows, (n_expert * M, K), as the backend is handed them
        w, exact = make_weight(rng, s, (shape[0] * shape[1], shape[2]))
        return w, exact.reshape(shape)
    ne0 = shape[-1]
    if s.dtype == "q4_k":  # gguf cannot quantize K-quants: random valid blocks, decoded by gguf as the reference
        raw = rng.integers(0, 256, (shape[0], ne0 // 256, 144), dtype=np.uint8)
        raw[..., 0:4] = np.asarray(rng.uniform(0.5, 1.5, raw.shape[:2] + (2,)) * 1e-3, np.float16).view(np.uint8)
        raw = raw.reshape(shape[0], -1)
        return QWeight.prepare(raw, GT.Q4_K, ne0), gguf.quants.dequantize(raw, GT.Q4_K).astype(np.float64)
    qtype = GT[s.dtype.upper()]
    if s.dtype == "f32":
        return QWeight.prepare(data, qtype, ne0), data.astype(np.float64)
    if s.dtype == "f16":
        raw = data.astype(np.float16)
        return QWeight.prepare(raw, qtype, ne0), raw.astype(np.float64)
    raw = gguf.quants.quantize(data, qtype)
    deq = {"q8_0": deq_q8_0, "q4_1": deq_q4_1, "bf16": deq_bf16}[s.dtype]
    return QWeight.prepare(raw, qtype, ne0), deq(raw, ne0)


def make_input(rng: np.random.Generator, s: Src, shape: tuple[int, ...]) -> np.ndarray:
    dt = NP_DTYPE[s.dtype]
    if s.init == "uniform":
        return rng.uniform(s.lo, s.hi, shape).astype(dt)
    if s.init == "ids":
        return rng.integers(0, s.n, shape).astype(dt)
    if s.init == "uids":
        return rng.permutation(s.n)[: shape[0]].astype(dt)
    if s.init == "ruids":  # batched ids: distinct within each batch
        rows = [rng.permutation(s.n)[: shape[-1]] for _ in range(int(np.prod(shape[:-1])))]
        return np.array(rows).reshape(shape).astype(dt)
    if s.init == "pos":
        return rng.integers(0, s.n, shape).astype(dt)
    if s.init == "mask":  # 0 or -inf; every row keeps at least one visible column (no all -inf row)
        m = np.where(rng.random(shape) < 0.4, -np.inf, 0.0)
        rows = m.reshape(-1, shape[-1])
        rows[np.arange(len(rows)), rng.integers(0, shape[-1], len(rows))] = 0.0
        return m.astype(dt)
    raise ValueError(s.init)


# ---------------------------------------------------------------------------------------------------- running

def nmse(out: np.ndarray, ref: np.ndarray) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(((out - ref) ** 2).sum() / (ref ** 2).sum())


def build_graph(case: Case) -> tuple[Graph, Node]:
    leaves = []
    for k, s in enumerate(case.srcs):
        name = f"src{k}"
        attrs = {"role": name} if s.leaf == "input" else {"tensor": name}
        leaves.append(Node(name, s.leaf, (), attrs, s.dtype, tuple(s.shape)))
    attrs = {k: case.attrs[k] for k in OPS[case.op].attrs}  # the catalogue's attribute order
    dtype, shape = infer(case.op, leaves, attrs)
    node = Node("out", case.op, tuple(leaves), attrs, dtype, tuple(shape))
    dims = [d for x in leaves + [node] for d in x.shape] + [*attrs.get("shape", ()), *attrs.get("strides", ()),
                                                            attrs.get("offset", 0)]
    syms = sorted({s for d in dims if isinstance(d, Sym) for s in d.symbols})
    return Graph({"test": case.id}, tuple(DimDecl(s) for s in syms), leaves + [node], {"out": node}), node


def run_case(case: Case, seed: int, path: IsaPath) -> tuple[np.ndarray, np.ndarray, Node]:
    """(backend result on one llama.cpp CPU path, float64 reference, the op node)."""
    rng = np.random.default_rng(seed)
    graph, node = build_graph(case)
    weights: dict[str, Any] = {}
    feeds: dict[str, np.ndarray] = {}
    vals: list[np.ndarray] = []
    for k, s in enumerate(case.srcs):
        shape = np_shape(s.shape, case.env)
        if s.leaf == "weight":
            weights[f"src{k}"], exact = make_weight(rng, s, shape)
            vals.append(exact)
        else:
            x = make_input(rng, s, shape)
            in_place = k == 0 and OPS[case.op].in_place      # the reference writes its own copy in place
            vals.append(x.astype(np.float64) if x.dtype.kind == "f" and not in_place else x.copy())
            feeds[f"src{k}"] = _strided(x) if s.strided else x
    out = Program(graph, lambda name, stacked=False: weights[name], path).run(case.env, feeds)["out"]
    ref = REFERENCES[case.op](vals, node.attrs, np_shape(node.shape, case.env), case.env)
    return out, ref, node


@pytest.mark.parametrize("path", PATHS.values(), ids=list(PATHS))
@pytest.mark.parametrize("case", CASES, ids=[f"{i:03d}-{c.id}" for i, c in enumerate(CASES)])
def test_op(case: Case, path: IsaPath) -> None:
    """Every path's kernels are held to the same thresholds: the paths differ only in the last bits."""
    out, ref, node = run_case(case, seed=CASES.index(case), path=path)
    want_shape = np_shape(node.shape, case.env)
    assert isinstance(out, np.ndarray)
    assert out.shape == want_shape, f"numpy shape {out.shape}, the IR infers {node.type_str} = {want_shape}"
    assert out.dtype == NP_DTYPE[node.dtype], f"dtype {out.dtype}, the IR infers {node.dtype}"
    if case.op == "cont":
        assert out.flags.c_contiguous
    assert np.isfinite(out).all()
    err = nmse(out, ref)
    assert err <= case.tol, f"NMSE {err:.3g} > {case.tol:g}"


def test_every_op_of_the_catalogue_has_cases() -> None:
    """Adding an op to graphir.graph.ops.OPS without backend cases here fails this test."""
    computing = {name for name, d in OPS.items() if d.kind != "leaf"}
    covered = {c.op for c in CASES}
    assert computing - covered == set(), f"ops without a backend case: {sorted(computing - covered)}"
    assert covered <= computing
    counts = {op: sum(c.op == op for c in CASES) for op in computing}
    assert min(counts.values()) >= 2, f"ops with a single case: {[o for o, n in counts.items() if n < 2]}"


def test_every_computing_op_has_exactly_one_kernel() -> None:
    """The backend's kernels register against the catalogue: none missing, none for an unknown or leaf op,
    and a second kernel for an op is refused."""
    assert set(KERNELS) == COMPUTING
    with pytest.raises(ValueError, match="two kernels for op 'add'"):
        kernel("add")(lambda n, memo, path: None)
    with pytest.raises(ValueError, match="kernel for 'weight': not a computing op"):
        kernel("weight")(lambda n, memo, path: None)
    assert set(KERNELS) == COMPUTING


def test_mul_mat_id_touches_only_the_experts_a_token_chose() -> None:
    """An expert's quantized matrix is repacked on its first multiplication: after a ubatch whose tokens chose
    experts 1, 5 and 6 of 8, those three are repacked and the other five never were."""
    from graphir.backends.numba.kernels.moe import mul_mat_id
    from graphir.backends.numba.quant.weight import expert_matrices

    rng = np.random.default_rng(3)
    stacked, _ = make_weight(rng, W("q4_k", 256, 16, 8), (8, 16, 256))
    experts = expert_matrices(stacked, 8)
    ids = np.array([[1, 5], [6, 1], [5, 6]], np.int32)                  # (tokens, slots)
    out = mul_mat_id(lambda e, rows: experts[e].matmul(rows), 8, 16, rng.uniform(-1, 1, (3, 1, 256)).astype(np.float32),
                     ids)
    assert out.shape == (3, 2, 16) and np.isfinite(out).all()
    assert [e for e in range(8) if experts[e].packed_nbytes] == [1, 5, 6]


def test_reference_dequantizers_agree_with_gguf() -> None:
    """The test's own block decoders (the references for quantized weights) match gguf-py's."""
    rng = np.random.default_rng(7)
    data = rng.uniform(-1, 1, (3, 64)).astype(np.float32)
    for qt, deq in ((GT.Q8_0, deq_q8_0), (GT.Q4_1, deq_q4_1), (GT.BF16, deq_bf16)):
        raw = gguf.quants.quantize(data, qt)
        np.testing.assert_array_equal(deq(raw, 64).astype(np.float32), gguf.quants.dequantize(raw, qt))


def _gelu_table_f16() -> np.ndarray:
    """llama.cpp's ggml_table_gelu_f16, built here independently: entry i = fp16(gelu(half i)), every step of
    0.5x(1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))) rounded to float32 as ggml_gelu_f32 runs it, 1 + 0.044715x*x
    in one rounding (GCC fuses it), tanh in float64 rounded once (glibc's tanhf agrees for every |x| < 10)."""
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    f32, f64 = np.float32, np.float64
    with np.errstate(all="ignore"):
        inner = ((f32(0.044715) * x).astype(f64) * x + 1.0).astype(f32)
        arg = (f32(0.7978845608028654) * x) * inner
        return ((f32(0.5) * x) * (f32(1) + np.tanh(arg.astype(f64)).astype(f32))).astype(np.float16)


def _run_1d(op: str, *xs: np.ndarray) -> np.ndarray:
    graph, _ = build_graph(C(op, *(I("f32", len(xs[0])) for _ in xs), tol=EXACT))
    return Program(graph, dict().__getitem__, numerics().path).run({}, {f"src{k}": x for k, x in enumerate(xs)})["out"]


def test_gelu_and_geglu_read_llama_cpps_fp16_table() -> None:
    """GGML_GELU_FP16 (ggml-cpu vec.h): x <= -10 gives +0, x >= 10 gives x, anything between reads the table at
    fp16(x) (nearest even). Every table entry in (-10, 10), random values and both edges, bit for bit."""
    table = _gelu_table_f16().astype(np.float32)
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    edges = np.array([-10, 10, np.nextafter(-10, 0), np.nextafter(10, 0), np.nextafter(-10, -11),
                      np.nextafter(10, 11), -9.998, 9.998, 0.0, -0.0, 1e-8, 1e5, -1e5], np.float32)
    rng = np.random.default_rng(0)
    x = np.concatenate([halves[np.abs(halves) < 10], rng.uniform(-12, 12, 4000).astype(np.float32), edges])
    with np.errstate(over="ignore"):
        g = np.where(x >= 10, x, table[x.astype(np.float16).view(np.uint16)])
    u = rng.uniform(-3, 3, x.shape).astype(np.float32)
    for out, want in ((_run_1d("gelu", x), np.where(x <= -10, np.float32(0), g)),
                      (_run_1d("geglu", x, u), np.where(x <= -10, np.float32(0), g * u))):
        np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))
    out = _run_1d("gelu", edges)
    assert out[0] == 0 and not np.signbit(out[0]) and out[1] == 10 and out[3] == 10 and out[5] == edges[5]


# ---- the vision ops on both backends, against numpy written here ------------------------------------------------


def _on_both_backends(graph: Graph, feeds: dict[str, np.ndarray],
                      weights: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The graph's output on each backend, by name, as the runtime compiles it: ``weights`` (float32 or float16
    arrays: F32 or F16 tensors) prepared by the backend from their rows."""
    from graphir.running.backend import get

    outs = {}
    for name in ("numba", "reference"):
        backend, num = get(name), get(name).numerics()
        prepared = {k: backend.prepare_weight(w.reshape(-1, w.shape[-1]), GT.F16 if w.dtype == np.float16 else GT.F32,
                                              w.shape[-1], num) for k, w in (weights or {}).items()}
        outs[name] = backend.compile(graph, lambda k, stacked=False: prepared[k], num).run({}, feeds)["out"]
    return outs


def _windows(x: np.ndarray, kw: int, kh: int, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int) -> np.ndarray:
    """im2col of x (N, C, H, W) from a zero-padded copy: for each kernel tap (i, j), the value every output position
    reads there, one strided slice; (N, OH, OW, C * kh * kw), a channel's taps row by row."""
    n, c, h, w = x.shape
    oh, ow = (h + 2 * p1 - d1 * (kh - 1) - 1) // s1 + 1, (w + 2 * p0 - d0 * (kw - 1) - 1) // s0 + 1
    padded = np.pad(x, ((0, 0), (0, 0), (p1, p1), (p0, p0)))
    out = np.empty((n, oh, ow, c, kh, kw), x.dtype)
    for i in range(kh):
        for j in range(kw):
            out[..., i, j] = padded[:, :, i * d1::s1, j * d0::s0][:, :, :oh, :ow].transpose(0, 2, 3, 1)
    return out.reshape(n, oh, ow, -1)


_PATCHES = {"kw": 14, "kh": 14, "s0": 14, "s1": 14, "p0": 0, "p1": 0, "d0": 1, "d1": 1}
_PADDED_DILATED = {"kw": 3, "kh": 2, "s0": 2, "s1": 1, "p0": 1, "p1": 2, "d0": 2, "d1": 1}
_IM2COLS = pytest.mark.parametrize("shape, attrs", [((3, 28, 42), _PATCHES), ((2, 2, 7, 9), _PADDED_DILATED)],
                                   ids=["14x14-patches", "padded-dilated"])


@pytest.mark.parametrize("t", ["f16", "f32"])
@_IM2COLS
def test_im2col_lays_each_window_out_as_a_row(shape: tuple[int, ...], attrs: dict[str, int], t: str) -> None:
    """Row (n, oh, ow) holds the window at that output position, channel by channel, each channel's kh x kw taps
    row by row, zeros in the padding; for an f16 kernel rounded to f16 (nearest even). A kernel as large as its
    stride cuts the image into patches. Both backends, bit for bit."""
    x = np.random.default_rng(1).uniform(-1, 1, shape).astype(np.float32)
    want = _windows(x.reshape((1,) * (4 - x.ndim) + x.shape), **attrs).astype(NP_DTYPE[t])
    if attrs is _PATCHES:
        c, h, w = shape
        patches = x.reshape(c, h // 14, 14, w // 14, 14).transpose(1, 3, 0, 2, 4).reshape(h // 14, w // 14, -1)
        np.testing.assert_array_equal(want[0], patches.astype(NP_DTYPE[t]))
    graph, _ = build_graph(C("im2col", I("f32", *reversed(shape)), type=t, tol=EXACT, **attrs))
    for backend, got in _on_both_backends(graph, {"src0": x}).items():
        assert got.dtype == want.dtype, backend
        np.testing.assert_array_equal(got.reshape(want.shape), want, err_msg=backend)


def _pooled(x: np.ndarray, pool: str, k0: int, k1: int, s0: int, s1: int, p0: int, p1: int) -> np.ndarray:
    """pool_2d of x (N, C, H, W) from a padded copy (zeros for avg: adding one leaves a sum as it is; -inf for max):
    every window's taps one strided slice at a time, kernel row by kernel row, added in float32 (avg, then over
    k0 k1) or their largest kept (max, from -FLT_MAX)."""
    n, c, h, w = x.shape
    oh, ow = (h + 2 * p1 - k1) // s1 + 1, (w + 2 * p0 - k0) // s0 + 1
    avg = pool == "avg"
    padded = np.pad(x, ((0, 0), (0, 0), (p1, p1), (p0, p0)), constant_values=0 if avg else -np.inf)
    res = np.full((n, c, oh, ow), 0 if avg else -np.finfo(np.float32).max, np.float32)
    for i in range(k1):
        for j in range(k0):
            tap = padded[:, :, i::s1, j::s0][:, :, :oh, :ow]
            res = res + tap if avg else np.maximum(res, tap)
    return res / np.float32(k0 * k1) if avg else res


_POOLS = pytest.mark.parametrize("shape, attrs", [
    ((5, 8, 8), {"pool": "avg", "k0": 4, "k1": 4, "s0": 4, "s1": 4, "p0": 0, "p1": 0}),
    ((3, 6, 7), {"pool": "avg", "k0": 3, "k1": 2, "s0": 2, "s1": 2, "p0": 1, "p1": 1}),
    ((2, 3, 6, 7), {"pool": "max", "k0": 3, "k1": 3, "s0": 2, "s1": 1, "p0": 1, "p1": 1})],
    ids=["gemma3-4x4", "avg-padded", "max-padded"])


@_POOLS
def test_pool_2d_takes_each_windows_mean_or_max(shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
    """avg: a window's values inside the image added in float32, kernel row by kernel row, then divided by k0 k1
    (the padding counts in the divisor only); max: the largest value inside. The numba backend gives these bits;
    the reference adds in float64 (within float32's rounding of the sums)."""
    x = (np.random.default_rng(2).standard_normal(shape) * 4).astype(np.float32)
    want = _pooled(x.reshape((1,) * (4 - x.ndim) + x.shape), **attrs)
    want = want.reshape(want.shape[4 - x.ndim:])
    graph, _ = build_graph(C("pool_2d", I("f32", *reversed(shape)), tol=EXACT, **attrs))
    got = _on_both_backends(graph, {"src0": x})
    np.testing.assert_array_equal(got["numba"].view(np.uint32), want.view(np.uint32))
    np.testing.assert_allclose(got["reference"], want, rtol=0, atol=1e-5)


def _gelu_quick_table_f16() -> np.ndarray:
    """llama.cpp's ggml_table_gelu_quick_f16, built here independently: entry i = fp16(x (1 / (1 + e^(-1.702 x))))
    for half i, each step in float32 as ggml_gelu_quick_f32 runs it (-1.702 a float), e^ in float64 rounded once
    (glibc's expf agrees on every half)."""
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    f32 = np.float32
    with np.errstate(all="ignore"):
        e = np.exp((f32(-1.702) * x).astype(np.float64)).astype(f32)
        return (x * (f32(1) / (f32(1) + e))).astype(np.float16)


def test_gelu_quick_reads_llama_cpps_fp16_table() -> None:
    """GGML_GELU_QUICK_FP16 (ggml-cpu vec.h): every x reads the table at fp16(x) (nearest even), with no cut-offs
    (gelu's at +-10): every finite half, random values, tiny ones, large ones and one past the halves (inf's
    entry), bit for bit on both backends."""
    table = _gelu_quick_table_f16().astype(np.float32)
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    edges = np.array([12.3, -11.0, 0.0, -0.0, 1e-8, -1e-8, 6e-8, -3e-5, 65504, -65504, 1e5], np.float32)
    x = np.concatenate([halves[np.isfinite(halves)], np.random.default_rng(0).uniform(-30, 30, 4000)
                        .astype(np.float32), edges])
    with np.errstate(over="ignore"):
        want = table[x.astype(np.float16).view(np.uint16)]
    graph, _ = build_graph(C("gelu_quick", I("f32", len(x)), tol=EXACT))
    for backend, got in _on_both_backends(graph, {"src0": x}).items():
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=backend)
    tail = want[-len(edges):]
    assert tail[0] == np.float16(12.3) != np.float32(12.3) and -1e-6 < tail[1] < 0 and tail[-1] == np.inf


def _patch_embedding(c: int, h: int, w: int, k: int, e: int, kernel_type: str, windows_type: str) -> Graph:
    """ggml_conv_2d of an image [w, h, c] by a kernel [k, k, c, e] with stride k, as a vision tower's graph writes
    it: im2col's windows reshaped to [c k k, OW OH], by the kernel (a weight, operand 1) reshaped to [k k c, e]."""
    x = Node("image", "input", (), {"role": "image"}, "f32", (w, h, c))
    kernel = Node("kernel", "weight", (), {"tensor": "kernel"}, kernel_type, (k, k, c, e))
    nodes = [x, kernel]

    def add(name: str, op: str, inputs: tuple[Node, ...], **attrs: Any) -> Node:
        nodes.append(Node(name, op, inputs, attrs, *infer(op, list(inputs), attrs)))
        return nodes[-1]

    square = {"kw": k, "kh": k, "s0": k, "s1": k, "p0": 0, "p1": 0, "d0": 1, "d1": 1}
    windows = add("windows", "reshape", (add("cols", "im2col", (x,), **square, type=windows_type),),
                  shape=(c * k * k, (w // k) * (h // k)))
    out = add("out", "mul_mat", (windows, add("kernel2d", "reshape", (kernel,), shape=(k * k * c, e))))
    return Graph({}, (), nodes, {"out": out})


@pytest.mark.parametrize("kernel_type, windows_type", [("f16", "f16"), ("f32", "f16"), ("f32", "f32")])
def test_a_patch_embedding_is_im2col_then_mul_mat_by_the_kernel(kernel_type: str, windows_type: str) -> None:
    """A patch embedding (_patch_embedding; ggml_conv_2d makes f16 windows for an f32 kernel too) is the
    convolution of the image by the kernel, [OW OH, E]: here numpy's in float64 of the values the product reads
    (the kernel in the windows' type where they are f16: ggml converts it). Each backend sums a dot in its own
    order (numba: ggml's, in float32): within 1e-5 of the largest value."""
    rng = np.random.default_rng(3)
    c, h, w, k, e = 3, 28, 42, 14, 8
    image = rng.uniform(-1, 1, (c, h, w)).astype(np.float32)
    kernel = rng.uniform(-1, 1, (e, c, k, k)).astype(NP_DTYPE[kernel_type])
    read = NP_DTYPE["f16" if windows_type == "f16" else kernel_type]
    patches = image.astype(NP_DTYPE[windows_type]).reshape(c, h // k, k, w // k, k).astype(np.float64)
    want = np.einsum("cyixj,ecij->eyx", patches, kernel.astype(read).astype(np.float64)).reshape(e, -1)
    graph = _patch_embedding(c, h, w, k, e, kernel_type, windows_type)
    for backend, got in _on_both_backends(graph, {"image": image}, {"kernel": kernel}).items():
        assert got.shape == want.shape and got.dtype == np.float32, backend
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max(), err_msg=backend)


def _cache_graph(d: int, n_head_kv: int) -> Graph:
    """A KV cache's write and read: set_rows of a ubatch's rows into the fed cache, a view of its first n_kv cells."""
    width = d * n_head_kv
    cache = Node("cache_k", "input", (), {"role": "cache_k"}, "f16", (width, CTX))
    rows = Node("rows", "input", (), {"role": "rows"}, "f32", (width, T))
    idxs = Node("k_idxs", "input", (), {"role": "k_idxs"}, "i64", (T,))
    w_attrs: dict[str, Any] = {}
    written = Node("write", "set_rows", (cache, rows, idxs), w_attrs, *infer("set_rows", [cache, rows, idxs], w_attrs))
    v_attrs = {"shape": (d, n_head_kv, KV), "strides": (1, d, width), "offset": 0}
    view = Node("view", "view", (written,), v_attrs, *infer("view", [written], v_attrs))
    return Graph({}, (DimDecl("n_tokens"), DimDecl("n_ctx"), DimDecl("n_kv")), [cache, rows, idxs, written, view],
                 {"out": view})


@pytest.mark.parametrize("held", [False, True])
def test_set_rows_writes_the_fed_cache_in_place_and_the_view_reads_it(held: bool) -> None:
    """KV-cache semantics: the cache buffer fed to the graph (or held: the same array run after run) is written
    where the ids say, keeps its other cells across runs, and the view over the first n_kv cells reads the rows
    just written."""
    d, n_head_kv, n_ctx = 4, 3, 8
    width = d * n_head_kv
    prog = Program(_cache_graph(d, n_head_kv), lambda name: pytest.fail(f"no weights here, asked for {name}"),
                   numerics().path)
    buf = np.zeros((n_ctx, width), np.float16)
    expect = np.zeros((n_ctx, width), np.float64)
    rng = np.random.default_rng(0)
    for ids, n_kv in (([0, 1, 2], 3), ([5, 3], 6), ([4], 6)):
        r = rng.uniform(-1, 1, (len(ids), width)).astype(np.float32)
        env = {"n_tokens": len(ids), "n_ctx": n_ctx, "n_kv": n_kv}
        feeds = {"rows": r, "k_idxs": np.array(ids, np.int64)}
        out = prog.run(env, feeds, held={"cache_k": buf}) if held else prog.run(env, {**feeds, "cache_k": buf})
        expect[ids] = r.astype(np.float16)
        np.testing.assert_array_equal(buf.astype(np.float64), expect)  # written in place, other cells kept
        assert out["out"].shape == (n_kv, n_head_kv, d) and out["out"].dtype == np.float16
        np.testing.assert_array_equal(out["out"].astype(np.float64), expect[:n_kv].reshape(n_kv, n_head_kv, d))


@pytest.mark.parametrize("taped", [True, False])
def test_a_plan_views_a_held_buffer_once_and_another_buffer_gets_its_own_plan(taped: bool, monkeypatch) -> None:
    """A plan binds the dims once: the view of a held cache is made when the plan is (no step of it runs), the
    same plan serves every run with those dims and that array, and another array or other dims get theirs. A
    graph this small plays set_rows from the plan's tape; with no tape, set_rows is its one step."""
    if not taped:
        monkeypatch.setattr(tape, "ARENA_MAX", -1)
    prog = Program(_cache_graph(2, 1), dict().__getitem__, numerics().path)
    bufs = [np.zeros((4, 2), np.float16), np.full((4, 2), 7, np.float16)]
    env = {"n_tokens": 1, "n_ctx": 4, "n_kv": 3}
    for i in range(3):
        feeds = {"rows": np.full((1, 2), i, np.float32), "k_idxs": np.array([i], np.int64)}
        out = prog.run(env, feeds, held={"cache_k": bufs[0]})["out"]
        np.testing.assert_array_equal(out[:, 0, :], [[j, j] if j <= i else [0, 0] for j in range(3)])
    assert len(prog.plans) == 1
    (plan,) = prog.plans.values()
    made = [prog.ops[out] for _, out, _, _ in plan.steps if out >= 0]         # steps making a value in Python
    if taped:
        assert made == [] and plan.lock is not None                           # the view was made with the plan
    else:
        assert made == ["set_rows"] and plan.lock is None                     # the view was made with the plan
        assert plan.run is not None and "= f0(k0, " in plan.run.source and "f1" not in plan.run.source
    out = prog.run(env, {"rows": np.ones((1, 2), np.float32), "k_idxs": np.array([3], np.int64)},
                   held={"cache_k": bufs[1]})["out"]
    np.testing.assert_array_equal(out, np.full((3, 1, 2), 7, np.float16))   # the other array's cells, not the first's
    prog.run({**env, "n_kv": 4}, {"rows": np.ones((1, 2), np.float32), "k_idxs": np.array([0], np.int64)},
             held={"cache_k": bufs[1]})
    assert len(prog.plans) == 3


if __name__ == "__main__":  # print the measured NMSE of every case (to re-pin thresholds)
    for i, c in enumerate(CASES):
        try:
            o, r, n = run_case(c, seed=i, path=numerics().path)
            e = nmse(o, r) if o.shape == r.shape else float("nan")
            print(f"{i:03d} {c.id:70s} nmse={e:.3g} tol={c.tol:g} shape={o.shape} want={r.shape} {o.dtype}")
        except Exception as ex:  # noqa: BLE001
            print(f"{i:03d} {c.id:70s} ERROR {type(ex).__name__}: {ex}")


# ---- xIELU against ggml's own ------------------------------------------------------------------------------


GGML_F32, GGML_F16 = 0, 1   # ggml's type ids


def _ggml_op(op: str, args: list[Any], *sources: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """ggml's ``op`` of float32 (or float16) ``sources`` (numpy order, each a ggml tensor of the reversed shape)
    and the scalar ``args`` after them (an int as C's int, a float as a float, a ctypes value as its own type),
    computed by ggml's CPU backend on
    one thread (the llama.cpp the oracle tests load): its result (flat, float32 or float16 as ggml made it) and
    the op parameters ggml stored."""
    import ctypes as C

    import llama_made
    from graphir.llamacpp.reserve import GGMLTensor

    class InitParams(C.Structure):
        _fields_ = [("mem_size", C.c_size_t), ("mem_buffer", C.c_void_p), ("no_alloc", C.c_bool)]

    base, cpu = llama_made._lib("ggml-base"), llama_made._lib("ggml-cpu")
    for fn, res, argtypes in (("ggml_init", C.c_void_p, [InitParams]), ("ggml_free", None, [C.c_void_p]),
                              ("ggml_new_tensor", C.c_void_p, [C.c_void_p, C.c_int, C.c_int, C.POINTER(C.c_int64)]),
                              ("ggml_nbytes", C.c_size_t, [C.c_void_p]),
                              (op, C.c_void_p, [C.c_void_p] * (1 + len(sources))
                               + [type(a) if isinstance(a, C._SimpleCData) else C.c_int if isinstance(a, int)
                                  else C.c_float for a in args]),
                              ("ggml_new_graph", C.c_void_p, [C.c_void_p]),
                              ("ggml_build_forward_expand", None, [C.c_void_p, C.c_void_p])):
        getattr(base, fn).restype, getattr(base, fn).argtypes = res, argtypes
    cpu.ggml_graph_compute_with_ctx.argtypes = [C.c_void_p, C.c_void_p, C.c_int]
    size = sum(x.nbytes for x in sources)
    ctx = base.ggml_init(InitParams(4 * size + (1 << 20), None, False))
    try:
        tensors = []
        for x in sources:
            x = np.ascontiguousarray(x, np.float16 if x.dtype == np.float16 else np.float32)
            ne = (C.c_int64 * x.ndim)(*reversed(x.shape))
            t = base.ggml_new_tensor(ctx, GGML_F16 if x.dtype == np.float16 else GGML_F32, x.ndim, ne)
            C.memmove(GGMLTensor.from_address(t).data, x.ctypes.data, x.nbytes)
            tensors.append(t)
        y = getattr(base, op)(ctx, *tensors, *args)
        graph = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(graph, y)
        cpu.ggml_graph_compute_with_ctx(ctx, graph, 1)
        t = GGMLTensor.from_address(y)
        out = np.empty(base.ggml_nbytes(y), np.uint8).view(np.float16 if t.type == GGML_F16 else np.float32)
        C.memmove(out.ctypes.data, t.data, out.nbytes)
        return out, list(t.op_params)
    finally:
        base.ggml_free(ctx)


def _ggml_xielu(x: np.ndarray, alpha_n: float, alpha_p: float, beta: float,
                eps: float) -> tuple[np.ndarray, list[float]]:
    """ggml_xielu of a layer's parameters over x and the op parameters ggml stored: [alpha_n, alpha_p, beta, eps]
    as its kernel reads them."""
    out, params = _ggml_op("ggml_xielu", [alpha_n, alpha_p, beta, eps], x)
    return out, list(np.array(params[1:5], np.int32).view(np.float32))


@pytest.mark.oracle
@pytest.mark.parametrize("layer", [(0.8, 0.8, 0.5, -1e-6), (1.0, 1.0, 1.0, 1e-7), (-3.0, 25.0, 0.25, -1e-3)],
                         ids=["apertus-init", "llama-archs", "softplus-past-20"])
def test_xielu_is_ggmls_bit_for_bit(layer: tuple[float, float, float, float]) -> None:
    """A layer's xIELU parameters become ggml's op parameters as ggml_xielu makes them (alpha_n: beta +
    softplus(alpha_n), alpha_p: softplus(alpha_p), glibc's logf and expf), and the kernel gives ggml's values bit
    for bit on both branches: around 0 and eps, subnormals, far out, infinities and nan."""
    from graphir.graph.floats import f32, softplus

    alpha_n, alpha_p, beta, eps = layer
    attrs = {"alpha_n": f32(f32(beta) + softplus(alpha_n)), "alpha_p": softplus(alpha_p), "beta": f32(beta),
             "eps": f32(eps)}
    rng = np.random.default_rng(0)
    special = np.array([0.0, -0.0, 1e-8, -1e-8, 1e-7, -1e-7, 1e-6, -1e-6, 1e-3, -1e-3, 1e-40, -1e-40, 88.0, -88.0,
                        1e18, -1e18, np.inf, -np.inf, np.nan], np.float32)
    x = np.concatenate([rng.standard_normal(20000).astype(np.float32) * 4, rng.uniform(-1e-5, 1e-5, 2000)
                        .astype(np.float32), special])
    want, params = _ggml_xielu(x, alpha_n, alpha_p, beta, eps)
    assert params == list(attrs.values())
    graph, _ = build_graph(C("xielu", I("f32", len(x)), tol=EXACT, **attrs))
    got = Program(graph, dict().__getitem__, numerics().path).run({}, {"src0": x})["out"]
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


# ---- RWKV7's ops against ggml's own ------------------------------------------------------------------------


@pytest.mark.oracle
@pytest.mark.parametrize("hs, n_head, per_seq, n_seqs", [(64, 2, 3, 2), (64, 3, 1, 1), (128, 1, 4, 1)],
                         ids=["head64-2seqs", "head64-decode", "head128"])
def test_rwkv_wkv7_is_ggmls_bit_for_bit(hs: int, n_head: int, per_seq: int, n_seqs: int) -> None:
    """rwkv_wkv7's outputs and final states are ggml's bit for bit on this CPU's path, for head sizes that are a
    multiple of ggml's vector step (64 floats on AVX-512, 32 on AVX2: its loops read past a smaller head)."""
    rng = np.random.default_rng(hs + n_head)
    n = per_seq * n_seqs

    def tokens(lo: float = -1.0, hi: float = 1.0) -> np.ndarray:
        return rng.uniform(lo, hi, (n, n_head, hs)).astype(np.float32)

    r, w, k, v = tokens(), tokens(0.5, 1.0), tokens(), tokens()
    kk = tokens()
    kk /= np.linalg.norm(kk, axis=-1, keepdims=True)
    a, b = -kk, kk * tokens(0, 1)  # RWKV7's in-context learning rate: -kk and kk * a
    state = rng.uniform(-1, 1, (n_seqs, n_head * hs * hs)).astype(np.float32)
    want, _ = _ggml_op("ggml_rwkv_wkv7", [], r, w, k, v, a, b, state)
    case = C("rwkv_wkv7", *(I("f32", hs, n_head, n),) * 6, I("f32", hs * hs * n_head, n_seqs), tol=EXACT)
    graph, _ = build_graph(case)
    feeds = {f"src{i}": x for i, x in enumerate((r, w, k, v, a, b, state))}
    got = Program(graph, dict().__getitem__, numerics().path).run({}, feeds)["out"]
    np.testing.assert_array_equal(got.reshape(-1).view(np.uint32), want.view(np.uint32))


@pytest.mark.oracle
def test_l2_norm_is_ggmls_bit_for_bit() -> None:
    """l2_norm is ggml's bit for bit: the squares summed in double, the root of that sum as a float, eps where the
    root is smaller (RWKV7's kk, eps 1e-12; and rows whose root is below a larger eps)."""
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal((40, 64)), rng.uniform(-1e-8, 1e-8, (4, 64))]).astype(np.float32)
    for eps in (1e-12, 1e-6):
        want, params = _ggml_op("ggml_l2_norm", [eps], x)
        assert np.array(params[:1], np.int32).view(np.float32)[0] == np.float32(eps)
        graph, _ = build_graph(C("l2_norm", I("f32", 64, 44), tol=EXACT, eps=eps))
        got = Program(graph, dict().__getitem__, numerics().path).run({}, {"src0": x})["out"]
        np.testing.assert_array_equal(got.reshape(-1).view(np.uint32), want.view(np.uint32))


_PROMPT_SIZED = (4, 1, 128, 512)   # numpy order: 4 blocks of 128 rows, as RWKV-7's six token-shift mixes of a prompt


@pytest.mark.oracle
@pytest.mark.parametrize("y_shape", [(512,), (4, 1, 1, 512), (1, 128, 512), (4, 1, 128, 512), (128, 1)])
def test_prompt_sized_arithmetic_is_ggmls_bit_for_bit(y_shape: tuple[int, ...]) -> None:
    """add, sub, mul, div of a prompt-sized x (past the size from which they run on both threads, as rows) and a y
    that broadcasts to it (a bias; a row per block of x's rows; rows x's repeat; x's own shape; a column) are
    ggml's bit for bit."""
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal(_PROMPT_SIZED).astype(np.float32), rng.standard_normal(y_shape).astype(np.float32)
    for op in ("add", "sub", "mul", "div"):
        want, _ = _ggml_op(f"ggml_{op}", [], x, y)
        graph, _ = build_graph(C(op, I("f32", *reversed(x.shape)), I("f32", *reversed(y_shape)), tol=EXACT))
        got = Program(graph, dict().__getitem__, numerics().path).run({}, {"src0": x, "src1": y})["out"]
        np.testing.assert_array_equal(got.reshape(-1).view(np.uint32), want.view(np.uint32), err_msg=op)


@pytest.mark.oracle
@pytest.mark.parametrize("op, eps", [("norm", 1e-5), ("l2_norm", 1e-12)])
def test_prompt_sized_norms_are_ggmls_bit_for_bit(op: str, eps: float) -> None:
    """norm and l2_norm of a prompt's rows (run on both threads) are ggml's bit for bit."""
    x = np.random.default_rng(5).standard_normal(_PROMPT_SIZED).astype(np.float32)
    want, _ = _ggml_op(f"ggml_{op}", [eps], x)
    graph, _ = build_graph(C(op, I("f32", *reversed(x.shape)), tol=EXACT, eps=eps))
    got = Program(graph, dict().__getitem__, numerics().path).run({}, {"src0": x})["out"]
    np.testing.assert_array_equal(got.reshape(-1).view(np.uint32), want.view(np.uint32))


@pytest.mark.oracle
@pytest.mark.parametrize("op, args", [("relu", {}), ("sqr", {}), ("neg", {}), ("scale", {"s": 0.7})])
def test_prompt_sized_unary_ops_are_ggmls_bit_for_bit(op: str, args: dict[str, float]) -> None:
    """relu, sqr, neg and scale of a prompt's rows (run on both threads) are ggml's bit for bit."""
    x = np.random.default_rng(6).standard_normal(_PROMPT_SIZED).astype(np.float32)
    want, _ = _ggml_op(f"ggml_{op}", list(args.values()), x)
    graph, _ = build_graph(C(op, I("f32", *reversed(x.shape)), tol=EXACT, **args))
    got = Program(graph, dict().__getitem__, numerics().path).run({}, {"src0": x})["out"]
    np.testing.assert_array_equal(got.reshape(-1).view(np.uint32), want.view(np.uint32))


# ---- the vision ops against ggml's own ---------------------------------------------------------------------


def _numba_run(graph: Graph, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return Program(graph, dict().__getitem__, numerics().path).run({}, feeds)["out"]


@pytest.mark.oracle
def test_gelu_quick_is_ggmls_bit_for_bit() -> None:
    """gelu_quick is ggml's (its fp16 table) bit for bit: every half but the nans, random values, and values past
    the halves both ways (inf's entry, -inf's nan)."""
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    x = np.concatenate([halves[~np.isnan(halves)], np.random.default_rng(4).uniform(-30, 30, 4000)
                        .astype(np.float32), np.array([1e5, -1e5], np.float32)])
    want, _ = _ggml_op("ggml_gelu_quick", [], x)
    got = _numba_run(build_graph(C("gelu_quick", I("f32", len(x)), tol=EXACT))[0], {"src0": x})
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.oracle
@pytest.mark.parametrize("t", ["f16", "f32"])
@_IM2COLS
def test_im2col_is_ggmls_bit_for_bit(shape: tuple[int, ...], attrs: dict[str, int], t: str) -> None:
    """im2col is ggml_im2col's (2-D, into f16 or f32) bit for bit; ggml reads only the sizes of its kernel."""
    x = np.random.default_rng(5).uniform(-1, 1, shape).astype(np.float32)
    kernel = np.zeros((1, shape[-3], attrs["kh"], attrs["kw"]), np.float32)
    want, _ = _ggml_op("ggml_im2col", [*(attrs[k] for k in ("s0", "s1", "p0", "p1", "d0", "d1")), True,  # is_2D
                                       GGML_F16 if t == "f16" else GGML_F32], kernel, x)
    got = _numba_run(build_graph(C("im2col", I("f32", *reversed(shape)), type=t, tol=EXACT, **attrs))[0],
                     {"src0": x})
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.reshape(-1).view(np.uint16), want.view(np.uint16))


_1D_WINDOWS = pytest.mark.parametrize("shape, attrs", [
    ((5, 40), {"kw": 3, "s0": 1, "p0": 1, "d0": 1}), ((5, 40), {"kw": 3, "s0": 2, "p0": 1, "d0": 1}),
    ((2, 3, 11), {"kw": 4, "s0": 3, "p0": 2, "d0": 2})], ids=["whisper-conv1", "whisper-conv2", "padded-dilated"])


@pytest.mark.parametrize("t", ["f16", "f32"])
@_1D_WINDOWS
def test_im2col_1d_lays_each_window_out_as_a_row(shape: tuple[int, ...], attrs: dict[str, int], t: str) -> None:
    """The 1-D form (kh 0): row (n, ol) holds the window at that output position, channel by channel, each
    channel's kw taps, zeros in the padding: the 2-D windows of a signal one row high. Both backends, bit for bit,
    and ggml_im2col's 1-D form (ggml reads only the sizes of its kernel [kw, C, 1])."""
    x = np.random.default_rng(8).uniform(-1, 1, shape).astype(np.float32)
    planes = x.reshape((1,) * (3 - x.ndim) + x.shape)[:, :, None, :]
    want = _windows(planes, attrs["kw"], 1, attrs["s0"], 1, attrs["p0"], 0, attrs["d0"], 1)[:, 0]
    want = want.reshape(want.shape[3 - x.ndim:]).astype(NP_DTYPE[t])
    graph, _ = build_graph(C("im2col", I("f32", *reversed(shape)), kh=0, s1=0, p1=0, d1=0, type=t, tol=EXACT,
                             **attrs))
    for backend, got in _on_both_backends(graph, {"src0": x}).items():
        assert got.dtype == want.dtype and got.shape == want.shape, backend
        np.testing.assert_array_equal(got, want, err_msg=backend)


@pytest.mark.oracle
@pytest.mark.parametrize("t", ["f16", "f32"])
@_1D_WINDOWS
def test_im2col_1d_is_ggmls_bit_for_bit(shape: tuple[int, ...], attrs: dict[str, int], t: str) -> None:
    x = np.random.default_rng(9).uniform(-1, 1, shape).astype(np.float32)
    kernel = np.zeros((1, shape[-2], attrs["kw"]), np.float32)
    want, _ = _ggml_op("ggml_im2col", [attrs["s0"], 0, attrs["p0"], 0, attrs["d0"], 0, False,  # is_2D
                                       GGML_F16 if t == "f16" else GGML_F32], kernel, x)
    graph, _ = build_graph(C("im2col", I("f32", *reversed(shape)), kh=0, s1=0, p1=0, d1=0, type=t, tol=EXACT,
                             **attrs))
    got = _numba_run(graph, {"src0": x})
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.reshape(-1).view(np.uint16), want.view(np.uint16))


@pytest.mark.oracle
def test_gelu_erf_is_ggmls_bit_for_bit() -> None:
    """gelu_erf is ggml's (0.5 x (1 + erff(x / sqrt 2)) in float32, glibc's erff) bit for bit, tails included."""
    x = np.concatenate([np.random.default_rng(10).uniform(-8, 8, 20000), [0.0, -0.0, 1e-30, -1e30, 1e30, -5.5]]
                       ).astype(np.float32)
    want, _ = _ggml_op("ggml_gelu_erf", [], x)
    got = _numba_run(build_graph(C("gelu_erf", I("f32", len(x)), tol=EXACT))[0], {"src0": x})
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.oracle
@_POOLS
def test_pool_2d_is_ggmls_bit_for_bit(shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
    """pool_2d is ggml_pool_2d's bit for bit (GGML_OP_POOL_MAX is 0, AVG 1; ggml takes the paddings as floats)."""
    x = (np.random.default_rng(6).standard_normal(shape) * 4).astype(np.float32)
    a = attrs
    want, _ = _ggml_op("ggml_pool_2d", [{"max": 0, "avg": 1}[a["pool"]], a["k0"], a["k1"], a["s0"], a["s1"],
                                        float(a["p0"]), float(a["p1"])], x)
    got = _numba_run(build_graph(C("pool_2d", I("f32", *reversed(shape)), tol=EXACT, **attrs))[0], {"src0": x})
    np.testing.assert_array_equal(got.reshape(-1).view(np.uint32), want.view(np.uint32))


_INTERPOLATIONS = pytest.mark.parametrize("shape, w, h, align_corners", [
    ((6, 4, 4), 6, 10, True), ((6, 4, 4), 2, 3, True), ((6, 4, 4), 1, 5, True), ((2, 2, 3, 5), 8, 4, False)],
    ids=["up", "down", "one-column", "pixel-centres"])


@pytest.mark.oracle
@_INTERPOLATIONS
def test_interpolate_is_ggmls_bit_for_bit(shape: tuple[int, ...], w: int, h: int, align_corners: bool) -> None:
    """interpolate is ggml_interpolate's bilinear mode bit for bit (GGML_SCALE_MODE_BILINEAR 1, the flag
    GGML_SCALE_FLAG_ALIGN_CORNERS 1 << 8; the other two sizes kept), ggml's fused multiply-adds included."""
    import ctypes

    x = (np.random.default_rng(7).standard_normal(shape) * 4).astype(np.float32)
    lead = (1,) * (4 - len(shape)) + shape[:-2]  # numpy order: N, C
    mode = ctypes.c_uint32(1 | (1 << 8 if align_corners else 0))
    sizes = [ctypes.c_int64(n) for n in (w, h, lead[1], lead[0])]
    want, _ = _ggml_op("ggml_interpolate", [*sizes, mode], x)
    got = _numba_run(build_graph(C("interpolate", I("f32", *reversed(shape)), w=w, h=h, align_corners=align_corners,
                                   tol=EXACT))[0], {"src0": x})
    np.testing.assert_array_equal(got.reshape(-1).view(np.uint32), want.view(np.uint32))


@pytest.mark.oracle
@pytest.mark.parametrize("kernel_type", ["f16", "f32"])
@pytest.mark.parametrize("windows_type", ["f16", "f32"])
@pytest.mark.parametrize("c, h, w, k, e", [(3, 28, 42, 14, 8), (3, 48, 16, 16, 8), (3, 32, 64, 16, 8)],
                         ids=["vec_dot", "3-rows-vec_dot", "tinyBLAS"])
def test_a_patch_embedding_is_ggmls_bit_for_bit(c: int, h: int, w: int, k: int, e: int, windows_type: str,
                                                kernel_type: str) -> None:
    """A patch embedding (_patch_embedding) is ggml's where graphir runs the oracle's path, bit for bit: f16
    windows as ggml_conv_2d makes them, f32 ones as ggml_im2col and ggml_mul_mat do. ggml sees the kernel
    contiguous: tinyBLAS multiplies where the inner length is a multiple of a register and the windows come in
    fours (the third case; the second has three), ggml_vec_dot elsewhere. On another path, within 1e-5 of the
    largest value."""
    from conftest import oracle_is_exact

    rng = np.random.default_rng(7)
    image = rng.uniform(-1, 1, (c, h, w)).astype(np.float32)
    kernel = rng.uniform(-1, 1, (e, c, k, k)).astype(NP_DTYPE[kernel_type])
    if windows_type == "f16":
        want, _ = _ggml_op("ggml_conv_2d", [k, k, 0, 0, 1, 1], kernel, image)
    else:
        cols, _ = _ggml_op("ggml_im2col", [k, k, 0, 0, 1, 1, True, GGML_F32], kernel, image)
        want, _ = _ggml_op("ggml_mul_mat", [], cols.reshape(-1, c * k * k), kernel.reshape(e, -1))
    weight = QWeight.prepare(kernel.reshape(-1, k), GT.F16 if kernel_type == "f16" else GT.F32, k)
    graph = _patch_embedding(c, h, w, k, e, kernel_type, windows_type)
    got = Program(graph, lambda name, stacked=False: weight, numerics().path).run({}, {"image": image})["out"]
    if oracle_is_exact():
        np.testing.assert_array_equal(got.reshape(-1).view(np.uint32), want.view(np.uint32))
    else:
        np.testing.assert_allclose(got.reshape(-1), want, rtol=0, atol=1e-5 * np.abs(want).max())
