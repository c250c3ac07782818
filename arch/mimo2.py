"""MiMo-V2 (mimo2): a pre-norm decoder whose layers slide or not by the file's per-layer pattern (sliding layers
rotate with ``rope.freq_base_swa``), whose attention has optional per-head sinks, K and V heads of their own sizes
(``key_length``, ``value_length``) and per-layer head counts, and whose output is scaled by
``attention.value_scale`` where the file sets one; each FFN is a sigmoid-routed mixture of SwiGLU experts (an
optional selection bias, weights renormalised) where the layer has a router, else a dense SwiGLU.
Q, K and V are projected by one fused ``attn_qkv`` or three matrices, without biases or scales, as llama.cpp's graph
does.
Multi-token-prediction layers (``nextn_predict_layers``) load and never run: llama.cpp's main graph leaves them to its
draft graph, and asks for their tensors only where the file has their projection (a file without it holds the
trunk alone).

No public configuration is at hand: the family's golden graphs come from llama.cpp's tiny header of it (the sizes
tests/test-llama-archs.cpp gives mimo2), and no Hugging Face mapping is registered.

Reference: Xiaomi 2025, "MiMo-V2-Flash"; llama.cpp src/models/mimo2.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.graph.ir import Node
from graphir.model import presets
from graphir.model.architecture import Architecture
from graphir.model.builder import Gating, GraphBuilder
from graphir.model.hparams import HParams, Key, SlidingWindow
from graphir.memory.layers import LayerNeeds
from graphir.model.moe import MOE_KEYS, NEXTN_KEY, check_experts, nextn_layer, trunk_layers
from graphir.model.presets import Preset
from graphir.model.qkv import fused_or_split_qkv_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope
VALUE_SCALE = "{arch}.attention.value_scale"  # llama.cpp's key; gguf-py has no constant for it yet


class Mimo2(Architecture):
    name = "mimo2"
    rope_mode = "neox"
    required_keys = (A.HEAD_COUNT, A.LAYERNORM_RMS_EPS, A.SLIDING_WINDOW, A.SLIDING_WINDOW_PATTERN,
                     L.EXPERT_FEED_FORWARD_LENGTH)
    swa = SlidingWindow("standard")  # the window and the per-layer pattern from the file
    per_layer = True  # head counts per layer, as llama.cpp reads them
    keys = MOE_KEYS + (
        Key("n_ff_exp", L.EXPERT_FEED_FORWARD_LENGTH, tuple, (), minimum=0),
        Key("rope_freq_base_swa", R.FREQ_BASE_SWA, float, default_from="rope_freq_base"),
        Key("value_scale", VALUE_SCALE, float, 0.0),  # 0 or 1: the attention output is not scaled
        NEXTN_KEY,
    )

    def __init__(self, hp: HParams):
        check_experts(hp, self.name)
        self.n_trunk = trunk_layers(hp, self.name)  # the prediction layers after it are loaded, never run
        super().__init__(hp)

    def layers(self) -> LayerNeeds:
        return super().layers()[:self.n_trunk]

    def tensors(self) -> list[TensorSpec]:
        """Per layer the attention (sinks optional), and both FFN forms optional: the router decides which a
        layer runs."""
        hp = self.hp
        E, V, X, Fx = hp.n_embd, hp.n_vocab, hp.n_expert, hp.n_ff_exp[0]
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"), spec(T.OUTPUT, (E, V))]
        for il in range(hp.n_layer):
            F = hp.ff_length(il)
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), *fused_or_split_qkv_tensors(hp, il),
                     spec(T.ATTN_OUT, (hp.head_count(il) * hp.n_embd_head_v, E), il),
                     spec(T.ATTN_SINKS, (hp.head_count(il),), il, kind="vector", optional=True),
                     spec(T.FFN_NORM, (E,), il, kind="vector"),
                     spec(T.FFN_GATE, (E, F), il, optional=True), spec(T.FFN_DOWN, (F, E), il, optional=True),
                     spec(T.FFN_UP, (E, F), il, optional=True), spec(T.FFN_GATE_INP, (E, X), il, optional=True),
                     spec(T.FFN_GATE_EXP, (E, Fx, X), il, optional=True),
                     spec(T.FFN_DOWN_EXP, (Fx, E, X), il, optional=True),
                     spec(T.FFN_UP_EXP, (E, Fx, X), il, optional=True),
                     spec(T.FFN_EXP_PROBS_B, (X,), il, "bias", kind="vector", optional=True)]
            layer += layer_scales(layer, il, X)
            specs += layer if il < self.n_trunk else nextn_layer(
                layer + [spec(T.LAYER_OUT_NORM, (E,), il, kind="vector", optional=True)], hp, il)
        return specs

    def qkv(self, b: GraphBuilder, h: Node, il: int) -> tuple[Node, Node, Node]:
        """Q, K, V [head, heads, tokens] from the fused projection (strided views of one product) or the three, each
        without its bias or scale."""
        hp = self.hp
        dk, dv, H, Hkv, n_tok = hp.n_embd_head_k, hp.n_embd_head_v, hp.head_count(il), hp.head_count_kv(il), b.n_tokens
        fused = b.w_opt(T.ATTN_QKV, il)
        if fused is not None:
            qkv = b.mm(fused, h, name="wqkv")
            row = dk * (H + Hkv) + dv * Hkv
            views = (b.op("view", qkv, shape=(w, n, n_tok), strides=(1, w, row), offset=off, name=tag)
                     for tag, w, n, off in (("Qcur", dk, H, 0), ("Kcur", dk, Hkv, dk * H),
                                           ("Vcur", dv, Hkv, dk * (H + Hkv))))
            return tuple(views)  # type: ignore[return-value]
        return tuple(b.reshape(b.mm(b.w(t, il), h, name=tag), shape, name=f"{tag}.heads")  # type: ignore[return-value]
                     for t, tag, shape in ((T.ATTN_Q, "Qcur", (dk, H, n_tok)), (T.ATTN_K, "Kcur", (dk, Hkv, n_tok)),
                                           (T.ATTN_V, "Vcur", (dv, Hkv, n_tok))))

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers(self.n_trunk):
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            q, k, v = self.qkv(b, h, il)
            base = hp.rope_freq_base_swa if hp.is_swa(il) else None
            q = b.rope(q, pos, name="Qcur.rope", freq_base=base)
            k = b.rope(k, pos, name="Kcur.rope", freq_base=base)
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il), kq_scale=b.kq_scale(),
                             sinks=b.w_opt(T.ATTN_SINKS, il))
            if hp.value_scale not in (0.0, 1.0):
                a = b.op("scale", a, s=hp.value_scale, name="attn_out_scaled")
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            h = b.norm(x, T.FFN_NORM, il, name="ffn_norm")
            router = b.w_opt(T.FFN_GATE_INP, il)
            if router is None:
                f = b.build_ffn(h, up=b.w(T.FFN_UP, il), gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il))
            else:
                f = b.build_moe_ffn(h, gate_inp=router, up_exps=b.w(T.FFN_UP_EXP, il),
                                    gate_exps=b.w(T.FFN_GATE_EXP, il), down_exps=b.w(T.FFN_DOWN_EXP, il),
                                    probs_b=b.w_opt(T.FFN_EXP_PROBS_B, il, "bias"), n_expert=hp.n_expert,
                                    n_expert_used=hp.n_expert_used, gating=Gating.SIGMOID, norm_w=True)
            x = b.op("add", f, x, name="l_out")
        x = b.norm(x, T.OUTPUT_NORM, name="result_norm")
        b.build_output(x, b.w(T.OUTPUT))


presets.register({
    # llama.cpp's tiny mimo2, over five layers (so that alike ones fold) alternating as its first two: width 256, two
    # heads of 128; layer 1 slides over 32 positions, layer 0 is global; each FFN 2 experts of 384, both used, sigmoid-
    # routed
    "mimo2-tiny-header": Preset("mimo2", {
        L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 256, L.BLOCK_COUNT: 5, L.FEED_FORWARD_LENGTH: 384,
        A.HEAD_COUNT: 2, A.HEAD_COUNT_KV: 2, A.LAYERNORM_RMS_EPS: 1e-5, A.SLIDING_WINDOW: 32,
        A.SLIDING_WINDOW_PATTERN: [il % 2 == 1 for il in range(5)], L.VOCAB_SIZE: 128, L.EXPERT_COUNT: 2,
        L.EXPERT_USED_COUNT: 2,
        L.EXPERT_FEED_FORWARD_LENGTH: 384,
    }, tied=False, include=r"blk\.\d+\.(attn_[qkv]|ffn_gate_inp|ffn_(gate|up|down)_exps)\.weight",
        f32=presets.ROUTER_F32,
        source="llama.cpp tests/test-llama-archs.cpp, its tiny mimo2 header"),
})
