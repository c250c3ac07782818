"""DeepSeek-MoE (deepseek), GLM-4.5 (glm4moe), dots.llm1 (dots1) and Ling (bailingmoe): pre-norm decoders whose
FFNs, after a few dense ones (none in Ling), route each token to its best experts and add shared experts every
token takes. One graph; what a variant changes is data (:class:`Traits`).

The first ``leading_dense_block_count`` FFNs are dense SwiGLU; the others route each token to its
``expert_used_count`` best of ``expert_count`` experts of ``expert_feed_forward_length`` (DeepSeek-MoE: softmax,
weights as they come; Ling: softmax, renormalised as the file says; GLM-4.5 and dots.llm1: the file's gating
function, sigmoid, plus a selection bias, weights renormalised and scaled as the file says) and add ``expert_shared_count`` shared experts as one FFN. Attention:
Q, K, V (biases where the file has them), RoPE over ``rope.dimension_count`` values of each head, with a per-head
RMS norm of Q and K in dots.llm1 and where a GLM-4.5 file has it (the 355B model; Air has none). GLM-4.5 names the
FFN's norm ``post_attention_norm``, and its last ``nextn_predict_layers`` layers are multi-token-prediction
layers: loaded, never run here (llama.cpp runs them only in its draft graph). A GLM file with M-RoPE sections
(GLM-4.5V's text model) turns its heads by sections one after the other (M-RoPE), a text token at (p, p, p, 0).

References: Dai et al. 2024, "DeepSeekMoE: Towards Ultimate Expert Specialization in Mixture-of-Experts Language
Models"; Zhipu AI 2025, "GLM-4.5: Agentic, Reasoning, and Coding (ARC) Foundation Models"; rednote-hilab 2025,
"dots.llm1 Technical Report"; Ling Team 2025, "Every FLOP Counts: Scaling a 300B Mixture-of-Experts LING LLM
without Premium GPUs"; llama.cpp src/models/deepseek.cpp, glm4-moe.cpp, dots1.cpp, bailingmoe.cpp.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

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
from graphir.model.moe import (GATING_FUNC_KEY, MOE_KEYS, NEXTN_KEY, check_experts, expert_width, gate_up,
                               gate_up_tensors, gating, nextn_layer, nextn_written, routed_expert_tensors,
                               routed_experts, shared_expert, shared_expert_tensors, trunk_layers)
from graphir.model.presets import Preset
from graphir.model.qkv import check_whole_heads, qkv_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, swiglu_tensors, tensor_name

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope

# the keys every variant reads: the dense lead, the experts' and the shared experts' sizes, the weights' scale
SHARED_EXPERT_KEYS = MOE_KEYS + (
    Key("n_ff_exp", L.EXPERT_FEED_FORWARD_LENGTH, list, 0),  # one value, or one per layer
    Key("n_expert_shared", L.EXPERT_SHARED_COUNT, int, 0, minimum=0),
    Key("n_layer_dense_lead", L.LEADING_DENSE_BLOCK_COUNT, int, 0, minimum=0),
    Key("expert_weights_scale", L.EXPERT_WEIGHTS_SCALE, float, 0.0),
)
WEIGHTS_NORM_KEY = Key("expert_weights_norm", L.EXPERT_WEIGHTS_NORM, bool, False)


@dataclass(frozen=True)
class Traits:
    """What one variant of the graph changes, each a line or two of its llama.cpp file."""

    ffn_norm: T = T.FFN_NORM  # the FFN's norm (GLM-4.5: post_attention_norm)
    qk_norm: str = "none"  # none | optional (GLM-4.5: where the file has it) | required (dots.llm1)
    selection_bias: str = "none"  # exp_probs_b: none | optional | required
    gating: Gating | None = Gating.SOFTMAX  # fixed; None: the file's expert_gating_func
    gating_absent: Gating | None = None  # where the file's key is absent or 0 (None: refused, llama.cpp aborts)
    weights_norm: bool = False  # the file's expert_weights_norm renormalises the weights (DeepSeek-MoE: never)
    head_optional: bool = True  # the LM head may be tied to the embedding
    nextn: bool = False  # the file's last nextn_predict_layers layers are left out of the graph
    mha_only: bool = False  # K and V are sized as Q (dots.llm1's loader): one KV head per query head
    whole_heads: bool = True  # RoPE turns whole heads (llama.cpp asserts it; GLM-4.5 turns half)
    dense_lead: bool = True  # the first leading_dense_block_count FFNs are dense (Ling: the key is read, unused)
    fused_qkv: bool = False  # Q, K and V from one projection, attn_qkv (Ling 2.0)
    shared_width_key: bool = False  # expert_shared_feed_forward_length sizes a shared expert (else the experts' width)
    groups: bool = False  # group-limited routing where the file has expert groups (Ling 2.0)
    nextn_extra: tuple[T, ...] = ()  # what a NextN layer holds beyond the others' (Ling 2.0: layer_output_norm)
    residual_name: str = "ffn_inp"  # llama.cpp's name of the stream after attention (Ling 2.0: sa_out)
    # DeepSeek-OCR: RoPE over whole heads at base 10000, unscaled, whatever the file says of scaling (llama.cpp's
    # graph fixes it so, and asserts the base)
    plain_rope: bool = False
    gate_up_either: bool = False  # the experts' gate and up as one stack or two (llama.cpp's create_tensor_gate_up_exps)


class DeepSeek(Architecture):
    name = "deepseek"
    rope_mode = "norm"
    required_keys: ClassVar[tuple[str, ...]] = (A.HEAD_COUNT, A.LAYERNORM_RMS_EPS, L.EXPERT_FEED_FORWARD_LENGTH,
                                                L.EXPERT_SHARED_COUNT)
    keys = SHARED_EXPERT_KEYS
    traits: ClassVar[Traits] = Traits()

    def __init__(self, hp: HParams):
        t, key = self.traits, lambda k: k.format(arch=self.name)  # noqa: E731
        check_experts(hp, self.name, groups=t.groups)
        self.n_trunk = trunk_layers(hp, self.name) if t.nextn else hp.n_layer
        routed = not t.dense_lead or hp.n_layer_dense_lead < self.n_trunk
        if routed and not (hp.n_expert and hp.n_expert_used):
            raise MetadataError(f"the model's FFNs are mixtures of experts but '{key(L.EXPERT_COUNT)}' or "
                                f"'{key(L.EXPERT_USED_COUNT)}' is 0")
        if not hp.n_expert_shared:
            raise MetadataError(f"'{key(L.EXPERT_SHARED_COUNT)}' = 0: llama.cpp's graph adds shared experts to "
                                f"every mixture of experts")
        if t.mha_only and hp.head_count_kv(0) != hp.head_count(0):
            raise MetadataError(f"'{key(A.HEAD_COUNT_KV)}' = {hp.head_count_kv(0)}: llama.cpp's loader sizes K and V "
                                f"as Q, one KV head per query head ({hp.head_count(0)})")
        if t.whole_heads:
            check_whole_heads(hp, self.name)
        # GLM-4.5V's text model: M-RoPE (sections one after the other) where the file gives time and height sections
        sections = dict(hp.family).get("rope_sections")
        self.sections = tuple(sections) if sections and sections[0] and sections[1] else None
        if self.sections:
            self.rope_mode = "mrope"  # type: ignore[misc]  # the file decides, as llama.cpp's rope type
        self.gating = t.gating or gating(hp, self.name, t.gating_absent)
        if t.plain_rope and abs(hp.rope_freq_base - 10000.0) >= 1e-4:
            raise MetadataError(f"'{key(R.FREQ_BASE)}' is {hp.rope_freq_base}: llama.cpp's '{self.name}' graph turns "
                                f"by base 10000 alone")
        super().__init__(hp)

    def layers(self) -> LayerNeeds:
        return super().layers()[:self.n_trunk]

    def moe_layer(self, il: int) -> bool:
        return il >= self.hp.n_layer_dense_lead or not self.traits.dense_lead

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V, d = hp.n_embd, hp.n_vocab, hp.n_embd_head_k
        t = self.traits
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD) if t.head_optional else None)]
        for il in range(hp.n_layer):
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector")]
            if t.fused_qkv:
                layer += [spec(T.ATTN_QKV, (E, E + 2 * hp.n_embd_v_gqa), il),
                          spec(T.ATTN_OUT, (d * hp.head_count(il), E), il)]
            else:
                layer += qkv_tensors(hp, il)
            if t.qk_norm != "none":
                layer += [spec(n, (d,), il, kind="vector", optional=t.qk_norm == "optional")
                          for n in (T.ATTN_Q_NORM, T.ATTN_K_NORM)]
            layer.append(spec(t.ffn_norm, (E,), il, kind="vector"))
            if self.moe_layer(il):
                X, F = hp.n_expert, expert_width(hp)
                if t.gate_up_either:
                    layer += [spec(T.FFN_GATE_INP, (E, X), il), spec(T.FFN_DOWN_EXP, (F, E, X), il),
                              *gate_up_tensors(E, F, X, il)]
                else:
                    layer += routed_expert_tensors(E, F, X, il)
                if t.selection_bias != "none":
                    layer.append(spec(T.FFN_EXP_PROBS_B, (X,), il, "bias", kind="vector",
                                      optional=t.selection_bias == "optional"))
                layer += shared_expert_tensors(E, ((t.shared_width_key and hp.n_ff_shexp) or F) * hp.n_expert_shared, il)
            else:
                F = hp.ff_length(0)
                layer += swiglu_tensors(E, F, il)
            layer += layer_scales(layer, il, hp.n_expert)
            own = [spec(n, (E,), il, kind="vector") for n in t.nextn_extra]
            specs += layer if il < self.n_trunk else nextn_layer(layer + own, hp, il)
        return specs

    def ffn(self, b: GraphBuilder, h: Node, il: int) -> Node:
        hp, w = self.hp, b.w
        if not self.moe_layer(il):
            return b.build_ffn(h, up=w(T.FFN_UP, il), gate=w(T.FFN_GATE, il), down=w(T.FFN_DOWN, il))
        routing = dict(gating=self.gating, norm_w=self.traits.weights_norm and hp.expert_weights_norm,
                       w_scale=hp.expert_weights_scale,
                       probs_b=b.w_opt(T.FFN_EXP_PROBS_B, il, "bias") if self.traits.selection_bias != "none" else None,
                       n_groups=hp.n_expert_groups, n_group_used=hp.n_group_used if self.traits.groups else 0)
        if self.traits.gate_up_either:
            routed = b.build_moe_ffn(h, gate_inp=w(T.FFN_GATE_INP, il), down_exps=w(T.FFN_DOWN_EXP, il),
                                     **gate_up(b, il), n_expert=hp.n_expert, n_expert_used=hp.n_expert_used, **routing)
        else:
            routed = routed_experts(b, h, il, **routing)
        return b.op("add", routed, shared_expert(b, h, il), name="ffn_out")

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers(self.n_trunk):
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            q, k, v = b.build_qkv(h, il)
            if self.traits.qk_norm != "none" and b.w_opt(T.ATTN_Q_NORM, il) is not None:
                q = b.norm(q, T.ATTN_Q_NORM, il, name="Qcur_normed")
            if self.traits.qk_norm != "none" and b.w_opt(T.ATTN_K_NORM, il) is not None:
                k = b.norm(k, T.ATTN_K_NORM, il, name="Kcur_normed")
            rope = dict(n_dims=hp.n_embd_head_k, n_ctx_orig=0, freq_scale=1.0, ext_factor=0.0, attn_factor=1.0,
                        beta_fast=0.0, beta_slow=0.0) if self.traits.plain_rope else {}
            q = b.rope(q, pos, name="Qcur.rope", sections=self.sections, **rope)
            k = b.rope(k, pos, name="Kcur.rope", sections=self.sections, **rope)
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il),
                             kq_scale=inv_sqrt(hp.n_embd_head_k))
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name=self.traits.residual_name)
            norm = "post_attn_norm" if self.traits.ffn_norm is T.ATTN_POST_NORM else "ffn_norm"
            f = self.ffn(b, b.norm(x, self.traits.ffn_norm, il, name=norm), il)
            x = b.op("add", f, x, name="l_out")
        b.build_output(b.norm(x, T.OUTPUT_NORM, name="result_norm"), b.w(T.OUTPUT))


class Glm4Moe(DeepSeek):
    name = "glm4moe"
    rope_mode = "neox"
    required_keys = DeepSeek.required_keys + (L.FEED_FORWARD_LENGTH,)
    keys = SHARED_EXPERT_KEYS + (
        WEIGHTS_NORM_KEY, GATING_FUNC_KEY, NEXTN_KEY,
        Key("rope_sections", R.DIMENSION_SECTIONS, tuple, (), count=4),  # (): none
    )
    traits = Traits(ffn_norm=T.ATTN_POST_NORM, qk_norm="optional", selection_bias="required", gating=None,
                    gating_absent=Gating.SIGMOID, weights_norm=True, nextn=True, whole_heads=False)


class DeepSeek2OCR(DeepSeek):
    """DeepSeek-OCR's text model: DeepSeek-V2's mixture of experts (softmax routing where the file names no gating,
    weights renormalised and scaled as the file says, an optional selection bias) under plain multi-head attention
    (no MLA) turned over whole heads by llama.cpp's fixed NeoX RoPE (src/models/deepseek2.cpp, its OCR branch)."""

    name = "deepseek2-ocr"
    rope_mode = "neox"
    required_keys = (A.LAYERNORM_RMS_EPS, L.EXPERT_FEED_FORWARD_LENGTH, L.EXPERT_SHARED_COUNT)
    keys = SHARED_EXPERT_KEYS + (WEIGHTS_NORM_KEY, GATING_FUNC_KEY)
    traits = Traits(selection_bias="optional", gating=None, gating_absent=Gating.SOFTMAX, weights_norm=True,
                    mha_only=True, plain_rope=True, gate_up_either=True)


