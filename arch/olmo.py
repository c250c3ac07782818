"""OLMo (AI2, the first release): the pre-norm decoder whose LayerNorms have no parameters at all, SwiGLU without
biases, RoPE over adjacent pairs of whole heads, and Q, K and V clamped to [-c, c] where the file sets clamp_kqv
(OLMo-7B-0424's clip_qkv). The LM head is the token embedding unless the file has its own.

References: Groeneveld et al. 2024, "OLMo: Accelerating the Science of Language Models" (arXiv:2402.00838);
llama.cpp src/models/olmo.cpp.
"""

from __future__ import annotations

from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.builder import Norm
from graphir.model.hf_config import TEXT, VOCAB, Family, fixed, hf
from graphir.model.prenorm import LAYER_NORM_KEYS, READ, PreNormDecoder, Traits, synthetic
from graphir.model.qkv import CLAMP_KQV

A = Keys.Attention


class Olmo(PreNormDecoder):
    name = "olmo"
    rope_mode = "norm"
    required_keys = LAYER_NORM_KEYS
    keys = (CLAMP_KQV,)
    traits = Traits(whole_heads=True, norm=Norm.LAYER, norm_weights=False, fused_qkv=READ, clamp_kqv=True)


# ---- Hugging Face: convert_hf_to_gguf's OlmoModel: the text model's keys, an epsilon of 1e-5, clip_qkv ------------


hf_config.register(Family("olmo", TEXT + (VOCAB, fixed(A.LAYERNORM_EPS, 1e-5), hf(A.CLAMP_KQV, "clip_qkv", kind="number",
                                                                                  default=None)),
                          {"tie_word_embeddings": False}, lambda c: presets.SPLIT_QKV), "OlmoForCausalLM")

presets.register({"OLMo-tiny": synthetic("olmo", "a synthetic header of tiny sizes, Q, K and V clamped to 8",
                                         A.LAYERNORM_EPS, presets.SPLIT_QKV, {A.CLAMP_KQV: 8.0})})
