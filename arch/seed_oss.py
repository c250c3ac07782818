"""Seed-OSS (ByteDance Seed): the pre-norm decoder with RMSNorm, SwiGLU and GQA, RoPE over split halves; the
FFN's norm is the tensor the file names attn_post_norm, and Q, K and V carry biases.

References: ByteDance Seed Team 2025, "Seed-OSS-36B" model card; llama.cpp src/models/seed-oss.cpp.
"""

from __future__ import annotations

from gguf import Keys
from gguf import MODEL_TENSOR as T

from graphir.model import hf_config, presets
from graphir.model.hf_config import TEXT, VOCAB, Family
from graphir.model.prenorm import RMS_KEYS, PreNormDecoder, Traits
from graphir.model.presets import Preset


class SeedOss(PreNormDecoder):
    name = "seed_oss"
    rope_mode = "neox"
    required_keys = RMS_KEYS
    traits = Traits(ffn_norm=T.ATTN_POST_NORM)


# ---- Hugging Face: convert_hf_to_gguf's SeedOssModel (the generic text keys) ------------------------------

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope
QKV_BIASES = r"blk\.\d+\.attn_[qkv]\.bias"


def _qkv_biases(c: hf_config.Config) -> str:
    return QKV_BIASES if c.find("attention_bias", kind="flag", default=False) else ""


hf_config.register(Family("seed_oss", TEXT + (VOCAB,), {"tie_word_embeddings": False}, _qkv_biases),
                   "SeedOssForCausalLM")

# ---- presets -----------------------------------------------------------------------------------------------

presets.register({
    # 64 layers of 80 heads (8 KV heads) of 128 over a width of 5120; Q, K and V with biases
    "Seed-OSS-36B": Preset("seed_oss", {
        L.CONTEXT_LENGTH: 524288, L.EMBEDDING_LENGTH: 5120, L.BLOCK_COUNT: 64, L.FEED_FORWARD_LENGTH: 27648,
        A.HEAD_COUNT: 80, A.HEAD_COUNT_KV: 8, A.KEY_LENGTH: 128, A.VALUE_LENGTH: 128, R.FREQ_BASE: 10000000.0,
        A.LAYERNORM_RMS_EPS: 1e-6, L.VOCAB_SIZE: 155136,
    }, tied=False, include=QKV_BIASES, source="ByteDance-Seed/Seed-OSS-36B-Instruct config.json"),
})