class Dots1(DeepSeek):
    name = "dots1"
    rope_mode = "neox"
    keys = SHARED_EXPERT_KEYS + (WEIGHTS_NORM_KEY, GATING_FUNC_KEY)
    traits = Traits(qk_norm="required", selection_bias="optional", gating=None, weights_norm=True,
                    head_optional=False, mha_only=True)


class BailingMoe(DeepSeek):
    """Ling (bailingmoe): DeepSeek-MoE's graph with every FFN routed, weights renormalised as the file says."""

    name = "bailingmoe"
    keys = SHARED_EXPERT_KEYS + (WEIGHTS_NORM_KEY,)
    traits = Traits(weights_norm=True, head_optional=False, dense_lead=False)


class BailingMoe2(DeepSeek):
    """Ling 2.0 (bailingmoe2): dots.llm1's graph with one fused QKV, partial rotation, the file's gating function
    (required) with group-limited routing where the file has groups, NextN layers left out."""

    name = "bailingmoe2"
    rope_mode = "neox"
    required_keys = DeepSeek.required_keys + (L.EXPERT_GATING_FUNC,)
    keys = SHARED_EXPERT_KEYS + (
        WEIGHTS_NORM_KEY, GATING_FUNC_KEY, NEXTN_KEY,
        Key("n_group_used", L.EXPERT_GROUP_USED_COUNT, int, 0, minimum=0),
        Key("n_ff_shexp", L.EXPERT_SHARED_FEED_FORWARD_LENGTH, int, 0, minimum=0),
    )
    traits = Traits(qk_norm="required", selection_bias="optional", gating=None, weights_norm=True,
                    head_optional=False, nextn=True, whole_heads=False, fused_qkv=True, shared_width_key=True,
                    groups=True, nextn_extra=(T.LAYER_OUT_NORM,), residual_name="sa_out")


