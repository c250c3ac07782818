"""Phi-3 (Phi-3-mini, Phi-3.5-mini, Phi-4-mini): a pre-RMSNorm decoder with fused QKV, one fused gate+up
projection and LongRoPE.

Each block is ``x += attn(RMSNorm(x))`` then ``x += W_down (silu(g) * u)`` where ``[g; u] = W_up RMSNorm(x)``
(``ffn_up`` holds the gate rows first, then the up rows). Attention is grouped-query over NEOX-rotated Q and K,
with Q divided by sqrt(head size) before the scores (which are then not scaled again). RoPE may cover only the
first ``n_rot`` values of a head (Phi-4-mini: 3/4) and divides its frequencies by one of two learned
per-frequency factor vectors shared by all layers: the *short* ones for contexts up to the original training
context, the *long* ones beyond it (LongRoPE), so the graph depends on the context size. The checkpoints'
``sliding_window`` is read and ignored, as llama.cpp does: every layer attends to the whole context.
Reference: Abdin et al. 2024, "Phi-3 Technical Report"; Ding et al. 2024, "LongRoPE"; llama.cpp
src/models/phi3.cpp and llama_model::get_rope_factors.
"""

from __future__ import annotations

import math
from typing import Mapping

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import TensorError
from graphir.graph.ir import Node
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hparams import f32
from graphir.model.tensors import TensorDecl, TensorSpec, spec, tensor_name


class Phi3(Architecture):
    name = "phi3"
    rope_mode = "neox"  # HF rotate-half layout, kept by the converter
    required_keys = (Keys.LLM.FEED_FORWARD_LENGTH, Keys.Attention.HEAD_COUNT, Keys.Attention.LAYERNORM_RMS_EPS)

    def variant(self, n_ctx_seq: int) -> bool:
        """Whether a context of n_ctx_seq cells per sequence uses the long RoPE factors."""
        return n_ctx_seq > self.hp.n_ctx_orig_yarn

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, F, V, E_gqa = hp.n_embd, hp.n_ff, hp.n_vocab, hp.n_embd_v_gqa
        specs = [
            spec(T.TOKEN_EMBD, (E, V)),
            spec(T.OUTPUT_NORM, (E,), kind="vector"),
            spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD)),
            spec(T.ROPE_FACTORS_LONG, (hp.n_rot // 2,), kind="vector", optional=True),
            spec(T.ROPE_FACTORS_SHORT, (hp.n_rot // 2,), kind="vector", optional=True),
        ]
        for il in range(hp.n_layer):
            specs += [
                spec(T.ATTN_NORM, (E,), il, kind="vector"),
                # one fused projection (what the converter writes), or three; each with an optional bias
                spec(T.ATTN_QKV, (E, E + 2 * E_gqa), il, optional=True),
                spec(T.ATTN_QKV, (E + 2 * E_gqa,), il, "bias", kind="vector", optional=True),
                *(spec(t, (E, w), il, optional=True) for t, w in ((T.ATTN_Q, E), (T.ATTN_K, E_gqa), (T.ATTN_V, E_gqa))),
                *(spec(t, (w,), il, "bias", kind="vector", optional=True)
                  for t, w in ((T.ATTN_Q, E), (T.ATTN_K, E_gqa), (T.ATTN_V, E_gqa))),
                spec(T.ATTN_OUT, (E, E), il),
                spec(T.FFN_NORM, (E,), il, kind="vector"),
                spec(T.FFN_UP, (E, 2 * F), il),  # [gate; up]
                spec(T.FFN_DOWN, (F, E), il),
            ]
        return specs

    def check(self, tensors: Mapping[str, TensorDecl]) -> list[str]:
        missing = [f"missing tensor '{tensor_name(T.ATTN_QKV, il)}'" for il in range(self.hp.n_layer)
                   if tensor_name(T.ATTN_QKV, il) not in tensors and tensor_name(T.ATTN_Q, il) not in tensors]
        return super().check(tensors) + missing

    def attention(self, b: GraphBuilder, h: Node, pos: Node, factors: Node | None, il: int) -> Node:
        if b.w(T.ATTN_QKV, il) is None and b.w(T.ATTN_Q, il) is None:
            raise TensorError(f"{b.label}: missing tensor '{tensor_name(T.ATTN_QKV, il)}'")
        q, k, v = b.build_qkv(h, il)
        q = b.rope(q, pos, factors, name="Qcur.rope")
        k = b.rope(k, pos, factors, name="Kcur.rope")
        d = float(self.hp.n_embd_head_k)
        q = b.op("scale", q, s=f32(1.0 / f32(math.sqrt(d))), name="Qcur.scaled")  # 1.0f / sqrtf(d)
        return b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), kq_scale=1.0)

    def ffn(self, b: GraphBuilder, h: Node, il: int) -> Node:
        """SwiGLU over the two halves of one projection: silu(gate rows) * up rows."""
        gu = b.linear(h, b.w(T.FFN_UP, il), name="ffn_up")  # type: ignore[arg-type]
        F, n = gu.shape[0] // 2, gu.shape[1]  # type: ignore[operator]
        gate, up = (b.op("view", gu, shape=(F, n), strides=(1, 2 * F), offset=off, name=tag)
                    for tag, off in (("ffn_gate", 0), ("ffn_up.half", F)))
        h = b.op("swiglu", gate, up, name="ffn_swiglu")
        return b.linear(h, b.w(T.FFN_DOWN, il), name="ffn_out")  # type: ignore[arg-type]

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        out_ids = b.build_inp_out_ids()
        factors = b.w(T.ROPE_FACTORS_LONG if self.variant(b.n_ctx_seq) else T.ROPE_FACTORS_SHORT)
        for il in range(hp.n_layer):
            with b.layer(il):
                h = b.build_norm(x, b.w(T.ATTN_NORM, il), name="attn_norm")
                a = self.attention(b, h, pos, factors, il)
                if il == hp.n_layer - 1:  # only requested rows go through the last FFN and the head
                    a = b.op("get_rows", a, out_ids, name="attn_out.rows")
                    x = b.op("get_rows", x, out_ids, name="inp.rows")
                x = b.op("add", a, x, name="ffn_inp")
                h = b.build_norm(x, b.w(T.FFN_NORM, il), name="ffn_norm")
                x = b.op("add", x, self.ffn(b, h, il), name="l_out")
        x = b.build_norm(x, b.w(T.OUTPUT_NORM), name="result_norm")
        b.build_output(x, b.w(T.OUTPUT))
