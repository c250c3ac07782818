"""Seed-OSS (ByteDance Seed): the pre-norm decoder with RMSNorm, SwiGLU and GQA, RoPE over split halves; the
FFN's norm is the tensor the file names attn_post_norm, and Q, K and V carry biases.

References: ByteDance Seed Team 2025, "Seed-OSS-36B" model card; llama.cpp src/models/seed-oss.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T

from graphir.model.prenorm import RMS_KEYS, PreNormDecoder, Traits


class SeedOss(PreNormDecoder):
    name = "seed_oss"
    rope_mode = "neox"
    required_keys = RMS_KEYS
    traits = Traits(ffn_norm=T.ATTN_POST_NORM)
