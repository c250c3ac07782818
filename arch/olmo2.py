"""OLMo 2 and OLMo 3 (AI2): a decoder that normalises after, not before: each layer is
``x += norm(attn(x))`` then ``x += norm(ffn(x))``, with RMS norms and no norm ahead of either branch.

Q and K are RMS-normalised across all their heads at once (one learned scale per value of the whole projection,
before they are split into heads), then NEOX RoPE turns whole heads; the FFN is SwiGLU; the LM head is a matrix
of its own. OLMo 3's files add a sliding window on three layers of four (``attention.sliding_window`` > 0);
those layers rotate without the model's RoPE scaling (llama.cpp's olmo2.cpp: frequency scale 1, no YaRN).

References: Team OLMo 2024, "2 OLMo 2 Furious" (arXiv:2501.00656); llama.cpp src/models/olmo2.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.graph.floats import inv_sqrt
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hf_config import TEXT, VOCAB, Family, hf
from graphir.model.hparams import SlidingWindow
from graphir.model.presets import Preset
from graphir.model.qkv import check_whole_heads, qkv_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class OLMo2(Architecture):
    name = "olmo2"
    rope_mode = "neox"
    required_keys = (L.FEED_FORWARD_LENGTH, A.HEAD_COUNT, A.LAYERNORM_RMS_EPS)
    swa = SlidingWindow("standard", period=4, off_when_zero=True)  # OLMo 3; absent or 0: no window

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        check_whole_heads(hp, self.name)
        E, F, V = hp.n_embd, hp.n_ff, hp.n_vocab
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"), spec(T.OUTPUT, (E, V))]
        for il in range(hp.n_layer):
            layer = [*qkv_tensors(hp, il), spec(T.ATTN_Q_NORM, (hp.head_count(il) * hp.n_embd_head_k,), il,
                                                kind="vector"),
                     spec(T.ATTN_K_NORM, (hp.n_embd_k_gqa_at(il),), il, kind="vector"),
                     spec(T.ATTN_POST_NORM, (E,), il, kind="vector"),
                     spec(T.FFN_GATE, (E, F), il), spec(T.FFN_UP, (E, F), il), spec(T.FFN_DOWN, (F, E), il),
                     spec(T.FFN_POST_NORM, (E,), il, kind="vector")]
            specs += layer + layer_scales(layer, il)
        return specs

    def build(self, b: GraphBuilder) -> None:
        hp, T_ = self.hp, b.n_tokens
        d = hp.n_embd_head_k
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            q, k, v = b.build_qkv(x, il, heads=False)
            q = b.norm(q, T.ATTN_Q_NORM, il, name="Qcur_normed")
            k = b.norm(k, T.ATTN_K_NORM, il, name="Kcur_normed")
            q = b.reshape(q, (d, hp.head_count(il), T_), name="Qcur.heads")
            k = b.reshape(k, (d, hp.head_count_kv(il), T_), name="Kcur.heads")
            v = b.reshape(v, (d, hp.head_count_kv(il), T_), name="Vcur.heads")
            plain = dict(freq_scale=1.0, ext_factor=0.0, attn_factor=1.0) if hp.is_swa(il) else {}
            q, k = b.rope(q, pos, name="Qcur.rope", **plain), b.rope(k, pos, name="Kcur.rope", **plain)
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il), kq_scale=inv_sqrt(d))
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            a = b.norm(a, T.ATTN_POST_NORM, il, name="attn_post_norm")
            x = b.op("add", a, x, name="ffn_inp")
            # the FFN's matrices' scales unread, as llama.cpp's graph passes none
            f = b.build_ffn(x, up=b.w(T.FFN_UP, il), gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il))
            f = b.norm(f, T.FFN_POST_NORM, il, name="ffn_post_norm")
            x = b.op("add", f, x, name="l_out")
        x = b.norm(x, T.OUTPUT_NORM, name="result_norm")
        b.build_output(x, b.w(T.OUTPUT))


# ---- Hugging Face: convert_hf_to_gguf's Olmo2Model (OLMo 3: Olmo3ForCausalLM, with its window) ---------------

hf_config.register(Family("olmo2", TEXT + (hf(A.SLIDING_WINDOW, "sliding_window", default=None), VOCAB),
                          {"tie_word_embeddings": False}), "Olmo2ForCausalLM")

presets.register({
    # 32 layers of 32 heads of 128; RoPE base 500000
    "OLMo-2-7B": Preset("olmo2", {
        L.CONTEXT_LENGTH: 4096, L.EMBEDDING_LENGTH: 4096, L.BLOCK_COUNT: 32, L.FEED_FORWARD_LENGTH: 11008,
        A.HEAD_COUNT: 32, A.HEAD_COUNT_KV: 32, R.FREQ_BASE: 500000.0, A.LAYERNORM_RMS_EPS: 1e-6,
        L.VOCAB_SIZE: 100352,
    }, tied=False, source="allenai/OLMo-2-1124-7B config.json"),
})
