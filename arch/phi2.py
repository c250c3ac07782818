"""Phi-2 (Microsoft): a decoder whose attention and MLP read one LayerNorm in parallel (GPT-J's block):
``x + attn(LN(x)) + mlp(LN(x))``, with biases everywhere, NEOX RoPE over the first ``rope.dimension_count`` values
of each head (Phi-2: 32 of 80), queries scaled by 1/sqrt(head size) before attention (as llama.cpp's phi2.cpp does
it, for precision), a GELU MLP and an LM head of its own with a bias.

References: Microsoft 2023, "Phi-2: The surprising power of small language models"; llama.cpp src/models/phi2.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.graph.floats import inv_sqrt
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import Act, GraphBuilder, Norm
from graphir.model.hf_config import BLOCKS, VOCAB, Family, derived, hf
from graphir.model.presets import Preset
from graphir.model.qkv import qkv_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, with_bias

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class Phi2(Architecture):
    name = "phi2"
    rope_mode = "neox"
    required_keys = (L.FEED_FORWARD_LENGTH, A.HEAD_COUNT, A.LAYERNORM_EPS)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, F, V = hp.n_embd, hp.n_ff, hp.n_vocab
        specs = [spec(T.TOKEN_EMBD, (E, V)), *with_bias(T.OUTPUT_NORM, (E,)), *with_bias(T.OUTPUT, (E, V))]
        for il in range(hp.n_layer):
            layer = [*with_bias(T.ATTN_NORM, (E,), il), *qkv_tensors(hp, il),
                     spec(T.ATTN_OUT, (E,), il, "bias", kind="vector"),
                     *with_bias(T.FFN_UP, (E, F), il), *with_bias(T.FFN_DOWN, (F, E), il)]
            specs += layer + layer_scales(layer, il)
        return specs

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, Norm.LAYER, name="attn_norm")
            q, k, v = b.build_qkv(h, il)
            q, k = b.rope(q, pos, name="Qcur.rope"), b.rope(k, pos, name="Kcur.rope")
            q = b.op("scale", q, s=inv_sqrt(hp.n_embd_head_k), name="Qcur.scaled")
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_b=b.w(T.ATTN_OUT, il, "bias"),
                             wo_s=b.scale(T.ATTN_OUT, il), kq_scale=1.0)
            a, x, h = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"), (h, "ffn_inp.rows"))
            # the MLP reads the same norm (its matrices' scales unread, as llama.cpp's graph passes none)
            f = b.build_ffn(h, up=b.w(T.FFN_UP, il), up_b=b.w(T.FFN_UP, il, "bias"), gate=None,
                            down=b.w(T.FFN_DOWN, il), down_b=b.w(T.FFN_DOWN, il, "bias"), act=Act.GELU)
            x = b.op("add", b.op("add", a, f, name="attn_ffn"), x, name="l_out")
        x = b.norm(x, T.OUTPUT_NORM, kind=Norm.LAYER, name="result_norm")
        b.build_output(x, b.w(T.OUTPUT), bias=b.w(T.OUTPUT, None, "bias"))


# ---- Hugging Face: convert_hf_to_gguf's Phi2Model ------------------------------------------------------------

hf_config.register(Family("phi2", (
    hf(L.BLOCK_COUNT, *BLOCKS),
    hf(L.CONTEXT_LENGTH, "max_position_embeddings", "n_positions"),
    hf(L.EMBEDDING_LENGTH, "hidden_size", "n_embd"),
    derived(L.FEED_FORWARD_LENGTH, lambda c: 4 * c.find("hidden_size", "n_embd")),
    hf(A.HEAD_COUNT, "num_attention_heads", "n_head"),
    hf(A.HEAD_COUNT_KV, "num_attention_heads", "n_head"),
    hf(A.LAYERNORM_EPS, "layer_norm_eps", "layer_norm_epsilon", kind="number"),
    derived(R.DIMENSION_COUNT, lambda c: int(c.find("partial_rotary_factor", kind="number")
                                             * (c.find("hidden_size", "n_embd") // c.find("num_attention_heads",
                                                                                          "n_head")))),
    VOCAB,
), {"tie_word_embeddings": False}), "PhiForCausalLM")

presets.register({
    # 32 layers of 32 heads of 80, RoPE over 32 values of each
    "Phi-2": Preset("phi2", {
        L.CONTEXT_LENGTH: 2048, L.EMBEDDING_LENGTH: 2560, L.BLOCK_COUNT: 32, L.FEED_FORWARD_LENGTH: 10240,
        A.HEAD_COUNT: 32, A.HEAD_COUNT_KV: 32, A.LAYERNORM_EPS: 1e-5, R.DIMENSION_COUNT: 32, L.VOCAB_SIZE: 51200,
    }, tied=False, source="microsoft/phi-2 config.json"),
})
