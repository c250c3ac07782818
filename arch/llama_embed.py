"""llama-embed: Llama's layers as an embedding model (llama.cpp's graph<true> of src/models/llama.cpp).

The graph is Llama's, with attention over the ubatch's own tokens (no cache: llama.cpp's no-cache attention
input) and no LM head: the final norm's output is pooled as the context says. The mask is causal unless the
file says attention.causal = false (the converter of LlamaBidirectionalModel, nvidia/llama-embed-nemotron-8b,
writes no such key, so llama.cpp keeps it causal). llama.cpp's loader takes Llama's tensors, the LM head included,
which the graph does not read.
"""

from __future__ import annotations

from functools import cached_property

from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.hf_config import Family, pooling_rule
from graphir.model.presets import Preset
from graphir.arch.llama import LLAMA_RULES, Llama, Traits

L, A = Keys.LLM, Keys.Attention


class LlamaEmbed(Llama):
    name = "llama-embed"
    traits = Traits(lm_head=False)

    @cached_property
    def contexts(self) -> tuple[str, ...]:
        return ("none",)  # attention reads no cache, whether or not it is causal


hf_config.register(Family("llama-embed", LLAMA_RULES + (pooling_rule,), {"tie_word_embeddings": False}),
                   "LlamaBidirectionalModel")

presets.register({
    # llama.cpp's tiny llama-embed over four layers (so that alike ones fold; 256 wide, 2 heads, FFN 384),
    # bidirectional and mean-pooled: no released model's config is known here for certain
    "llama-embed-tiny-header": Preset("llama-embed", {
        L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 256, L.BLOCK_COUNT: 4, L.FEED_FORWARD_LENGTH: 384,
        A.HEAD_COUNT: 2, A.HEAD_COUNT_KV: 2, A.LAYERNORM_RMS_EPS: 1e-5, A.CAUSAL: False, L.VOCAB_SIZE: 128,
        L.POOLING_TYPE: 1,
    }, tied=False, source="llama.cpp tests/test-llama-archs.cpp, its tiny llama-embed header"),
})
