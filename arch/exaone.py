"""EXAONE 3 and 3.5 (LG AI Research): the pre-norm decoder with RMSNorm, SwiGLU and GQA, RoPE over split
halves with Llama-3.1's per-dimension divisors where the file has them.

References: LG AI Research 2024, "EXAONE 3.5: Series of Large Language Models for Real-world Use Cases";
llama.cpp src/models/exaone.cpp.
"""

from __future__ import annotations

from gguf import Keys
from gguf import MODEL_TENSOR as T

from graphir.model import hf_config, presets
from graphir.model.hf_config import TEXT, VOCAB, Family, derived, hf
from graphir.model.prenorm import READ, RMS_KEYS, PreNormDecoder, Traits
from graphir.model.presets import Preset
from graphir.model.tensors import tensor_name


class Exaone(PreNormDecoder):
    name = "exaone"
    rope_mode = "neox"
    required_keys = RMS_KEYS
    traits = Traits(rope_freqs=READ)


# ---- Hugging Face: convert_hf_to_gguf's ExaoneModel --------------------------------------------------------

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope
ROPE_FREQS = tensor_name(T.ROPE_FREQS).replace(".", r"\.")


def _llama3_factors(c: hf_config.Config) -> str:
    """The converter computes Llama-3.1's RoPE divisors into rope_freqs for a llama3 rope_scaling."""
    return ROPE_FREQS if str(c.full_rope.get("rope_type", "")).lower() == "llama3" else ""


# The norm epsilon: EXAONE's config names it layer_norm_epsilon, which the converter's generic rule writes as the
# LayerNorm key; llama.cpp's loader reads the RMS key, which released EXAONE GGUFs carry (written by the
# converter's own rule for this family before it took the generic one): both are written.
hf_config.register(Family("exaone", TEXT + (
    VOCAB, derived(R.DIMENSION_COUNT, lambda c: int(c.rope.get("partial_rotary_factor", 1.0) * hf_config.head_dim(c))),
    hf(A.LAYERNORM_RMS_EPS, "layer_norm_epsilon", kind="number")), {"tie_word_embeddings": False}, _llama3_factors),
    "ExaoneForCausalLM")

# ---- presets -----------------------------------------------------------------------------------------------

presets.register({
    # 30 layers of 32 heads (8 KV heads) of 80, Llama-3.1's RoPE divisors (factor 8 from 8192), tied head
    "EXAONE-3.5-2.4B": Preset("exaone", {
        L.CONTEXT_LENGTH: 32768, L.EMBEDDING_LENGTH: 2560, L.BLOCK_COUNT: 30, L.FEED_FORWARD_LENGTH: 7168,
        A.HEAD_COUNT: 32, A.HEAD_COUNT_KV: 8, R.FREQ_BASE: 1000000.0, A.LAYERNORM_EPS: 1e-5, A.LAYERNORM_RMS_EPS: 1e-5,
        R.DIMENSION_COUNT: 80, L.VOCAB_SIZE: 102400,
    }, tied=True, include=ROPE_FREQS, source="LGAI-EXAONE/EXAONE-3.5-2.4B-Instruct config.json"),
})
