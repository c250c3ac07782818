"""NVIDIA Nemotron-H (nemotron_h) and its mixture-of-experts form (nemotron_h_moe): a decoder whose every layer is
one of three blocks, each ``x += block(RMSNorm(x))``: a Mamba-2 mixer, grouped-query attention without positions,
or an FFN.

Which block a layer is follows from its sizes, as llama.cpp's loader decides it: no KV heads and no FFN width is a
Mamba-2 layer (the block Mamba-2 and Granite 4.0-H use, its grouped norm required), no FFN width with KV heads an
attention layer (scores by 1/sqrt(head size) unless ``attention.scale`` says otherwise, an optional output bias),
and an FFN width an FFN layer. The FFN is ungated: up, squared ReLU, down (each with an optional bias), or, with
``expert_count`` > 0, a latent mixture of experts: the router reads the layer's input, sigmoid probabilities plus a
selection bias choose each token's ``expert_used_count`` experts (one count per layer where the file gives an
array), whose ungated squared-ReLU FFNs run in the ``moe_latent_size`` space (``ffn_latent_down`` before and
``ffn_latent_up`` after, where the file has them), beside a shared squared-ReLU expert every token takes. The last
``nextn_predict_layers`` layers are multi-token-prediction layers: loaded, never run here (llama.cpp's draft graph).
The output rows are chosen after the final norm.

Memory: an attention layer keeps K/V rows, a Mamba-2 layer its conv columns and SSM state, an FFN layer nothing
(the hybrid memory, as llama.cpp's layer filters for these families split it).
References: NVIDIA 2025, "Nemotron-H: A Family of Accurate and Efficient Hybrid Mamba-Transformer Models";
NVIDIA 2025, "NVIDIA Nemotron Nano 2"; llama.cpp src/models/nemotron-h.cpp, nemotron-h-moe.cpp, mamba-base.cpp.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError
from graphir.graph.ir import Node
from graphir.memory.layers import LayerNeeds
from graphir.model import hf_config, presets, ssm
from graphir.model.architecture import Architecture
from graphir.model.builder import Act, GraphBuilder, Gating
from graphir.model.hf_config import Config, Family, derived, fixed, hf
from graphir.model.hparams import HParams, Key
from graphir.model.moe import MOE_KEYS, NEXTN_KEY, NEXTN_TENSORS, check_experts, trunk_layers
from graphir.model.presets import Preset
from graphir.model.qkv import fused_or_split_qkv_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, tensor_name

L, A, R, S = Keys.LLM, Keys.Attention, Keys.Rope, Keys.SSM


def _at(v: int | tuple[int, ...], il: int) -> int:
    return v if isinstance(v, int) else v[il]


class NemotronH(Architecture):
    """Nemotron-H as llama.cpp's nemotron-h.cpp builds it; nemotron_h_moe is the same loader and graph."""

    name = "nemotron_h"
    required_keys = (A.LAYERNORM_EPS,)  # the draft head's final norm; the RMS norms' epsilon defaults to it
    per_layer = True  # head_count_kv and feed_forward_length per layer say which block each layer is
    keys = ssm.MAMBA2_KEYS + MOE_KEYS + (
        Key("n_ff_exp", L.EXPERT_FEED_FORWARD_LENGTH, list, 0),  # 0: the layer's FFN width over its used experts
        Key("n_ff_shexp", L.EXPERT_SHARED_FEED_FORWARD_LENGTH, int, 0, minimum=0),
        Key("expert_weights_norm", L.EXPERT_WEIGHTS_NORM, bool, False),
        Key("expert_weights_scale", L.EXPERT_WEIGHTS_SCALE, float, 0.0),
        Key("moe_latent_size", L.MOE_LATENT_SIZE, int, 0, minimum=0),  # 0: the experts run at the model's width
        NEXTN_KEY,
    )

    def __init__(self, hp: HParams):
        ssm.check_mamba2(hp)
        check_experts(hp, self.name)
        self.n_trunk = trunk_layers(hp, self.name)
        if not hp.norm_rms_eps:  # llama.cpp: layer_norm_rms_epsilon, else layer_norm_epsilon
            hp = replace(hp, norm_rms_eps=hp.norm_eps)
        super().__init__(hp)
        for il in range(self.n_trunk):
            if self.ffn_layer(il) and hp.n_expert and not self.expert_width(il):
                widths = (t.format(arch=self.name) for t in (L.EXPERT_FEED_FORWARD_LENGTH, L.FEED_FORWARD_LENGTH))
                raise MetadataError(f"layer {il}'s experts have no width ('{next(widths)}' and '{next(widths)}' "
                                    f"are 0)")

    # ---- which block a layer is ---------------------------------------------------------------------------

    def recurrent(self, il: int) -> bool:
        """A trunk layer without KV heads or FFN: Mamba-2 (llama.cpp's is_recr)."""
        hp = self.hp
        return il < self.n_trunk and hp.head_count_kv(il) == 0 and hp.ff_length(il) == 0

    def ffn_layer(self, il: int) -> bool:
        return not self.recurrent(il) and self.hp.ff_length(il) != 0

    def used_experts(self, il: int) -> int:
        return self.hp.n_expert_used_layers[il] if self.hp.n_expert_used_layers else self.hp.n_expert_used

    def expert_width(self, il: int) -> int:
        """Layer il's expert width: its ``expert_feed_forward_length``, else its FFN width over its used experts
        (a draft layer's: layer 0's FFN width)."""
        hp = self.hp
        used = self.used_experts(il)
        n_ff = hp.ff_length(il) if il < self.n_trunk else hp.ff_length(0)
        return _at(hp.n_ff_exp, il) or (n_ff // used if used else 0)

    def layers(self) -> LayerNeeds:
        hp, attention = self.hp, super().layers()
        state = ssm.recurrent_state(hp, ssm.mamba2_conv_dim(hp))
        return tuple(state if self.recurrent(il) else None if self.ffn_layer(il) else attention[il]
                     for il in range(self.n_trunk))

    # ---- tensors ------------------------------------------------------------------------------------------

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V = hp.n_embd, hp.n_vocab
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD))]
        for il in range(self.n_trunk):
            if self.recurrent(il):
                block = ssm.mamba2_tensors(hp, il)
            elif not self.ffn_layer(il):
                block = self.attn_tensors(il)
            else:
                block = self.moe_tensors(il) if hp.n_expert else self.ffn_tensors(il)
            specs += [spec(T.ATTN_NORM, (E,), il, kind="vector"), *block]
        for il in range(self.n_trunk, hp.n_layer):
            specs += self.nextn_tensors(il)
        return specs

    def attn_tensors(self, il: int) -> list[TensorSpec]:
        hp = self.hp
        layer = [*fused_or_split_qkv_tensors(hp, il), spec(T.ATTN_OUT, (hp.head_count(il) * hp.n_embd_head_k,
                                                                         hp.n_embd), il)]
        return [*layer, spec(T.ATTN_OUT, (hp.n_embd,), il, "bias", kind="vector", optional=True),
                *layer_scales(layer, il)]

    def ffn_tensors(self, il: int) -> list[TensorSpec]:
        E, F = self.hp.n_embd, self.hp.ff_length(il)
        layer = [spec(T.FFN_UP, (E, F), il), spec(T.FFN_DOWN, (F, E), il)]
        return [*layer, spec(T.FFN_UP, (F,), il, "bias", kind="vector", optional=True),
                spec(T.FFN_DOWN, (E,), il, "bias", kind="vector", optional=True), *layer_scales(layer, il)]

    def moe_tensors(self, il: int) -> list[TensorSpec]:
        """The router and its selection bias, the latent projections (optional), the ungated experts in the
        latent space and the ungated shared expert."""
        hp = self.hp
        E, X, F, Fs = hp.n_embd, hp.n_expert, self.expert_width(il), hp.n_ff_shexp
        M = hp.moe_latent_size or E
        layer = [spec(T.FFN_DOWN_EXP, (F, M, X), il), spec(T.FFN_UP_EXP, (M, F, X), il),
                 spec(T.FFN_DOWN_SHEXP, (Fs, E), il), spec(T.FFN_UP_SHEXP, (E, Fs), il)]
        return [spec(T.FFN_GATE_INP, (E, X), il), spec(T.FFN_EXP_PROBS_B, (X,), il, "bias", kind="vector"),
                spec(T.MOE_LATENT_DOWN, (E, M), il, optional=True), spec(T.MOE_LATENT_UP, (M, E), il, optional=True),
                *layer, *layer_scales(layer, il, X)]

    def nextn_tensors(self, il: int) -> list[TensorSpec]:
        """A draft layer: the NextN projection and norms, an attention sub-layer and a mixture-of-experts sub-layer
        after its own norm. llama.cpp's loader asks for them (and skips them unless it loads the draft head)."""
        E = self.hp.n_embd
        own = {T.NEXTN_EH_PROJ: (2 * E, E), T.NEXTN_ENORM: (E,), T.NEXTN_HNORM: (E,), T.NEXTN_SHARED_HEAD_NORM: (E,)}
        return [*(spec(t, own[t], il, kind="vector" if len(own[t]) == 1 else "matrix") for t, _ in NEXTN_TENSORS
                  if t in own),
                spec(T.ATTN_NORM, (E,), il, kind="vector"), *self.attn_tensors(il),
                spec(T.ATTN_POST_NORM, (E,), il, kind="vector"), *self.moe_tensors(il)]

    # ---- graph --------------------------------------------------------------------------------------------

    def attention(self, b: GraphBuilder, h: Node, il: int) -> Node:
        q, k, v = b.build_qkv(h, il)
        return b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_b=b.w_opt(T.ATTN_OUT, il, "bias"),
                            wo_s=b.scale(T.ATTN_OUT, il), kq_scale=b.kq_scale())

    def ffn(self, b: GraphBuilder, h: Node, il: int) -> Node:
        """The ungated squared-ReLU FFN, or the latent experts plus the shared expert."""
        w, w_opt, s = b.w, b.w_opt, b.scale
        if not self.hp.n_expert:
            return b.build_ffn(h, up=w(T.FFN_UP, il), up_b=w_opt(T.FFN_UP, il, "bias"), up_s=s(T.FFN_UP, il),
                               gate=None, down=w(T.FFN_DOWN, il), down_b=w_opt(T.FFN_DOWN, il, "bias"),
                               down_s=s(T.FFN_DOWN, il), act=Act.RELU_SQR)
        latent_down, latent_up = w_opt(T.MOE_LATENT_DOWN, il), w_opt(T.MOE_LATENT_UP, il)
        x = h if latent_down is None else b.op("mul_mat", latent_down, h, name="ffn_latent_in")
        logits = b.mm(w(T.FFN_GATE_INP, il), h, name="ffn_moe_logits")
        out = b.build_moe_ffn(x, gate_inp=None, logits=logits, up_exps=w(T.FFN_UP_EXP, il), gate_exps=None,
                              down_exps=w(T.FFN_DOWN_EXP, il), probs_b=w(T.FFN_EXP_PROBS_B, il, "bias"),
                              n_expert=self.hp.n_expert, n_expert_used=self.used_experts(il), act=Act.RELU_SQR,
                              norm_w=self.hp.expert_weights_norm, w_scale=self.hp.expert_weights_scale,
                              gating=Gating.SIGMOID, up_exps_s=s(T.FFN_UP_EXP, il), down_exps_s=s(T.FFN_DOWN_EXP, il))
        if latent_up is not None:
            out = b.op("mul_mat", latent_up, out, name="ffn_latent_out")
        shared = b.build_ffn(h, up=w(T.FFN_UP_SHEXP, il), up_s=s(T.FFN_UP_SHEXP, il), gate=None,
                             down=w(T.FFN_DOWN_SHEXP, il), down_s=s(T.FFN_DOWN_SHEXP, il), act=Act.RELU_SQR,
                             name="ffn_shexp")
        return b.op("add", out, shared, name="ffn_out")

    def build(self, b: GraphBuilder) -> None:
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        for il in b.layers(self.n_trunk):
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            if self.recurrent(il):
                h = ssm.mamba2_layer(b, h, il)
            elif self.ffn_layer(il):
                h = self.ffn(b, h, il)
            else:
                h = self.attention(b, h, il)
            x = b.op("add", h, x, name="nemotron_h_block_out")  # every row on, in the last layer too
        x = b.norm(x, T.OUTPUT_NORM, name="h_nextn")
        x = b.op("get_rows", x, b.build_inp_out_ids(), name="result_norm")  # the output rows, after the norm
        b.build_output(x, b.w(T.OUTPUT))


