"""GPT-2: a pre-LN decoder with a learned position table, fused biased QKV and a GELU MLP; BLOOM, the same
block with positions by ALiBi.

Each block is ``x += attn(LN(x))`` then ``x += mlp(LN(x))``, every LayerNorm and projection with a bias;
attention is causal multi-head attention without rotary positions. In GPT-2 positions are the rows of a trained
table added to the token embeddings, so a context cannot hold more than ``n_ctx_train`` positions; BLOOM biases
each head's scores by distance (ALiBi) instead, and normalises the token embeddings first. The LM head is the
token embedding unless the file has its own ``output.weight``.
References: Radford et al. 2019, "Language Models are Unsupervised Multitask Learners"; BigScience 2022,
"BLOOM: A 176B-Parameter Open-Access Multilingual Language Model" (arXiv:2211.05100); llama.cpp
src/models/gpt2.cpp and bloom.cpp.
"""

from __future__ import annotations

import math
from typing import ClassVar

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.model.architecture import Architecture
from graphir.model.hparams import Alibi
from graphir.model.builder import Act, GraphBuilder, Norm
from graphir.graph.floats import f32
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, tensor_name, with_bias
from graphir.model import hf_config, presets
from graphir.model.hf_config import BLOCKS, VOCAB, Family, derived, hf
from graphir.model.presets import Preset


class Gpt2(Architecture):
    name = "gpt2"
    rope_mode = "none"  # positions come from the table, not from rotations
    learned_positions: ClassVar[bool] = True  # a trained position table added to the token embeddings
    required_keys = (Keys.LLM.FEED_FORWARD_LENGTH, Keys.Attention.HEAD_COUNT, Keys.Attention.LAYERNORM_EPS)
    embd_norm: ClassVar[bool] = False  # a LayerNorm over the token embeddings before the first block (BLOOM)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, F, V = hp.n_embd, hp.n_ff, hp.n_vocab
        specs = [
            spec(T.TOKEN_EMBD, (E, V)),
            *((spec(T.POS_EMBD, (E, hp.n_ctx_train)),) if self.learned_positions else ()),
            *(with_bias(T.TOKEN_EMBD_NORM, (E,)) if self.embd_norm else ()),
            *with_bias(T.OUTPUT_NORM, (E,)),
            spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD)),
        ]
        for il in range(hp.n_layer):
            layer = [
                *with_bias(T.ATTN_NORM, (E,), il),
                *with_bias(T.ATTN_QKV, (E, E + 2 * hp.n_embd_v_gqa), il),
                *with_bias(T.ATTN_OUT, (E, E), il),
                *with_bias(T.FFN_NORM, (E,), il),
                *with_bias(T.FFN_UP, (E, F), il),
                *with_bias(T.FFN_DOWN, (F, E), il),
            ]
            specs += layer + layer_scales(layer, il)  # read: those of the QKV and output projections
        return specs

    def build(self, b: GraphBuilder) -> None:
        pos = b.build_inp_pos() if self.learned_positions else None
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        if pos is not None:
            x = b.op("add", x, b.op("get_rows", b.w(T.POS_EMBD), pos, name="pos_embd"), name="inpL")
        if self.embd_norm:
            x = b.norm(x, T.TOKEN_EMBD_NORM, kind=Norm.LAYER, name="inp_norm")
        kq_scale = f32(1.0 / f32(math.sqrt(self.hp.n_embd_head_k)))  # 1.0f / sqrtf(d): no attention.scale key is read
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, Norm.LAYER, name="attn_norm")
            q, k, v = b.build_qkv(h, il)
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_b=b.w(T.ATTN_OUT, il, "bias"),
                             wo_s=b.w_opt(T.ATTN_OUT, il, "scale"), kq_scale=kq_scale)
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            h = b.norm(x, T.FFN_NORM, il, Norm.LAYER, name="ffn_norm")
            f = b.build_ffn(h, up=b.w(T.FFN_UP, il), up_b=b.w(T.FFN_UP, il, "bias"), gate=None,
                            down=b.w(T.FFN_DOWN, il), down_b=b.w(T.FFN_DOWN, il, "bias"), act=Act.GELU)
            x = b.op("add", f, x, name="l_out")
        b.build_output(b.norm(x, T.OUTPUT_NORM, kind=Norm.LAYER, name="result_norm"), b.w(T.OUTPUT))


