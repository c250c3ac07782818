"""GLM-4-0414 (Zhipu AI): the pre-norm decoder with RMSNorms around both sublayers (each output normalised again
before its residual add), Q, K and V fused or apart with their biases, RoPE over adjacent pairs of half of each
head, and a SwiGLU over the two halves of one up projection. GLM-4.1V's text model rotates by M-RoPE where its
file gives the sections; GLM-OCR's multi-token-prediction layer is loaded and never run. The LM head is the token
embedding unless the file has its own.

References: GLM Team 2024, "ChatGLM: A Family of Large Language Models from GLM-130B to GLM-4 All Tools"
(arXiv:2406.12793); llama.cpp src/models/glm4.cpp.
"""

from __future__ import annotations

from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.hf_config import TEXT, VOCAB, Config, Family, derived, head_dim
from graphir.model.moe import NEXTN_KEY
from graphir.model.prenorm import READ, RMS_KEYS, ROPE_SECTIONS, PreNormDecoder, Traits, synthetic

R = Keys.Rope


class Glm4(PreNormDecoder):
    name = "glm4"
    rope_mode = "norm"
    required_keys = RMS_KEYS
    keys = (NEXTN_KEY, ROPE_SECTIONS)
    traits = Traits(fused_qkv=READ, post_norms=True, ffn_fused=True, mrope=True, nextn=True)


# ---- Hugging Face: convert_hf_to_gguf's Glm4Model: RoPE over partial_rotary_factor (0.5) of each head ---------

QKV_BIASES = r"blk\.\d+\.attn_[qkv]\.(weight|bias)"


def _rotated(c: Config) -> int:
    return int(head_dim(c) * c.rope_value(c.rope, "partial_rotary_factor", default=0.5))


hf_config.register(Family("glm4", TEXT + (derived(R.DIMENSION_COUNT, _rotated), VOCAB),
                          {"tie_word_embeddings": False},
                          lambda c: QKV_BIASES if c.find("attention_bias", kind="flag", default=False)
                          else presets.SPLIT_QKV),
                   "Glm4ForCausalLM")

presets.register({"GLM-4-tiny": synthetic("glm4", "a synthetic header of tiny sizes, RoPE over half of each head",
                                          include=QKV_BIASES, keys={R.DIMENSION_COUNT: 64})})
