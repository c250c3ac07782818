"""Qwen 1 (Alibaba): the pre-norm decoder whose Q, K and V are one matrix with its bias, RoPE over split halves,
a SwiGLU FFN half as wide as feed_forward_length says (the checkpoint's intermediate_size counts both halves).

References: Bai et al. 2023, "Qwen Technical Report"; llama.cpp src/models/qwen.cpp.
"""

from __future__ import annotations

from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.hf_config import TEXT, VOCAB, Family, hf
from graphir.model.prenorm import REQUIRED, RMS_KEYS, PreNormDecoder, Traits
from graphir.model.presets import Preset


class Qwen(PreNormDecoder):
    name = "qwen"
    rope_mode = "neox"
    required_keys = RMS_KEYS
    traits = Traits(tied_head=False, fused_qkv=REQUIRED, qkv_model_widths=True, ffn_halved=True)


# ---- Hugging Face: convert_hf_to_gguf's QwenModel (the generic text keys) ---------------------------------

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope

# The norm epsilon: Qwen's config names it layer_norm_epsilon, which the converter's generic rule writes as the
# LayerNorm key; llama.cpp's loader reads the RMS key, which released Qwen GGUFs carry (written by the
# converter's own rule for this family before it took the generic one): both are written.
hf_config.register(Family("qwen", TEXT + (VOCAB, hf(A.LAYERNORM_RMS_EPS, "layer_norm_epsilon", kind="number")),
                          {"tie_word_embeddings": False}), "QWenLMHeadModel")

# ---- presets -----------------------------------------------------------------------------------------------

presets.register({
    # 32 layers of 32 heads of 128; feed_forward_length counts both halves of the gated FFN (11008 each)
    "Qwen-7B": Preset("qwen", {
        L.CONTEXT_LENGTH: 32768, L.EMBEDDING_LENGTH: 4096, L.BLOCK_COUNT: 32, L.FEED_FORWARD_LENGTH: 22016,
        A.HEAD_COUNT: 32, R.FREQ_BASE: 10000.0, A.LAYERNORM_EPS: 1e-6, A.LAYERNORM_RMS_EPS: 1e-6,
        L.VOCAB_SIZE: 151936,
    }, tied=False, source="Qwen/Qwen-7B config.json"),
})
