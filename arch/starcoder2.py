"""StarCoder 2 (BigCode): the pre-norm decoder with LayerNorms and biases everywhere, RoPE over split halves,
grouped-query attention and a GELU MLP without a gate; the LM head is the token embedding unless the file has
its own. llama.cpp's graph has no sliding window (the configs' sliding_window is not read).

References: Lozhkov et al. 2024, "StarCoder 2 and The Stack v2: The Next Generation" (arXiv:2402.19173);
llama.cpp src/models/starcoder2.cpp.
"""

from __future__ import annotations

from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.builder import Act, Norm
from graphir.model.hf_config import TEXT, VOCAB, Family
from graphir.model.prenorm import REQUIRED, PreNormDecoder, Traits
from graphir.model.presets import Preset

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class StarCoder2(PreNormDecoder):
    name = "starcoder2"
    rope_mode = "neox"
    required_keys = (L.FEED_FORWARD_LENGTH, A.HEAD_COUNT, A.LAYERNORM_EPS)
    traits = Traits(norm=Norm.LAYER, wo_bias=REQUIRED, ffn_act=Act.GELU, ffn_bias=REQUIRED)


# ---- Hugging Face: convert_hf_to_gguf's StarCoder2Model writes the text model's keys --------------------------

hf_config.register(Family("starcoder2", TEXT + (VOCAB,), {"tie_word_embeddings": True}), "Starcoder2ForCausalLM")

presets.register({
    "StarCoder2-3B": Preset("starcoder2", {
        L.CONTEXT_LENGTH: 16384, L.EMBEDDING_LENGTH: 3072, L.BLOCK_COUNT: 30, L.FEED_FORWARD_LENGTH: 12288,
        A.HEAD_COUNT: 24, A.HEAD_COUNT_KV: 2, A.LAYERNORM_EPS: 1e-5, R.FREQ_BASE: 999999.4420358813,
        L.VOCAB_SIZE: 49152,
    }, tied=True, source="bigcode/starcoder2-3b config.json"),
})
