"""ChatGLM 2/3 and GLM-4-9B (THUDM): the pre-norm decoder with RMSNorm whose Q, K and V come from one projection
with a bias (grouped-query: multi_query_group_num K/V heads), RoPE over adjacent pairs of the first half of each
head (GLM's two-dimensional RoPE, of which llama.cpp keeps one), and a SwiGLU over the two halves of one up
projection. The LM head is a matrix of its own (the token embedding where a file lacks it).

References: GLM Team 2024, "ChatGLM: A Family of Large Language Models from GLM-130B to GLM-4 All Tools"
(arXiv:2406.12793); llama.cpp src/models/chatglm.cpp.
"""

from __future__ import annotations

from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.hf_config import BLOCKS, Family, derived, hf
from graphir.model.prenorm import READ, RMS_KEYS, PreNormDecoder, Traits
from graphir.model.presets import Preset

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class ChatGLM(PreNormDecoder):
    name = "chatglm"
    rope_mode = "norm"
    required_keys = RMS_KEYS
    traits = Traits(fused_qkv=READ, ffn_fused=True)


# ---- Hugging Face: convert_hf_to_gguf's ChatGLMModel (RoPE over half a head, its base scaled by rope_ratio) ------

hf_config.register(Family("chatglm", (
    hf(L.BLOCK_COUNT, "num_layers", *BLOCKS),
    hf(L.CONTEXT_LENGTH, "seq_length"),
    hf(L.EMBEDDING_LENGTH, "hidden_size"),
    hf(L.FEED_FORWARD_LENGTH, "ffn_hidden_size"),
    hf(A.HEAD_COUNT, "num_attention_heads"),
    derived(A.HEAD_COUNT_KV, lambda c: c.find("multi_query_group_num", default=None)
            or c.find("num_attention_heads")),
    hf(A.LAYERNORM_RMS_EPS, "layernorm_epsilon", kind="number"),
    derived(R.DIMENSION_COUNT, lambda c: c.find("hidden_size") // c.find("num_attention_heads") // 2),
    derived(R.FREQ_BASE, lambda c: 10000.0 * c.find("rope_ratio", kind="number", default=1.0)),
    derived(L.VOCAB_SIZE, lambda c: c.find("padded_vocab_size", "vocab_size")),
), {"tie_word_embeddings": False},
    include=lambda c: r"blk\.\d+\.attn_qkv\.(weight|bias)" if c.find("add_qkv_bias", kind="flag", default=False)
    else r"blk\.\d+\.attn_qkv\.weight"),
    "ChatGLMModel", "ChatGLMForConditionalGeneration")

presets.register({
    # 40 layers of 32 heads of 128 sharing 2 K/V heads; RoPE over 64 values of each, base 10000 * 500
    "GLM-4-9B": Preset("chatglm", {
        L.CONTEXT_LENGTH: 8192, L.EMBEDDING_LENGTH: 4096, L.BLOCK_COUNT: 40, L.FEED_FORWARD_LENGTH: 13696,
        A.HEAD_COUNT: 32, A.HEAD_COUNT_KV: 2, A.LAYERNORM_RMS_EPS: 1.5625e-07, R.DIMENSION_COUNT: 64,
        R.FREQ_BASE: 5000000.0, L.VOCAB_SIZE: 151552,
    }, tied=False, source="THUDM/glm-4-9b config.json", include=r"blk\.\d+\.attn_qkv\.(weight|bias)"),
})
