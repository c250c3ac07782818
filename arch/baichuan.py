"""Baichuan and Baichuan 2: the pre-norm decoder with RMSNorm and SwiGLU, an LM head of its own; how it places
tokens depends on its size, as llama.cpp reads it from the layer count: the 7B (32 layers) rotates Q and K
(RoPE over adjacent pairs), the 13B (40 layers) biases each head's scores by distance (ALiBi), and a model of
any other depth does neither.

References: Yang et al. 2023, "Baichuan 2: Open Large-scale Language Models"; llama.cpp src/models/baichuan.cpp.
"""

from __future__ import annotations

from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.hf_config import TEXT, VOCAB, Family, derived
from graphir.model.hparams import Alibi
from graphir.model.prenorm import RMS_KEYS, PreNormDecoder, Traits
from graphir.model.presets import Preset

ROPE_N_LAYER, ALIBI_N_LAYER = 32, 40  # the 7B and the 13B

class Baichuan(PreNormDecoder):
    name = "baichuan"
    rope_mode = "norm"
    required_keys = RMS_KEYS
    alibi = Alibi(n_layer=ALIBI_N_LAYER)
    traits = Traits(tied_head=False, rope_at_n_layer=ROPE_N_LAYER)


# ---- Hugging Face: convert_hf_to_gguf's BaichuanModel -----------------------------------------------------

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope

hf_config.register(Family("baichuan", TEXT + (VOCAB, derived(R.DIMENSION_COUNT, hf_config.head_dim)),
                          {"tie_word_embeddings": False}), "BaichuanForCausalLM", "BaiChuanForCausalLM")

# ---- presets -----------------------------------------------------------------------------------------------


def _baichuan2(E: int, n_layer: int, n_ff: int, n_head: int, source: str) -> Preset:
    return Preset("baichuan", {
        L.CONTEXT_LENGTH: 4096, L.EMBEDDING_LENGTH: E, L.BLOCK_COUNT: n_layer, L.FEED_FORWARD_LENGTH: n_ff,
        A.HEAD_COUNT: n_head, A.LAYERNORM_RMS_EPS: 1e-6, R.DIMENSION_COUNT: 128, L.VOCAB_SIZE: 125696,
    }, tied=False, source=source)


presets.register({
    "Baichuan2-7B": _baichuan2(4096, 32, 11008, 32, "baichuan-inc/Baichuan2-7B-Base config.json"),  # RoPE
    "Baichuan2-13B": _baichuan2(5120, 40, 13696, 40, "baichuan-inc/Baichuan2-13B-Base config.json"),  # ALiBi
})
