"""Mistral 3 dense (Mistral Small 3.1 and its text part): the pre-norm decoder with RMSNorm, SwiGLU and GQA, RoPE
over adjacent pairs with optional per-dimension divisors (or LongRoPE's long and short sets), an optional bias of
the attention's output projection, and the FFN's optional biases and its matrices' scales, read by the graph.

Ministral 3 scales its queries by Llama 4's attention temperature (``attention.temperature_scale``), a factor that
grows with the position every ``rope.scaling.original_context_length`` tokens, fed as an input of its own, and
reads YaRN's ramp (``rope.scaling.yarn_beta_fast``/``_slow``) and the magnitude of all dimensions
(``rope.scaling.yarn_log_multiplier``) from the file. With ``expert_count`` > 0 every FFN is a mixture of experts of
``feed_forward_length`` (softmax-routed, renormalised; the gates optional, each stack's scales read).

References: Mistral AI 2025, "Mistral Small 3.1" model card; llama.cpp src/models/mistral3.cpp.
"""

from __future__ import annotations

from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.hf_config import TEXT, VOCAB, Family, derived
from graphir.model.moe import MOE_KEYS
from graphir.model.prenorm import ATTN_TEMP, READ, RMS_KEYS, YARN_KEYS, PreNormDecoder, Traits
from graphir.model.presets import Preset

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class Mistral3(PreNormDecoder):
    name = "mistral3"
    rope_mode = "norm"
    required_keys = RMS_KEYS
    keys = (ATTN_TEMP, *YARN_KEYS, *MOE_KEYS)
    traits = Traits(rope_freqs=READ, longrope=True, wo_bias=READ, ffn_bias=READ, ffn_scales=True, attn_temperature=True,
                    yarn_keys=True, experts=True)


# ---- Hugging Face: convert_hf_to_gguf's Mistral3Model (its text part, as LlamaModel writes it) -------------

def _ministral3(c: hf_config.Config) -> dict[str, float]:
    """Ministral 3 (model_type ministral3): the magnitude of all dimensions and Llama 4's temperature, from its
    YaRN parameters."""
    if c.doc.get("model_type") != "ministral3":
        return {}
    p = c.full_rope
    return {R.SCALING_YARN_LOG_MUL: c.rope_value(p, "mscale_all_dim"),
            A.TEMPERATURE_SCALE: c.rope_value(p, "llama_4_scaling_beta")}


hf_config.register(Family("mistral3", TEXT + (VOCAB, derived(R.DIMENSION_COUNT, hf_config.head_dim), _ministral3),
                          {"tie_word_embeddings": False}), "Mistral3ForConditionalGeneration", "Ministral3ForCausalLM")

# ---- presets -----------------------------------------------------------------------------------------------

presets.register({
    # the text part: 40 layers of 32 heads (8 KV heads) of 128 over a width of 5120
    "Mistral-Small-3.1-24B": Preset("mistral3", {
        L.CONTEXT_LENGTH: 131072, L.EMBEDDING_LENGTH: 5120, L.BLOCK_COUNT: 40, L.FEED_FORWARD_LENGTH: 32768,
        A.HEAD_COUNT: 32, A.HEAD_COUNT_KV: 8, A.KEY_LENGTH: 128, A.VALUE_LENGTH: 128, R.FREQ_BASE: 1000000000.0,
        A.LAYERNORM_RMS_EPS: 1e-5, R.DIMENSION_COUNT: 128, L.VOCAB_SIZE: 131072,
    }, tied=False, source="mistralai/Mistral-Small-3.1-24B-Instruct-2503 config.json"),
})
