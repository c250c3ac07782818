"""AFMoE (afmoe, Arcee's Trinity): a decoder with norms before and after both its attention and its FFN, RMS
QK-norm, and the attention's output gated per value by sigmoid(W_gate x) before W_o.

The token embeddings are scaled by sqrt(n_embd) (muP). Every fourth layer attends without positions; the others
rotate Q and K (NEOX), the sliding ones with ``rope.freq_base_swa``. Three layers of every four slide over
``attention.sliding_window`` positions (the pattern from the file where it gives one). The first
``leading_dense_block_count`` FFNs are dense SwiGLU; the others route each token to its ``expert_used_count`` best experts (sigmoid unless the
file's gating function says otherwise, with a selection bias; weights normalised and scaled as the file says) and
add ``expert_shared_count`` shared experts.

Reference: Arcee AI 2025, "Trinity"; llama.cpp src/models/afmoe.cpp. No public configuration is at hand: the golden
graphs come from a tiny header.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.graph.floats import f32, inv_sqrt
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import Gating, GraphBuilder
from graphir.model.hf_config import TEXT, VOCAB, Family, derived, hf
from graphir.model.hparams import HParams, Key, SlidingWindow
from graphir.model.moe import (MOE_KEYS, check_routed, experts, gating, routed_expert_tensors, shared_expert,
                               shared_expert_tensors)
from graphir.model.presets import Preset
from graphir.model.qkv import fused_or_split_qkv_tensors, qk_norm_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, swiglu_tensors, tensor_name

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope
NO_ROPE_STEP = 4  # llama.cpp's n_no_rope_layer_step, which AFMoE's loader leaves at its default: layer 4k+3 has no RoPE


class Afmoe(Architecture):
    name = "afmoe"
    rope_mode = "neox"
    required_keys = (A.LAYERNORM_RMS_EPS, L.EXPERT_FEED_FORWARD_LENGTH, L.EXPERT_SHARED_COUNT)
    # the window is required: llama.cpp's loader takes a file without one, but its graph then reads a sliding cache
    # the context does not have (and crashes)
    swa = SlidingWindow("standard", period=4)
    keys = MOE_KEYS + (
        Key("n_layer_dense_lead", L.LEADING_DENSE_BLOCK_COUNT, int, 0, minimum=0),
        Key("n_ff_exp", L.EXPERT_FEED_FORWARD_LENGTH, tuple, (), minimum=0),
        Key("n_expert_shared", L.EXPERT_SHARED_COUNT, int, 0, minimum=0),
        Key("expert_gating_func", L.EXPERT_GATING_FUNC, int, 0, minimum=0),  # 0: sigmoid
        Key("expert_weights_scale", L.EXPERT_WEIGHTS_SCALE, float, 0.0),
        Key("expert_weights_norm", L.EXPERT_WEIGHTS_NORM, bool, False),
        Key("rope_freq_base_swa", R.FREQ_BASE_SWA, float, default_from="rope_freq_base"),
    )

    def __init__(self, hp: HParams):
        if hp.n_layer_dense_lead < hp.n_layer:
            check_routed(hp, self.name)
        self.gating = gating(hp, self.name, Gating.SIGMOID)
        super().__init__(hp)

    def moe_layer(self, il: int) -> bool:
        return il >= self.hp.n_layer_dense_lead

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V, X, d = hp.n_embd, hp.n_vocab, hp.n_expert, hp.n_embd_head_k
        Fx = hp.n_ff_exp[0]
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD))]
        for il in range(hp.n_layer):
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), spec(T.ATTN_POST_NORM, (E,), il, kind="vector"),
                     *fused_or_split_qkv_tensors(hp, il), spec(T.ATTN_OUT, (hp.head_count(il) * d, E), il),
                     *qk_norm_tensors(hp, il), spec(T.ATTN_GATE, (E, d * hp.head_count(il)), il),
                     spec(T.FFN_NORM, (E,), il, kind="vector"), spec(T.FFN_POST_NORM, (E,), il, kind="vector")]
            if self.moe_layer(il):
                layer += [*routed_expert_tensors(E, Fx, X, il),
                          spec(T.FFN_EXP_PROBS_B, (X,), il, "bias", kind="vector"),
                          *(shared_expert_tensors(E, Fx * hp.n_expert_shared, il) if hp.n_expert_shared else ())]
            else:
                layer += swiglu_tensors(E, hp.ff_length(il), il)
            specs += layer + layer_scales(layer, il, X)
        return specs

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = b.op("scale", b.build_inp_embd(b.w(T.TOKEN_EMBD)), s=f32(hp.n_embd ** 0.5), name="inp_embd_scaled")
        pos = b.build_inp_pos()
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            q, k, v = b.build_qkv(h, il)
            gate = b.mm(b.w(T.ATTN_GATE, il), h, name="attn_gate_proj")  # its scale unread, as llama.cpp
            q, k = b.norm(q, T.ATTN_Q_NORM, il, name="Qcur_normed"), b.norm(k, T.ATTN_K_NORM, il, name="Kcur_normed")
            if (il + 1) % NO_ROPE_STEP:
                base = hp.rope_freq_base_swa if hp.is_swa(il) else None
                q = b.rope(q, pos, name="Qcur_rope", freq_base=base)
                k = b.rope(k, pos, name="Kcur_rope", freq_base=base)
            a = b.build_attn(q, k, v, wo=None, kq_scale=inv_sqrt(hp.n_embd_head_k))
            a = b.op("mul", a, b.op("sigmoid", gate, name="attn_gate_sig"), name="attn_gated")
            a = b.mm(b.w(T.ATTN_OUT, il), a, b.scale(T.ATTN_OUT, il), name="attn_o_proj")
            a = b.norm(a, T.ATTN_POST_NORM, il, name="attn_post_norm")
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            h = b.norm(x, T.FFN_NORM, il, name="ffn_norm")
            if self.moe_layer(il):
                f = b.build_moe_ffn(h, **experts(b, il), probs_b=b.w(T.FFN_EXP_PROBS_B, il, "bias"),
                                    n_expert=hp.n_expert, n_expert_used=hp.n_expert_used, gating=self.gating,
                                    norm_w=hp.expert_weights_norm, w_scale=hp.expert_weights_scale)
                if hp.n_expert_shared:
                    f = b.op("add", f, shared_expert(b, h, il), name="ffn_out")
            else:
                f = b.build_ffn(h, up=b.w(T.FFN_UP, il), gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il))
            f = b.norm(f, T.FFN_POST_NORM, il, name="ffn_post_norm")
            x = b.op("add", f, x, name="l_out")
        b.build_output(b.norm(x, T.OUTPUT_NORM, name="result_norm"), b.w(T.OUTPUT))


# AfmoeModel: LlamaModel's keys (the rotated dimensions a head), the shared experts, the experts' width, the
# leading dense layers, the routing's normalisation and scale, the window
hf_config.register(Family("afmoe", TEXT + (
    VOCAB, derived(R.DIMENSION_COUNT, hf_config.head_dim),
    hf(L.EXPERT_SHARED_COUNT, "num_shared_experts", kind="size", default=None),
    hf(L.EXPERT_FEED_FORWARD_LENGTH, "moe_intermediate_size", default=None),
    hf(L.LEADING_DENSE_BLOCK_COUNT, "num_dense_layers", kind="size", default=None),
    hf(L.EXPERT_WEIGHTS_NORM, "route_norm", kind="flag", default=None),
    hf(L.EXPERT_WEIGHTS_SCALE, "route_scale", kind="number", default=None),
    hf(A.SLIDING_WINDOW, "sliding_window", default=None),
), {"tie_word_embeddings": False}, lambda c: presets.SPLIT_QKV), "AfmoeForCausalLM")


presets.register({
    # llama.cpp's tiny afmoe over five layers (so that alike ones fold): width 256, four heads of 64 sharing two
    # K/V heads; layer 0 dense (384), then 2 experts of 384 (both used, sigmoid-routed with a selection bias) and a
    # shared expert of 384; three layers of four sliding over 32 positions, the fourth without positions
    "afmoe-tiny-header": Preset("afmoe", {
        L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 256, L.BLOCK_COUNT: 5, L.FEED_FORWARD_LENGTH: 384,
        A.HEAD_COUNT: 4, A.HEAD_COUNT_KV: 2, A.LAYERNORM_RMS_EPS: 1e-5, A.SLIDING_WINDOW: 32, L.VOCAB_SIZE: 128,
        L.LEADING_DENSE_BLOCK_COUNT: 1, L.EXPERT_COUNT: 2, L.EXPERT_USED_COUNT: 2, L.EXPERT_FEED_FORWARD_LENGTH: 384,
        L.EXPERT_SHARED_COUNT: 1, L.EXPERT_GATING_FUNC: 2,
    }, tied=False, include=presets.SPLIT_QKV, f32=presets.ROUTER_F32,
        source="llama.cpp tests/test-llama-archs.cpp's tiny afmoe header"),
})
