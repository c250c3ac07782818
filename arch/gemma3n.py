"""Gemma 3n (text): Gemma 3's sandwich-normed attention inside AltUp, with per-layer embeddings, LAuReL and
layers that read an earlier layer's cache.

The residual stream is four streams at once (AltUp, "alternating updates"): each layer predicts all four from
the active one through learned coefficients chosen by a router, runs attention and the FFN on the active
prediction alone, then corrects every stream by what the layer changed. Beside attention runs LAuReL, a
low-rank learned residual. Each layer also gets its own small embedding of the token (per-layer inputs, from
a second embedding table plus a projection of the token embedding), which gates a projection added to the
streams after the correction. The first ten layers keep only the FFN gate's values above mean + 1.645 std of
their row (activation sparsity). Layers from the twentieth on keep no K/V: each attends over the cache of the
last layer of its kind (sliding or global) that has one (llama.cpp's ``n_layer_kv_from_start``), a need the
memory serves (:mod:`graphir.memory.reuse`). The AltUp and LAuReL sizes, the sparsity and the logit cap are
fixed in llama.cpp's graph, not read from the file.

References: Gemma Team 2025, "Gemma 3n" model card; Baykal et al. 2023, "Alternating Updates for Efficient
Transformers" (arXiv:2301.13310); Menghani et al. 2024, "LAuReL: Learned Augmented Residual Layer"
(arXiv:2411.07501); llama.cpp src/models/gemma3n.cpp (as vendored in llama-cpp-python 0.3.36).
"""

from __future__ import annotations

import math

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.graph.floats import f32, inv_sqrt
from graphir.graph.ir import Node
from graphir.memory.layers import Attention, LayerNeeds
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hf_config import VOCAB, Family, derived, hf
from graphir.model.hparams import Key, SlidingWindow
from graphir.model.presets import Preset
from graphir.model.qkv import fused_or_split_qkv_tensors, qk_norm_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, tensor_name

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope

N_ALTUP = 4  # AltUp's streams (altup_num_inputs)
ALTUP_ACTIVE = 0  # the stream attention and the FFN run on (altup_active_idx)
LAUREL_RANK = 64
N_EMBD_ALTUP = 256  # the per-layer input's width (hidden_size_per_layer_input)
N_LAYER_KV = 20  # layers from this one on read an earlier layer's cache
N_LAYER_SPARSE = 10  # layers whose FFN gate keeps only its largest values
SPARSITY_STD = 1.6448533535003662  # the standard normal's 95th percentile, in float32
FINAL_SOFTCAP = 30.0


