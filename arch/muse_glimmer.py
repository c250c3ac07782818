"""Muse Glimmer: a decoder with RMSNorms before and after both sublayers (the post-norms with an epsilon of 1e-8),
the token embeddings RMS-normalised without weights, per-head RMS QK-norm, and an elementwise sigmoid gate on the
attention's heads (a projection of the sublayer's input) before the output projection. Its sliding layers (as the
file's pattern says; three of every four by default) rotate adjacent pairs with their own base, the global ones
attend without positions. The logits are multiplied by logit_scale and soft-capped (30 unless the file says).

Reference: llama.cpp src/models/muse-glimmer.cpp (the text model of MuseGlimmerForConditionalGeneration).
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.graph.floats import inv_sqrt
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.graph.ir import Node
from graphir.model.builder import GraphBuilder
from graphir.model.hf_config import TEXT, VOCAB, Config, Family, hf
from graphir.model.hparams import Key, SlidingWindow
from graphir.model.prenorm import RMS_KEYS, synthetic
from graphir.model.qkv import fused_or_split_qkv_tensors, qk_norm_tensors, qkv
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope
POST_NORM_EPS = 1e-8  # the post-norms' own epsilon, fixed in llama.cpp's graph


class MuseGlimmer(Architecture):
    name = "muse-glimmer"
    rope_mode = "norm"
    required_keys = (*RMS_KEYS, A.SLIDING_WINDOW, L.LOGIT_SCALE)
    swa = SlidingWindow("standard", period=4)
    keys = (Key("logit_scale", L.LOGIT_SCALE, float, 0.0),
            Key("final_logit_softcapping", L.FINAL_LOGIT_SOFTCAPPING, float, 30.0),
            Key("rope_freq_base_swa", R.FREQ_BASE_SWA, float, default_from="rope_freq_base"))

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, F, V = hp.n_embd, hp.n_ff, hp.n_vocab
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"), spec(T.OUTPUT, (E, V))]
        for il in range(hp.n_layer):
            HD = hp.head_count(il) * hp.n_embd_head_k
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), spec(T.ATTN_POST_NORM, (E,), il, kind="vector"),
                     *fused_or_split_qkv_tensors(hp, il), spec(T.ATTN_OUT, (HD, E), il), *qk_norm_tensors(hp, il),
                     spec(T.ATTN_GATE, (E, HD), il), spec(T.FFN_NORM, (E,), il, kind="vector"),
                     spec(T.FFN_POST_NORM, (E,), il, kind="vector"), spec(T.FFN_GATE, (E, F), il),
                     spec(T.FFN_DOWN, (F, E), il), spec(T.FFN_UP, (E, F), il)]
            specs += layer + layer_scales(layer, il)
        return specs


    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = b.build_norm(b.build_inp_embd(b.w(T.TOKEN_EMBD)), None, name="embd_norm")
        pos = b.build_inp_pos()
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            # self-attention, its heads gated by sigmoid(W_gate h) before the output projection
            q, k, v = qkv(b, h, il, True)
            gate = b.mm(b.w(T.ATTN_GATE, il), h, name="attn_gate_proj")
            if hp.is_swa(il):  # only the sliding layers know positions
                q = b.rope(q, pos, name="Qcur.rope", freq_base=hp.rope_freq_base_swa)
                k = b.rope(k, pos, name="Kcur.rope", freq_base=hp.rope_freq_base_swa)
            a = b.build_attn(q, k, v, wo=None, kq_scale=inv_sqrt(hp.n_embd_head_k))
            a = b.op("mul", a, b.op("sigmoid", gate, name="attn_gate_sig"), name="attn_gated")
            a = b.mm(b.w(T.ATTN_OUT, il), a, b.scale(T.ATTN_OUT, il), name="attn_o_proj")
            a = self._post_norm(b, a, T.ATTN_POST_NORM, il, "attn_post_norm")
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            # feed-forward network
            f = b.build_ffn(b.norm(x, T.FFN_NORM, il, name="ffn_norm"), up=b.w(T.FFN_UP, il),
                            gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il))
            x = b.op("add", self._post_norm(b, f, T.FFN_POST_NORM, il, "ffn_post_norm"), x, name="l_out")
        b.build_output(b.norm(x, T.OUTPUT_NORM, name="result_norm"), b.w(T.OUTPUT))
        logits = b.op("scale", b.outputs["logits"], s=hp.logit_scale, name="result_output.scaled")
        cap = hp.final_logit_softcapping
        b.outputs["logits"] = b.softcap(logits, cap, name="result_output.capped") if cap else logits

    @staticmethod
    def _post_norm(b: GraphBuilder, x: Node, t: T, il: int, name: str) -> Node:
        y = b.op("rms_norm", x, eps=POST_NORM_EPS, name=f"{name}.rms_norm")
        return b.op("mul", y, b.w(t, il), name=name)


# ---- Hugging Face: convert_hf_to_gguf's MuseGlimmerModel (the text model's keys, its multiplier and cap, which
# layers slide from layer_types) -----------------------------------------------------------------------------------

def _window(c: Config) -> dict[str, object]:
    return {A.SLIDING_WINDOW: c.find("sliding_window"),
            A.SLIDING_WINDOW_PATTERN: [t == "sliding_attention" for t in c.find("layer_types", kind="list")]}


hf_config.register(Family("muse-glimmer", TEXT + (
    VOCAB, _window, hf(L.FINAL_LOGIT_SOFTCAPPING, "final_logit_softcapping", kind="number"),
    hf(L.LOGIT_SCALE, "output_multiplier", kind="number"),
), {"tie_word_embeddings": False}, lambda c: presets.SPLIT_QKV), "MuseGlimmerForConditionalGeneration")

presets.register({"Muse-Glimmer-tiny": synthetic(
    "muse-glimmer", "a synthetic header of tiny sizes: three layers of four slide over 64 positions",
    include=presets.SPLIT_QKV, keys={A.SLIDING_WINDOW: 64, L.LOGIT_SCALE: 0.5})})
