"""XVERSE (Shenzhen Yuanxiang): the pre-norm decoder with RMSNorm, SwiGLU and RoPE over adjacent pairs, an LM
head of its own.

References: XVERSE Technology 2023, "XVERSE-7B" model card; llama.cpp src/models/xverse.cpp.
"""

from __future__ import annotations

from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.hf_config import TEXT, VOCAB, Family, derived
from graphir.model.prenorm import RMS_KEYS, PreNormDecoder, Traits, synthetic


class Xverse(PreNormDecoder):
    name = "xverse"
    rope_mode = "norm"
    required_keys = RMS_KEYS
    traits = Traits(tied_head=False)


# ---- Hugging Face: convert_hf_to_gguf's XverseModel -------------------------------------------------------

hf_config.register(Family("xverse", TEXT + (VOCAB, derived(Keys.Rope.DIMENSION_COUNT, hf_config.head_dim)),
                          {"tie_word_embeddings": False}), "XverseForCausalLM")



# ---- presets -----------------------------------------------------------------------------------------------

# XVERSE-7B's public config is not known here for certain: the golden graphs come from a tiny header
presets.register({"XVERSE-tiny": synthetic("xverse", "a synthetic header of tiny sizes")})
