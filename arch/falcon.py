"""Falcon (TII): a decoder whose attention and MLP run in parallel on the layer's input, NEOX RoPE, multi-query
(7B) or grouped-query (40B) attention through a fused QKV without bias, a GELU MLP without bias.

Falcon-7B normalises once: one LayerNorm feeds attention and MLP. Falcon-40B's files carry a second LayerNorm
per layer (``attn_norm_2``): it feeds attention, the first the MLP; the graph takes that form wherever the file
has the tensor, as llama.cpp's does. The LM head is the token embedding unless the file has its own.

References: Almazrouei et al. 2023, "The Falcon Series of Open Language Models" (arXiv:2311.16867); llama.cpp
src/models/falcon.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import Act, GraphBuilder, Norm
from graphir.model.hf_config import BLOCKS, VOCAB, Family, derived, fixed, hf
from graphir.model.presets import Preset
from graphir.model.qkv import check_whole_heads, roped_attention
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, tensor_name, with_bias

L, A = Keys.LLM, Keys.Attention


class Falcon(Architecture):
    name = "falcon"
    rope_mode = "neox"
    required_keys = (L.FEED_FORWARD_LENGTH, A.HEAD_COUNT, A.LAYERNORM_EPS)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        check_whole_heads(hp, self.name)
        E, F, V = hp.n_embd, hp.n_ff, hp.n_vocab
        specs = [spec(T.TOKEN_EMBD, (E, V)), *with_bias(T.OUTPUT_NORM, (E,)),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD))]
        for il in range(hp.n_layer):
            layer = [*with_bias(T.ATTN_NORM, (E,), il),
                     *(spec(T.ATTN_NORM_2, (E,), il, suffix, kind="vector", optional=True)
                       for suffix in ("weight", "bias")),
                     spec(T.ATTN_QKV, (E, E + 2 * hp.n_embd_v_gqa), il), spec(T.ATTN_OUT, (E, E), il),
                     spec(T.FFN_UP, (E, F), il), spec(T.FFN_DOWN, (F, E), il)]
            specs += layer + layer_scales(layer, il)
        return specs

    def build(self, b: GraphBuilder) -> None:
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, Norm.LAYER, name="attn_norm")
            # Falcon-40B's second norm feeds attention where the file has it
            h2 = b.norm(x, T.ATTN_NORM_2, il, Norm.LAYER, name="attn_norm_2") \
                if b.w_opt(T.ATTN_NORM_2, il) is not None else h
            a = roped_attention(b, h2, pos, il)
            a, x, h = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"), (h, "ffn_inp.rows"))
            # the MLP reads the first norm (its matrices' scales unread, as llama.cpp's graph passes none)
            f = b.build_ffn(h, up=b.w(T.FFN_UP, il), gate=None, down=b.w(T.FFN_DOWN, il), act=Act.GELU)
            x = b.op("add", b.op("add", f, a, name="ffn_res"), x, name="l_out")
        x = b.norm(x, T.OUTPUT_NORM, kind=Norm.LAYER, name="result_norm")
        b.build_output(x, b.w(T.OUTPUT))


# ---- Hugging Face: convert_hf_to_gguf's FalconModel (the context length is not in the config: 2048) ------------

hf_config.register(Family("falcon", (
    hf(L.BLOCK_COUNT, *BLOCKS),
    fixed(L.CONTEXT_LENGTH, 2048),
    hf(L.EMBEDDING_LENGTH, "hidden_size"),
    derived(L.FEED_FORWARD_LENGTH, lambda c: 4 * c.find("hidden_size")),
    hf(A.HEAD_COUNT, "num_attention_heads", "n_head"),
    derived(A.HEAD_COUNT_KV, lambda c: c.find("num_kv_heads", "n_head_kv", default=1)),
    hf(A.LAYERNORM_EPS, "layer_norm_epsilon", kind="number"),
    VOCAB,
), {"tie_word_embeddings": True}), "FalconForCausalLM", "RWForCausalLM")

presets.register({
    # 32 layers of 71 heads of 64 sharing one K/V head; one norm a layer
    "Falcon-7B": Preset("falcon", {
        L.CONTEXT_LENGTH: 2048, L.EMBEDDING_LENGTH: 4544, L.BLOCK_COUNT: 32, L.FEED_FORWARD_LENGTH: 18176,
        A.HEAD_COUNT: 71, A.HEAD_COUNT_KV: 1, A.LAYERNORM_EPS: 1e-5, L.VOCAB_SIZE: 65024,
    }, tied=True, source="tiiuae/falcon-7b config.json"),
})
