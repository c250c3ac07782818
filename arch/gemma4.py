"""Gemma 4 (text): Gemma 3's sandwich-normed layers with two kinds of attention, layers that read an earlier
layer's cache, per-layer embeddings, and an optional mixture of experts beside the dense FFN.

Sliding layers and global layers differ in shape, not only in window: each kind has its own head size (and
may have its own KV head count), RoPE base and rotated width; the global layers rotate through the file's
``rope_freqs`` (factors of 1e30 leave the upper dims unrotated: "proportional" RoPE over a quarter of the
head). Q and K are RMS-normed per head with a learned scale, V without one, and scores are not scaled. The
last ``attention.shared_kv_layers`` layers make Q alone and attend over the cache of the last layer of their
kind that keeps one, a need the memory serves (:mod:`graphir.memory.reuse`). A global layer without ``attn_v``
uses its K projection as V too. Where the file has per-layer embeddings (``embedding_length_per_layer_input``
> 0), every layer adds a gated projection of its own slice of them after the FFN, as Gemma 3n does. A layer
with a router runs the dense FFN and the experts side by side, each normed before and after, and sums them;
the router reads the unweighted norm of the layer's residual at 1/sqrt(n_embd), times its own scale. A layer
may end by scaling its output by one learned value (``layer_output_scale``). Logits are soft-capped.

References: Gemma Team 2026, Gemma 4 model card; llama.cpp src/models/gemma4.cpp (as vendored in
llama-cpp-python 0.3.36) and its converter's Gemma4Model.
"""

from __future__ import annotations

import math

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError
from graphir.graph.floats import f32, inv_sqrt
from graphir.graph.ir import Node
from graphir.memory.layers import Attention, LayerNeeds
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import Act, GraphBuilder
from graphir.model.hf_config import VOCAB, Config, Family, hf
from graphir.model.hparams import HParams, Key, SlidingWindow
from graphir.model.moe import MOE_KEYS, check_experts, gate_up, gate_up_tensors
from graphir.model.presets import Preset
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, tensor_name

