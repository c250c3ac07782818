"""Command-R (Cohere): a decoder whose attention and FFN read the same LayerNorm in parallel; Command R7B
(``cohere2``), the same block with sliding windows.

Each layer is ``x + ffn(LN(x)) + attn(LN(x))``: one LayerNorm without bias feeds both branches, which join the
residual stream together (GPT-J's parallel block). RoPE rotates adjacent pairs; the 104B model (Command R+, 64
layers and more) normalises each head of Q and K with a LayerNorm of its own weights. The LM head is the token
embedding, and the logits are multiplied by ``logit_scale``. Command R7B makes three of every four layers
local (a sliding window) and rotates only those: its global layers attend without positions.

References: Cohere 2024, "Command R" and "Command R7B" model cards; llama.cpp src/models/command-r.cpp and
cohere2.cpp.
"""

from __future__ import annotations

from typing import ClassVar

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.graph.floats import inv_sqrt
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder, Norm
from graphir.model.hf_config import TEXT, VOCAB, Family, derived, hf
from graphir.model.hparams import Key, SlidingWindow
from graphir.model.presets import Preset
from graphir.model.qkv import qkv_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope
QK_NORM_FROM = 64  # llama.cpp gives the models of this many layers or more (Command R+) per-head QK-norm


class CommandR(Architecture):
    name = "command-r"
    rope_mode = "norm"
    required_keys = (L.FEED_FORWARD_LENGTH, A.HEAD_COUNT, A.LAYERNORM_EPS)
    keys = (Key("logit_scale", L.LOGIT_SCALE, float, 0.0),)  # 0: the logits are not scaled
    qk_norm_from: ClassVar[int | None] = QK_NORM_FROM  # None: no model of the family has QK-norm
    rope_sliding_only: ClassVar[bool] = False  # only the sliding-window layers rotate Q and K (Command R7B)
    ffn_scales: ClassVar[bool] = False  # the FFN's matrices' scales read by the graph (Command R7B)

    @property
    def qk_norm(self) -> bool:
        return self.qk_norm_from is not None and self.hp.n_layer >= self.qk_norm_from

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, F, V, d = hp.n_embd, hp.n_ff, hp.n_vocab, hp.n_embd_head_k
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector")]
        for il in range(hp.n_layer):
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), *qkv_tensors(hp, il),
                     spec(T.FFN_GATE, (E, F), il), spec(T.FFN_UP, (E, F), il), spec(T.FFN_DOWN, (F, E), il)]
            if self.qk_norm:
                layer += [spec(T.ATTN_Q_NORM, (d, hp.head_count(il)), il),
                          spec(T.ATTN_K_NORM, (d, hp.head_count_kv(il)), il)]
            specs += layer + layer_scales(layer, il)
        return specs

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, Norm.LAYER, name="attn_norm")
            # self-attention
            q, k, v = b.build_qkv(h, il)
            if self.qk_norm:
                q = b.norm(q, T.ATTN_Q_NORM, il, Norm.LAYER, name="Qcur_normed")
                k = b.norm(k, T.ATTN_K_NORM, il, Norm.LAYER, name="Kcur_normed")
            if not self.rope_sliding_only or hp.is_swa(il):
                q = b.rope(q, pos, name="Qcur.rope")
                k = b.rope(k, pos, name="Kcur.rope")
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il),
                             kq_scale=inv_sqrt(hp.n_embd_head_k))  # 1/sqrt(head size): no attention.scale is read
            a, x, h = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"), (h, "ffn_inp.rows"))
            # the FFN reads the same norm (Command-R's graph passes none of its matrices' scales)
            scales = {f"{n}_s": b.scale(m, il) for n, m in (("up", T.FFN_UP), ("gate", T.FFN_GATE),
                                                            ("down", T.FFN_DOWN))} if self.ffn_scales else {}
            f = b.build_ffn(h, up=b.w(T.FFN_UP, il), gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il), **scales)
            x = b.op("add", b.op("add", f, x, name="ffn_res"), a, name="l_out")  # both branches join the stream
        x = b.norm(x, T.OUTPUT_NORM, kind=Norm.LAYER, name="result_norm")
        b.build_output(x, b.w(T.TOKEN_EMBD))
        if hp.logit_scale:
            b.outputs["logits"] = b.op("scale", b.outputs["logits"], s=hp.logit_scale, name="result_scaled")


class Cohere2(CommandR):
    name = "cohere2"
    swa = SlidingWindow("standard", period=4)  # the window is required; three local layers, then a global one
    qk_norm_from = None
    rope_sliding_only = True
    ffn_scales = True


# ---- Hugging Face: convert_hf_to_gguf's CommandR2Model ------------------------------------------------------

hf_config.register(Family("command-r", TEXT + (hf(A.LAYERNORM_EPS, "layer_norm_eps", kind="number"),
                                               hf(L.LOGIT_SCALE, "logit_scale", kind="number"), VOCAB),
                          {"tie_word_embeddings": True}),
                   "CohereForCausalLM")

# Cohere2Model: the window, RoPE over rotary_pct of each head, no RoPE scaling
hf_config.register(Family("cohere2", TEXT + (
    hf(A.LAYERNORM_EPS, "layer_norm_eps", kind="number"), hf(L.LOGIT_SCALE, "logit_scale", kind="number"),
    hf(A.SLIDING_WINDOW, "sliding_window"),
    derived(R.DIMENSION_COUNT, lambda c: int(c.find("rotary_pct", kind="number", default=1.0)
                                             * (c.find("hidden_size") // c.find("num_attention_heads")))),
    VOCAB), {"tie_word_embeddings": True}), "Cohere2ForCausalLM")

# ---- presets -----------------------------------------------------------------------------------------------

presets.register({
    # 35B: 40 layers of 64 heads (no grouping) of 128, no QK-norm; the head is the token embedding
    "Command-R-35B": Preset("command-r", {
        L.CONTEXT_LENGTH: 8192, L.EMBEDDING_LENGTH: 8192, L.BLOCK_COUNT: 40, L.FEED_FORWARD_LENGTH: 22528,
        A.HEAD_COUNT: 64, A.HEAD_COUNT_KV: 64, R.FREQ_BASE: 8000000.0, A.LAYERNORM_EPS: 1e-5, L.LOGIT_SCALE: 0.0625,
        L.VOCAB_SIZE: 256000,
    }, tied=True, source="CohereForAI/c4ai-command-r-v01 config.json"),
    # 32 layers of 32 heads of 128 in groups of 4; windows of 4096 on three layers of four
    "Command-R7B": Preset("cohere2", {
        L.CONTEXT_LENGTH: 8192, L.EMBEDDING_LENGTH: 4096, L.BLOCK_COUNT: 32, L.FEED_FORWARD_LENGTH: 14336,
        A.HEAD_COUNT: 32, A.HEAD_COUNT_KV: 8, R.FREQ_BASE: 50000.0, A.LAYERNORM_EPS: 1e-5, L.LOGIT_SCALE: 0.25,
        A.SLIDING_WINDOW: 4096, R.DIMENSION_COUNT: 128, L.VOCAB_SIZE: 256000,
    }, tied=True, source="CohereForAI/c4ai-command-r7b-12-2024 config.json"),
})
