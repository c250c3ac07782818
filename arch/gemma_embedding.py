"""EmbeddingGemma: Gemma 3's layers made an encoder (llama.cpp's gemma-embedding).

Every token sees the whole sequence; the local layers (five of every six) see a window of n/2 positions either
side (the symmetric window) instead of the n behind. No LM head is built: the final norm's output is pooled by the
context as the file says (EmbeddingGemma-300M: mean). Queries are scaled by 1/sqrt(head_dim) whatever the depth,
and the local layers rotate with rope.freq_base_swa (absent: 10000) unscaled, as Gemma 3's.
The converter's optional sentence-transformers projections (dense_2, dense_3) are not built: a file with them is
refused as carrying tensors graphir does not know.
Reference: Vera et al. 2025, "EmbeddingGemma: Powerful and Lightweight Text Representations"; llama.cpp
src/models/gemma-embedding.cpp.
"""

from __future__ import annotations

from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.hf_config import Family, pooling_rule
from graphir.model.hparams import Key, SlidingWindow
from graphir.model.presets import Preset

from graphir.arch.gemma import _GEMMA3, GEMMA3_RULES, Gemma2, Traits

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class GemmaEmbedding(Gemma2):
    name = "gemma-embedding"
    causal = False  # llama.cpp's loader makes it bidirectional whatever attention.causal says
    swa = SlidingWindow("symmetric", window=0, period=6)  # the window is required
    keys = (Key("rope_freq_base_swa", R.FREQ_BASE_SWA, float, 10000.0),)  # llama.cpp's default
    traits = Traits(sandwich=True, final_cap=False, score_cap=False, qk_norm=True, own_head=True, swa_rope_scale=1.0,
                    layers_of_27b=0, lm_head=False)


# Gemma3TextModel's converter: Gemma 3's keys, the sentence-transformers pooling
hf_config.register(Family("gemma-embedding", GEMMA3_RULES + (pooling_rule,), _GEMMA3), "Gemma3TextModel")

presets.register({
    # 24 layers of 768 (3 heads of 256 sharing one K/V head), a window of 512 (256 either side), mean pooling
    "EmbeddingGemma-300M": Preset("gemma-embedding", {
        L.CONTEXT_LENGTH: 2048, L.EMBEDDING_LENGTH: 768, L.BLOCK_COUNT: 24, L.FEED_FORWARD_LENGTH: 1152,
        A.HEAD_COUNT: 3, A.HEAD_COUNT_KV: 1, A.KEY_LENGTH: 256, A.VALUE_LENGTH: 256, A.LAYERNORM_RMS_EPS: 1e-6,
        A.SLIDING_WINDOW: 512, R.FREQ_BASE: 1000000.0, R.FREQ_BASE_SWA: 10000.0, L.VOCAB_SIZE: 262144,
        L.POOLING_TYPE: 1,
    }, tied=True, source="google/embeddinggemma-300m config.json and 1_Pooling (mean)"),
})
