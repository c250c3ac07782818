"""LFM2 (lfm2) and LFM2-MoE (lfm2moe), Liquid AI's hybrids of short convolutions and attention.

A layer whose ``attention.head_count_kv`` entry is 0 mixes tokens by a gated short convolution: one projection
gives three chunks b, c and x of the width; b * x runs through a depthwise causal convolution of
``shortconv.l_cache`` taps over each sequence's last l_cache - 1 inputs, and c gates its output before the out
projection. The other layers are grouped-query attention with QK-norm and NeoX RoPE. Every layer then adds a
SwiGLU FFN behind its own norm; in LFM2-MoE the layers after ``leading_dense_block_count`` route each token to
sigmoid-scored experts chosen with a selection bias, their weights normalised (the one variant as data:
:attr:`Lfm2.experts`). The memory is the ``hybrid`` kind: a KV cache for the attention layers and, per sequence,
the convolution's saved columns for the others, a rolling state with no scan state beside it (0 floats).

With ``attention.sliding_window`` > 0 every attention layer of LFM2 slides (a standard window) and the memory is
the ``hybrid_iswa`` kind, its attention part an iswa pair; LFM2-MoE's loader reads no window. Refused: non-causal
attention (llama.cpp pads the convolution on both sides then). The optional ``dense_2``
projection (LFM2-ColBert) loads and is not built: llama.cpp applies it to pooled embeddings only, after its graph.
Reference: Liquid AI 2025, "LFM2 Technical Report"; llama.cpp src/models/lfm2.cpp, lfm2moe.cpp.
"""

from __future__ import annotations

from typing import ClassVar

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError
from graphir.graph.floats import inv_sqrt
from graphir.graph.ir import Node
from graphir.memory.layers import Attention, LayerNeeds, Recurrent
from graphir.model import moe, ssm
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hparams import HParams, Key
from graphir.model.qkv import fused_or_split_qkv_tensors, qk_norm_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, swiglu_tensors, tensor_name
from graphir.model import presets
from graphir.model.presets import Preset
from graphir.model import hf_config
from graphir.model.hf_config import BLOCKS, TEXT, VOCAB, Config, Family, derived, hf

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope
QKV_APART = r"blk\.\d+\.attn_[qkv]\.weight"  # the converter writes Q, K and V apart (either form loads)


