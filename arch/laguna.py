"""Laguna (laguna): a pre-norm decoder with RMS QK-norm whose attention output is gated per head by
softplus(W_gate x) before W_o; the first ``leading_dense_block_count`` FFNs are dense SwiGLU, the others a
mixture of experts (sigmoid-routed unless the file says otherwise, with a selection bias; weights normalised and
scaled as the file says) plus a shared expert. With ``attention.sliding_window`` set, all but the first of every
four layers slide and rotate plainly (no YaRN: scale 1, the trained context, ``rope.freq_base_swa`` and
``rope.dimension_count_swa``); the others rotate as the file says. Per-layer head counts are read as llama.cpp
reads them. The gate has one value per head (XS.2) or per element of every head (M.1, ``attn_gate`` of
head_dim * n_head rows), as the file's gate says.

No public configuration is at hand: the family's golden graphs come from llama.cpp's tiny header of it (the sizes
tests/test-llama-archs.cpp gives laguna).

Reference: llama.cpp src/models/laguna.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.arch.deepseek2 import GATINGS
from graphir.errors import MetadataError
from graphir.model import hf_config, presets
from graphir.model.hf_config import BLOCKS, TEXT, VOCAB, Config, Family, derived, fixed, hf
from graphir.model.architecture import Architecture
from graphir.model.builder import Gating, GraphBuilder
from graphir.model.hparams import HParams, Key, SlidingWindow
from graphir.model.moe import MOE_KEYS, check_experts, routed_expert_tensors, experts, shared_expert, shared_expert_tensors
from graphir.model.presets import Preset
from graphir.model.qkv import check_head_sizes, qk_norm_tensors, qkv_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, tensor_name

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class Laguna(Architecture):
    name = "laguna"
    rope_mode = "neox"
    required_keys = (A.LAYERNORM_RMS_EPS, L.LEADING_DENSE_BLOCK_COUNT, L.EXPERT_FEED_FORWARD_LENGTH)
    swa = SlidingWindow("standard", period=4, dense_first=True, off_when_zero=True)
    per_layer = True  # head counts per layer, as llama.cpp reads them
    keys = MOE_KEYS + (
        Key("n_layer_dense_lead", L.LEADING_DENSE_BLOCK_COUNT, int, 0, minimum=0),
        Key("n_ff_exp", L.EXPERT_FEED_FORWARD_LENGTH, tuple, (), minimum=0),
        Key("expert_gating_func", L.EXPERT_GATING_FUNC, int, 0, minimum=0),  # 0: sigmoid
        Key("expert_weights_scale", L.EXPERT_WEIGHTS_SCALE, float, 0.0),
        Key("expert_weights_norm", L.EXPERT_WEIGHTS_NORM, bool, False),
        Key("n_expert_shared", L.EXPERT_SHARED_COUNT, int, 1, minimum=0),
        Key("n_ff_shexp", L.EXPERT_SHARED_FEED_FORWARD_LENGTH, int, 0, minimum=0),  # 0: n_ff_exp per shared one
        Key("rope_freq_base_swa", R.FREQ_BASE_SWA, float, default_from="rope_freq_base"),
        Key("n_rot_swa", R.DIMENSION_COUNT_SWA, int, default_from="n_rot", minimum=0),
    )

    def __init__(self, hp: HParams):
        key = lambda t: t.format(arch=self.name)  # noqa: E731
        if hp.n_layer_dense_lead < hp.n_layer and not hp.n_expert:
            raise MetadataError(f"a '{self.name}' model needs experts ('{key(L.EXPERT_COUNT)}' > 0)")
        check_experts(hp, self.name)
        if hp.expert_gating_func not in (0, *GATINGS):
            raise MetadataError(f"'{key(L.EXPERT_GATING_FUNC)}' = {hp.expert_gating_func}: not a gating graphir "
                                f"builds (1 softmax, 2 sigmoid, 3 softmax of the chosen)")
        check_head_sizes(hp, self.name, rotated=False)
        super().__init__(hp)

    def moe_layer(self, il: int) -> bool:
        return il >= self.hp.n_layer_dense_lead

    def gating(self) -> Gating:
        return GATINGS.get(self.hp.expert_gating_func, Gating.SIGMOID)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V, X, Fx = hp.n_embd, hp.n_vocab, hp.n_expert, hp.n_ff_exp[0]
        Fs = hp.n_ff_shexp or Fx * hp.n_expert_shared
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD))]
        for il in range(hp.n_layer):
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), *qkv_tensors(hp, il), *qk_norm_tensors(hp, il),
                     spec(T.ATTN_GATE, (E, hp.head_count(il)), il, also=(E, hp.n_embd_head_k * hp.head_count(il))),
                     spec(T.FFN_NORM, (E,), il, kind="vector")]
            if self.moe_layer(il):
                layer += [*routed_expert_tensors(E, Fx, X, il), *shared_expert_tensors(E, Fs, il),
                          spec(T.FFN_EXP_PROBS_B, (X,), il, "bias", kind="vector")]
            else:
                F = hp.ff_length(il)
                layer += [spec(T.FFN_GATE, (E, F), il), spec(T.FFN_UP, (E, F), il), spec(T.FFN_DOWN, (F, E), il)]
            specs += layer + layer_scales(layer, il, X)
        return specs

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        plain = dict(freq_base=hp.rope_freq_base_swa, freq_scale=1.0, ext_factor=0.0, attn_factor=1.0,
                     beta_fast=0.0, beta_slow=0.0, n_ctx_orig=hp.n_ctx_train, n_dims=hp.n_rot_swa)
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            H, d, n_tok = hp.head_count(il), hp.n_embd_head_k, b.n_tokens
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            q, k, v = b.build_qkv(h, il)
            gate = b.mm(b.w(T.ATTN_GATE, il), h, name="attn_gate_proj")  # its scale unread, as llama.cpp
            q, k = b.norm(q, T.ATTN_Q_NORM, il, name="Qcur_normed"), b.norm(k, T.ATTN_K_NORM, il, name="Kcur_normed")
            rope = plain if hp.is_swa(il) else {}
            q = b.rope(q, pos, name="Qcur_rope", **rope)  # type: ignore[arg-type]
            k = b.rope(k, pos, name="Kcur_rope", **rope)  # type: ignore[arg-type]
            a = b.build_attn(q, k, v, wo=None, kq_scale=b.kq_scale())
            gate = b.op("softplus", gate, name="attn_gate_softplus")
            per_head = gate.shape[0] == H  # a gate per head, over its values; else one per value
            if per_head:
                gate = b.reshape(gate, (1, H, n_tok), name="attn_gate.heads")
                a = b.op("mul", b.reshape(a, (d, H, n_tok), name="attn_out.heads"), gate, name="attn_gated.heads")
            else:
                a = b.op("mul", a, gate, name="attn_gated")
            a = b.mm(b.w(T.ATTN_OUT, il), b.reshape(a, (d * H, n_tok), name="attn_gated") if per_head else a,
                     b.scale(T.ATTN_OUT, il), name="attn_o_proj")
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            h = b.norm(x, T.FFN_NORM, il, name="ffn_norm")
            if self.moe_layer(il):
                moe = b.build_moe_ffn(h, **experts(b, il), probs_b=b.w(T.FFN_EXP_PROBS_B, il, "bias"),
                                      n_expert=hp.n_expert, n_expert_used=hp.n_expert_used, gating=self.gating(),
                                      norm_w=hp.expert_weights_norm, w_scale=hp.expert_weights_scale)
                f = b.op("add", moe, shared_expert(b, h, il), name="ffn_out")
            else:
                f = b.build_ffn(h, up=b.w(T.FFN_UP, il), gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il))
            x = b.op("add", f, x, name="l_out")
        x = b.norm(x, T.OUTPUT_NORM, name="result_norm")
        b.build_output(x, b.w(T.OUTPUT))


def _heads(c: Config) -> list[int]:
    """num_attention_heads_per_layer, or num_attention_heads for every layer: the converter writes an array."""
    return c.find("num_attention_heads_per_layer", kind="list", default=None) or \
        [c.find("num_attention_heads")] * c.find(*BLOCKS)


def _dense_lead(c: Config) -> int:
    """The leading "dense" entries of mlp_layer_types."""
    n = 0
    for t in c.find("mlp_layer_types", kind="list"):
        if t != "dense":
            break
        n += 1
    return n


def _rotated(c: Config) -> dict[str, int]:
    """Each layer type's rotated dims: head_dim times its partial rotary factor."""
    d, swa = c.find("head_dim"), c.rope.get("sliding_attention")
    out = {R.DIMENSION_COUNT: int(d * float(c.full_rope.get("partial_rotary_factor", 1.0)))}
    if isinstance(swa, dict):
        out[R.DIMENSION_COUNT_SWA] = int(d * float(swa.get("partial_rotary_factor", 1.0)))
    return out