class NemotronHMoE(NemotronH):
    name = "nemotron_h_moe"


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------


def _pattern(pattern: str, attention: int, ffn: int) -> dict[str, Any]:
    """The per-layer sizes of a hybrid_override_pattern (M Mamba-2, * attention, - or E FFN), as the converter
    writes them: KV heads on the attention layers, the FFN width on the FFN layers, 0 elsewhere."""
    return {A.HEAD_COUNT_KV: [attention if c == "*" else 0 for c in pattern],
            L.FEED_FORWARD_LENGTH: [ffn if c in "-E" else 0 for c in pattern]}


def _nemotron_h(E: int, pattern: str, n_head: int, n_ff: int, n_ssm_head: int, ssm_head: int,
                source: str) -> Preset:
    """A Nemotron-H: attention of heads of 128 sharing 8 KV heads, Mamba-2 in 8 groups of 128 states, squared-ReLU
    FFNs; the context the converter writes for a hybrid without positions (2^20); the rotary width it writes
    (width over heads) is unread."""
    return Preset("nemotron_h", {
        L.CONTEXT_LENGTH: 1048576, L.EMBEDDING_LENGTH: E, L.BLOCK_COUNT: len(pattern), **_pattern(pattern, 8, n_ff),
        A.HEAD_COUNT: n_head, A.KEY_LENGTH: 128, A.VALUE_LENGTH: 128, R.DIMENSION_COUNT: E // n_head,
        A.LAYERNORM_EPS: 1e-5, S.CONV_KERNEL: 4, S.INNER_SIZE: n_ssm_head * ssm_head, S.STATE_SIZE: 128,
        S.TIME_STEP_RANK: n_ssm_head, S.GROUP_COUNT: 8, L.VOCAB_SIZE: 131072,
    }, tied=False, include=presets.SPLIT_QKV,
        f32=r"blk\.\d+\.ssm_(conv1d\.weight|a|d|norm\.weight)", source=source)


