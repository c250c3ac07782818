"""Maincoder: the pre-norm decoder with RMSNorm, SwiGLU and GQA, RoPE over adjacent pairs, and each head of Q and
K RMS-normalised after RoPE.

References: llama.cpp src/models/maincoder.cpp.
"""

from __future__ import annotations

from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.hf_config import TEXT, VOCAB, Family, hf
from graphir.model.prenorm import RMS_KEYS, PreNormDecoder, Traits, synthetic


class Maincoder(PreNormDecoder):
    name = "maincoder"
    rope_mode = "norm"
    required_keys = RMS_KEYS
    traits = Traits(qk_norm_after_rope=True)


# ---- Hugging Face: convert_hf_to_gguf's MaincoderModel ----------------------------------------------------

hf_config.register(Family("maincoder", TEXT + (VOCAB, hf(Keys.Rope.DIMENSION_COUNT, "head_dim", default=None)),
                          {"tie_word_embeddings": False}), "MaincoderForCausalLM")



# ---- presets -----------------------------------------------------------------------------------------------

# Maincoder-1B's public config is not known here for certain: the golden graphs come from a tiny header
presets.register({"Maincoder-tiny": synthetic("maincoder", "a synthetic header of tiny sizes")})