# ---- Hugging Face: what convert_hf_to_gguf writes for each of these configs ----------------------------------

# DeepseekModel, Dots1Model: the dense lead, the experts' and shared experts' sizes, the weights' scale and norm
SHARED_EXPERT_RULES = (
    hf(L.LEADING_DENSE_BLOCK_COUNT, "first_k_dense_replace", kind="size", default=0),
    hf(L.EXPERT_FEED_FORWARD_LENGTH, "moe_intermediate_size"),
    hf(L.EXPERT_SHARED_COUNT, "n_shared_experts", "num_shared_experts", kind="size", default=0),
    hf(L.EXPERT_WEIGHTS_SCALE, "routed_scaling_factor", kind="number", default=None),
    derived(L.EXPERT_WEIGHTS_NORM, lambda c: c.find("norm_topk_prob", kind="flag", default=False) or None),
    VOCAB,
)
SELECTION_BIAS = r"blk\.\d+\.exp_probs_b\.bias"  # e_score_correction_bias

hf_config.register(Family("deepseek", TEXT + SHARED_EXPERT_RULES, {"tie_word_embeddings": False}),
                   "DeepseekForCausalLM")
hf_config.register(Family("bailingmoe", TEXT + SHARED_EXPERT_RULES + (derived(R.DIMENSION_COUNT, hf_config.head_dim),),
                          {"tie_word_embeddings": False}), "BailingMoeForCausalLM")
