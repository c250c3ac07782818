"""EXAONE MoE (exaone-moe): a pre-norm decoder with RMS QK-norm whose sliding-window layers (three of every four,
over ``attention.sliding_window`` positions) are RoPE'd and whose global layers attend without positions; the first
``leading_dense_block_count`` FFNs are dense SwiGLU, the others a mixture of experts routed by the file's gating
function (with an optional selection bias; weights normalised and scaled as the file says) plus a shared expert.
Multi-token-prediction layers (``nextn_predict_layers``, dense) are loaded as llama.cpp asks for them and never run.

No public configuration is at hand: the family's golden graphs come from llama.cpp's tiny header of it (the sizes
tests/test-llama-archs.cpp gives exaone-moe).

Reference: LG AI Research 2025, "K-EXAONE"; llama.cpp src/models/exaone-moe.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.arch.deepseek2 import GATINGS
from graphir.arch.exaone4 import sliding
from graphir.errors import MetadataError
from graphir.model import hf_config, presets
from graphir.model.hf_config import BLOCKS, TEXT, VOCAB, Config, Family, derived, fixed, hf
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hparams import HParams, Key, SlidingWindow
from graphir.model.moe import (MOE_KEYS, NEXTN_KEY, check_experts, experts, nextn_layer, routed_expert_tensors,
                               shared_expert, shared_expert_tensors, trunk_layers)
from graphir.model.presets import Preset
from graphir.model.qkv import check_head_sizes, qk_norm_tensors, qkv, qkv_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, swiglu_tensors
from graphir.memory.layers import LayerNeeds

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class ExaoneMoe(Architecture):
    name = "exaone-moe"
    rope_mode = "neox"
    required_keys = (A.HEAD_COUNT, A.LAYERNORM_RMS_EPS, A.SLIDING_WINDOW, L.EXPERT_FEED_FORWARD_LENGTH,
                     L.EXPERT_GATING_FUNC)
    swa = SlidingWindow("standard", period=4)
    keys = MOE_KEYS + (
        Key("n_ff_exp", L.EXPERT_FEED_FORWARD_LENGTH, tuple, (), minimum=0),
        Key("n_ff_shexp", L.EXPERT_SHARED_FEED_FORWARD_LENGTH, int, 0, minimum=0),
        Key("n_expert_shared", L.EXPERT_SHARED_COUNT, int, 0, minimum=0),  # read, not used by the graph
        Key("expert_gating_func", L.EXPERT_GATING_FUNC, int, 0, minimum=0),
        Key("expert_weights_scale", L.EXPERT_WEIGHTS_SCALE, float, 0.0),
        Key("expert_weights_norm", L.EXPERT_WEIGHTS_NORM, bool, False),
        Key("n_layer_dense_lead", L.LEADING_DENSE_BLOCK_COUNT, int, 0, minimum=0),
        Key("rope_freq_base_swa", R.FREQ_BASE_SWA, float, default_from="rope_freq_base"),  # read, not used
        NEXTN_KEY,
    )

    def __init__(self, hp: HParams):
        key = lambda t: t.format(arch=self.name)  # noqa: E731
        self.n_trunk = trunk_layers(hp, self.name)  # the prediction layers after it are loaded, never run
        if hp.n_layer_dense_lead < self.n_trunk and not hp.n_expert:
            raise MetadataError(f"a '{self.name}' model needs experts ('{key(L.EXPERT_COUNT)}' > 0)")
        check_experts(hp, self.name)
        if hp.expert_gating_func not in GATINGS:
            raise MetadataError(f"'{key(L.EXPERT_GATING_FUNC)}' = {hp.expert_gating_func}: not a gating graphir "
                                f"builds (1 softmax, 2 sigmoid, 3 softmax of the chosen)")
        check_head_sizes(hp, self.name)
        super().__init__(hp)

    def moe_layer(self, il: int) -> bool:
        """A mixture of experts after the leading dense layers; the prediction layers are dense."""
        return self.hp.n_layer_dense_lead <= il < self.n_trunk

    def layers(self) -> LayerNeeds:
        return super().layers()[:self.n_trunk]

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V, X = hp.n_embd, hp.n_vocab, hp.n_expert
        Fx = hp.n_ff_exp[0]
        Fs = hp.n_ff_shexp or Fx
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"), spec(T.OUTPUT, (E, V)),
                 spec(T.ROPE_FREQS, (hp.n_rot // 2,), kind="vector", optional=True)]
        for il in range(hp.n_layer):
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), *qkv_tensors(hp, il), *qk_norm_tensors(hp, il),
                     spec(T.FFN_NORM, (E,), il, kind="vector")]
            if self.moe_layer(il):
                layer += [*routed_expert_tensors(E, Fx, X, il), *shared_expert_tensors(E, Fs, il),
                          spec(T.FFN_EXP_PROBS_B, (X,), il, "bias", kind="vector", optional=True)]
            else:
                F = hp.ff_length(il)
                layer += swiglu_tensors(E, F, il)
            layer += layer_scales(layer, il, X)
            specs += layer if il < self.n_trunk else nextn_layer(layer, hp, il, required=True)
        return specs

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers(self.n_trunk):
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            q, k, v = qkv(b, h, il, True)
            if hp.is_swa(il):  # only the sliding layers know positions
                rope_factors = b.w_opt(T.ROPE_FREQS)
                q = b.rope(q, pos, rope_factors, name="Qcur.rope")
                k = b.rope(k, pos, rope_factors, name="Kcur.rope")
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il), kq_scale=b.kq_scale())
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            h = b.norm(x, T.FFN_NORM, il, name="ffn_norm")
            if self.moe_layer(il):
                moe = b.build_moe_ffn(h, **experts(b, il), probs_b=b.w_opt(T.FFN_EXP_PROBS_B, il, "bias"),
                                      n_expert=hp.n_expert, n_expert_used=hp.n_expert_used,
                                      gating=GATINGS[hp.expert_gating_func],
                                      norm_w=hp.expert_weights_norm, w_scale=hp.expert_weights_scale)
                f = b.op("add", moe, shared_expert(b, h, il), name="ffn_out")
            else:
                f = b.build_ffn(h, up=b.w(T.FFN_UP, il), gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il))
            x = b.op("add", f, x, name="l_out")
        x = b.norm(x, T.OUTPUT_NORM, name="result_norm")
        b.build_output(x, b.w(T.OUTPUT))


def _shared(c: Config) -> dict[str, object]:
    width, n = c.find("moe_intermediate_size"), c.find("num_shared_experts", kind="size")
    return {L.EXPERT_FEED_FORWARD_LENGTH: width, L.EXPERT_SHARED_COUNT: n,
            L.EXPERT_SHARED_FEED_FORWARD_LENGTH: width * n}


# ExaoneMoEModel: Exaone4Model's keys (the window and its pattern), the experts', and no RoPE scaling; its
# multi-token-prediction layers counted in the blocks
hf_config.register(Family("exaone-moe", TEXT + (
    VOCAB, sliding, _shared,
    hf(L.EXPERT_WEIGHTS_SCALE, "routed_scaling_factor", kind="number"),
    hf(L.EXPERT_WEIGHTS_NORM, "norm_topk_prob", kind="flag"),
    hf(L.LEADING_DENSE_BLOCK_COUNT, "first_k_dense_replace", "first_last_k_dense_replace", kind="size", default=0),
    hf(L.NEXTN_PREDICT_LAYERS, "num_nextn_predict_layers", kind="size", default=0),
    derived(L.BLOCK_COUNT, lambda c: c.find(*BLOCKS) + c.find("num_nextn_predict_layers", kind="size", default=0)),
    fixed(R.SCALING_TYPE, "none"),
), {"tie_word_embeddings": False}), "ExaoneMoEForCausalLM", "ExaoneMoeForCausalLM")


presets.register({
    # llama.cpp's tiny exaone-moe, over five layers (so that alike ones fold) alternating as its first two: width 256,
    # two heads of 128; layer 0 slides over 32 positions (pattern 2) with a dense FFN of 384, layer 1 is global without
    # positions with 2 experts of 384 (both used, sigmoid-routed) and a shared expert of 192
    "exaone-moe-tiny-header": Preset("exaone-moe", {
        L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 256, L.BLOCK_COUNT: 5, L.FEED_FORWARD_LENGTH: 384,
        A.HEAD_COUNT: 2, A.HEAD_COUNT_KV: 2, A.LAYERNORM_RMS_EPS: 1e-5, A.SLIDING_WINDOW: 32,
        A.SLIDING_WINDOW_PATTERN: 2, L.VOCAB_SIZE: 128, L.LEADING_DENSE_BLOCK_COUNT: 1, L.EXPERT_COUNT: 2,
        L.EXPERT_USED_COUNT: 2, L.EXPERT_FEED_FORWARD_LENGTH: 384, L.EXPERT_SHARED_FEED_FORWARD_LENGTH: 192,
        L.EXPERT_SHARED_COUNT: 1, L.EXPERT_GATING_FUNC: 2,
    }, tied=False, f32=presets.ROUTER_F32, source="llama.cpp tests/test-llama-archs.cpp, its tiny exaone-moe header"),
})