class Gemma3n(Architecture):
    """llama.cpp's src/models/gemma3n.cpp, top to bottom."""

    name = "gemma3n"
    rope_mode = "neox"
    required_keys = (L.FEED_FORWARD_LENGTH, A.HEAD_COUNT, A.LAYERNORM_RMS_EPS)
    swa = SlidingWindow("standard", window=0, period=5)  # four local layers, then a global one
    keys = (Key("rope_freq_base_swa", R.FREQ_BASE_SWA, float, 10000.0),)

    def reads(self, il: int) -> int | None:
        """The layer whose cache layer il attends over (None: its own): the last KV layer of its kind."""
        if il < N_LAYER_KV:
            return None
        return N_LAYER_KV - (2 if self.hp.is_swa(il) else 1)

    def layers(self) -> LayerNeeds:
        hp = self.hp
        return tuple(Attention(hp.n_embd_k_gqa_at(il), hp.n_embd_v_gqa_at(il), hp.n_swa if hp.is_swa(il) else 0,
                               reads=self.reads(il)) for il in range(hp.n_layer))

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V, n_layer, d = hp.n_embd, hp.n_vocab, hp.n_layer, hp.n_embd_head_k
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD)),
                 spec(T.ALTUP_PROJ, (E, E, N_ALTUP - 1)), spec(T.ALTUP_UNEMBD_PROJ, (E, E, N_ALTUP - 1)),
                 spec(T.PER_LAYER_TOKEN_EMBD, (N_EMBD_ALTUP * n_layer, V)),
                 spec(T.PER_LAYER_MODEL_PROJ, (E, N_EMBD_ALTUP * n_layer)),
                 spec(T.PER_LAYER_PROJ_NORM, (N_EMBD_ALTUP,), kind="vector"),
                 spec(T.OUTPUT_NORM, (E,), kind="vector")]
        for il in range(n_layer):
            F = hp.ff_length(il)
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), *fused_or_split_qkv_tensors(hp, il),
                     spec(T.ATTN_OUT, (hp.head_count(il) * d, E), il), *qk_norm_tensors(hp, il),
                     spec(T.ATTN_POST_NORM, (E,), il, kind="vector"), spec(T.FFN_NORM, (E,), il, kind="vector"),
                     spec(T.FFN_GATE, (E, F), il), spec(T.FFN_UP, (E, F), il), spec(T.FFN_DOWN, (F, E), il),
                     spec(T.FFN_POST_NORM, (E,), il, kind="vector"),
                     spec(T.PER_LAYER_INP_GATE, (E, N_EMBD_ALTUP), il), spec(T.PER_LAYER_PROJ, (N_EMBD_ALTUP, E), il),
                     spec(T.PER_LAYER_POST_NORM, (E,), il, kind="vector"),
                     spec(T.ALTUP_CORRECT_COEF, (N_ALTUP, N_ALTUP), il),
                     spec(T.ALTUP_CORRECT_SCALE, (E,), il, kind="vector"),
                     spec(T.ALTUP_PREDICT_COEF, (N_ALTUP, N_ALTUP * N_ALTUP), il),
                     spec(T.ALTUP_ROUTER, (E, N_ALTUP), il), spec(T.ALTUP_ROUTER_NORM, (E,), il, kind="vector"),
                     spec(T.LAUREL_L, (E, LAUREL_RANK), il), spec(T.LAUREL_R, (LAUREL_RANK, E), il),
                     spec(T.LAUREL_POST_NORM, (E,), il, kind="vector")]
            specs += layer + layer_scales(layer, il)
        return specs

    # ---- the graph ------------------------------------------------------------------------------------

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        E, T_ = hp.n_embd, b.n_tokens
        x = b.op("scale", b.build_inp_embd(b.w(T.TOKEN_EMBD)), s=f32(math.sqrt(E)), name="inp_scaled")
        pos = b.build_inp_pos()
        per_layer = per_layer_inputs(b, x, N_EMBD_ALTUP)
        # the token's embedding is the active stream; the others are projections of it at its magnitude
        magnitude = self.magnitude(b, x, "inp_magnitude")
        added = b.op("mul_mat", b.w(T.ALTUP_PROJ), b.op("repeat", x, shape=(E, T_, N_ALTUP - 1), name="inp_repeated"),
                     name="altup_added")
        added = self.rescaled(b, added, magnitude, "altup_added")
        x = b.op("concat", x, added, dim=2, name="inp_stacked")
        for il in b.layers():
            predictions = self.altup_predict(b, x, il)
            active = layer_slice(b, predictions, ALTUP_ACTIVE, "active_prediction")
            h = b.norm(active, T.ATTN_NORM, il, name="attn_norm")
            laurel = self.laurel(b, h, il)
            a = self.attention(b, h, pos, il)
            a = b.norm(a, T.ATTN_POST_NORM, il, name="attn_post_norm")
            a = b.op("add", a, active, name="attn_gated")
            a = b.op("scale", b.op("add", a, laurel, name="attn_laurel.sum"), s=f32(inv_sqrt(2)), name="attn_laurel")
            f = self.ffn(b, b.norm(a, T.FFN_NORM, il, name="ffn_norm"), il)
            f = b.norm(f, T.FFN_POST_NORM, il, name="ffn_post_norm")
            f = b.op("add", f, a, name="attn_ffw_laurel_gated")
            corrected = self.altup_correct(b, predictions, f, il)
            x = self.add_per_layer_input(b, corrected, per_layer, il)
        # back to one stream: the mean of the active one and the others projected back at its magnitude
        magnitude = self.magnitude(b, layer_slice(b, x, ALTUP_ACTIVE, "unembd_active"), "unembd_magnitude")
        rest = self.streams_after_first(b, x, "unembd_rest")
        back = self.rescaled(b, b.op("mul_mat", b.w(T.ALTUP_UNEMBD_PROJ), rest, name="altup_unembd.proj"), magnitude,
                             "altup_unembd")
        y = layer_slice(b, x, 0, "unembd_first")
        for i in range(N_ALTUP - 1):
            y = b.op("add", y, layer_slice(b, back, i, f"altup_unembd.{i}"), name=f"unembd_sum.{i}")
        y = b.op("scale", y, s=f32(1.0 / N_ALTUP), name="unembd_merged")
        y = b.op("get_rows", y, b.build_inp_out_ids(), name="unembd_merged.rows")
        y = b.norm(y, T.OUTPUT_NORM, name="result_norm")
        b.build_output(y, b.w(T.OUTPUT), softcap=FINAL_SOFTCAP)

    # ---- its blocks -----------------------------------------------------------------------------------

    @staticmethod
    def streams_after_first(b: GraphBuilder, x: Node, name: str) -> Node:
        """Streams 1.. of x [n, n_tokens, streams] (a view)."""
        n, T_, k = x.shape
        return b.op("view", x, shape=(n, T_, k - 1), strides=(1, n, n * T_), offset=n * T_, name=name)

    @staticmethod
    def magnitude(b: GraphBuilder, x: Node, name: str) -> Node:
        """The L2 norm of each row of x."""
        squares = b.op("sum_rows", b.op("sqr", x, name=f"{name}.sqr"), name=f"{name}.sum")
        return b.op("sqrt", squares, name=name)

    def rescaled(self, b: GraphBuilder, x: Node, target: Node, name: str) -> Node:
        """x's rows brought to the magnitudes ``target``: x * target / |x|."""
        return b.op("div", b.op("mul", x, target, name=f"{name}.mul"), self.magnitude(b, x, f"{name}.magnitude"),
                    name=name)

    def router(self, b: GraphBuilder, x: Node, il: int, name: str) -> Node:
        """The coefficient weights [N_ALTUP, n_tokens] of the stream x: tanh of a projection of x normalised."""
        h = b.norm(x, T.ALTUP_ROUTER_NORM, il, name=f"{name}.norm")
        h = b.op("scale", h, s=f32(1.0 / self.hp.n_embd), name=f"{name}.scaled")
        return b.op("tanh", b.op("mul_mat", b.w(T.ALTUP_ROUTER, il), h, name=f"{name}.mm"), name=name)

    def altup_predict(self, b: GraphBuilder, x: Node, il: int) -> Node:
        """Every stream predicted as itself plus a mix of all four, the mix chosen per token by the router."""
        T_ = b.n_tokens
        modalities = self.router(b, layer_slice(b, x, ALTUP_ACTIVE, "activated"), il, "modalities")
        coefs = b.op("mul_mat", b.w(T.ALTUP_PREDICT_COEF, il), modalities, name="all_coefs")
        coefs = b.reshape(coefs, (N_ALTUP, N_ALTUP, T_), name="all_coefs.3d")
        streams = b.op("cont", b.op("permute", x, axes=(1, 2, 0, 3), name="streams.t"), name="streams")
        mixed = b.op("mul_mat", streams, coefs, name="predictions.mm")  # [E, N_ALTUP, n_tokens]
        mixed = b.op("cont", b.op("permute", mixed, axes=(0, 2, 1, 3), name="predictions.t"), name="predictions.cont")
        return b.op("add", mixed, x, name="predictions")

    def altup_correct(self, b: GraphBuilder, predictions: Node, activated: Node, il: int) -> Node:
        """Every stream's prediction plus the active stream's innovation (what the layer changed of it), weighted
        per stream by 1 + the router's coefficients."""
        E, T_ = self.hp.n_embd, b.n_tokens
        modalities = self.router(b, activated, il, "modalities.correct")
        innovation = b.op("sub", activated, layer_slice(b, predictions, ALTUP_ACTIVE, "predicted"), name="innovation")
        coefs = b.op("mul_mat", b.w(T.ALTUP_CORRECT_COEF, il), modalities, name="correct_coefs.mm")
        coefs = b.op("scale_bias", coefs, s=1.0, b=1.0, name="correct_coefs")
        coefs = b.op("cont", b.op("transpose", coefs, name="correct_coefs.t"), name="correct_coefs.cont")
        coefs = b.reshape(coefs, (1, T_, N_ALTUP), name="correct_coefs.3d")
        innovation = b.op("repeat", innovation, shape=(E, T_, N_ALTUP), name="innovation.repeated")
        return b.op("add", b.op("mul", innovation, coefs, name="corrected.mul"), predictions, name="corrected")

    def add_per_layer_input(self, b: GraphBuilder, corrected: Node, per_layer: Node, il: int) -> Node:
        """The corrected streams, all but the first plus the layer's input gated by the active stream."""
        g = b.op("mul", layer_slice(b, corrected, ALTUP_ACTIVE, "first_prediction"), b.w(T.ALTUP_CORRECT_SCALE, il),
                 name="first_prediction.scaled")
        g = b.op("gelu", b.op("mul_mat", b.w(T.PER_LAYER_INP_GATE, il), g, name="first_prediction.gate"),
                 name="first_prediction_gated")
        g = b.op("mul", g, layer_slice(b, per_layer, il, "inp_this_layer"), name="first_prediction_scaled")
        g = b.op("mul_mat", b.w(T.PER_LAYER_PROJ, il), g, name="first_prediction.proj")
        g = b.norm(g, T.PER_LAYER_POST_NORM, il, name="first_prediction_out")
        rest = b.op("add", self.streams_after_first(b, corrected, "corrected_rest"), g, name="corrected_rest.sum")
        return b.op("concat", layer_slice(b, corrected, 0, "corrected_first"), rest, dim=2, name="l_out")

    @staticmethod
    def laurel(b: GraphBuilder, h: Node, il: int) -> Node:
        """LAuReL: h plus its normalised low-rank projection."""
        y = b.op("mul_mat", b.w(T.LAUREL_L, il), h, name="laurel_l")
        y = b.op("mul_mat", b.w(T.LAUREL_R, il), y, name="laurel_r")
        return b.op("add", b.norm(y, T.LAUREL_POST_NORM, il, name="laurel_post_norm"), h, name="laurel_out")

    def attention(self, b: GraphBuilder, h: Node, pos: Node, il: int) -> Node:
        """QK-normed attention with V normalised too, unscaled scores; a layer reading another's cache makes Q
        alone."""
        hp = self.hp
        base, scale = (hp.rope_freq_base_swa, 1.0) if hp.is_swa(il) else (None, None)
        if self.reads(il) is None:
            q, k, v = b.build_qkv(h, il)
            q, k = b.norm(q, T.ATTN_Q_NORM, il, name="Qcur_normed"), b.norm(k, T.ATTN_K_NORM, il, name="Kcur_normed")
            v = b.build_norm(v, None, name="Vcur_normed")
            k = b.rope(k, pos, name="Kcur_pos", freq_base=base, freq_scale=scale)
        else:
            q, k, v = self.query(b, h, il), None, None
            q = b.norm(q, T.ATTN_Q_NORM, il, name="Qcur_normed")
        q = b.rope(q, pos, name="Qcur_pos", freq_base=base, freq_scale=scale)
        return b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il), kq_scale=1.0)

    def query(self, b: GraphBuilder, h: Node, il: int) -> Node:
        """Q alone [d, n_head, n_tokens], from the fused projection's first rows or from attn_q (unscaled: llama.cpp
        reads no per-tensor scale here)."""
        hp, T_ = self.hp, b.n_tokens
        d, H = hp.n_embd_head_k, hp.head_count(il)
        fused = b.w_opt(T.ATTN_QKV, il)
        if fused is not None:
            qkv = b.op("mul_mat", fused, h, name="wqkv")
            q = b.op("cont", b.op("view", qkv, shape=(d * H, T_), strides=(1, qkv.shape[0]), offset=0,
                                  name="Qcur.view"), name="Qcur")
        else:
            q = b.op("mul_mat", b.w(T.ATTN_Q, il), h, name="Qcur")
        return b.reshape(q, (d, H, T_), name="Qcur.heads")

    def ffn(self, b: GraphBuilder, h: Node, il: int) -> Node:
        """GELU-gated FFN; in the first layers the gate keeps only what exceeds its row's mean + 1.645 std."""
        up = b.op("mul_mat", b.w(T.FFN_UP, il), h, name="ffn_up")
        gate = b.op("mul_mat", b.w(T.FFN_GATE, il), h, name="ffn_gate")
        if il < N_LAYER_SPARSE:
            gate = self.gaussian_top_k(b, gate)
        gate = b.op("gelu", gate, name="ffn_gelu")
        return b.op("mul_mat", b.w(T.FFN_DOWN, il), b.op("mul", up, gate, name="ffn_gate_par"), name="ffn_out")

    @staticmethod
    def gaussian_top_k(b: GraphBuilder, x: Node) -> Node:
        """relu(x - (mean + SPARSITY_STD * std)) per row, the std with n - 1."""
        mean = b.op("mean", x, name="sparsity_mean")
        dev = b.op("sqr", b.op("sub", x, mean, name="sparsity_dev"), name="sparsity_dev.sqr")
        var = b.op("scale", b.op("sum_rows", dev, name="sparsity_var.sum"), s=f32(1.0 / (x.shape[0] - 1)),
                   name="sparsity_var")
        cutoff = b.op("add", mean, b.op("scale", b.op("sqrt", var, name="sparsity_std"), s=f32(SPARSITY_STD),
                                        name="sparsity_std.scaled"), name="sparsity_cutoff")
        return b.op("relu", b.op("sub", x, cutoff, name="sparsity_gap"), name="ffn_gate_sparse")


