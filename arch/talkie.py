"""Talkie: a decoder whose RMSNorms have no weights at all (on the embeddings, before each sublayer, at the end)
and whose layers each add back the normalised embeddings times a learned scale (an embedding skip). Queries are
RMS-normalised per head after RoPE with a gain per head, keys without one; the attention output and the FFN's
down projection are multiplied by learned gains (their per-tensor scales), and the logits by logit_scale. RoPE
turns split halves of whole heads; the LM head is a matrix of its own.

Reference: llama.cpp src/models/talkie.cpp (and convert_hf_to_gguf's TalkieModel, which maps the gains).
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.graph.floats import inv_sqrt
from graphir.model import presets
from graphir.model.architecture import Architecture
from graphir.graph.ir import Node
from graphir.model.builder import GraphBuilder
from graphir.model.hparams import HParams, Key
from graphir.model.prenorm import RMS_KEYS, synthetic
from graphir.model.qkv import check_whole_heads, fused_or_split_qkv_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec

L = Keys.LLM


class Talkie(Architecture):
    name = "talkie"
    rope_mode = "neox"
    required_keys = (*RMS_KEYS, L.LOGIT_SCALE)
    keys = (Key("logit_scale", L.LOGIT_SCALE, float, 0.0),)

    def __init__(self, hp: HParams):
        check_whole_heads(hp, self.name)
        super().__init__(hp)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, F, V = hp.n_embd, hp.n_ff, hp.n_vocab
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT, (E, V))]
        for il in range(hp.n_layer):
            H = hp.head_count(il)
            layer = [*fused_or_split_qkv_tensors(hp, il), spec(T.ATTN_OUT, (H * hp.n_embd_head_v, E), il),
                     spec(T.ATTN_Q_NORM, (1, H), il, kind="vector"),  # a gain per head
                     spec(T.FFN_GATE, (E, F), il), spec(T.FFN_UP, (E, F), il), spec(T.FFN_DOWN, (F, E), il),
                     spec(T.LAYER_OUT_SCALE, (1,), il, kind="vector")]
            specs += layer + layer_scales(layer, il)
        return specs


    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = self._rms(b, b.build_inp_embd(b.w(T.TOKEN_EMBD)), "inp_norm")
        skip = x  # the normalised embeddings every layer adds back, scaled
        pos = b.build_inp_pos()
        for il in b.layers():
            q, k, v = b.build_qkv(self._rms(b, x, "attn_norm"), il)
            q, k = b.rope(q, pos, name="Qcur.rope"), b.rope(k, pos, name="Kcur.rope")
            q = b.norm(q, T.ATTN_Q_NORM, il, name="Qcur_norm")  # after RoPE, as the reference model
            k = self._rms(b, k, "Kcur_norm")
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il),
                             kq_scale=inv_sqrt(hp.n_embd_head_k))
            a, x, skip_rows = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"), (skip, "embd_skip.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            f = b.build_ffn(self._rms(b, x, "ffn_norm"), up=b.w(T.FFN_UP, il), gate=b.w(T.FFN_GATE, il),
                            down=b.w(T.FFN_DOWN, il), down_s=b.scale(T.FFN_DOWN, il))
            x = b.op("add", f, x, name="ffn_res")
            x = b.op("add", x, b.op("mul", skip_rows, b.w(T.LAYER_OUT_SCALE, il), name="embd_skip"), name="l_out")
        x = self._rms(b, x, "result_norm")
        b.build_output(x, b.w(T.OUTPUT))
        b.outputs["logits"] = b.op("scale", b.outputs["logits"], s=hp.logit_scale, name="result_output.scaled")

    @staticmethod
    def _rms(b: GraphBuilder, x: Node, name: str) -> Node:
        return b.build_norm(x, None, name=name)


# ---- presets (no Hugging Face mapping: the converter reads logit_scale from a checkpoint weight, lm_head_gain) ----

presets.register({"Talkie-tiny": synthetic("talkie", "a synthetic header of tiny sizes",
                                           include=presets.SPLIT_QKV, keys={L.LOGIT_SCALE: 0.5})})