hf_config.register(Family("dots1", TEXT + SHARED_EXPERT_RULES, {"tie_word_embeddings": False},
                          lambda c: SELECTION_BIAS if c.find("topk_method", kind="text", default="") == "noaux_tc"
                          else ""), "Dots1ForCausalLM")




def _glm_written(n_layer: int, n_nextn: int, qk_norm: bool) -> str:
    """GLM-4.5's optional tensors: Q/K/V biases, QK-norm where the config asks for it, its NextN layers."""
    out = [r"blk\.\d+\.attn_[qkv]\.bias"]
    if qk_norm:
        out.append(r"blk\.\d+\.attn_[qk]_norm\.weight")
    if n_nextn:
        out.append(nextn_written(n_layer, n_nextn, r"attn_norm|attn_[qkv]|attn_output|post_attention_norm"))
    return "|".join(out)


def _ling2_written(c: Config) -> str:
    """Ling 2.0's optional tensors: the selection bias where the router trains one, its NextN layers."""
    out = [SELECTION_BIAS] if c.find("moe_router_enable_expert_bias", kind="flag", default=False) else []
    if _nextn(c):
        out.append(nextn_written(c.find("num_hidden_layers"), _nextn(c),
                                  r"attn_norm|attn_qkv|attn_output|attn_[qk]_norm|ffn_norm|layer_output_norm"))
    return "|".join(out)


