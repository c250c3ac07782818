"""Maple (maple): a pre-norm decoder with RMS QK-norm whose sliding-window layers (the file's per-layer pattern) are
RoPE'd, over ``rope.dimension_count_swa`` dims, and whose global layers attend without positions; every FFN a
softmax-routed mixture of SwiGLU experts (weights renormalised) whose gate and up are clamped at the layer's
``swiglu_clamp_exp`` (ggml's swiglu_clamp).

No public configuration is at hand: the family's golden graphs come from llama.cpp's tiny header of it (the sizes
tests/test-llama-archs.cpp gives maple).

Reference: llama.cpp src/models/maple.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.arch.mellum import sliding_layers
from graphir.model import hf_config, presets
from graphir.model.hf_config import TEXT, VOCAB, Config, Family, derived, head_dim, hf
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hparams import HParams, Key, SlidingWindow
from graphir.model.moe import MOE_KEYS, routed_expert_tensors, experts, check_routed
from graphir.model.presets import Preset
from graphir.model.qkv import check_head_sizes, qk_norm_tensors, qkv, qkv_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class Maple(Architecture):
    name = "maple"
    rope_mode = "neox"
    required_keys = (A.LAYERNORM_RMS_EPS, A.SLIDING_WINDOW, A.SLIDING_WINDOW_PATTERN, L.EXPERT_FEED_FORWARD_LENGTH,
                     L.SWIGLU_CLAMP_EXP)
    swa = SlidingWindow("standard")  # the window and the per-layer pattern from the file
    keys = MOE_KEYS + (
        Key("n_ff_exp", L.EXPERT_FEED_FORWARD_LENGTH, tuple, (), minimum=0),
        Key("swiglu_clamp_exp", L.SWIGLU_CLAMP_EXP, tuple, (), item=float),
        Key("rope_freq_base_swa", R.FREQ_BASE_SWA, float, default_from="rope_freq_base"),
        Key("n_rot_swa", R.DIMENSION_COUNT_SWA, int, default_from="n_rot", minimum=0),
    )

    def __init__(self, hp: HParams):
        check_routed(hp, self.name)
        check_head_sizes(hp, self.name, rotated=False)
        super().__init__(hp)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V, X, F = hp.n_embd, hp.n_vocab, hp.n_expert, hp.n_ff_exp[0]
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
            if hp.is_swa(il):  # only the sliding layers know positions
                rope = dict(freq_base=hp.rope_freq_base_swa, n_dims=hp.n_rot_swa)
                q = b.rope(q, pos, name="Qcur.rope", **rope)
                k = b.rope(k, pos, name="Kcur.rope", **rope)
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il), kq_scale=b.kq_scale())
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            h = b.norm(x, T.FFN_NORM, il, name="ffn_norm")
            f = b.build_moe_ffn(h, **experts(b, il),
                                n_expert=hp.n_expert, n_expert_used=hp.n_expert_used, norm_w=True,
                                swiglu_limit=hp.swiglu_clamp_exp[il])
            x = b.op("add", f, x, name="l_out")
        x = b.norm(x, T.OUTPUT_NORM, name="result_norm")
        b.build_output(x, b.w(T.OUTPUT))


def _rotated(c: Config) -> int:
    return int(head_dim(c) * c.rope.get("partial_rotary_factor", 1.0))


# the converter clamps every layer's experts at 7, as the reference model does
hf_config.register(Family("maple", TEXT + (VOCAB, derived(R.DIMENSION_COUNT, _rotated), sliding_layers,
                                           hf(L.EXPERT_FEED_FORWARD_LENGTH, "moe_intermediate_size"),
                                           derived(L.SWIGLU_CLAMP_EXP, lambda c: [7.0] * c.find(*hf_config.BLOCKS))),
                          {"tie_word_embeddings": False}), "MapleForCausalLM")


presets.register({
    # llama.cpp's tiny maple, over five layers (so that alike ones fold) alternating as its first two: width 256, two
    # heads of 128; layer 1 slides over 32 positions (RoPE'd), layer 0 is global without positions; each FFN 2 experts
    # of 384, both used, their SwiGLU clamped at 7
    "maple-tiny-header": Preset("maple", {
        L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 256, L.BLOCK_COUNT: 5, L.FEED_FORWARD_LENGTH: 384,
        A.HEAD_COUNT: 2, A.HEAD_COUNT_KV: 2, A.LAYERNORM_RMS_EPS: 1e-5, A.SLIDING_WINDOW: 32,
        A.SLIDING_WINDOW_PATTERN: [il % 2 == 1 for il in range(5)], L.VOCAB_SIZE: 128, L.EXPERT_COUNT: 2,
        L.EXPERT_USED_COUNT: 2,
        L.EXPERT_FEED_FORWARD_LENGTH: 384, L.SWIGLU_CLAMP_EXP: 7.0,
    }, tied=False, f32=presets.ROUTER_F32, source="llama.cpp tests/test-llama-archs.cpp, its tiny maple header"),
})