hf_config.register(Family("laguna", TEXT + (
    VOCAB, derived(A.HEAD_COUNT, _heads),
    derived(A.SLIDING_WINDOW, lambda c: c.find("sliding_window", kind="size", default=0) or None),
    hf(L.EXPERT_FEED_FORWARD_LENGTH, "moe_intermediate_size"),
    hf(L.EXPERT_SHARED_FEED_FORWARD_LENGTH, "shared_expert_intermediate_size"),
    fixed(L.EXPERT_WEIGHTS_NORM, True), hf(L.EXPERT_WEIGHTS_SCALE, "moe_routed_scaling_factor", kind="number"),
    fixed(L.EXPERT_GATING_FUNC, 2), derived(L.LEADING_DENSE_BLOCK_COUNT, _dense_lead), _rotated,
), {"tie_word_embeddings": False}), "LagunaForCausalLM")


presets.register({
    # llama.cpp's tiny laguna, over five layers (so that alike ones fold) alternating as its first two: width 160, two
    # heads of 80; layer 0 global (dense FFN of 384), layer 1 sliding over 32 positions (pattern 2) with 2 experts of
    # 384 (both used, sigmoid-routed) and a shared expert of 192
    "laguna-tiny-header": Preset("laguna", {
        L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 160, L.BLOCK_COUNT: 5, L.FEED_FORWARD_LENGTH: 384,
        A.HEAD_COUNT: 2, A.HEAD_COUNT_KV: 2, A.LAYERNORM_RMS_EPS: 1e-5, A.SLIDING_WINDOW: 32,
        A.SLIDING_WINDOW_PATTERN: 2, L.VOCAB_SIZE: 128, L.LEADING_DENSE_BLOCK_COUNT: 1, L.EXPERT_COUNT: 2,
        L.EXPERT_USED_COUNT: 2, L.EXPERT_FEED_FORWARD_LENGTH: 384, L.EXPERT_SHARED_FEED_FORWARD_LENGTH: 192,
        L.EXPERT_SHARED_COUNT: 1, L.EXPERT_GATING_FUNC: 2,
    }, tied=False, f32=presets.ROUTER_F32, source="llama.cpp tests/test-llama-archs.cpp, its tiny laguna header"),
})