class StarCoder(Gpt2):
    """StarCoder and SantaCoder (GPTBigCode): GPT-2's graph, llama.cpp's starcoder.cpp; multi-query attention is
    its fused QKV's width."""

    name = "starcoder"


class Bloom(Gpt2):
    name = "bloom"
    learned_positions = False
    alibi = Alibi()  # llama.cpp sets the bias itself (8), no key
    embd_norm = True


# ---- Hugging Face: what convert_hf_to_gguf writes for a GPT2LMHeadModel config ---------------------------

L, A = Keys.LLM, Keys.Attention

hf_config.register(Family("gpt2", (
    hf(L.BLOCK_COUNT, *BLOCKS),
    hf(L.CONTEXT_LENGTH, "n_ctx"),
    hf(L.EMBEDDING_LENGTH, "n_embd"),
    derived(L.FEED_FORWARD_LENGTH, lambda c: 4 * c.find("n_embd")),
    hf(A.HEAD_COUNT, "n_head"),
    hf(A.LAYERNORM_EPS, "layer_norm_epsilon", kind="number"),
    VOCAB,
), {"tie_word_embeddings": True, "layer_norm_epsilon": 1e-5}), "GPT2LMHeadModel")


# StarCoderModel: one K/V head, the FFN four times the width
hf_config.register(Family("starcoder", (
    hf(L.BLOCK_COUNT, *BLOCKS),
    hf(L.CONTEXT_LENGTH, "n_positions"),
    hf(L.EMBEDDING_LENGTH, "n_embd"),
    derived(L.FEED_FORWARD_LENGTH, lambda c: 4 * c.find("n_embd")),
    hf(A.HEAD_COUNT, "n_head"),
    derived(A.HEAD_COUNT_KV, lambda c: 1),
    hf(A.LAYERNORM_EPS, "layer_norm_epsilon", kind="number"),
    VOCAB,
), {"tie_word_embeddings": True, "layer_norm_epsilon": 1e-5}), "GPTBigCodeForCausalLM")

# BloomModel: the context length is seq_length, else (as the converter falls back) the width
hf_config.register(Family("bloom", (
    hf(L.BLOCK_COUNT, *BLOCKS),
    derived(L.CONTEXT_LENGTH, lambda c: c.find("seq_length", default=None) or c.find("hidden_size", "n_embed")),
    hf(L.EMBEDDING_LENGTH, "hidden_size", "n_embed"),
    derived(L.FEED_FORWARD_LENGTH, lambda c: 4 * c.find("hidden_size", "n_embed")),
    hf(A.HEAD_COUNT, "n_head", "num_attention_heads"),
    hf(A.HEAD_COUNT_KV, "n_head", "num_attention_heads"),
    hf(A.LAYERNORM_EPS, "layer_norm_epsilon", kind="number"),
    VOCAB,
), {"tie_word_embeddings": True}), "BloomForCausalLM", "BloomModel")


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------

presets.register({
    # GPT-2 small; the converter keeps the position table in f32, and the LM head is the token embedding.
    "GPT-2": Preset("gpt2", {
        L.CONTEXT_LENGTH: 1024, L.EMBEDDING_LENGTH: 768, L.BLOCK_COUNT: 12, L.FEED_FORWARD_LENGTH: 3072,
        A.HEAD_COUNT: 12, A.LAYERNORM_EPS: 1e-5, L.VOCAB_SIZE: 50257,
    }, tied=True, f32=r"position_embd\.weight", source="openai-community/gpt2 config.json"),
    "StarCoder-15.5B": Preset("starcoder", {
        L.CONTEXT_LENGTH: 8192, L.EMBEDDING_LENGTH: 6144, L.BLOCK_COUNT: 40, L.FEED_FORWARD_LENGTH: 24576,
        A.HEAD_COUNT: 48, A.HEAD_COUNT_KV: 1, A.LAYERNORM_EPS: 1e-5, L.VOCAB_SIZE: 49152,
    }, tied=True, f32=r"position_embd\.weight", source="bigcode/starcoder config.json"),
    "BLOOM-560M": Preset("bloom", {
        L.CONTEXT_LENGTH: 1024, L.EMBEDDING_LENGTH: 1024, L.BLOCK_COUNT: 24, L.FEED_FORWARD_LENGTH: 4096,
        A.HEAD_COUNT: 16, A.HEAD_COUNT_KV: 16, A.LAYERNORM_EPS: 1e-5, L.VOCAB_SIZE: 250880,
    }, tied=True, source="bigscience/bloom-560m config.json"),
})
