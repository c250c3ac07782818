"""openPangu-Embedded (Huawei): the pre-norm decoder with RMSNorm, SwiGLU and GQA, RoPE over split halves, and a
bias on the attention's output projection. The loader takes optional RoPE divisors (Llama-3.1's, or a LongRoPE
file's long and short sets), which the graph does not read.

References: Huawei 2025, "openPangu-Embedded-1B/7B" model cards; llama.cpp src/models/pangu-embed.cpp.
"""

from __future__ import annotations

from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.hf_config import TEXT, VOCAB, Family
from graphir.model.prenorm import REQUIRED, RMS_KEYS, UNREAD, PreNormDecoder, Traits, synthetic


class PanguEmbedded(PreNormDecoder):
    name = "pangu-embedded"
    rope_mode = "neox"
    required_keys = RMS_KEYS
    traits = Traits(rope_freqs=UNREAD, longrope=True, wo_bias=REQUIRED)


# ---- Hugging Face: convert_hf_to_gguf's PanguEmbeddedModel ------------------------------------------------


def _head_sizes(c: hf_config.Config) -> dict[str, int]:
    """The rotated dimensions, and the key and value lengths (written whether or not the config gives head_dim)."""
    d = hf_config.head_dim(c)
    return {Keys.Rope.DIMENSION_COUNT: d, Keys.Attention.KEY_LENGTH: d, Keys.Attention.VALUE_LENGTH: d}


hf_config.register(Family("pangu-embedded", TEXT + (VOCAB, _head_sizes), {"tie_word_embeddings": False}),
                   "PanguEmbeddedForCausalLM")



# ---- presets -----------------------------------------------------------------------------------------------

# openPangu-Embedded's public configs are not known here for certain: the golden graphs come from a tiny header
presets.register({"openPangu-Embedded-tiny": synthetic("pangu-embedded", "a synthetic header of tiny sizes")})