from graphir.arch.gemma3n import layer_slice, per_layer_inputs

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class Gemma4(Architecture):
    """llama.cpp's src/models/gemma4.cpp, top to bottom."""

    name = "gemma4"
    rope_mode = "neox"
    per_layer = True
    required_keys = (A.LAYERNORM_RMS_EPS, A.SLIDING_WINDOW, A.SLIDING_WINDOW_PATTERN, L.EMBD_LENGTH_PER_LAYER_INP,
                     A.KEY_LENGTH_SWA, A.VALUE_LENGTH_SWA)
    swa = SlidingWindow("standard")
    keys = (Key("n_embd_per_layer", L.EMBD_LENGTH_PER_LAYER_INP, int, minimum=0),
            Key("n_kv_shared", A.SHARED_KV_LAYERS, int, 0, minimum=0),
            Key("n_embd_head_k_swa", A.KEY_LENGTH_SWA, int, minimum=1),
            Key("n_embd_head_v_swa", A.VALUE_LENGTH_SWA, int, minimum=1),
            Key("n_rot_swa", R.DIMENSION_COUNT_SWA, int, default_from="n_rot", minimum=0),
            Key("rope_freq_base_swa", R.FREQ_BASE_SWA, float, 10000.0),
            Key("final_softcap", L.FINAL_LOGIT_SOFTCAPPING, float, 30.0),
            Key("n_ff_exp", L.EXPERT_FEED_FORWARD_LENGTH, int, 0, minimum=0, first=True),
            *MOE_KEYS)

    def __init__(self, hp: HParams):
        key = lambda t: t.format(arch=self.name)  # noqa: E731
        if hp.n_embd_head_k != hp.n_embd_head_v or hp.n_embd_head_k_swa != hp.n_embd_head_v_swa:
            raise MetadataError(f"heads of {hp.n_embd_head_k} keys and {hp.n_embd_head_v} values ('{key(A.KEY_LENGTH)}', "
                                f"'{key(A.VALUE_LENGTH)}'), of {hp.n_embd_head_k_swa} and {hp.n_embd_head_v_swa} in "
                                f"sliding layers ('{key(A.KEY_LENGTH_SWA)}', '{key(A.VALUE_LENGTH_SWA)}'): Gemma 4 "
                                f"needs keys and values equally wide")
        for rot, head, t in ((hp.n_rot, hp.n_embd_head_k, R.DIMENSION_COUNT),
                             (hp.n_rot_swa, hp.n_embd_head_k_swa, R.DIMENSION_COUNT_SWA)):
            if rot > head:
                raise MetadataError(f"'{key(t)}' = {rot}: RoPE cannot turn more dims than a head's {head}")
        n_kv = hp.n_layer - hp.n_kv_shared
        if hp.n_kv_shared and (n_kv < 2 or not hp.is_swa(n_kv - 2) or hp.is_swa(n_kv - 1)):
            raise MetadataError(f"'{key(A.SHARED_KV_LAYERS)}' = {hp.n_kv_shared} of {hp.n_layer} layers: the layers "
                                f"sharing a cache read layer {n_kv - 2} (sliding) and layer {n_kv - 1} (global), "
                                f"which must be of those kinds")
        check_experts(hp, self.name)
        super().__init__(hp)

    # ---- each layer's shape ---------------------------------------------------------------------------

    def head(self, il: int) -> int:
        """Layer il's head size (keys and values alike): its kind's."""
        return self.hp.n_embd_head_k_swa if self.hp.is_swa(il) else self.hp.n_embd_head_k

    def reads(self, il: int) -> int | None:
        """The layer whose cache layer il attends over (None: its own): the last KV layer of its kind."""
        n_kv = self.hp.n_layer - self.hp.n_kv_shared
        if il < n_kv:
            return None
        return n_kv - (2 if self.hp.is_swa(il) else 1)

    def layers(self) -> LayerNeeds:
        hp = self.hp
        return tuple(Attention(self.head(il) * hp.head_count_kv(il), self.head(il) * hp.head_count_kv(il),
                               hp.n_swa if hp.is_swa(il) else 0, reads=self.reads(il)) for il in range(hp.n_layer))

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V, P, X = hp.n_embd, hp.n_vocab, hp.n_embd_per_layer, hp.n_expert
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD)),
                 spec(T.OUTPUT_NORM, (E,), kind="vector")]
        if P:
            specs += [spec(T.PER_LAYER_TOKEN_EMBD, (P * hp.n_layer, V)),
                      spec(T.PER_LAYER_MODEL_PROJ, (E, P * hp.n_layer)),
                      spec(T.PER_LAYER_PROJ_NORM, (P,), kind="vector")]
        if not all(hp.is_swa(il) for il in range(hp.n_layer)):
            specs.append(spec(T.ROPE_FREQS, (hp.n_embd_head_k // 2,), kind="vector"))
        for il in range(hp.n_layer):
            d, H, F = self.head(il), hp.head_count(il), hp.ff_length(il)
            own = self.reads(il) is None
            kv = d * hp.head_count_kv(il)
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"),
                     spec(T.ATTN_QKV, (E, d * H + 2 * kv), il, optional=True),
                     spec(T.ATTN_Q, (E, d * H), il, optional=True), spec(T.ATTN_K, (E, kv), il, optional=True),
                     spec(T.ATTN_V, (E, kv), il, optional=True), spec(T.ATTN_OUT, (d * H, E), il),
                     spec(T.ATTN_Q_NORM, (d,), il, kind="vector"),
                     spec(T.ATTN_K_NORM, (d,), il, kind="vector", optional=not own),
                     spec(T.ATTN_POST_NORM, (E,), il, kind="vector"),
                     spec(T.FFN_NORM, (E,), il, kind="vector"), spec(T.FFN_GATE, (E, F), il),
                     spec(T.FFN_UP, (E, F), il), spec(T.FFN_DOWN, (F, E), il),
                     spec(T.FFN_POST_NORM, (E,), il, kind="vector"),
                     spec(T.LAYER_OUT_SCALE, (1,), il, kind="vector", optional=True)]
            if X:  # a layer with a router (optional: a file may have experts in some layers only) runs them
                Fx = hp.n_ff_exp
                layer += [spec(T.FFN_GATE_INP, (E, X), il, optional=True),
                          spec(T.FFN_GATE_INP, (E,), il, "scale", kind="vector", optional=True),
                          *(spec(t, (E,), il, kind="vector", optional=True)
                            for t in (T.FFN_PRE_NORM_2, T.FFN_POST_NORM_1, T.FFN_POST_NORM_2)),
                          *gate_up_tensors(E, Fx, X, il), spec(T.FFN_DOWN_EXP, (Fx, E, X), il, optional=True)]
            if P:
                layer += [spec(T.PER_LAYER_INP_GATE, (E, P), il), spec(T.PER_LAYER_PROJ, (P, E), il),
                          spec(T.PER_LAYER_POST_NORM, (E,), il, kind="vector")]
            specs += layer + layer_scales(layer, il, X)
        return specs

    # ---- the graph ------------------------------------------------------------------------------------

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = b.op("scale", b.build_inp_embd(b.w(T.TOKEN_EMBD)), s=f32(math.sqrt(hp.n_embd)), name="inp_scaled")
        pos = b.build_inp_pos()
        per_layer = per_layer_inputs(b, x, hp.n_embd_per_layer) if hp.n_embd_per_layer else None
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            a = b.norm(self.attention(b, h, pos, il), T.ATTN_POST_NORM, il, name="attn_post_norm")
            a = b.op("add", a, x, name="attn_residual")
            if hp.n_expert and b.w_opt(T.FFN_GATE_INP, il) is not None:
                f = self.dense_and_experts(b, a, il)
            else:
                f = self.dense(b, b.norm(a, T.FFN_NORM, il, name="ffn_norm"), il, name="ffn_out")
            f = b.norm(f, T.FFN_POST_NORM, il, name="ffn_post_norm")
            x = b.op("add", f, a, name="ffn_residual")
            if per_layer is not None:
                x = self.add_per_layer_input(b, x, per_layer, il)
            out_scale = b.w_opt(T.LAYER_OUT_SCALE, il)
            if out_scale is not None:
                x = b.op("mul", x, out_scale, name="out_scaled")
        y = b.norm(x, T.OUTPUT_NORM, name="h_nextn")
        y = b.op("get_rows", y, b.build_inp_out_ids(), name="result_norm")
        b.build_output(y, b.w(T.OUTPUT), softcap=hp.final_softcap)

    # ---- its blocks -----------------------------------------------------------------------------------

    def attention(self, b: GraphBuilder, h: Node, pos: Node, il: int) -> Node:
        """QK-normed attention with V normalised too, unscaled scores, each layer kind with its RoPE; a layer
        reading another's cache makes Q alone."""
        hp = self.hp
        rope = (dict(freq_base=hp.rope_freq_base_swa, freq_scale=1.0, n_dims=hp.n_rot_swa) if hp.is_swa(il) else
                dict(freq_factors=b.w(T.ROPE_FREQS)))
        q, k, v = self.projections(b, h, il)
        q = b.rope(b.norm(q, T.ATTN_Q_NORM, il, name="Qcur_normed"), pos, name="Qcur_pos", **rope)
        if k is not None:
            k = b.norm(k, T.ATTN_K_NORM, il, name="Kcur_normed")
            v = b.build_norm(v, None, name="Vcur_normed")
            k = b.rope(k, pos, name="Kcur_pos", **rope)
        return b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il), kq_scale=1.0)

    def projections(self, b: GraphBuilder, h: Node, il: int) -> tuple[Node, Node | None, Node | None]:
        """Q, K, V [d, heads, n_tokens] of layer il from its fused attn_qkv (contiguous copies of the product's
        rows) or apart; K and V None where the layer reads another's cache; V is K where the file has no attn_v."""
        hp, T_ = self.hp, b.n_tokens
        d, H, Hkv = self.head(il), hp.head_count(il), hp.head_count_kv(il)
        own = self.reads(il) is None
        fused = b.w_opt(T.ATTN_QKV, il)
        if fused is not None:
            qkv = b.mm(fused, h, b.scale(T.ATTN_QKV, il), name="wqkv")
            q_w, kv_w = d * H, d * Hkv

            def part(width: int, offset: int, tag: str) -> Node:
                view = b.op("view", qkv, shape=(width, T_), strides=(1, qkv.shape[0]), offset=offset, name=f"{tag}.view")
                return b.op("cont", view, name=tag)

            q = part(q_w, 0, "Qcur")
            k, v = (part(kv_w, q_w, "Kcur"), part(kv_w, q_w + kv_w, "Vcur")) if own else (None, None)
        else:
            q = b.mm(b.w(T.ATTN_Q, il), h, b.scale(T.ATTN_Q, il), name="Qcur")
            k = v = None
            if own:
                k = b.mm(b.w(T.ATTN_K, il), h, b.scale(T.ATTN_K, il), name="Kcur")
                wv = b.w_opt(T.ATTN_V, il)
                v = k if wv is None else b.mm(wv, h, b.scale(T.ATTN_V, il), name="Vcur")
        q = b.reshape(q, (d, H, T_), name="Qcur.heads")
        if k is None:
            return q, None, None
        return q, b.reshape(k, (d, Hkv, T_), name="Kcur.heads"), b.reshape(v, (d, Hkv, T_), name="Vcur.heads")

    @staticmethod
    def dense(b: GraphBuilder, h: Node, il: int, name: str) -> Node:
        """The GELU-gated FFN."""
        return b.build_ffn(h, up=b.w(T.FFN_UP, il), gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il), act=Act.GELU,
                           up_s=b.scale(T.FFN_UP, il), gate_s=b.scale(T.FFN_GATE, il), down_s=b.scale(T.FFN_DOWN, il),
                           name=name)

    def dense_and_experts(self, b: GraphBuilder, a: Node, il: int) -> Node:
        """The dense FFN (the shared expert) and the routed GELU experts of the residual a, each normed before and
        after, summed; the router scores the unweighted norm of a at 1/sqrt(n_embd), times its own scale."""
        hp = self.hp
        shared = self.dense(b, b.norm(a, T.FFN_NORM, il, name="ffn_norm_1"), il, name="ffn_mlp.out")
        shared = b.norm(shared, T.FFN_POST_NORM_1, il, name="ffn_mlp")
        routed = b.norm(a, T.FFN_PRE_NORM_2, il, name="ffn_norm_2")
        r = b.op("scale", b.build_norm(a, None, name="ffn_moe_router_norm"), s=f32(inv_sqrt(hp.n_embd)),
                 name="ffn_moe_router_scaled")
        r = b.op("mul", r, b.w(T.FFN_GATE_INP, il, "scale"), name="ffn_moe_router_in")
        logits = b.op("mul_mat", b.w(T.FFN_GATE_INP, il), r, name="ffn_moe_logits")
        routed = b.build_moe_ffn(routed, gate_inp=None, logits=logits, down_exps=b.w(T.FFN_DOWN_EXP, il),
                                 n_expert=hp.n_expert, n_expert_used=hp.n_expert_used, act=Act.GELU, norm_w=True,
                                 w_scale=1.0, down_exps_s=b.scale(T.FFN_DOWN_EXP, il),
                                 up_exps_s=b.scale(T.FFN_UP_EXP, il), gate_exps_s=b.scale(T.FFN_GATE_EXP, il),
                                 **gate_up(b, il))
        routed = b.norm(routed, T.FFN_POST_NORM_2, il, name="ffn_moe")
        return b.op("add", shared, routed, name="ffn_moe_combined")

    @staticmethod
    def add_per_layer_input(b: GraphBuilder, x: Node, per_layer: Node, il: int) -> Node:
        """x plus its own gated projection through the layer's slice of the per-layer inputs, normed."""
        g = b.op("gelu", b.op("mul_mat", b.w(T.PER_LAYER_INP_GATE, il), x, name="pe_gate"), name="pe_gelu")
        g = b.op("mul", g, layer_slice(b, per_layer, il, "inp_this_layer"), name="pe_gated")
        g = b.op("mul_mat", b.w(T.PER_LAYER_PROJ, il), g, name="pe_proj")
        g = b.norm(g, T.PER_LAYER_POST_NORM, il, name="per_layer_embd_out")
        return b.op("add", x, g, name="l_out")


