"""Mistral 3 dense (Mistral Small 3.1 and its text part): the pre-norm decoder with RMSNorm, SwiGLU and GQA, RoPE
over adjacent pairs with optional per-dimension divisors (or LongRoPE's long and short sets), an optional bias of
the attention's output projection, and the FFN's optional biases and its matrices' scales, read by the graph.

Ministral 3 scales its queries by Llama 4's attention temperature (``attention.temperature_scale``), a factor that
grows with the position every ``rope.scaling.original_context_length`` tokens, fed as an input of its own; YaRN
parameters other than llama.cpp's defaults are refused here, by name; the mixture-of-experts form is another
family's.

References: Mistral AI 2025, "Mistral Small 3.1" model card; llama.cpp src/models/mistral3.cpp.
"""

from __future__ import annotations

from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.hf_config import TEXT, VOCAB, Family, derived
from graphir.model.hparams import Key
from graphir.model.prenorm import ATTN_TEMP, READ, RMS_KEYS, PreNormDecoder, Traits
from graphir.model.presets import Preset

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope
# Keys llama.cpp's mistral3 loader reads that graphir's graph does not follow yet, with the value that changes
# nothing (llama.cpp's default: the context's YaRN betas 32 and 1, no log multiplier).
UNFOLLOWED = (Key("yarn_beta_fast", R.SCALING_YARN_BETA_FAST, float, 32.0),
              Key("yarn_beta_slow", R.SCALING_YARN_BETA_SLOW, float, 1.0),
              Key("rope_yarn_log_mul", R.SCALING_YARN_LOG_MUL, float, 0.0))


class Mistral3(PreNormDecoder):
    name = "mistral3"
    rope_mode = "norm"
    required_keys = RMS_KEYS
    keys = (ATTN_TEMP, *UNFOLLOWED)
    traits = Traits(rope_freqs=READ, longrope=True, wo_bias=READ, ffn_extras=True, attn_temperature=True,
                    refused=UNFOLLOWED)


# ---- Hugging Face: convert_hf_to_gguf's Mistral3Model (its text part, as LlamaModel writes it) -------------

hf_config.register(Family("mistral3", TEXT + (VOCAB, derived(R.DIMENSION_COUNT, hf_config.head_dim)),
                          {"tie_word_embeddings": False}), "Mistral3ForConditionalGeneration")

# ---- presets -----------------------------------------------------------------------------------------------

presets.register({
    # the text part: 40 layers of 32 heads (8 KV heads) of 128 over a width of 5120
    "Mistral-Small-3.1-24B": Preset("mistral3", {
        L.CONTEXT_LENGTH: 131072, L.EMBEDDING_LENGTH: 5120, L.BLOCK_COUNT: 40, L.FEED_FORWARD_LENGTH: 32768,
        A.HEAD_COUNT: 32, A.HEAD_COUNT_KV: 8, A.KEY_LENGTH: 128, A.VALUE_LENGTH: 128, R.FREQ_BASE: 1000000000.0,
        A.LAYERNORM_RMS_EPS: 1e-5, R.DIMENSION_COUNT: 128, L.VOCAB_SIZE: 131072,
    }, tied=False, source="mistralai/Mistral-Small-3.1-24B-Instruct-2503 config.json"),
})
