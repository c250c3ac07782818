"""Diffusion language models: decoders that attend both ways and keep no cache, refining a masked sequence over
steps (llama.cpp's diffusion example calls llama_decode on the whole sequence at each step, every position's
logits out).

llama.cpp's graphs of them are literally those of causal families with the attention over the ubatch's own tokens
(its no-cache attention input) and no mask: Dream is Qwen2's layers (src/models/dream.cpp); each is the causal
family's module here, made non-causal (``causal = False``: llama.cpp's loader sets causal_attn false whatever the
file says, and gives the family no memory).
"""

from __future__ import annotations

from dataclasses import replace

from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.hf_config import TEXT, VOCAB, Family
from graphir.model.presets import Preset
from graphir.arch.llama import Qwen2

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class Dream(Qwen2):
    """Dream: Qwen2's graph and tensors, bidirectional; its loader creates the optional output.bias, which its
    graph does not add."""

    name = "dream"
    causal = False
    traits = replace(Qwen2.traits, head_bias=False)


hf_config.register(Family("dream", TEXT + (VOCAB,), {"tie_word_embeddings": False}), "DreamModel")

presets.register({
    # Dream-org/Dream-v0-Instruct-7B: Qwen2.5-7B's shape (its config.json)
    "Dream-v0-Instruct-7B": Preset("dream", {
        L.CONTEXT_LENGTH: 131072, L.EMBEDDING_LENGTH: 3584, L.BLOCK_COUNT: 28, L.FEED_FORWARD_LENGTH: 18944,
        A.HEAD_COUNT: 28, A.HEAD_COUNT_KV: 4, R.FREQ_BASE: 1000000.0, A.LAYERNORM_RMS_EPS: 1e-6,
        L.VOCAB_SIZE: 152064,
    }, tied=False, source="Dream-org/Dream-v0-Instruct-7B config.json"),
})