presets.register({
    # 52 layers of width 4096: 24 Mamba-2 (128 heads of 64), 4 attention (32 heads), 24 FFNs of 21504
    "Nemotron-H-8B": _nemotron_h(4096, "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-", 32, 21504, 128, 64,
                                 "nvidia/Nemotron-H-8B-Base-8K config.json"),
    # 56 layers of width 4480: 27 Mamba-2 (128 heads of 80), 4 attention (40 heads), 25 FFNs of 15680
    "Nemotron-Nano-9B-v2": _nemotron_h(4480, "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-", 40, 15680,
                                       128, 80, "nvidia/NVIDIA-Nemotron-Nano-9B-v2 config.json"),
    # llama.cpp's tiny nemotron_h_moe with experts, over five layers (so that alike ones fold): attention, then
    # Mamba-2 and a mixture of two experts of 384 twice (the last using one: a per-layer expert count; latent width
    # 128) with a shared expert of 192; no released model's public figures are known here well enough for a preset
    "nemotron_h_moe-tiny-header": Preset("nemotron_h_moe", {
        L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 256, L.BLOCK_COUNT: 5, L.FEED_FORWARD_LENGTH: [0, 0, 384, 0, 384],
        A.HEAD_COUNT: 2, A.HEAD_COUNT_KV: [2, 0, 2, 0, 2], A.LAYERNORM_EPS: 1e-5, S.CONV_KERNEL: 4,
        S.INNER_SIZE: 512, S.STATE_SIZE: 128, S.TIME_STEP_RANK: 2, S.GROUP_COUNT: 2, L.VOCAB_SIZE: 128,
        L.EXPERT_COUNT: 2, L.EXPERT_USED_COUNT: [2, 2, 2, 2, 1], L.EXPERT_FEED_FORWARD_LENGTH: 384,
        L.EXPERT_SHARED_FEED_FORWARD_LENGTH: 192, L.MOE_LATENT_SIZE: 128, L.EXPERT_WEIGHTS_NORM: True,
        L.EXPERT_WEIGHTS_SCALE: 2.5,
    }, tied=False, include=rf"{presets.SPLIT_QKV}|blk\.\d+\.ffn_latent_(down|up)\.weight",
        f32=presets.ROUTER_F32 + r"|blk\.\d+\.ssm_(conv1d\.weight|a|d|norm\.weight)",
        source="llama.cpp tests/test-llama-archs.cpp, its tiny nemotron_h_moe header, with experts"),
})


