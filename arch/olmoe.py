"""OLMoE (olmoe) and MiniMax-M2 (minimax-m2): pre-norm decoders whose every FFN is a mixture of experts, with
full-width QK-norm. One graph; what MiniMax-M2 changes is data (:class:`Routing`).

Q and K are RMS-normalised across all their heads at once (one learned scale per value of the whole projection,
before they are split into heads), then NEOX RoPE turns the first ``rope.dimension_count`` values of each head
(all of them in OLMoE, 64 of 128 in MiniMax-M2). Each FFN routes a token to its ``expert_used_count`` best
experts: OLMoE by softmax, weights as the softmax gave them; MiniMax-M2 by the file's gating function (sigmoid)
plus a selection bias, weights renormalised. The experts are ``feed_forward_length`` wide, as llama.cpp's loader
sizes them (MiniMax-M2's requires ``expert_feed_forward_length`` but does not use it). No shared expert.

References: Muennighoff et al. 2024, "OLMoE: Open Mixture-of-Experts Language Models"; MiniMax 2025,
"MiniMax-M2"; llama.cpp src/models/olmoe.cpp, minimax-m2.cpp.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.graph.floats import inv_sqrt
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import Gating, GraphBuilder
from graphir.model.hf_config import TEXT, VOCAB, Family, hf
from graphir.model.hparams import HParams
from graphir.model.moe import (GATING_FUNC_KEY, MOE_KEYS, check_routed, gating, routed_expert_tensors,
                               routed_experts)
from graphir.model.presets import Preset
from graphir.model.qkv import check_whole_heads, qkv_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


@dataclass(frozen=True)
class Routing:
    """How a variant routes its tokens and turns its heads, each a line of its llama.cpp file."""

    gating: Gating | None = Gating.SOFTMAX  # None: the file's expert_gating_func, required
    selection_bias: bool = False  # exp_probs_b added to the scores for choosing only (MiniMax-M2)
    norm_w: bool = False  # the chosen experts' weights renormalised to sum 1
    whole_heads: bool = True  # RoPE must turn whole heads (OLMoE: llama.cpp asserts n_rot == head size)


class OLMoE(Architecture):
    name = "olmoe"
    rope_mode = "neox"
    required_keys: ClassVar[tuple[str, ...]] = (A.HEAD_COUNT, A.LAYERNORM_RMS_EPS)
    keys = MOE_KEYS
    routing: ClassVar[Routing] = Routing()

    def __init__(self, hp: HParams):
        r = self.routing
        check_routed(hp, self.name)
        if r.whole_heads:
            check_whole_heads(hp, self.name)
        self.gating = r.gating or gating(hp, self.name, None)
        super().__init__(hp)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V, X = hp.n_embd, hp.n_vocab, hp.n_expert
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"), spec(T.OUTPUT, (E, V))]
        for il in range(hp.n_layer):
            F = hp.ff_length(il)
            layer = [*qkv_tensors(hp, il), spec(T.ATTN_NORM, (E,), il, kind="vector"),
                     spec(T.ATTN_Q_NORM, (hp.n_embd_head_k * hp.head_count(il),), il, kind="vector"),
                     spec(T.ATTN_K_NORM, (hp.n_embd_k_gqa_at(il),), il, kind="vector"),
                     spec(T.FFN_NORM, (E,), il, kind="vector"), *routed_expert_tensors(E, F, X, il)]
            if self.routing.selection_bias:
                layer.append(spec(T.FFN_EXP_PROBS_B, (X,), il, "bias", kind="vector"))
            specs += layer + layer_scales(layer, il, X)
        return specs

    def build(self, b: GraphBuilder) -> None:
        hp, w = self.hp, b.w
        d, T_ = hp.n_embd_head_k, b.n_tokens
        x = b.build_inp_embd(w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            q, k, v = b.build_qkv(h, il, heads=False)
            q = b.norm(q, T.ATTN_Q_NORM, il, name="Qcur_normed")
            k = b.norm(k, T.ATTN_K_NORM, il, name="Kcur_normed")
            q = b.reshape(q, (d, hp.head_count(il), T_), name="Qcur.heads")
            k = b.reshape(k, (d, hp.head_count_kv(il), T_), name="Kcur.heads")
            v = b.reshape(v, (d, hp.head_count_kv(il), T_), name="Vcur.heads")
            q, k = b.rope(q, pos, name="Qcur.rope"), b.rope(k, pos, name="Kcur.rope")
            a = b.build_attn(q, k, v, wo=w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il), kq_scale=inv_sqrt(d))
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            h = b.norm(x, T.FFN_NORM, il, name="ffn_norm")
            f = routed_experts(b, h, il, gating=self.gating, norm_w=self.routing.norm_w,
                               probs_b=w(T.FFN_EXP_PROBS_B, il, "bias") if self.routing.selection_bias else None)
            x = b.op("add", f, x, name="l_out")
        b.build_output(b.norm(x, T.OUTPUT_NORM, name="result_norm"), w(T.OUTPUT))


class MiniMaxM2(OLMoE):
    name = "minimax-m2"
    required_keys = (A.HEAD_COUNT, A.LAYERNORM_RMS_EPS, L.EXPERT_FEED_FORWARD_LENGTH)
    keys = MOE_KEYS + (GATING_FUNC_KEY,)
    routing = Routing(gating=None, selection_bias=True, norm_w=True, whole_heads=False)


# ---- Hugging Face: what convert_hf_to_gguf writes for these configs -----------------------------------------

hf_config.register(Family("olmoe", TEXT + (VOCAB,), {"tie_word_embeddings": False}), "OlmoeForCausalLM")
hf_config.register(Family("minimax-m2", TEXT + (
    hf(L.EXPERT_FEED_FORWARD_LENGTH, "intermediate_size"),
    hf(R.DIMENSION_COUNT, "rotary_dim"),
    VOCAB,
), {"tie_word_embeddings": False}), "MiniMaxM2ForCausalLM")


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------

presets.register({
    # 16 layers, 16 heads of 128, 64 experts of 1024 with 8 per token by softmax, not renormalised
    "OLMoE-1B-7B": Preset("olmoe", {
        L.CONTEXT_LENGTH: 4096, L.EMBEDDING_LENGTH: 2048, L.BLOCK_COUNT: 16, L.FEED_FORWARD_LENGTH: 1024,
        A.HEAD_COUNT: 16, A.HEAD_COUNT_KV: 16, R.FREQ_BASE: 10000.0, A.LAYERNORM_RMS_EPS: 1e-5,
        L.EXPERT_COUNT: 64, L.EXPERT_USED_COUNT: 8, L.VOCAB_SIZE: 50304,
    }, tied=False, f32=presets.ROUTER_F32, source="allenai/OLMoE-1B-7B-0924 config.json"),
    # 62 layers, 48 query and 8 KV heads of 128 (64 values of each rotated), 256 experts of 1536 with 8 per token by
    # sigmoid scores and a selection bias; its multi-token-prediction modules are not converted
    "MiniMax-M2": Preset("minimax-m2", {
        L.CONTEXT_LENGTH: 196608, L.EMBEDDING_LENGTH: 3072, L.BLOCK_COUNT: 62, L.FEED_FORWARD_LENGTH: 1536,
        A.HEAD_COUNT: 48, A.HEAD_COUNT_KV: 8, A.KEY_LENGTH: 128, A.VALUE_LENGTH: 128, R.DIMENSION_COUNT: 64,
        R.FREQ_BASE: 5000000.0, A.LAYERNORM_RMS_EPS: 1e-6, L.EXPERT_COUNT: 256, L.EXPERT_USED_COUNT: 8,
        L.EXPERT_FEED_FORWARD_LENGTH: 1536, L.EXPERT_GATING_FUNC: 2, L.VOCAB_SIZE: 200064,
    }, tied=False, f32=presets.ROUTER_F32, source="MiniMaxAI/MiniMax-M2 config.json"),
})