class Lfm2(Architecture):
    name = "lfm2"
    rope_mode = "neox"
    per_layer = True  # head_count_kv per layer says which layers convolve
    required_keys = (A.LAYERNORM_RMS_EPS,)
    keys = (Key("shortconv_l_cache", Keys.ShortConv.L_CACHE, int, required=True, minimum=2),  # conv taps
            Key("sliding_window", A.SLIDING_WINDOW, int, 0, minimum=0),  # > 0: every attention layer slides
            Key("n_embd_out", L.EMBEDDING_LENGTH_OUT, int, 0, minimum=0))  # dense_2's width (0: n_embd)
    experts: ClassVar[bool] = False  # the FFNs after the leading dense ones are mixtures of experts (lfm2moe)
    windowed: ClassVar[bool] = True  # attention.sliding_window > 0 makes the attention layers slide

    def __init__(self, hp: HParams):
        if not hp.causal:
            raise MetadataError(f"'{A.CAUSAL.format(arch=hp.arch)}' is false: non-causal LFM2 (its convolution "
                                f"padded on both sides) is not built")
        if self.experts:
            moe.check_routed(hp, self.name)
            moe.gating(hp, self.name, None)
        super().__init__(hp)

    # ---- sizes -------------------------------------------------------------------------------------------

    def recurrent(self, il: int) -> bool:
        """Whether layer il convolves: it has no KV heads (as llama.cpp's loader decides)."""
        return self.hp.head_count_kv(il) == 0

    @property
    def window(self) -> int:
        """The attention layers' sliding window (0: they see every earlier token)."""
        return self.hp.sliding_window if self.windowed else 0

    @property
    def n_dense(self) -> int:
        """The leading layers with a dense FFN: all of LFM2's, ``leading_dense_block_count`` of LFM2-MoE's."""
        return self.hp.n_layer_dense_lead if self.experts else self.hp.n_layer

    def layers(self) -> LayerNeeds:
        """Attention's K and V rows, or the convolution's last l_cache - 1 input columns and no scan state."""
        hp = self.hp
        conv = Recurrent((hp.shortconv_l_cache - 1) * hp.n_embd, 0)
        return tuple(conv if self.recurrent(il) else
                     Attention(hp.n_embd_k_gqa_at(il), hp.n_embd_v_gqa_at(il), self.window)
                     for il in range(hp.n_layer))

    # ---- tensors -----------------------------------------------------------------------------------------

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V = hp.n_embd, hp.n_vocab
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.TOKEN_EMBD_NORM, (E,), kind="vector"),  # the final norm
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD)),
                 spec(T.DENSE_2_OUT, (E, hp.n_embd_out or E), optional=True),
                 spec(T.DENSE_2_OUT, (hp.n_embd_out or E,), suffix="bias", kind="vector", optional=True)]
        for il in range(hp.n_layer):
            layer = [spec(T.FFN_NORM, (E,), il, kind="vector"), *self.ffn_tensors(il),
                     spec(T.ATTN_NORM, (E,), il, kind="vector"),
                     *(self.conv_tensors(il) if self.recurrent(il) else self.attn_tensors(il))]
            specs += layer + layer_scales(layer, il, hp.n_expert if self.experts else 0)
        return specs

    def ffn_tensors(self, il: int) -> list[TensorSpec]:
        hp = self.hp
        if il < self.n_dense:
            return swiglu_tensors(hp.n_embd, hp.ff_length(0), il)
        return [*moe.routed_expert_tensors(hp.n_embd, hp.n_ff_exp, hp.n_expert, il),
                spec(T.FFN_EXP_PROBS_B, (hp.n_expert,), il, "bias", kind="vector")]

    def attn_tensors(self, il: int) -> list[TensorSpec]:
        """QK-norm, Q/K/V fused or apart, and W_o [n_embd, n_embd] (as llama.cpp's loader sizes it)."""
        E = self.hp.n_embd
        return [*qk_norm_tensors(self.hp, il), *fused_or_split_qkv_tensors(self.hp, il),
                spec(T.ATTN_OUT, (E, E), il)]

    def conv_tensors(self, il: int) -> list[TensorSpec]:
        E = self.hp.n_embd
        return [spec(T.SHORTCONV_CONV, (self.hp.shortconv_l_cache, E), il),
                spec(T.SHORTCONV_INPROJ, (E, 3 * E), il), spec(T.SHORTCONV_OUTPROJ, (E, E), il)]

    # ---- graph -------------------------------------------------------------------------------------------

    def attention(self, b: GraphBuilder, h: Node, pos: Node, il: int) -> Node:
        q, k, v = b.build_qkv(h, il)
        q = b.norm(q, T.ATTN_Q_NORM, il, name="q_layernorm")
        k = b.norm(k, T.ATTN_K_NORM, il, name="k_layernorm")
        q, k = b.rope(q, pos, name="Qcur.rope"), b.rope(k, pos, name="Kcur.rope")
        return b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il),
                            kq_scale=inv_sqrt(self.hp.n_embd_head_v))

    def short_conv(self, b: GraphBuilder, h: Node, il: int) -> Node:
        """c * conv(b * x) through the out projection, over the ubatch's sequences ([E, n_tokens] in and out)."""
        E, Ts, S = self.hp.n_embd, b.n_seq_tokens, b.n_seqs
        assert Ts is not None
        h = b.reshape(h, (E, Ts, S), name="operator_norm.seqs")
        bcx = b.mm(b.w(T.SHORTCONV_INPROJ, il), h, name="conv.in_proj")
        gate_in, gate_out, x = (b.op("view", bcx, shape=(E, Ts, S), strides=(1, 3 * E, 3 * E * Ts), offset=i * E,
                                     name=tag) for i, tag in enumerate(("conv.b", "conv.c", "conv.x")))
        bx = b.op("mul", gate_in, x, name="conv.bx")
        conv_x = ssm.conv_input(b, bx, name="conv.input", transposed="conv.bx.t")
        y = b.op("ssm_conv", conv_x, b.w(T.SHORTCONV_CONV, il), name="conv.conv")
        y = b.mm(b.w(T.SHORTCONV_OUTPROJ, il), b.op("mul", gate_out, y, name="conv.gated"), name="conv.out_proj")
        return b.reshape(y, (E, b.n_tokens), name="conv.out_proj.tokens")

    def ffn(self, b: GraphBuilder, h: Node, il: int) -> Node:
        if il < self.n_dense:
            return b.build_ffn(h, up=b.w(T.FFN_UP, il), gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il))
        return moe.routed_experts(b, h, il, gating=moe.gating(self.hp, self.name, None), norm_w=True,
                                  probs_b=b.w(T.FFN_EXP_PROBS_B, il, "bias"))

    def build(self, b: GraphBuilder) -> None:
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, name="operator_norm")
            a = self.short_conv(b, h, il) if self.recurrent(il) else self.attention(b, h, pos, il)
            a, x = b.last_layer_rows((a, "mixer_out.rows"), (x, "inp.rows"))
            x = b.op("add", x, a, name="mixer_residual")
            f = self.ffn(b, b.norm(x, T.FFN_NORM, il, name="ffn_norm"), il)
            x = b.op("add", x, f, name="l_out")
        x = b.norm(x, T.TOKEN_EMBD_NORM, name="result_norm")
        b.build_output(x, b.w(T.OUTPUT))


class Lfm2Moe(Lfm2):
    name = "lfm2moe"
    keys = Lfm2.keys + moe.MOE_KEYS + (
        Key("n_layer_dense_lead", L.LEADING_DENSE_BLOCK_COUNT, int, 0, minimum=0),
        Key("n_ff_exp", L.EXPERT_FEED_FORWARD_LENGTH, int, required=True, minimum=1, first=True),
        moe.GATING_FUNC_KEY)
    experts = True
    windowed = False


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------