def _nextn(c: Config) -> int:
    return c.find("num_nextn_predict_layers", kind="size", default=0)


def _rotated(default: float) -> Callable[[Config], int]:
    """The rotated values of a head: its size times partial_rotary_factor (``default`` where absent)."""
    return lambda c: int(hf_config.head_dim(c) * c.find("partial_rotary_factor", kind="number", default=default))


# GLM-4.5 and Ling 2.0 (Glm4MoeModel, BailingMoeV2Model): NextN layers counted in block_count, heads partly rotated
NEXTN_RULES = (
    derived(L.BLOCK_COUNT, lambda c: c.find("num_hidden_layers") + _nextn(c)),
    derived(L.NEXTN_PREDICT_LAYERS, lambda c: _nextn(c) or None),
)

hf_config.register(Family("glm4moe", TEXT + SHARED_EXPERT_RULES + NEXTN_RULES + (
    derived(R.DIMENSION_COUNT, _rotated(0.5)),
    fixed(L.EXPERT_GATING_FUNC, 2),  # sigmoid
), {"tie_word_embeddings": False},
    lambda c: _glm_written(c.find("num_hidden_layers"), _nextn(c),
                           c.find("use_qk_norm", kind="flag", default=False))),
    "Glm4MoeForCausalLM")
hf_config.register(Family("bailingmoe2", TEXT + SHARED_EXPERT_RULES + NEXTN_RULES + (
    derived(R.DIMENSION_COUNT, _rotated(1.0)),
    hf(L.EXPERT_SHARED_FEED_FORWARD_LENGTH, "moe_shared_expert_intermediate_size", default=None),
), {"tie_word_embeddings": False}, _ling2_written), "BailingMoeV2ForCausalLM")


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
    }, tied=False, include=_glm_written(n_layer, 1, qk_norm), f32=presets.ROUTER_F32, source=source)