def per_layer_inputs(b: GraphBuilder, x: Node, width: int) -> Node:
    """Every layer's own input [width, n_tokens, n_layer] (per-layer embeddings, shared with Gemma 4): the token's
    row of the per-layer table at sqrt(width), plus the normalised projection of its embedding x, over sqrt(2)."""
    n_layer, T_ = b.hp.n_layer, b.n_tokens
    tokens = b.input("tokens", "i32", (T_,))
    rows = b.op("get_rows", b.w(T.PER_LAYER_TOKEN_EMBD), tokens, name="inp_per_layer.rows")
    rows = b.reshape(rows, (width, n_layer, T_), name="inp_per_layer.3d")
    rows = b.op("scale", rows, s=f32(math.sqrt(width)), name="inp_per_layer_selected")
    proj = b.op("mul_mat", b.w(T.PER_LAYER_MODEL_PROJ), x, name="per_layer_proj.mm")
    proj = b.op("scale", proj, s=f32(inv_sqrt(b.hp.n_embd)), name="per_layer_proj.scaled")
    proj = b.reshape(proj, (width, n_layer, T_), name="per_layer_proj.3d")
    proj = b.norm(proj, T.PER_LAYER_PROJ_NORM, name="per_layer_proj")
    both = b.op("scale", b.op("add", proj, rows, name="inp_per_layer.sum"), s=f32(inv_sqrt(2)), name="inp_per_layer")
    return b.op("cont", b.op("permute", both, axes=(0, 2, 1, 3), name="inp_per_layer.t"), name="inp_per_layer.cont")


