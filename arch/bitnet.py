"""BitNet b1.58 (bitnet): Llama's decoder with sub-norms and per-tensor weight scales.

Attention's heads are RMS-normalised (``attn_sub_norm``) before the output projection, and the FFN's gated
hidden values (``ffn_sub_norm``) before its down projection; every projection's product is multiplied by its
matrix's scale (``.scale``, one value) where the file has one: the ternary weights' absmean. RoPE pairs NEOX
halves; the LM head is the token embedding. (The ternary weight types themselves are not read here: matrices are
F32, F16 or block-quantized as in any family.)
References: Ma et al. 2024, "The Era of 1-bit LLMs"; Microsoft 2025, "BitNet b1.58 2B4T Technical Report";
llama.cpp src/models/bitnet.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.graph.floats import inv_sqrt
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hf_config import TEXT, VOCAB, Family, fixed
from graphir.model.presets import Preset
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class BitNet(Architecture):
    name = "bitnet"
    rope_mode = "neox"
    required_keys = (L.FEED_FORWARD_LENGTH, A.HEAD_COUNT, A.LAYERNORM_RMS_EPS)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V, F, E_gqa = hp.n_embd, hp.n_vocab, hp.n_ff, hp.n_embd_k_gqa
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector")]
        for il in range(hp.n_layer):
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), spec(T.ATTN_SUB_NORM, (E,), il, kind="vector"),
                     spec(T.ATTN_Q, (E, E), il), spec(T.ATTN_K, (E, E_gqa), il), spec(T.ATTN_V, (E, E_gqa), il),
                     spec(T.ATTN_OUT, (E, E), il), spec(T.FFN_NORM, (E,), il, kind="vector"),
                     spec(T.FFN_SUB_NORM, (F,), il, kind="vector"), spec(T.FFN_GATE, (E, F), il),
                     spec(T.FFN_DOWN, (F, E), il), spec(T.FFN_UP, (E, F), il)]
            specs += layer + layer_scales(layer, il)  # every matrix's scale is read
        return specs

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            # self-attention; the heads' output normalised before W_o
            q, k, v = b.build_qkv(h, il)
            q = b.rope(q, pos, name="Qcur.rope")
            k = b.rope(k, pos, name="Kcur.rope")
            a = b.build_attn(q, k, v, wo=None, kq_scale=inv_sqrt(hp.n_embd_head_k))
            a = b.norm(a, T.ATTN_SUB_NORM, il, name="attn_sub_norm")
            a = b.linear(a, b.w(T.ATTN_OUT, il), name="attn_out", s=b.scale(T.ATTN_OUT, il))
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            # feed-forward network: the gated hidden values normalised before W_down
            h = b.norm(x, T.FFN_NORM, il, name="ffn_norm")
            up = b.linear(h, b.w(T.FFN_UP, il), name="ffn_up", s=b.scale(T.FFN_UP, il))
            gate = b.linear(h, b.w(T.FFN_GATE, il), name="ffn_gate", s=b.scale(T.FFN_GATE, il))
            f = b.norm(b.op("swiglu", gate, up, name="ffn_sub_out"), T.FFN_SUB_NORM, il, name="ffn_sub_norm")
            f = b.linear(f, b.w(T.FFN_DOWN, il), name="ffn_down", s=b.scale(T.FFN_DOWN, il))
            x = b.op("add", f, x, name="l_out")
        x = b.norm(x, T.OUTPUT_NORM, name="result_norm")
        b.build_output(x, b.w(T.TOKEN_EMBD))


# ---- Hugging Face: convert_hf_to_gguf's BitnetModel ---------------------------------------------------------

hf_config.register(Family("bitnet", TEXT + (VOCAB, fixed(R.SCALING_TYPE, "linear"), fixed(R.SCALING_FACTOR, 1.0)),
                          {"tie_word_embeddings": True}), "BitnetForCausalLM", "BitNetForCausalLM")

# ---- presets -----------------------------------------------------------------------------------------------

presets.register({
    # 2B4T: 30 layers of 20 heads (5 KV heads) of 128, RoPE base 5e5; the converter writes linear scaling by 1
    "BitNet-b1.58-2B-4T": Preset("bitnet", {
        L.CONTEXT_LENGTH: 4096, L.EMBEDDING_LENGTH: 2560, L.BLOCK_COUNT: 30, L.FEED_FORWARD_LENGTH: 6912,
        A.HEAD_COUNT: 20, A.HEAD_COUNT_KV: 5, R.FREQ_BASE: 500000.0, A.LAYERNORM_RMS_EPS: 1e-5,
        R.SCALING_TYPE: "linear", R.SCALING_FACTOR: 1.0, L.VOCAB_SIZE: 128256,
    }, tied=True, source="microsoft/bitnet-b1.58-2B-4T config.json"),
})
