"""InternLM2 (Shanghai AI Laboratory): the pre-norm decoder with RMSNorm, SwiGLU and GQA, RoPE over adjacent
pairs, an LM head of its own (the converter splits the checkpoint's fused wqkv into Q, K and V).

References: Cai et al. 2024, "InternLM2 Technical Report"; llama.cpp src/models/internlm2.cpp.
"""

from __future__ import annotations

from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.hf_config import TEXT, VOCAB, Family
from graphir.model.prenorm import RMS_KEYS, PreNormDecoder, Traits
from graphir.model.presets import Preset


class InternLM2(PreNormDecoder):
    name = "internlm2"
    rope_mode = "norm"
    required_keys = RMS_KEYS
    traits = Traits(tied_head=False)


# ---- Hugging Face: convert_hf_to_gguf's InternLM2Model (the generic text keys) ----------------------------

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope

hf_config.register(Family("internlm2", TEXT + (VOCAB,), {"tie_word_embeddings": False}), "InternLM2ForCausalLM")

# ---- presets -----------------------------------------------------------------------------------------------

presets.register({
    # 32 layers of 32 heads (8 KV heads) of 128; the config's dynamic RoPE scaling is not written by the converter
    "InternLM2-7B": Preset("internlm2", {
        L.CONTEXT_LENGTH: 32768, L.EMBEDDING_LENGTH: 4096, L.BLOCK_COUNT: 32, L.FEED_FORWARD_LENGTH: 14336,
        A.HEAD_COUNT: 32, A.HEAD_COUNT_KV: 8, R.FREQ_BASE: 1000000.0, A.LAYERNORM_RMS_EPS: 1e-5, L.VOCAB_SIZE: 92544,
    }, tied=False, source="internlm/internlm2-7b config.json"),
})