presets.register({
    # Ten short-convolution layers (3 taps) and six attention layers (32 query and 8 KV heads of 64, at layers 2,
    # 5, 8, 10, 12 and 14), a SwiGLU FFN of 8192 in each (12288 adjusted by two thirds, a multiple of 256).
    "LFM2-1.2B": Preset("lfm2", {
        L.CONTEXT_LENGTH: 128000, L.EMBEDDING_LENGTH: 2048, L.BLOCK_COUNT: 16, L.FEED_FORWARD_LENGTH: 8192,
        A.HEAD_COUNT: 32, A.HEAD_COUNT_KV: [0, 0, 8, 0, 0, 8, 0, 0, 8, 0, 8, 0, 8, 0, 8, 0],
        R.FREQ_BASE: 1000000.0, A.LAYERNORM_RMS_EPS: 1e-5, Keys.ShortConv.L_CACHE: 3, L.VOCAB_SIZE: 65536,
    }, tied=True, include=QKV_APART, f32=r"blk\.\d+\.shortconv\.conv\.weight",
        source="LiquidAI/LFM2-1.2B config.json"),
    # Eighteen short-convolution and six attention layers of LFM2's width; the first two FFNs dense (7168), the
    # others 32 experts of 1792, 4 per token, chosen by sigmoid scores plus a bias, weights normalised.
    "LFM2-8B-A1B": Preset("lfm2moe", {
        L.CONTEXT_LENGTH: 128000, L.EMBEDDING_LENGTH: 2048, L.BLOCK_COUNT: 24, L.FEED_FORWARD_LENGTH: 7168,
        A.HEAD_COUNT: 32,
        A.HEAD_COUNT_KV: [0, 0, 8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 8, 0, 0],
        R.FREQ_BASE: 1000000.0, A.LAYERNORM_RMS_EPS: 1e-5, Keys.ShortConv.L_CACHE: 3, L.VOCAB_SIZE: 65536,
        L.EXPERT_COUNT: 32, L.EXPERT_USED_COUNT: 4, L.EXPERT_FEED_FORWARD_LENGTH: 1792,
        L.LEADING_DENSE_BLOCK_COUNT: 2, L.EXPERT_GATING_FUNC: 2,
    }, tied=True, include=QKV_APART, f32=r"blk\.\d+\.(shortconv\.conv|ffn_gate_inp)\.weight",
        source="LiquidAI/LFM2-8B-A1B config.json"),
})


# ---- Hugging Face: the keys convert_hf_to_gguf writes for LFM2 ----------------------------------------------------

def _kv_heads(c: Config) -> list[int]:
    """num_key_value_heads on the attention layers of layer_types (full_attention_idxs in older configs), 0 on
    the convolution layers."""
    n = c.find(*BLOCKS)
    types = c.find("layer_types", kind="list", default=None)
    if types is None:
        attention = set(c.find("full_attn_idxs", kind="list"))
    elif len(types) != n:
        raise c.error(f"layer_types has {len(types)} entries, num_hidden_layers {n}")
    else:
        attention = {il for il, t in enumerate(types) if t == "full_attention"}
    kv = c.find("num_key_value_heads")
    return [kv if il in attention else 0 for il in range(n)]


def _ff_length(c: Config) -> int:
    """block_ff_dim, cut to two thirds, times block_ffn_dim_multiplier and rounded up to block_multiple_of when
    block_auto_adjust_ff_dim (LFM2's converter); else intermediate_size."""
    ff = c.find("block_ff_dim", "intermediate_size")
    if c.find("block_auto_adjust_ff_dim", kind="flag", default=False):
        ff = int(2 * ff / 3)
        multiplier = c.find("block_ffn_dim_multiplier", kind="number", default=None)
        if multiplier is not None:
            ff = int(multiplier * ff)
        step = c.find("block_multiple_of")
        ff = step * -(-ff // step)
    return ff


LFM2 = TEXT + (
    derived(A.HEAD_COUNT_KV, _kv_heads),
    derived(L.FEED_FORWARD_LENGTH, _ff_length),
    hf(A.LAYERNORM_RMS_EPS, "norm_eps", kind="number"),
    hf(Keys.ShortConv.L_CACHE, "conv_L_cache"),
    VOCAB,
)
LFM2_MOE = TEXT + (
    derived(A.HEAD_COUNT_KV, _kv_heads),
    hf(A.LAYERNORM_RMS_EPS, "norm_eps", kind="number"),
    hf(Keys.ShortConv.L_CACHE, "conv_L_cache"),
    hf(L.EXPERT_FEED_FORWARD_LENGTH, "moe_intermediate_size"),
    hf(L.LEADING_DENSE_BLOCK_COUNT, "num_dense_layers", kind="size"),
    derived(L.EXPERT_GATING_FUNC, lambda c: 2),  # the converter writes sigmoid routing
    VOCAB,
)

hf_config.register(Family("lfm2", LFM2, {"tie_word_embeddings": True}, lambda c: QKV_APART), "Lfm2ForCausalLM",
                   "LFM2ForCausalLM")
hf_config.register(Family("lfm2moe", LFM2_MOE, {"tie_word_embeddings": True}, lambda c: QKV_APART),
                   "Lfm2MoeForCausalLM")
