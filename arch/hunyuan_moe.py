"""Hunyuan-A13B (hunyuan-moe): a pre-norm decoder whose every FFN adds a shared FFN to a mixture of experts, with
Q and K normalised after RoPE.

Attention: Q, K, V (biases where the file has them), NEOX RoPE over whole heads, then a per-head RMS norm of K and
of Q. FFN: the shared FFN of ``expert_shared_feed_forward_length`` (absent: the FFN length) plus each token's
``expert_used_count`` best experts by softmax, weights renormalised; the experts are ``feed_forward_length`` wide,
as llama.cpp's loader sizes them (it requires ``expert_feed_forward_length`` and does not use it).

References: Tencent Hunyuan Team 2025, "Hunyuan-A13B Technical Report"; llama.cpp src/models/hunyuan-moe.cpp.
"""

from __future__ import annotations

from typing import Any, Mapping

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.graph.floats import inv_sqrt
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hf_config import TEXT, VOCAB, Config, Family
from graphir.model.hparams import HParams, Key
from graphir.model.moe import (MOE_KEYS, check_routed, routed_expert_tensors, routed_experts, shared_expert,
                               shared_expert_tensors)
from graphir.model.presets import Preset
from graphir.model.qkv import check_whole_heads, qk_norm_tensors, qkv_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, tensor_name

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class HunyuanMoe(Architecture):
    name = "hunyuan-moe"
    rope_mode = "neox"
    required_keys = (A.HEAD_COUNT, A.LAYERNORM_RMS_EPS, L.EXPERT_FEED_FORWARD_LENGTH)
    keys = MOE_KEYS + (Key("n_ff_shexp", L.EXPERT_SHARED_FEED_FORWARD_LENGTH, int, 0, minimum=0),)  # 0: n_ff

    def __init__(self, hp: HParams):
        check_routed(hp, self.name)
        check_whole_heads(hp, self.name)
        super().__init__(hp)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V, X = hp.n_embd, hp.n_vocab, hp.n_expert
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD))]
        for il in range(hp.n_layer):
            F = hp.ff_length(il)
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), *qkv_tensors(hp, il), *qk_norm_tensors(hp, il),
                     spec(T.FFN_NORM, (E,), il, kind="vector"), *routed_expert_tensors(E, F, X, il),
                     *shared_expert_tensors(E, hp.n_ff_shexp or F, il)]
            specs += layer + layer_scales(layer, il, X)
        return specs

    def build(self, b: GraphBuilder) -> None:
        hp, w = self.hp, b.w
        x = b.build_inp_embd(w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            q, k, v = b.build_qkv(h, il)
            q, k = b.rope(q, pos, name="Qcur.rope"), b.rope(k, pos, name="Kcur.rope")
            k = b.norm(k, T.ATTN_K_NORM, il, name="Kcur_norm")
            q = b.norm(q, T.ATTN_Q_NORM, il, name="Qcur_norm")
            a = b.build_attn(q, k, v, wo=w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il),
                             kq_scale=inv_sqrt(hp.n_embd_head_k))
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            h = b.norm(x, T.FFN_NORM, il, name="ffn_norm")
            mlp = shared_expert(b, h, il)
            moe = routed_experts(b, h, il, norm_w=True)
            x = b.op("add", b.op("add", moe, mlp, name="ffn_out"), x, name="l_out")
        b.build_output(b.norm(x, T.OUTPUT_NORM, name="result_norm"), w(T.OUTPUT))


# ---- Hugging Face: what convert_hf_to_gguf writes for HunYuanMoEV1ForCausalLM -------------------------------


def _first(c: Config, name: str) -> int:
    """A per-layer list's first entry (the converter writes one value; its layers agree)."""
    v = c.find(name, kind="any")
    return c.check(name, v[0] if isinstance(v, list) else v, "size")


def _hunyuan(c: Config) -> Mapping[str, Any]:
    """The experts from the per-layer lists, the head size, and dynamic NTK RoPE as the converter folds it into the
    base (theta * alpha^(d / (d - 2))) with a 256K context."""
    d = c.find("attention_head_dim", default=None) or c.find("hidden_size") // c.find("num_attention_heads")
    out: dict[str, Any] = {L.EXPERT_FEED_FORWARD_LENGTH: _first(c, "moe_intermediate_size"),
                           L.EXPERT_USED_COUNT: _first(c, "moe_topk"),
                           L.EXPERT_SHARED_COUNT: _first(c, "num_shared_expert"),
                           L.EXPERT_SHARED_FEED_FORWARD_LENGTH: c.find("intermediate_size"),
                           A.KEY_LENGTH: d, A.VALUE_LENGTH: d}
    scaling = c.find("rope_scaling", kind="map", default={})
    if scaling.get("type") == "dynamic":
        alpha = c.check("rope_scaling.alpha", scaling.get("alpha", 1000), "number")
        out.update({R.FREQ_BASE: c.find("rope_theta", kind="number", default=10000.0) * alpha ** (d / (d - 2)),
                    R.SCALING_TYPE: "none", R.SCALING_FACTOR: 1.0, R.SCALING_ORIG_CTX_LEN: 256 * 1024,
                    L.CONTEXT_LENGTH: 256 * 1024})
    return out


hf_config.register(Family("hunyuan-moe", TEXT + (VOCAB, _hunyuan), {"tie_word_embeddings": True},
                          tie_drops_head=True), "HunYuanMoEV1ForCausalLM")


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------

presets.register({
    # 32 layers, 32 query and 8 KV heads of 128, 64 experts of 3072 with 8 per token and a shared FFN of 3072; the
    # dynamic NTK RoPE (alpha 1000) folded into the base; the LM head tied to the embedding
    "Hunyuan-A13B": Preset("hunyuan-moe", {
        L.CONTEXT_LENGTH: 262144, L.EMBEDDING_LENGTH: 4096, L.BLOCK_COUNT: 32, L.FEED_FORWARD_LENGTH: 3072,
        A.HEAD_COUNT: 32, A.HEAD_COUNT_KV: 8, A.KEY_LENGTH: 128, A.VALUE_LENGTH: 128,
        R.FREQ_BASE: 10000.0 * 1000.0 ** (128 / 126), R.SCALING_TYPE: "none", R.SCALING_FACTOR: 1.0,
        R.SCALING_ORIG_CTX_LEN: 262144, A.LAYERNORM_RMS_EPS: 1e-5, L.EXPERT_COUNT: 64, L.EXPERT_USED_COUNT: 8,
        L.EXPERT_FEED_FORWARD_LENGTH: 3072, L.EXPERT_SHARED_COUNT: 1, L.EXPERT_SHARED_FEED_FORWARD_LENGTH: 3072,
        L.VOCAB_SIZE: 128167,
    }, tied=True, f32=presets.ROUTER_F32, source="tencent/Hunyuan-A13B-Instruct config.json"),
})
