"""ERNIE 4.5 dense (Baidu): the pre-norm decoder with RMSNorm, SwiGLU and GQA, RoPE over adjacent pairs.

The loader takes an optional bias of the attention's output projection, which the graph does not read.
PaddleOCR-VL's text model is ERNIE 4.5's tensors in Qwen2-VL's graph: M-RoPE sections one after the other, and the
output projection's bias read where the file has it.

References: Baidu ERNIE Team 2025, "ERNIE 4.5 Technical Report"; PaddlePaddle 2025, "PaddleOCR-VL"; llama.cpp
src/models/ernie4-5.cpp, paddleocr.cpp.
"""

from __future__ import annotations

from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.hf_config import TEXT, VOCAB, Family
from graphir.model.prenorm import READ, RMS_KEYS, ROPE_SECTIONS, UNREAD, PreNormDecoder, Traits, synthetic
from graphir.model.presets import Preset


class Ernie45(PreNormDecoder):
    name = "ernie4_5"
    rope_mode = "norm"
    required_keys = RMS_KEYS
    traits = Traits(wo_bias=UNREAD)


class PaddleOCR(PreNormDecoder):
    name = "paddleocr"
    rope_mode = "mrope"
    required_keys = RMS_KEYS
    keys = (ROPE_SECTIONS,)
    traits = Traits(wo_bias=READ, mrope=True)


# ---- Hugging Face: convert_hf_to_gguf's Ernie4_5Model (the generic text keys) -----------------------------

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope

hf_config.register(Family("ernie4_5", TEXT + (VOCAB,), {"tie_word_embeddings": True}),
                   "Ernie4_5ForCausalLM", "Ernie4_5_ForCausalLM")

# ---- presets -----------------------------------------------------------------------------------------------

presets.register({
    # 18 layers of 16 heads (2 KV heads) of 128 over a width of 1024; the head is the token embedding
    "ERNIE-4.5-0.3B": Preset("ernie4_5", {
        L.CONTEXT_LENGTH: 131072, L.EMBEDDING_LENGTH: 1024, L.BLOCK_COUNT: 18, L.FEED_FORWARD_LENGTH: 3072,
        A.HEAD_COUNT: 16, A.HEAD_COUNT_KV: 2, A.KEY_LENGTH: 128, A.VALUE_LENGTH: 128, R.FREQ_BASE: 500000.0,
        A.LAYERNORM_RMS_EPS: 1e-5, L.VOCAB_SIZE: 103424,
    }, tied=True, source="baidu/ERNIE-4.5-0.3B-PT config.json"),
    # PaddleOCR-VL's text model at tiny sizes (its released config is not known here for certain): heads of 128,
    # M-RoPE over 16 time, 24 height and 24 width pairs, the output projection's bias
    "PaddleOCR-VL-tiny": synthetic("paddleocr", "a synthetic header of tiny sizes, M-RoPE sections",
                                   include=r"blk\.\d+\.attn_output\.bias", keys={R.DIMENSION_SECTIONS: [16, 24, 24, 0]}),
})