# ---- Hugging Face: Gemma4ForConditionalGeneration's text_config, as convert_hf_to_gguf writes it -------------

def _layers(c: Config) -> dict[str, object]:
    """Which layers slide, each kind's head size, rotated dims and KV heads, the shared layers, the per-layer
    inputs, and the wider FFN of the shared layers where the config doubles it."""
    kinds = [t == "sliding_attention" for t in c.find("layer_types", kind="list")]
    n_layer, shared = len(kinds), c.find("num_kv_shared_layers", kind="size", default=0)
    d_swa, d_full = c.find("head_dim"), c.find("global_head_dim")
    rope_swa = c.check("rope_parameters.sliding_attention", c.rope.get("sliding_attention", {}), "map")
    n_ff = c.find("intermediate_size")
    out: dict[str, object] = {
        A.SLIDING_WINDOW_PATTERN: kinds, A.SHARED_KV_LAYERS: shared,
        L.EMBD_LENGTH_PER_LAYER_INP: c.find("hidden_size_per_layer_input", kind="size", default=0),
        A.KEY_LENGTH: d_full, A.VALUE_LENGTH: d_full, A.KEY_LENGTH_SWA: d_swa, A.VALUE_LENGTH_SWA: d_swa,
        R.DIMENSION_COUNT: d_full,
        R.DIMENSION_COUNT_SWA: int(d_swa * c.rope_value(rope_swa, "partial_rotary_factor", default=1.0)),
        R.FREQ_BASE_SWA: c.rope_value(rope_swa, "rope_theta", default=10000.0),
        R.FREQ_BASE: c.rope_value(c.full_rope, "rope_theta", default=1_000_000.0),
        L.FEED_FORWARD_LENGTH: ([n_ff if il < n_layer - shared else 2 * n_ff for il in range(n_layer)]
                                if c.find("use_double_wide_mlp", kind="flag", default=False) else n_ff),
    }
    full_kv = c.find("num_global_key_value_heads", default=None)
    if full_kv is not None:
        swa_kv = c.find("num_key_value_heads")
        out[A.HEAD_COUNT_KV] = [swa_kv if s else full_kv for s in kinds]
    softcap = c.find("final_logit_softcapping", kind="number", default=None)
    if softcap is not None:
        out[L.FINAL_LOGIT_SOFTCAPPING] = softcap
    return out


