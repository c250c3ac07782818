"""Mellum (mellum): a pre-norm decoder with RMS QK-norm and a softmax-routed mixture of SwiGLU experts in every
layer (weights renormalised, each stack times its per-expert scales where the file has them). With
``attention.sliding_window`` set, three layers of every four slide (``sliding_window_pattern``) and rotate without
any RoPE scaling (llama.cpp's graph gives them scale 1, no YaRN, the model's base); the others rotate as the file
says.

No public configuration is at hand: the family's golden graphs come from llama.cpp's tiny header of it (the sizes
tests/test-llama-archs.cpp gives mellum).

Reference: JetBrains 2025, "Mellum"; llama.cpp src/models/mellum.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.hf_config import TEXT, VOCAB, Config, Family, hf
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hparams import HParams, Key, SlidingWindow
from graphir.model.moe import MOE_KEYS, routed_expert_tensors, experts, check_routed
from graphir.model.presets import Preset
from graphir.model.qkv import check_head_sizes, qk_norm_tensors, qkv, qkv_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope

UNSCALED = dict(freq_scale=1.0, ext_factor=0.0, attn_factor=1.0)  # the sliding layers' rotation


class Mellum(Architecture):
    name = "mellum"
    rope_mode = "neox"
    required_keys = (A.HEAD_COUNT, A.LAYERNORM_RMS_EPS, L.EXPERT_FEED_FORWARD_LENGTH)
    swa = SlidingWindow("standard", period=4, off_when_zero=True)
    keys = MOE_KEYS + (
        Key("n_ff_exp", L.EXPERT_FEED_FORWARD_LENGTH, tuple, (), minimum=0),
        Key("rope_freq_base_swa", R.FREQ_BASE_SWA, float, default_from="rope_freq_base"),  # read, not used
    )

    def __init__(self, hp: HParams):
        check_routed(hp, self.name)
        check_head_sizes(hp, self.name)
        super().__init__(hp)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V, X = hp.n_embd, hp.n_vocab, hp.n_expert
        F = hp.n_ff_exp[0] or hp.ff_length(0) // hp.n_expert_used
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"), spec(T.OUTPUT, (E, V))]
        for il in range(hp.n_layer):
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), *qkv_tensors(hp, il), *qk_norm_tensors(hp, il),
                     spec(T.FFN_NORM, (E,), il, kind="vector"), *routed_expert_tensors(E, F, X, il)]
            specs += layer + layer_scales(layer, il, X)
        return specs

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            q, k, v = qkv(b, h, il, True)
            rope = UNSCALED if hp.is_swa(il) else {}
            q = b.rope(q, pos, name="Qcur.rope", **rope)
            k = b.rope(k, pos, name="Kcur.rope", **rope)
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il), kq_scale=b.kq_scale())
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            h = b.norm(x, T.FFN_NORM, il, name="ffn_norm")
            f = b.build_moe_ffn(h, **experts(b, il),
                                up_exps_s=b.scale(T.FFN_UP_EXP, il), gate_exps_s=b.scale(T.FFN_GATE_EXP, il),
                                down_exps_s=b.scale(T.FFN_DOWN_EXP, il),
                                n_expert=hp.n_expert, n_expert_used=hp.n_expert_used, norm_w=True)
            x = b.op("add", f, x, name="l_out")
        x = b.norm(x, T.OUTPUT_NORM, name="result_norm")
        b.build_output(x, b.w(T.OUTPUT))


def sliding_layers(c: Config) -> dict[str, object]:
    """The window and the per-layer pattern of layer_types, where the config slides (use_sliding_window not
    false): what the converter writes for Mellum and Maple."""
    window = c.find("sliding_window", kind="size", default=None)
    if window is None or c.find("use_sliding_window", kind="flag", default=True) is False:
        return {}
    return {A.SLIDING_WINDOW: window,
            A.SLIDING_WINDOW_PATTERN: [t == "sliding_attention" for t in c.find("layer_types", kind="list")]}


hf_config.register(Family("mellum", TEXT + (VOCAB, hf(L.EXPERT_FEED_FORWARD_LENGTH, "moe_intermediate_size",
                                                       default=None), sliding_layers),
                          {"tie_word_embeddings": False}), "MellumForCausalLM")


presets.register({
    # llama.cpp's tiny mellum, over five layers (so that alike ones fold) alternating as its first two: width 256, two
    # heads of 128; layer 0 slides over 32 positions (pattern 2), layer 1 is global; each FFN 2 experts of 384, both
    # used
    "mellum-tiny-header": Preset("mellum", {
        L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 256, L.BLOCK_COUNT: 5, L.FEED_FORWARD_LENGTH: 384,
        A.HEAD_COUNT: 2, A.HEAD_COUNT_KV: 2, A.LAYERNORM_RMS_EPS: 1e-5, A.SLIDING_WINDOW: 32,
        A.SLIDING_WINDOW_PATTERN: 2, L.VOCAB_SIZE: 128, L.EXPERT_COUNT: 2, L.EXPERT_USED_COUNT: 2,
        L.EXPERT_FEED_FORWARD_LENGTH: 384,
    }, tied=False, f32=presets.ROUTER_F32, source="llama.cpp tests/test-llama-archs.cpp, its tiny mellum header"),
})
