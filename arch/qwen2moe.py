"""Qwen1.5-MoE and Qwen2-57B-A14B (qwen2moe): Qwen2's attention with mixture-of-experts FFNs and a gated shared expert.

Every layer's FFN routes each token to its ``expert_used_count`` best experts by softmax, their weights as the
softmax gave them (not renormalised), and adds one shared expert of ``expert_shared_feed_forward_length`` (absent:
the FFN length), whose output is scaled per token by a sigmoid gate: a learned row ``ffn_gate_inp_shexp`` dotted
with the token, through silu(g) / g, as llama.cpp computes the sigmoid. Experts are ``expert_feed_forward_length``
wide (absent: the FFN length shared among the used experts).

References: Qwen Team 2024, "Qwen1.5-MoE: Matching 7B Model Performance with 1/3 Activated Parameters";
llama.cpp src/models/qwen2moe.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.graph.ir import Node
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hf_config import TEXT, VOCAB, Family, hf
from graphir.model.hparams import HParams, Key
from graphir.model.moe import (MOE_KEYS, check_routed, expert_width, routed_expert_tensors, routed_experts,
                               shared_expert, shared_expert_tensors)
from graphir.model.presets import Preset
from graphir.model.qkv import check_whole_heads, qkv_tensors, roped_attention
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class Qwen2Moe(Architecture):
    name = "qwen2moe"
    rope_mode = "neox"
    required_keys = (A.HEAD_COUNT, A.LAYERNORM_RMS_EPS)
    keys = MOE_KEYS + (
        Key("n_ff_exp", L.EXPERT_FEED_FORWARD_LENGTH, list, 0),  # 0: n_ff / n_expert_used
        Key("n_ff_shexp", L.EXPERT_SHARED_FEED_FORWARD_LENGTH, int, 0, minimum=0),  # 0: n_ff
    )

    def __init__(self, hp: HParams):
        check_routed(hp, self.name)
        check_whole_heads(hp, self.name)
        super().__init__(hp)


    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V, X = hp.n_embd, hp.n_vocab, hp.n_expert
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"), spec(T.OUTPUT, (E, V))]
        for il in range(hp.n_layer):
            F = expert_width(hp)
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), *qkv_tensors(hp, il),
                     spec(T.FFN_NORM, (E,), il, kind="vector"), *routed_expert_tensors(E, F, X, il),
                     spec(T.FFN_GATE_INP_SHEXP, (E,), il),
                     *shared_expert_tensors(E, hp.n_ff_shexp or hp.ff_length(0), il)]
            specs += layer + layer_scales(layer, il, X)
        return specs

    def build(self, b: GraphBuilder) -> None:
        w = b.w
        x = b.build_inp_embd(w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            a = roped_attention(b, h, pos, il)
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            h = b.norm(x, T.FFN_NORM, il, name="ffn_norm")
            moe = routed_experts(b, h, il)
            x = b.op("add", b.op("add", moe, self.gated_shared_expert(b, h, il), name="ffn_out"), x, name="l_out")
        b.build_output(b.norm(x, T.OUTPUT_NORM, name="result_norm"), w(T.OUTPUT))

    def gated_shared_expert(self, b: GraphBuilder, h: Node, il: int) -> Node:
        """The shared expert's output times sigmoid(gate . h) per token, the sigmoid as silu(g) / g."""
        g = b.linear(h, b.w(T.FFN_GATE_INP_SHEXP, il), name="ffn_shexp_gate_inp")
        gate = b.op("div", b.op("silu", g, name="ffn_shexp_gate_silu"), g, name="ffn_shexp_gate")
        return b.op("mul", shared_expert(b, h, il), gate, name="ffn_shexp_out")


# ---- Hugging Face: what convert_hf_to_gguf writes for Qwen2MoeForCausalLM -----------------------------------

QKV_BIASES = r"blk\.\d+\.attn_[qkv]\.bias"  # Qwen's attention has them
ROUTERS_F32 = presets.ROUTER_F32 + r"|blk\.\d+\.ffn_gate_inp_shexp\.weight"  # the converter keeps both in f32

hf_config.register(Family("qwen2moe", TEXT + (
    hf(L.EXPERT_FEED_FORWARD_LENGTH, "moe_intermediate_size", default=None),
    hf(L.EXPERT_SHARED_FEED_FORWARD_LENGTH, "shared_expert_intermediate_size", default=None),
    VOCAB,
), {"tie_word_embeddings": False}, lambda c: QKV_BIASES), "Qwen2MoeForCausalLM")


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------

presets.register({
    # 24 layers, 16 heads of 128, 60 experts of 1408 with 4 per token, a shared expert of 5632
    "Qwen1.5-MoE-A2.7B": Preset("qwen2moe", {
        L.CONTEXT_LENGTH: 8192, L.EMBEDDING_LENGTH: 2048, L.BLOCK_COUNT: 24, L.FEED_FORWARD_LENGTH: 5632,
        A.HEAD_COUNT: 16, A.HEAD_COUNT_KV: 16, R.FREQ_BASE: 1000000.0, A.LAYERNORM_RMS_EPS: 1e-6,
        L.EXPERT_COUNT: 60, L.EXPERT_USED_COUNT: 4, L.EXPERT_FEED_FORWARD_LENGTH: 1408,
        L.EXPERT_SHARED_FEED_FORWARD_LENGTH: 5632, L.VOCAB_SIZE: 151936,
    }, tied=False, include=QKV_BIASES, f32=ROUTERS_F32, source="Qwen/Qwen1.5-MoE-A2.7B config.json"),
})