GEMMA4_RULES: tuple[hf_config.Rule, ...] = (
    hf(L.EMBEDDING_LENGTH, "hidden_size"),
    hf(L.CONTEXT_LENGTH, "max_position_embeddings", default=131072),
    hf(A.HEAD_COUNT, "num_attention_heads"),
    hf(A.HEAD_COUNT_KV, "num_key_value_heads"),
    hf(A.LAYERNORM_RMS_EPS, "rms_norm_eps", kind="number", default=1e-6),
    hf(A.SLIDING_WINDOW, "sliding_window", default=512),
    _layers,
    hf(L.BLOCK_COUNT, *hf_config.BLOCKS),
    VOCAB,
)
hf_config.register(Family("gemma4", GEMMA4_RULES, {"tie_word_embeddings": True}, lambda c: presets.SPLIT_QKV),
                   "Gemma4ForConditionalGeneration", "Gemma4ForCausalLM")


presets.register({
    # the text model of google/gemma-4-E2B: 35 layers of 1536, 8 heads over 1 KV head, of 256 in the sliding
    # layers (a window of 512, four of every five) and of 512 in the global ones (a quarter rotated); the last 20
    # layers read layers 13 and 14's caches and have a double-wide FFN; per-layer inputs of 256
    "Gemma-4-E2B": Preset("gemma4", {
        L.CONTEXT_LENGTH: 131072, L.EMBEDDING_LENGTH: 1536, L.BLOCK_COUNT: 35,
        L.FEED_FORWARD_LENGTH: [6144] * 15 + [12288] * 20, A.HEAD_COUNT: 8, A.HEAD_COUNT_KV: 1,
        A.KEY_LENGTH: 512, A.VALUE_LENGTH: 512, A.KEY_LENGTH_SWA: 256, A.VALUE_LENGTH_SWA: 256,
        R.DIMENSION_COUNT: 512, R.DIMENSION_COUNT_SWA: 256, R.FREQ_BASE: 1000000.0, R.FREQ_BASE_SWA: 10000.0,
        A.SLIDING_WINDOW: 512, A.SLIDING_WINDOW_PATTERN: [il % 5 != 4 for il in range(35)],
        A.SHARED_KV_LAYERS: 20, L.EMBD_LENGTH_PER_LAYER_INP: 256, L.FINAL_LOGIT_SOFTCAPPING: 30.0,
        A.LAYERNORM_RMS_EPS: 1e-6, L.VOCAB_SIZE: 262144,
    }, tied=True, include=presets.SPLIT_QKV, source="google/gemma-4-E2B config.json (text_config)"),
})