def layer_slice(b: GraphBuilder, x: Node, i: int, name: str) -> Node:
    """Slice i [n, n_tokens] of x [n, n_tokens, k] (a view): one AltUp stream, or one layer's own input."""
    n, T_ = x.shape[0], x.shape[1]
    return b.op("view", x, shape=(n, T_), strides=(1, n), offset=i * n * T_, name=name)


# ---- Hugging Face: Gemma3nForConditionalGeneration's text_config, as convert_hf_to_gguf writes it -----------

GEMMA3N_RULES: tuple[hf_config.Rule, ...] = (
    hf(L.BLOCK_COUNT, *hf_config.BLOCKS),
    hf(L.EMBEDDING_LENGTH, "hidden_size"),
    # one width per layer, as the converter writes it (every released size gives all layers the same)
    derived(L.FEED_FORWARD_LENGTH, lambda c: c.doc["intermediate_size"]),
    hf(L.CONTEXT_LENGTH, "max_position_embeddings", default=32768),
    hf(A.HEAD_COUNT, "num_attention_heads", default=8),
    hf(A.HEAD_COUNT_KV, "num_key_value_heads", default=2),
    hf(A.LAYERNORM_RMS_EPS, "rms_norm_eps", kind="number", default=1e-6),
    lambda c: {A.KEY_LENGTH: (d := c.find("head_dim", default=256)), A.VALUE_LENGTH: d},
    hf(R.FREQ_BASE, "rope_theta", kind="number", default=1_000_000.0),
    hf(R.FREQ_BASE_SWA, "rope_local_base_freq", kind="number", default=10000.0),
    hf(A.SLIDING_WINDOW, "sliding_window", default=512),
    VOCAB,
)
hf_config.register(Family("gemma3n", GEMMA3N_RULES, {"tie_word_embeddings": True, "vocab_size": 262400},
                          lambda c: presets.SPLIT_QKV), "Gemma3nForConditionalGeneration", "Gemma3nForCausalLM")


presets.register({
    # the text model of google/gemma-3n-E2B: 30 layers of 2048 (FFN 8192), 8 heads of 256 over 2 KV heads,
    # a window of 512 on four of every five layers; the last ten layers read layers 18 and 19's caches
    "Gemma-3n-E2B": Preset("gemma3n", {
        L.CONTEXT_LENGTH: 32768, L.EMBEDDING_LENGTH: 2048, L.BLOCK_COUNT: 30, L.FEED_FORWARD_LENGTH: [8192] * 30,
        A.HEAD_COUNT: 8, A.HEAD_COUNT_KV: 2, A.KEY_LENGTH: 256, A.VALUE_LENGTH: 256, A.LAYERNORM_RMS_EPS: 1e-6,
        R.FREQ_BASE: 1000000.0, R.FREQ_BASE_SWA: 10000.0, A.SLIDING_WINDOW: 512, L.VOCAB_SIZE: 262400,
    }, tied=True, include=presets.SPLIT_QKV, source="google/gemma-3n-E2B config.json (text_config)"),
})