presets.register({
    # DeepSeek-OCR's text model at tiny sizes (its released config is not known here for certain): 4 layers, the
    # first dense, 4 experts (2 used) in one gate-and-up stack each, a shared expert, multi-head attention
    "DeepSeek-OCR-tiny": Preset("deepseek2-ocr", {
        L.CONTEXT_LENGTH: 4096, L.EMBEDDING_LENGTH: 256, L.BLOCK_COUNT: 4, L.FEED_FORWARD_LENGTH: 384,
        A.HEAD_COUNT: 2, A.HEAD_COUNT_KV: 2, R.FREQ_BASE: 10000.0, A.LAYERNORM_RMS_EPS: 1e-6, L.EXPERT_COUNT: 4,
        L.EXPERT_USED_COUNT: 2, L.LEADING_DENSE_BLOCK_COUNT: 1, L.EXPERT_FEED_FORWARD_LENGTH: 128,
        L.EXPERT_SHARED_COUNT: 1, L.VOCAB_SIZE: 1024,
    }, tied=False, f32=presets.ROUTER_F32, source="synthetic header", include=r"blk\.\d+\.ffn_gate_up_exps\.weight"),
    # a synthetic header (no public config is given here): the conformance row's sizes, 4 layers (the first dense)
    # with 8 experts in 4 groups, 2 used from the 2 best groups, partial rotation, and one NextN layer
    "Ling-2.0-synthetic": Preset("bailingmoe2", {
        L.CONTEXT_LENGTH: 4096, L.EMBEDDING_LENGTH: 256, L.BLOCK_COUNT: 5, L.FEED_FORWARD_LENGTH: 384,
        A.HEAD_COUNT: 2, A.HEAD_COUNT_KV: 1, R.DIMENSION_COUNT: 64, R.FREQ_BASE: 600000.0, A.LAYERNORM_RMS_EPS: 1e-6,
        L.EXPERT_COUNT: 8, L.EXPERT_USED_COUNT: 2, L.EXPERT_GROUP_COUNT: 4, L.EXPERT_GROUP_USED_COUNT: 2,
        L.LEADING_DENSE_BLOCK_COUNT: 1, L.EXPERT_FEED_FORWARD_LENGTH: 128, L.EXPERT_SHARED_COUNT: 1,
        L.EXPERT_WEIGHTS_SCALE: 2.5, L.EXPERT_WEIGHTS_NORM: True, L.EXPERT_GATING_FUNC: 2, L.NEXTN_PREDICT_LAYERS: 1,
        L.VOCAB_SIZE: 1024,
    }, tied=False, f32=presets.ROUTER_F32, source="synthetic header",  # its NextN layer written, as llama.cpp requires
        include=SELECTION_BIAS + "|" + nextn_written(4, 1, r"attn_norm|attn_qkv|attn_output|attn_[qk]_norm|ffn_norm|"
                                                           r"layer_output_norm")),
    # 28 layers (the first dense), 16 heads of 128, 64 experts of 1408 with 6 per token by softmax and 2 shared
    "DeepSeek-MoE-16B": Preset("deepseek", {
        L.CONTEXT_LENGTH: 4096, L.EMBEDDING_LENGTH: 2048, L.BLOCK_COUNT: 28, L.FEED_FORWARD_LENGTH: 10944,
        A.HEAD_COUNT: 16, A.HEAD_COUNT_KV: 16, R.FREQ_BASE: 10000.0, A.LAYERNORM_RMS_EPS: 1e-6,
        L.EXPERT_COUNT: 64, L.EXPERT_USED_COUNT: 6, L.LEADING_DENSE_BLOCK_COUNT: 1, L.EXPERT_FEED_FORWARD_LENGTH: 1408,
        L.EXPERT_SHARED_COUNT: 2, L.VOCAB_SIZE: 102400,
    }, tied=False, f32=presets.ROUTER_F32, source="deepseek-ai/deepseek-moe-16b-base config.json"),
    # 28 layers, 16 query and 4 KV heads of 128, 64 experts of 1408 with 6 per token by softmax, renormalised, 2 shared
    "Ling-lite": Preset("bailingmoe", {
        L.CONTEXT_LENGTH: 16384, L.EMBEDDING_LENGTH: 2048, L.BLOCK_COUNT: 28, L.FEED_FORWARD_LENGTH: 5632,
        A.HEAD_COUNT: 16, A.HEAD_COUNT_KV: 4, R.DIMENSION_COUNT: 128, R.FREQ_BASE: 600000.0,
        A.LAYERNORM_RMS_EPS: 1e-6, L.EXPERT_COUNT: 64, L.EXPERT_USED_COUNT: 6, L.LEADING_DENSE_BLOCK_COUNT: 0,
        L.EXPERT_FEED_FORWARD_LENGTH: 1408, L.EXPERT_SHARED_COUNT: 2, L.EXPERT_WEIGHTS_NORM: True,
        L.VOCAB_SIZE: 126464,
    }, tied=False, f32=presets.ROUTER_F32, source="inclusionAI/Ling-lite config.json"),
    # 62 layers (the first dense), 32 heads of 128 with QK-norm, 128 experts of 1408 with 6 per token by sigmoid
    # scores and a selection bias, renormalised and scaled by 2.5, and 2 shared
    "dots.llm1": Preset("dots1", {
        L.CONTEXT_LENGTH: 32768, L.EMBEDDING_LENGTH: 4096, L.BLOCK_COUNT: 62, L.FEED_FORWARD_LENGTH: 10944,
        A.HEAD_COUNT: 32, A.HEAD_COUNT_KV: 32, A.KEY_LENGTH: 128, A.VALUE_LENGTH: 128, R.FREQ_BASE: 10000000.0,
        A.LAYERNORM_RMS_EPS: 1e-5, L.EXPERT_COUNT: 128, L.EXPERT_USED_COUNT: 6, L.EXPERT_GROUP_COUNT: 1,
        L.EXPERT_GROUP_USED_COUNT: 1, L.LEADING_DENSE_BLOCK_COUNT: 1, L.EXPERT_FEED_FORWARD_LENGTH: 1408,
        L.EXPERT_SHARED_COUNT: 2, L.EXPERT_WEIGHTS_SCALE: 2.5, L.EXPERT_WEIGHTS_NORM: True, L.EXPERT_GATING_FUNC: 2,
        L.VOCAB_SIZE: 152064,
    }, tied=False, include=SELECTION_BIAS, f32=presets.ROUTER_F32, source="rednote-hilab/dots.llm1.base config.json"),
    # 46 layers (the first dense), 128 experts of 1408, no QK-norm
    "GLM-4.5-Air": _glm45(4096, 46, 10944, 1, 128, 1408, 1.0, 131072, False, "zai-org/GLM-4.5-Air config.json"),
    # 92 layers (the first 3 dense), 160 experts of 1536, QK-norm, routed weights scaled by 2.5
    "GLM-4.6": _glm45(5120, 92, 12288, 3, 160, 1536, 2.5, 202752, True, "zai-org/GLM-4.6 config.json"),
})
