"""Refact (Small Magic AI's code model): the pre-norm decoder with RMSNorm and SwiGLU whose attention takes
positions from ALiBi alone (no RoPE), multi-query attention; its optional biases and RoPE factors are loaded
and left unread, as llama.cpp's loader and graph do.

References: Small Magic AI 2023, "Refact-1.6B"; Press et al. 2021, "Train Short, Test Long" (ALiBi); llama.cpp
src/models/refact.cpp.
"""

from __future__ import annotations

from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.hf_config import VOCAB, Family, derived, fixed, hf
from graphir.model.hparams import Alibi
from graphir.model.prenorm import RMS_KEYS, UNREAD, PreNormDecoder, Traits
from graphir.model.presets import Preset


class Refact(PreNormDecoder):
    name = "refact"
    rope_mode = "norm"
    required_keys = RMS_KEYS
    alibi = Alibi()  # llama.cpp sets the bias itself (8), no key
    traits = Traits(rope=False, rope_freqs=UNREAD, longrope=True, wo_bias=UNREAD, ffn_bias=UNREAD)


# ---- Hugging Face: convert_hf_to_gguf's RefactModel, which sizes the FFN as SwiGLU's two thirds of 4x ----------

L, A = Keys.LLM, Keys.Attention


def _ffn(c: hf_config.Config) -> int:
    hidden = int(2 * 4 * c.find("n_embd") / 3)
    return 256 * ((hidden + 255) // 256)


hf_config.register(Family("refact", (
    hf(L.CONTEXT_LENGTH, "n_positions"), hf(L.EMBEDDING_LENGTH, "n_embd"), hf(L.BLOCK_COUNT, "n_layer"),
    derived(L.FEED_FORWARD_LENGTH, _ffn), hf(A.HEAD_COUNT, "n_head"), fixed(A.HEAD_COUNT_KV, 1),
    hf(A.LAYERNORM_RMS_EPS, "layer_norm_epsilon", kind="number"), VOCAB), {"tie_word_embeddings": False}),
    "GPTRefactForCausalLM")

presets.register({
    "Refact-1.6B": Preset("refact", {
        L.CONTEXT_LENGTH: 4096, L.EMBEDDING_LENGTH: 2048, L.BLOCK_COUNT: 32, L.FEED_FORWARD_LENGTH: 5632,
        A.HEAD_COUNT: 32, A.HEAD_COUNT_KV: 1, A.LAYERNORM_RMS_EPS: 1e-5, L.VOCAB_SIZE: 49216,
    }, tied=False, source="smallcloudai/Refact-1_6B-fim config.json"),
})
