"""GLM-4.5 and GLM-4.6 (glm4moe): a pre-norm decoder whose FFNs are mixtures of experts after a few dense ones.

Attention: Q, K, V with biases (the converter writes them), an optional per-head RMS norm of Q and K (GLM-4.5's
355B model has it, Air has not), NEOX RoPE over the first ``rope.dimension_count`` values of each head (half of
it). The layer's second norm is ``attn_post_norm``. The first ``leading_dense_block_count`` FFNs are dense SwiGLU;
the others route each token to its ``expert_used_count`` best experts by sigmoid scores plus a selection bias
(``exp_probs_b``), weights renormalised and scaled as the file says, and add ``expert_shared_count`` shared
experts every token takes. The last ``nextn_predict_layers`` layers are GLM's multi-token-prediction layers:
loaded, never run here (llama.cpp runs them only in its draft graph). Files with M-RoPE sections (GLM-4.5V's
text model) are refused.

References: Zhipu AI 2025, "GLM-4.5: Agentic, Reasoning, and Coding (ARC) Foundation Models"; llama.cpp
src/models/glm4-moe.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError
from graphir.graph.floats import inv_sqrt
from graphir.graph.ir import Node
from graphir.memory.layers import LayerNeeds
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import Gating, GraphBuilder
from graphir.model.hf_config import TEXT, VOCAB, Config, Family, derived, fixed, hf
from graphir.model.hparams import HParams, Key
from graphir.model.moe import (GATING_FUNC_KEY, MOE_KEYS, NEXTN_KEY, check_experts, expert_width, gating,
                               nextn_layer, shared_expert, shared_expert_tensors, trunk_layers)
from graphir.model.presets import Preset
from graphir.model.qkv import qkv_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, tensor_name

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class Glm4Moe(Architecture):
    name = "glm4moe"
    rope_mode = "neox"
    required_keys = (L.FEED_FORWARD_LENGTH, A.HEAD_COUNT, A.LAYERNORM_RMS_EPS, L.EXPERT_FEED_FORWARD_LENGTH,
                     L.EXPERT_SHARED_COUNT)
    keys = MOE_KEYS + (
        Key("n_ff_exp", L.EXPERT_FEED_FORWARD_LENGTH, list, 0),  # one value, or one per layer
        Key("n_expert_shared", L.EXPERT_SHARED_COUNT, int, 0, minimum=0),
        Key("n_layer_dense_lead", L.LEADING_DENSE_BLOCK_COUNT, int, 0, minimum=0),
        Key("expert_weights_scale", L.EXPERT_WEIGHTS_SCALE, float, 0.0),
        Key("expert_weights_norm", L.EXPERT_WEIGHTS_NORM, bool, False),
        GATING_FUNC_KEY,
        Key("rope_sections", R.DIMENSION_SECTIONS, tuple, (), count=4),  # (): none
        NEXTN_KEY,
    )

    def __init__(self, hp: HParams):
        check_experts(hp, self.name)
        if not (hp.n_expert and hp.n_expert_used):
            raise MetadataError(f"a '{self.name}' model needs experts ('{L.EXPERT_COUNT.format(arch=self.name)}' "
                                f"and '{L.EXPERT_USED_COUNT.format(arch=self.name)}' > 0)")
        if hp.rope_sections and hp.rope_sections[0] and hp.rope_sections[1]:
            raise MetadataError(f"'{R.DIMENSION_SECTIONS.format(arch=self.name)}' = {list(hp.rope_sections)}: "
                                f"M-RoPE (GLM-4.5V) is not built")
        if not hp.n_expert_shared:
            raise MetadataError(f"'{L.EXPERT_SHARED_COUNT.format(arch=self.name)}' = 0: llama.cpp's graph adds a "
                                f"shared expert to every mixture of experts")
        self.n_trunk = trunk_layers(hp, self.name)
        self.gating = gating(hp, self.name, Gating.SIGMOID)  # GLM-4.5's, where the file leaves it out
        super().__init__(hp)

    def layers(self) -> LayerNeeds:
        return super().layers()[:self.n_trunk]

    def moe_layer(self, il: int) -> bool:
        return il >= self.hp.n_layer_dense_lead


    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V, d = hp.n_embd, hp.n_vocab, hp.n_embd_head_k
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD))]
        for il in range(hp.n_layer):
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), *qkv_tensors(hp, il),
                     spec(T.ATTN_Q_NORM, (d,), il, kind="vector", optional=True),
                     spec(T.ATTN_K_NORM, (d,), il, kind="vector", optional=True),
                     spec(T.ATTN_POST_NORM, (E,), il, kind="vector")]
            if self.moe_layer(il):
                X, F = hp.n_expert, expert_width(hp)
                layer += [spec(T.FFN_GATE_INP, (E, X), il), spec(T.FFN_EXP_PROBS_B, (X,), il, "bias", kind="vector"),
                          spec(T.FFN_GATE_EXP, (E, F, X), il), spec(T.FFN_DOWN_EXP, (F, E, X), il),
                          spec(T.FFN_UP_EXP, (E, F, X), il)]
                layer += shared_expert_tensors(E, F * hp.n_expert_shared, il)
            else:
                F = hp.ff_length(il)
                layer += [spec(T.FFN_GATE, (E, F), il), spec(T.FFN_DOWN, (F, E), il), spec(T.FFN_UP, (E, F), il)]
            layer += layer_scales(layer, il, hp.n_expert)
            specs += layer if il < self.n_trunk else nextn_layer(layer, hp, il)
        return specs

    def ffn(self, b: GraphBuilder, h: Node, il: int) -> Node:
        hp, w = self.hp, b.w
        if not self.moe_layer(il):
            return b.build_ffn(h, up=w(T.FFN_UP, il), gate=w(T.FFN_GATE, il), down=w(T.FFN_DOWN, il))
        routed = b.build_moe_ffn(h, gate_inp=w(T.FFN_GATE_INP, il), up_exps=w(T.FFN_UP_EXP, il),
                                 gate_exps=w(T.FFN_GATE_EXP, il), down_exps=w(T.FFN_DOWN_EXP, il),
                                 n_expert=hp.n_expert, n_expert_used=hp.n_expert_used, gating=self.gating,
                                 norm_w=hp.expert_weights_norm, w_scale=hp.expert_weights_scale,
                                 probs_b=w(T.FFN_EXP_PROBS_B, il, "bias"))
        return b.op("add", routed, shared_expert(b, h, il), name="ffn_out")

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers(self.n_trunk):
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            q, k, v = b.build_qkv(h, il)
            if b.w_opt(T.ATTN_Q_NORM, il) is not None:
                q = b.norm(q, T.ATTN_Q_NORM, il, name="Qcur_normed")
            if b.w_opt(T.ATTN_K_NORM, il) is not None:
                k = b.norm(k, T.ATTN_K_NORM, il, name="Kcur_normed")
            q, k = b.rope(q, pos, name="Qcur.rope"), b.rope(k, pos, name="Kcur.rope")
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il),
                             kq_scale=inv_sqrt(hp.n_embd_head_k))
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            f = self.ffn(b, b.norm(x, T.ATTN_POST_NORM, il, name="post_attn_norm"), il)
            x = b.op("add", f, x, name="l_out")
        b.build_output(b.norm(x, T.OUTPUT_NORM, name="result_norm"), b.w(T.OUTPUT))


# ---- Hugging Face: what convert_hf_to_gguf writes for Glm4MoeForCausalLM ------------------------------------


def _written(n_layer: int, n_nextn: int, qk_norm: bool) -> str:
    """The optional tensors the converter writes: Q/K/V biases, QK-norm where the config asks for it, and the
    NextN layers' tensors (their trunk part, eh_proj, the two norms and the shared head's norm)."""
    nextn = "|".join(str(il) for il in range(n_layer, n_layer + n_nextn))
    out = [r"blk\.\d+\.attn_[qkv]\.bias"]
    if qk_norm:
        out.append(r"blk\.\d+\.attn_[qk]_norm\.weight")
    if n_nextn:
        out.append(rf"blk\.({nextn})\.(attn_norm|attn_[qkv]|attn_output|post_attention_norm|ffn_gate_inp|"
                   rf"ffn_(gate|up|down)_(exps|shexp)|nextn\.(eh_proj|enorm|hnorm|shared_head_norm))\.weight|"
                   rf"blk\.({nextn})\.exp_probs_b\.bias")
    return "|".join(out)


def _nextn(c: Config) -> int:
    return c.find("num_nextn_predict_layers", kind="size", default=0)


def _rotated(c: Config) -> int:
    return int(hf_config.head_dim(c) * c.find("partial_rotary_factor", kind="number", default=0.5))


hf_config.register(Family("glm4moe", TEXT + (
    derived(L.BLOCK_COUNT, lambda c: c.find("num_hidden_layers") + _nextn(c)),  # the converter counts NextN layers
    derived(L.NEXTN_PREDICT_LAYERS, lambda c: _nextn(c) or None),
    derived(R.DIMENSION_COUNT, _rotated),
    hf(L.EXPERT_FEED_FORWARD_LENGTH, "moe_intermediate_size"),
    hf(L.EXPERT_SHARED_COUNT, "n_shared_experts", kind="size", default=0),
    hf(L.LEADING_DENSE_BLOCK_COUNT, "first_k_dense_replace", kind="size", default=0),
    hf(L.EXPERT_WEIGHTS_SCALE, "routed_scaling_factor", kind="number", default=None),
    derived(L.EXPERT_WEIGHTS_NORM, lambda c: c.find("norm_topk_prob", kind="flag", default=False) or None),
    fixed(L.EXPERT_GATING_FUNC, 2),  # sigmoid
    VOCAB,
), {"tie_word_embeddings": False},
    lambda c: _written(c.find("num_hidden_layers"), _nextn(c), c.find("use_qk_norm", kind="flag", default=False))),
    "Glm4MoeForCausalLM")


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------


def _glm45(E: int, n_layer: int, n_ff: int, n_dense: int, n_expert: int, n_ff_exp: int, scale: float, ctx: int,
           qk_norm: bool, source: str) -> Preset:
    """GLM-4.5 as convert_hf_to_gguf writes it: 96 heads of 128 (8 KV heads), half of each rotated (NEOX, base 1e6),
    8 of ``n_expert`` experts by sigmoid scores and a selection bias, renormalised and scaled by ``scale``, one shared
    expert; one NextN layer after the ``n_layer`` trunk layers; the router kept in f32."""
    return Preset("glm4moe", {
        L.CONTEXT_LENGTH: ctx, L.EMBEDDING_LENGTH: E, L.BLOCK_COUNT: n_layer + 1, L.FEED_FORWARD_LENGTH: n_ff,
        A.HEAD_COUNT: 96, A.HEAD_COUNT_KV: 8, A.KEY_LENGTH: 128, A.VALUE_LENGTH: 128, R.DIMENSION_COUNT: 64,
        R.FREQ_BASE: 1000000.0, A.LAYERNORM_RMS_EPS: 1e-5, L.EXPERT_COUNT: n_expert, L.EXPERT_USED_COUNT: 8,
        L.EXPERT_GROUP_COUNT: 1, L.EXPERT_GROUP_USED_COUNT: 1, L.EXPERT_FEED_FORWARD_LENGTH: n_ff_exp,
        L.EXPERT_SHARED_COUNT: 1, L.LEADING_DENSE_BLOCK_COUNT: n_dense, L.EXPERT_WEIGHTS_SCALE: scale,
        L.EXPERT_WEIGHTS_NORM: True, L.EXPERT_GATING_FUNC: 2, L.NEXTN_PREDICT_LAYERS: 1, L.VOCAB_SIZE: 151552,
    }, tied=False, include=_written(n_layer, 1, qk_norm), f32=presets.ROUTER_F32, source=source)


presets.register({
    # 46 layers (the first dense), 128 experts of 1408, no QK-norm
    "GLM-4.5-Air": _glm45(4096, 46, 10944, 1, 128, 1408, 1.0, 131072, False, "zai-org/GLM-4.5-Air config.json"),
    # 92 layers (the first 3 dense), 160 experts of 1536, QK-norm, routed weights scaled by 2.5
    "GLM-4.6": _glm45(5120, 92, 12288, 3, 160, 1536, 2.5, 202752, True, "zai-org/GLM-4.6 config.json"),
})
