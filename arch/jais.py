"""Jais (Inception, MBZUAI, Cerebras): GPT-2's block with a SwiGLU MLP, LayerNorms and biases everywhere, positions
by ALiBi alone, and scores scaled by 1/d rather than 1/sqrt(d) (muP); the converter folds the embedding's and the
head's muP multipliers into their weights. The LM head is a matrix of its own.

References: Sengupta et al. 2023, "Jais and Jais-chat: Arabic-Centric Foundation and Instruction-Tuned Open
Generative Large Language Models" (arXiv:2308.16149); llama.cpp src/models/jais.cpp.
"""

from __future__ import annotations

from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.builder import Norm
from graphir.model.hf_config import BLOCKS, VOCAB, Family, fixed, hf
from graphir.model.hparams import Alibi
from graphir.model.prenorm import LAYER_NORM_KEYS, REQUIRED, PreNormDecoder, Traits, synthetic

L, A = Keys.LLM, Keys.Attention


class Jais(PreNormDecoder):
    name = "jais"
    rope_mode = "none"
    required_keys = LAYER_NORM_KEYS
    alibi = Alibi(key=True)  # the file's max_alibi_bias (absent: 0, no bias)
    traits = Traits(norm=Norm.LAYER, tied_head=False, fused_qkv=REQUIRED, wo_bias=REQUIRED, ffn_bias=REQUIRED,
                    kq_scale_d=True, rope=False)


# ---- Hugging Face: convert_hf_to_gguf's JaisModel. The ALiBi bias comes from the checkpoint's slopes, not the
# config: the converter's value before it reads them (8) is what the config alone gives -------------------------

hf_config.register(Family("jais", (
    hf(L.BLOCK_COUNT, *BLOCKS),
    hf(L.CONTEXT_LENGTH, "n_positions"),
    hf(L.EMBEDDING_LENGTH, "n_embd"),
    hf(L.FEED_FORWARD_LENGTH, "n_inner"),
    hf(A.HEAD_COUNT, "n_head"),
    hf(A.LAYERNORM_EPS, "layer_norm_epsilon", kind="number"),
    fixed(A.MAX_ALIBI_BIAS, 8.0),
    VOCAB,
), {"tie_word_embeddings": False}), "JAISLMHeadModel")

presets.register({"Jais-tiny": synthetic("jais", "a synthetic header of tiny sizes, ALiBi's bias 8", A.LAYERNORM_EPS,
                                         keys={A.MAX_ALIBI_BIAS: 8.0})})