# ---- Hugging Face: convert_hf_to_gguf's NemotronHModel (a GraniteHybridModel) -----------------------------------


def _layer_kinds(c: Config) -> str:
    """hybrid_override_pattern, one character per layer (M Mamba-2, * attention, - or E FFN)."""
    if c.find("num_experts_per_tok", kind="size", default=None) is not None:
        raise c.error("num_experts_per_tok: the mixture-of-experts form (nemotron_h_moe) is not mapped from configs")
    pattern = c.find("hybrid_override_pattern", kind="text")
    if len(pattern) != c.find("num_hidden_layers") or set(pattern) - set("M*-E"):
        raise c.error(f"hybrid_override_pattern '{pattern}' is not one of M, *, - or E per layer")
    return pattern


def _inner(c: Config) -> int:
    """The converter's d_inner: the SSM heads times their size (not expand times the width)."""
    return c.find("mamba_num_heads", "num_heads") * c.find("mamba_head_dim")


NEMOTRON_H = hf_config.TEXT_BASE + (
    hf_config.VOCAB,
    derived(R.DIMENSION_COUNT, lambda c: c.find(*hf_config.WIDTH) // hf_config.heads(c)),
    fixed(L.CONTEXT_LENGTH, 1 << 20),  # the converter's for a Granite hybrid without RoPE
    derived(A.KEY_LENGTH, lambda c: c.find("head_dim", "attention_head_dim")),
    derived(A.VALUE_LENGTH, lambda c: c.find("head_dim", "attention_head_dim")),
    derived(A.HEAD_COUNT_KV, lambda c: _pattern(_layer_kinds(c), c.find("num_key_value_heads"), 0)[A.HEAD_COUNT_KV]),
    derived(L.FEED_FORWARD_LENGTH, lambda c: _pattern(_layer_kinds(c), 0, c.find("intermediate_size"))[
        L.FEED_FORWARD_LENGTH]),
    hf(S.CONV_KERNEL, "conv_kernel", "mamba_conv_kernel"),
    hf(S.STATE_SIZE, "ssm_state_size", "mamba_state_size"),
    hf(S.GROUP_COUNT, "n_groups", "mamba_n_groups"),
    derived(S.INNER_SIZE, _inner),
    hf(S.TIME_STEP_RANK, "mamba_num_heads", "num_heads"),
)


hf_config.register(Family("nemotron_h", NEMOTRON_H, {"tie_word_embeddings": False}, lambda c: presets.SPLIT_QKV,
                          pad_vocab=8),
                   "NemotronHForCausalLM")
