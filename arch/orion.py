"""Orion (OrionStar): the pre-norm decoder whose norms are LayerNorms with biases, SwiGLU, RoPE over split
halves, an LM head of its own.

References: OrionStar 2024, "Orion-14B: Open-source Multilingual Large Language Models"; llama.cpp
src/models/orion.cpp.
"""

from __future__ import annotations

from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.builder import Norm
from graphir.model.hf_config import BLOCKS, VOCAB, Family, hf
from graphir.model.prenorm import PreNormDecoder, Traits
from graphir.model.presets import Preset


class Orion(PreNormDecoder):
    name = "orion"
    rope_mode = "neox"
    required_keys = (Keys.LLM.FEED_FORWARD_LENGTH, Keys.Attention.HEAD_COUNT, Keys.Attention.LAYERNORM_EPS)
    traits = Traits(norm=Norm.LAYER, tied_head=False)


# ---- Hugging Face: convert_hf_to_gguf's OrionModel, which writes its keys itself ---------------------------

L, A = Keys.LLM, Keys.Attention

hf_config.register(Family("orion", (
    hf(L.BLOCK_COUNT, *BLOCKS),
    hf(L.CONTEXT_LENGTH, "max_sequence_length", "max_position_embeddings", "model_max_length"),
    hf(L.EMBEDDING_LENGTH, "hidden_size"), hf(L.FEED_FORWARD_LENGTH, "intermediate_size"),
    hf(A.HEAD_COUNT, "num_attention_heads"), hf(A.HEAD_COUNT_KV, "num_key_value_heads", "num_attention_heads"),
    hf(A.LAYERNORM_EPS, "rms_norm_eps", kind="number"),  # a LayerNorm's epsilon, though the config calls it RMS
    VOCAB), {"tie_word_embeddings": False}), "OrionForCausalLM")

# ---- presets -----------------------------------------------------------------------------------------------

presets.register({
    # 40 layers of 40 heads of 128; no RoPE base is written (llama.cpp's 10000)
    "Orion-14B": Preset("orion", {
        L.CONTEXT_LENGTH: 4096, L.EMBEDDING_LENGTH: 5120, L.BLOCK_COUNT: 40, L.FEED_FORWARD_LENGTH: 15360,
        A.HEAD_COUNT: 40, A.HEAD_COUNT_KV: 40, A.LAYERNORM_EPS: 1e-5, L.VOCAB_SIZE: 84608,
    }, tied=False, source="OrionStarAI/Orion-14B-Base config.json"),
})
