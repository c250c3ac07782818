"""DBRX (dbrx): a pre-LayerNorm decoder (norms without bias) whose every FFN is a mixture of experts.

Q, K and V come from one fused projection whose output is clamped to [-clamp_kqv, clamp_kqv] (llama.cpp's
``attention.clamp_kqv``, required) before the split into heads; NEOX RoPE turns whole heads. The FFN's norm is
``attn_output_norm``; each token takes its ``expert_used_count`` best experts by softmax, weights renormalised;
experts are ``feed_forward_length`` wide.

References: Databricks 2024, "Introducing DBRX: A New State-of-the-Art Open LLM"; llama.cpp src/models/dbrx.cpp.
"""

from __future__ import annotations

from typing import Any, Mapping

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder, Norm
from graphir.model.hf_config import Config, Family, fixed, hf
from graphir.model.hparams import HParams
from graphir.model.moe import MOE_KEYS, check_routed, routed_expert_tensors, routed_experts
from graphir.model.presets import Preset
from graphir.model.qkv import CLAMP_KQV, check_whole_heads, roped_attention
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class Dbrx(Architecture):
    name = "dbrx"
    rope_mode = "neox"
    required_keys = (A.LAYERNORM_EPS, A.CLAMP_KQV)
    keys = MOE_KEYS + (CLAMP_KQV,)

    def __init__(self, hp: HParams):
        check_routed(hp, self.name)
        check_whole_heads(hp, self.name)
        super().__init__(hp)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V, X, F = hp.n_embd, hp.n_vocab, hp.n_expert, hp.ff_length(0)
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"), spec(T.OUTPUT, (E, V))]
        for il in range(hp.n_layer):
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), spec(T.ATTN_QKV, (E, E + 2 * hp.n_embd_v_gqa), il),
                     spec(T.ATTN_OUT, (E, E), il), spec(T.ATTN_OUT_NORM, (E,), il, kind="vector"),
                     *routed_expert_tensors(E, F, X, il)]
            specs += layer + layer_scales(layer, il, X)
        return specs

    def build(self, b: GraphBuilder) -> None:
        hp, w = self.hp, b.w
        x = b.build_inp_embd(w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, Norm.LAYER, name="attn_norm")
            a = roped_attention(b, h, pos, il, clamp=hp.clamp_kqv)
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            h = b.norm(x, T.ATTN_OUT_NORM, il, Norm.LAYER, name="attn_out_norm")
            f = routed_experts(b, h, il, norm_w=True)
            x = b.op("add", f, x, name="l_out")
        b.build_output(b.norm(x, T.OUTPUT_NORM, kind=Norm.LAYER, name="result_norm"), w(T.OUTPUT))


# ---- Hugging Face: what convert_hf_to_gguf writes for DbrxForCausalLM (its own nested config) ----------------


def _dbrx(c: Config) -> Mapping[str, Any]:
    attn, ffn = c.find("attn_config", kind="map"), c.find("ffn_config", kind="map")
    return {A.HEAD_COUNT_KV: c.check("attn_config.kv_n_heads", attn.get("kv_n_heads"), "count"),
            R.FREQ_BASE: c.check("attn_config.rope_theta", attn.get("rope_theta"), "number"),
            A.CLAMP_KQV: c.check("attn_config.clip_qkv", attn.get("clip_qkv"), "number"),
            L.FEED_FORWARD_LENGTH: c.check("ffn_config.ffn_hidden_size", ffn.get("ffn_hidden_size"), "count"),
            L.EXPERT_COUNT: c.check("ffn_config.moe_num_experts", ffn.get("moe_num_experts"), "count"),
            L.EXPERT_USED_COUNT: c.check("ffn_config.moe_top_k", ffn.get("moe_top_k"), "count")}


hf_config.register(Family("dbrx", (
    hf(L.BLOCK_COUNT, "n_layers"), hf(L.CONTEXT_LENGTH, "max_seq_len"), hf(L.EMBEDDING_LENGTH, "d_model"),
    hf(A.HEAD_COUNT, "n_heads"), fixed(A.LAYERNORM_EPS, 1e-5), _dbrx, hf(L.VOCAB_SIZE, "vocab_size"),
), {"tie_word_embeddings": False}), "DbrxForCausalLM")


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------

presets.register({
    # 40 layers, 48 query and 8 KV heads of 128, 16 experts of 10752 with 4 per token, Q/K/V clamped to [-8, 8]
    "DBRX": Preset("dbrx", {
        L.CONTEXT_LENGTH: 32768, L.EMBEDDING_LENGTH: 6144, L.BLOCK_COUNT: 40, L.FEED_FORWARD_LENGTH: 10752,
        A.HEAD_COUNT: 48, A.HEAD_COUNT_KV: 8, R.FREQ_BASE: 500000.0, A.LAYERNORM_EPS: 1e-5, A.CLAMP_KQV: 8.0,
        L.EXPERT_COUNT: 16, L.EXPERT_USED_COUNT: 4, L.VOCAB_SIZE: 100352,
    }, tied=False, f32=presets.ROUTER_F32, source="databricks/dbrx-base config.json"),
})
